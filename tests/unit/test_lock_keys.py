"""Every advisory lock of the ledger has its own key: two locks sharing one would serialise unrelated work (or,
taken in opposite orders with another lock, deadlock)."""

from __future__ import annotations

from ledger.store import locks
from ledger.store.postgres import APPEND_LOCK_KEY
from ledger.store.schema import MIGRATION_LOCK_KEY


def test_every_advisory_lock_key_is_its_own_and_fits_a_bigint() -> None:
    keys = [MIGRATION_LOCK_KEY, APPEND_LOCK_KEY, locks.ROLLUP_LOCK_KEY, locks.SNAPSHOT_LOCK_KEY]
    assert len(set(keys)) == len(keys)
    assert all(0 < k < 2**63 for k in keys)  # pg_advisory_xact_lock(bigint)
    assert [k >> 16 for k in keys] == [0x4C4544474552] * len(keys)  # "LEDGER" + a number, as the docstrings say
