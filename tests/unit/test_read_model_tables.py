"""Every read-model table is locked by reads and emptied by a rebuild in one order: ``READ_MODELS``'s."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import Column, Integer, MetaData, Table

from ledger.errors import LedgerError
from ledger.projections import runner
from ledger.projections.models import ALL, Claims, DeviceAllocations, NamespaceTeams
from ledger.store.tables import READ_MODELS


def test_the_read_model_list_holds_every_projection_table_once() -> None:
    listed = [t.name for t in READ_MODELS]
    assert len(listed) == len(set(listed))
    assert set(listed) == {t.name for p in ALL for t in p.tables}


def test_a_rebuild_truncates_in_the_read_model_order_whatever_the_projection_order() -> None:
    assert runner.table_names() == [t.name for t in READ_MODELS]
    # device_allocations comes first among the projections given, last in READ_MODELS.
    assert runner.table_names([DeviceAllocations(), Claims(), NamespaceTeams()]) == [
        "namespace_teams", "claims", "claim_states", "device_allocations"]


def test_a_projection_table_missing_from_the_read_model_list_is_refused() -> None:
    stray = Table("stray_read_model", MetaData(), Column("id", Integer))

    class Stray(NamespaceTeams):
        tables: Sequence[Table] = (stray,)

    with pytest.raises(LedgerError, match=r"missing from ledger.store.tables.READ_MODELS: \['stray_read_model'\]"):
        runner.table_names([NamespaceTeams(), Stray()])
