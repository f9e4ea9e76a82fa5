"""The app freezes the objects its startup leaves alive (``api.app.freeze_startup_objects``) and thaws them at
shutdown, so that full garbage collections during a large answer do not rescan them."""

from __future__ import annotations

import gc

from litestar.testing import TestClient

from api.app import create_app
from ledger.config import DEFAULT
from ledger.testing.handle import LedgerHandle


def test_objects_alive_at_startup_are_frozen_until_shutdown(seeded: LedgerHandle) -> None:
    assert gc.get_freeze_count() == 0
    with TestClient(create_app(db=seeded.db, config=DEFAULT)) as client:
        assert gc.get_freeze_count() > 10_000  # the modules, the app and its routes at least
        assert client.get("/v1/pending").status_code == 200
    assert gc.get_freeze_count() == 0
