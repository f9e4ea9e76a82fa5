"""Fixtures every test gets, whatever its directory."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _root_logging_kept() -> Iterator[None]:
    """Put the root logger's handlers and level back after each test.

    Why: ``watch``, ``record`` and ``fake-apiserver`` (``workers.logs.configure_logging``) point the root logger at
    the stderr of the moment, which under ``CliRunner`` is a stream closed when the run ends; a later test that
    logs (a replay, an Alembic upgrade) then wrote ``--- Logging error ---`` into its own captured output and failed.
    ``tests/workers`` invokes those commands too, so this is kept for every directory, not only ``tests/unit``.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
