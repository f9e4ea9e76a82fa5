"""Fixtures every unit test gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _root_logging_kept() -> Iterator[None]:
    """Put the root logger's handlers and level back after each test.

    Why: ``watch``, ``record`` and ``fake-apiserver`` (``workers.logs.configure_logging``) point the root logger at
    the stderr of the moment, which under ``CliRunner`` is a stream closed when the run ends; a later test that
    logs (a replay in ``tests/integration`` run after these) then wrote ``--- Logging error ---`` into its own
    captured output and failed.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
