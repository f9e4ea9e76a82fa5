"""``dra-ledger serve``: refuses to be open to the network without tokens; the demo serves the API."""

from __future__ import annotations

import pytest
import typer

from api.cli import register, serve_api
from ledger import cli
from ledger.errors import LedgerError
from ledger.settings import Settings


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_serving_without_tokens_on_a_non_loopback_address_is_refused(host: str) -> None:
    with pytest.raises(LedgerError, match="no API tokens are configured: refusing to serve"):
        serve_api(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), host=host, port=8472,
                  allow_open=False)


def test_registering_adds_serve_and_makes_the_demo_serve_the_api() -> None:
    app = typer.Typer()
    before = len(cli.DEMO_FOLLOWUPS)
    register(app)
    try:
        assert [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands] == ["serve"]
        assert len(cli.DEMO_FOLLOWUPS) == before + 1
    finally:
        del cli.DEMO_FOLLOWUPS[before:]
