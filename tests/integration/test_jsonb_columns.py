"""The ledger's engine decodes ``json`` / ``jsonb`` column values with ``postgres.decode_jsonb``."""

from __future__ import annotations

import math

import msgspec
import pytest
from sqlalchemy import text

from ledger.store import postgres
from ledger.testing.handle import LedgerHandle


class CountingDecoder:
    """Stands in for the module's msgspec decoder and counts the documents it is given."""

    def __init__(self) -> None:
        self.calls = 0
        self._inner = msgspec.json.Decoder()

    def decode(self, data: bytes) -> object:
        self.calls += 1
        return self._inner.decode(data)


def test_every_jsonb_value_read_goes_through_the_ledgers_decoder(ledger: LedgerHandle,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    counting = CountingDecoder()
    monkeypatch.setattr(postgres, "_JSONB_DECODER", counting)
    with ledger.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT CAST(v AS jsonb) AS b, CAST(v AS json) AS j FROM (VALUES ('{\"a\": [1, 2]}'), ('[true]'), "
            "('\"s\"')) AS t(v)")).all()
    assert [(r.b, r.j) for r in rows] == [({"a": [1, 2]}, {"a": [1, 2]}), ([True], [True]), ("s", "s")]
    assert counting.calls == 6


def test_numbers_jsonb_keeps_exactly_come_back_as_python_did_before(ledger: LedgerHandle) -> None:
    with ledger.engine.connect() as conn:
        big, huge = conn.execute(text(
            "SELECT jsonb_build_object('n', CAST('1180591620717411303425' AS numeric)), "
            "jsonb_build_object('n', CAST('1e400' AS numeric) + 0.5, 'k', 'kept')")).one()
    assert big == {"n": 2**70 + 1}  # not a float: 2**70 + 1 has no float of its own
    assert huge == {"n": math.inf, "k": "kept"}
