"""Which price a device-hour is billed at (``ledger.projections.queries.PriceTable``, the README's ``[[prices]]``)."""

from __future__ import annotations

from ledger.projections.queries import PriceTable

TABLE = PriceTable(by_class={"gpu.example.com": 2.5}, by_model={"A100": 1.0, "H100": 4.0})


def test_a_model_price_wins_over_the_price_of_the_device_class() -> None:
    assert TABLE.price("gpu.example.com", "A100") == 1.0
    assert TABLE.price("gpu.example.com", "H100") == 4.0


def test_a_class_price_covers_the_models_without_a_price_of_their_own() -> None:
    assert TABLE.price("gpu.example.com", "L4") == 2.5
    assert TABLE.price("gpu.example.com", "") == 2.5  # a device whose attributes name no model


def test_a_device_whose_class_and_model_are_both_unpriced_has_no_price() -> None:
    assert TABLE.price("nic.example.com", "L4") is None
    assert TABLE.price("nic.example.com", "A100") == 1.0  # the model is priced, whatever the class
