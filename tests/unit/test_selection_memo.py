"""``selectors.selects`` keeps its answers per device content and expressions, and never mixes two devices up."""

from __future__ import annotations

import pytest

from ledger.projections import selectors
from ledger.projections.selectors import DeviceView, content_digest, selects

MODEL_IS_A100 = "device.attributes['gpu.example.com'].model == 'A100'"


def gpu(model: str, *, index: int = 0) -> DeviceView:
    return DeviceView(driver="gpu.example.com", attributes={"model": {"string": model}, "index": {"int": index}},
                      capacity={"memory": {"value": "80Gi"}})


@pytest.fixture(autouse=True)
def _empty_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selectors, "_selections", {})
    monkeypatch.setattr(selectors, "_kept", 0)


def test_devices_that_differ_in_one_attribute_get_their_own_answers() -> None:
    assert selects([MODEL_IS_A100], gpu("A100")) is True
    assert selects([MODEL_IS_A100], gpu("H100")) is False
    assert selects([MODEL_IS_A100], gpu("A100")) is True
    assert content_digest(gpu("A100")) != content_digest(gpu("A100", index=1))
    assert content_digest(gpu("A100")) != content_digest(
        DeviceView(driver="gpu.example.com", attributes={"model": {"string": "A100"}, "index": {"int": 0}},
                   capacity={"memory": {"value": "80Gi"}}, allow_multiple_allocations=True))


@pytest.mark.parametrize(("one", "other"), [(float("inf"), float("-inf")), (float("inf"), float("nan")), (1, 1.0)])
def test_devices_differing_in_a_value_json_would_write_alike_get_their_own_answers(one: float, other: float) -> None:
    # JSON writes inf, -inf and nan all as null; the digest must still tell such devices apart.
    first = DeviceView(driver="d.example.com", attributes={"x": {"int": one}})
    second = DeviceView(driver="d.example.com", attributes={"x": {"int": other}})
    assert content_digest(first) != content_digest(second)
    expression = "device.attributes['d.example.com'].x > 0.0"
    assert selects([expression], DeviceView(driver="d.example.com", attributes={"x": {"int": float("inf")}})) is True
    assert selects([expression], DeviceView(driver="d.example.com", attributes={"x": {"int": float("-inf")}})) is False


def test_an_equal_device_is_answered_from_the_memo_without_evaluating_cel(monkeypatch: pytest.MonkeyPatch) -> None:
    assert selects([MODEL_IS_A100], gpu("A100")) is True

    def no_context(device: DeviceView) -> object:
        raise AssertionError("the memo should have answered")

    monkeypatch.setattr(selectors, "_context", no_context)
    assert selects([MODEL_IS_A100], gpu("A100")) is True  # another object, the same content
    with pytest.raises(AssertionError, match="memo"):
        selects([MODEL_IS_A100, "true"], gpu("A100"))  # other expressions: not kept yet


def test_the_memo_forgets_everything_once_it_holds_its_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selectors, "SELECTIONS_MAX", 3)
    for index in range(3):
        selects([MODEL_IS_A100], gpu("A100", index=index))
    assert selectors._kept == 3
    assert selects([MODEL_IS_A100], gpu("H100", index=9)) is False
    assert selectors._kept == 1
    assert selectors._selections == {(MODEL_IS_A100,): {content_digest(gpu("H100", index=9)): False}}
