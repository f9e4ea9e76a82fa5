"""``dra-ledger serve``: refuses to be open to the network without tokens; the demo serves the API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer

from api.cli import register, serve_api
from ledger import cli
from ledger.errors import LedgerError
from ledger.settings import Settings
from tests.factories import taken_port


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_serving_without_tokens_on_a_non_loopback_address_is_refused(host: str) -> None:
    with pytest.raises(LedgerError, match="no API tokens are configured: refusing to serve"):
        serve_api(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), host=host, port=8472,
                  allow_open=False)


@pytest.fixture()
def registered() -> Iterator[tuple[typer.Typer, int]]:
    """A Typer app with the API's commands registered, and how many demo follow-ups there were before."""
    app = typer.Typer()
    before = len(cli.DEMO_FOLLOWUPS)
    register(app)
    try:
        yield app, before
    finally:
        del cli.DEMO_FOLLOWUPS[before:]


def test_registering_adds_serve_and_makes_the_demo_serve_the_api(registered: tuple[typer.Typer, int]) -> None:
    app, before = registered
    assert [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands] == ["serve"]
    assert len(cli.DEMO_FOLLOWUPS) == before + 1


def test_a_port_another_process_listens_on_is_a_clear_error_before_the_database_is_touched() -> None:
    # The database URL leads nowhere: the port check must come first and name what to do.
    with taken_port() as port, pytest.raises(LedgerError, match=f"cannot listen on 127.0.0.1:{port}: .*pass --port"):
        serve_api(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), host="127.0.0.1", port=port,
                  allow_open=False)


def test_the_demo_serves_on_its_port_option(registered: tuple[typer.Typer, int]) -> None:
    followup = cli.DEMO_FOLLOWUPS[registered[1]]
    # A taken port: serve_api stops at its port check, naming the port it was given.
    with taken_port() as port, pytest.raises(LedgerError, match=f"127.0.0.1:{port}"):
        followup(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), port)


def test_an_empty_cluster_is_refused_before_the_database_is_touched() -> None:
    # An empty name would filter on a cluster called "" and serve nothing; the URL leads nowhere on purpose.
    with pytest.raises(LedgerError, match=r"^--cluster is empty; leave it out to serve every cluster$"):
        serve_api(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), host="127.0.0.1", port=8472,
                  allow_open=False, cluster="")
