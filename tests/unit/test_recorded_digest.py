"""The digest of a line does not depend on which JSON decoder read it.

JSON Lines are read by a fast decoder that refuses floats and other rarities; everything else (and
every other format) goes through ``json``. Both must give the same object and the same digest, or a
history replayed after an upgrade would be recorded a second time.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import Invalid
from ledger.recorded import LATEST_TIME, WatchLine, _receive_time, parse_time, read_text, watch_line
from ledger.simulate import FleetSpec, write_history
from ledger.types import JSONObject, JSONValue
from tests.paths import HISTORIES

AT = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)


def reference_digest(event_type: str, observed_at: datetime, obj: JSONValue) -> str:
    """The digest as documented on ``WatchLine.digest``, computed with the standard library only."""
    canonical = json.dumps([event_type, observed_at.isoformat(), obj], sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def only_line(text: str) -> WatchLine:
    results = list(read_text(text, source="test"))
    assert len(results) == 1 and isinstance(results[0], WatchLine), results
    return results[0]


texts = st.text(st.characters(codec="utf-8"), max_size=12)  # no lone surrogates
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(texts, inner, max_size=4)), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(texts, values, max_size=6), indent=st.booleans())
def test_any_object_reads_to_the_same_object_and_reference_digest(body: JSONObject, indent: bool) -> None:
    obj: JSONObject = {"kind": "Pod", "metadata": {"name": "p"}, "body": body}
    line = json.dumps({"observedAt": "2026-11-02T09:30:00Z", "type": "MODIFIED", "object": obj},
                      ensure_ascii=indent)  # both spellings of non-ASCII text

    read = only_line(line)

    assert read.object == obj
    assert read.digest == reference_digest("MODIFIED", AT, obj)
    assert json.loads(read.object_json) == obj  # the stored body, cut out of the digest input
    assert read.holds_nul == ("\\u0000" in json.dumps(obj))  # as the WatchLine.holds_nul docstring says


def test_every_recorded_line_has_the_digest_a_live_watch_event_gets(tmp_path: Path) -> None:
    # watch_line() is what the workers use for live events: it always encodes with json.
    fleet = tmp_path / "fleet.jsonl"
    write_history(FleetSpec(nodes=3, gpus_per_node=4, hours=6.0, seed=11), fleet)
    checked = 0
    for path in [*sorted(HISTORIES.glob("*.jsonl")), fleet]:
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not text.strip():
                continue
            try:
                read = only_line(text)
            except AssertionError:
                continue  # the broken lines some fixtures hold on purpose
            assert read.observed_at is not None
            live = watch_line(source="watch", line=number, event_type=read.type, observed_at=read.observed_at,
                              obj=json.loads(text)["object"])
            assert isinstance(live, WatchLine)
            assert (read.digest, read.object) == (live.digest, live.object), f"{path.name}:{number}"
            assert read.object_json == live.object_json, f"{path.name}:{number}"
            assert json.loads(read.object_json) == read.object, f"{path.name}:{number}"
            checked += 1
    assert checked > 300


def test_an_object_read_without_a_receive_time_keeps_its_whole_text_for_the_body() -> None:
    # kubectl output carries no observedAt: the digest input's time is "" and the object starts earlier.
    obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns", "labels": {"team": "é"}}}
    results = list(read_text(json.dumps(obj, indent=2), source="test"))
    assert len(results) == 1 and isinstance(results[0], WatchLine)
    read = results[0]
    assert read.observed_at is None
    assert json.loads(read.object_json) == obj
    assert read.object_json == json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# Up to the latest instant a line may carry (recorded.LATEST_TIME): a time in year 9999 is refused, and drawing
# one made this test fail now and then.
@given(when=st.datetimes(min_value=datetime(1, 1, 2), max_value=LATEST_TIME.replace(tzinfo=None),
                         timezones=st.just(UTC)),
       whole=st.booleans())
def test_a_recorder_time_reads_as_parse_time_and_isoformat_read_it(when: datetime, whole: bool) -> None:
    # The recorders' shape (six fraction digits, or none) takes the fast path; the digest spells the time
    # with isoformat(), which drops a fraction of zero: both must come out as the slow path's.
    if whole:
        when = when.replace(microsecond=0)
    value = (f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:{when.second:02d}"
             + ("Z" if whole else f".{when.microsecond:06d}Z"))
    expected = parse_time(value)
    assert _receive_time(value) == (expected, expected.isoformat())
    assert _receive_time(value)[0].tzinfo is UTC


@given(value=st.one_of(
    st.sampled_from(["2026-11-02T09:00:00.000000Z", "2026-11-02T09:00:60Z", "2026-02-30T09:00:00Z",
                     "0000-01-01T00:00:00Z", "2026-11-02t09:00:00Z", "2026-11-02T09:00:00z",
                     "2026-11-02 09:00:00Z", "2026-11-02T09:00:00.123456789Z", "2026-11-02T09:00:00.1Z",
                     "2026-11-02T09:00:00+01:00", "2026-11-02T09:00:00.123456-07:30", "2026-W44-1T09:00:00Z",
                     "2026-11-02T09:00:00,123456Z", "2026-11-02T09:00:00", "2026-11-02", "",
                     "２０２６-11-02T09:00:00Z"]),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
                  r"([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"),
    st.text(max_size=30)))
def test_any_observed_at_reads_as_parse_time_reads_it_or_is_refused_alike(value: str) -> None:
    try:
        expected = parse_time(value)
    except Invalid as e:
        with pytest.raises(Invalid) as refused:
            _receive_time(value)
        assert str(refused.value) == str(e)
        return
    assert _receive_time(value) == (expected, expected.isoformat())
