"""The chargeback split of a device held by several allocations at once (ledger.projections.split)."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from ledger.projections.split import Interval, capacity_fraction, shares, span_fractions, split
from ledger.types import JSONObject

T0 = datetime(2026, 12, 1, tzinfo=UTC)
DRIVER = "gpu.example.com"
MEMORY: JSONObject = {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_an_allocations_fraction_is_its_largest_consumed_capacity_ratio() -> None:
    nic: JSONObject = {"devicenetwork.io/maxVirtualInterfaces": {"value": "65535"}}
    assert capacity_fraction(nic, {"devicenetwork.io/maxVirtualInterfaces": "1"}, driver=DRIVER) == Decimal(1) / 65535
    # 16Gi of 80Gi is 0.2, 50 of 100 compute is 0.5: the bottleneck counts.
    assert capacity_fraction(MEMORY, {"memory": "16Gi", "compute": "50"}, driver=DRIVER) == Decimal("0.5")
    assert capacity_fraction(MEMORY, {"memory": "40Gi"}, driver=DRIVER) == Decimal("0.5")


def test_a_fraction_needs_a_capacity_the_device_publishes_and_a_sane_amount() -> None:
    assert capacity_fraction(MEMORY, {}, driver=DRIVER) is None
    assert capacity_fraction(MEMORY, {"bandwidth": "10"}, driver=DRIVER) is None  # the device publishes no bandwidth
    assert capacity_fraction(MEMORY, {"memory": "lots"}, driver=DRIVER) is None
    assert capacity_fraction(MEMORY, {"memory": "-1Gi"}, driver=DRIVER) is None
    assert capacity_fraction({"memory": {"value": "0"}}, {"memory": "1Gi"}, driver=DRIVER) is None
    assert capacity_fraction(None, {"memory": "1Gi"}, driver=DRIVER) is None  # the device was never in an inventory
    assert capacity_fraction(MEMORY, ["memory"], driver=DRIVER) is None


def test_a_span_splits_by_fractions_only_when_every_holder_states_one() -> None:
    assert span_fractions([Decimal("0.25"), Decimal("0.5")]) == ("consumedCapacity", [Decimal("0.25"), Decimal("0.5")])
    assert span_fractions([Decimal("0.25"), None]) == ("equal", [Decimal("0.5")] * 2)
    assert span_fractions([None, None, None]) == ("equal", [Decimal(1) / 3] * 3)
    assert span_fractions([Decimal("0.25")]) == ("whole", [Decimal(1)])  # alone, it holds the whole device


def test_an_allocation_stating_more_than_the_device_holds_the_whole_device() -> None:
    # 1e400 of a capacity of 1 (or of 1n) was a ratio past any float: the sweep divided infinity by infinity.
    assert capacity_fraction({"bw": {"value": "1"}}, {"bw": "1e400"}, driver=DRIVER) == Decimal(1)
    assert capacity_fraction({"bw": {"value": "1n"}}, {"bw": "1e300"}, driver=DRIVER) == Decimal(1)
    assert capacity_fraction(MEMORY, {"memory": "160Gi"}, driver=DRIVER) == Decimal(1)
    seconds: dict[str, float] = defaultdict(float)
    split([(at(0), at(60), "a", 1.0, "a"), (at(0), at(60), "b", 1.0, "b")], seconds)  # two whole devices' worth: halves
    assert dict(seconds) == {"a": 1800.0, "b": 1800.0}


def test_over_committed_fractions_are_scaled_down_to_the_whole_device() -> None:
    # 0.75 + 0.75 = 1.5 of the device: each is billed 0.5, so the device is never billed more than its time.
    assert span_fractions([Decimal("0.75"), Decimal("0.75")]) == ("consumedCapacity", [Decimal("0.5")] * 2)


def test_the_sweep_bills_each_span_by_the_rule_of_its_holders() -> None:
    # a: 0-60 min at 0.25; b: 30-90 min at 0.5; c: 45-60 min states nothing.
    intervals: list[Interval[str]] = [(at(0), at(60), "a", 0.25, "a"), (at(30), at(90), "b", 0.5, "b"),
                                      (at(45), at(60), "c", None, "c")]
    seconds: dict[str, float] = defaultdict(float)
    split(intervals, seconds)
    # a: 30 min alone (whole), 15 min with b (0.25), 15 min with b and c (1/3)
    assert seconds["a"] == 30 * 60 + 15 * 60 * 0.25 + 15 * 60 / 3
    # b: 15 min with a (0.5), 15 min with a and c (1/3), 30 min alone (whole)
    assert seconds["b"] == 15 * 60 * 0.5 + 15 * 60 / 3 + 30 * 60
    assert seconds["c"] == 15 * 60 / 3
    pieces = list(shares(intervals))
    assert [(lo, hi) for lo, hi, *_ in pieces] == sorted((lo, hi) for lo, hi, *_ in pieces)  # time order
    assert {(g, w) for lo, _, g, w in pieces if lo == at(30)} == {("a", 0.25), ("b", 0.5)}


def test_touching_intervals_share_nothing() -> None:
    seconds: dict[str, float] = defaultdict(float)
    split([(at(0), at(30), "a", 0.1, "a"), (at(30), at(60), "b", 0.1, "b")], seconds)
    assert dict(seconds) == {"a": 1800.0, "b": 1800.0}


def test_a_gap_between_allocations_bills_nobody() -> None:
    seconds: dict[str, float] = defaultdict(float)
    split([(at(0), at(30), "a", None, "a"), (at(60), at(90), "b", None, "b"), (at(60), at(90), "c", None, "c")],
          seconds)
    assert dict(seconds) == {"a": 1800.0, "b": 900.0, "c": 900.0}
    assert span_fractions([]) == ("whole", [])


def test_the_sweep_bills_what_a_minute_by_minute_count_bills() -> None:
    # Random intervals on whole minutes, some stating a fraction and some not (0 included), some of one claim; the
    # reference walks every minute, finds who covers it and applies the rule directly.
    rng = random.Random(42)
    for _ in range(200):
        intervals: list[Interval[int]] = []
        for g in range(rng.randint(1, 6)):
            s = rng.randint(0, 50)
            e = s + rng.randint(1, 30)
            fraction = rng.choice([None, 0.0, 0.1, 0.25, 0.5, 0.75])
            intervals.append((at(s), at(e), g % 4, fraction, rng.choice("xyz")))
        seconds: dict[int, float] = defaultdict(float)
        split(intervals, seconds)
        expected: dict[int, float] = defaultdict(float)
        for minute in range(0, 90):
            covering = [(g, f, c) for s, e, g, f, c in intervals if s <= at(minute) and at(minute + 1) <= e]
            known = [f for _, f, _ in covering if f is not None]
            total = sum(known) if len(known) == len(covering) else 0.0
            one_claim = len({c for _, _, c in covering}) == 1
            if len(covering) == 1:
                expected[covering[0][0]] += 60
            elif total > 0:
                for g, f, _ in covering:
                    assert f is not None
                    expected[g] += 60 * (f / total if total > 1 or one_claim else f)
            else:
                for g, _, _ in covering:
                    expected[g] += 60 / len(covering)
        assert set(seconds) == set(expected)
        for g, value in expected.items():
            assert seconds[g] == pytest.approx(value, rel=1e-9)


def test_a_capacity_name_without_a_domain_is_in_the_drivers_domain() -> None:
    # CEL reads a capacity "bw" of driver net.example.com as device.capacity["net.example.com"].bw: the same name
    # as "net.example.com/bw". A share stating either form of either side is one capacity; another domain is not.
    nic: JSONObject = {"bw": {"value": "100G"}}
    qualified: JSONObject = {"net.example.com/bw": {"value": "100G"}}
    assert capacity_fraction(nic, {"net.example.com/bw": "25G"}, driver="net.example.com") == Decimal("0.25")
    assert capacity_fraction(qualified, {"bw": "25G"}, driver="net.example.com") == Decimal("0.25")
    assert capacity_fraction(nic, {"other.example.com/bw": "25G"}, driver="net.example.com") is None


def test_shares_that_all_consume_nothing_split_the_device_equally() -> None:
    # Two shares stating "0" of the capacity: no fraction to weigh them by, so the device's time is not lost.
    assert span_fractions([Decimal(0), Decimal(0)]) == ("equal", [Decimal("0.5")] * 2)
    seconds: dict[str, float] = defaultdict(float)
    split([(at(0), at(60), "a", 0.0, "a"), (at(0), at(60), "b", 0.0, "b")], seconds)
    assert dict(seconds) == {"a": 1800.0, "b": 1800.0}
    # One share of 0 beside one of 0.5: the first holds none of the device, the second half of it.
    assert span_fractions([Decimal(0), Decimal("0.5")]) == ("consumedCapacity", [Decimal(0), Decimal("0.5")])


def test_a_device_held_by_one_claim_through_several_results_is_billed_to_it_whole() -> None:
    # One claim's two requests each got 30 of a 100-unit device: the claim alone holds it, as one result of 60
    # would, so its hour is billed whole, half to each result. It was billed 0.3 + 0.3.
    assert span_fractions([Decimal("0.3"), Decimal("0.3")], ["c", "c"]) == ("whole", [Decimal("0.5")] * 2)
    assert span_fractions([Decimal("0.1"), Decimal("0.3")], ["c", "c"]) == ("whole", [Decimal("0.25"), Decimal("0.75")])
    assert span_fractions([Decimal("0.3"), None], ["c", "c"]) == ("whole", [Decimal("0.5")] * 2)
    seconds: dict[str, float] = defaultdict(float)
    # 0-60 min: claim c's two results alone; 60-90: d joins with 0.4, so each result is billed its own fraction.
    split([(at(0), at(90), "c/gpu", 0.3, "c"), (at(0), at(90), "c/nic", 0.3, "c"), (at(60), at(90), "d", 0.4, "d")],
          seconds)
    assert seconds["c/gpu"] == pytest.approx(1800 + 30 * 60 * 0.3)
    assert seconds["c/nic"] == pytest.approx(1800 + 30 * 60 * 0.3)
    assert seconds["d"] == pytest.approx(30 * 60 * 0.4)
