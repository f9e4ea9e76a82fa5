"""``dra-ledger serve`` (and the demo's API), registered through the ``dra_ledger.commands`` entry point."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

import typer

from ledger import cli, services
from ledger.config import load_config
from ledger.embedded import require_port
from ledger.errors import LedgerError
from ledger.settings import Settings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = cli.DEMO_PORT
"""The API's default port (8472): unassigned by IANA, so it rarely collides with other local services."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_api(settings: Settings, *, host: str, port: int, allow_open: bool, cluster: str | None = None) -> None:
    """Serve the REST API with uvicorn until interrupted.

    Raises:
        LedgerError: the configuration is invalid, ``cluster`` is empty (``--cluster ""``), or no token is
            configured and ``host`` is not loopback while ``allow_open`` is false.
    """
    import uvicorn

    from api.app import create_app

    if cluster == "":
        raise LedgerError("--cluster is empty; leave it out to serve every cluster")
    config = load_config(settings.config)
    if not config.api.tokens and not _is_loopback(host) and not allow_open:
        raise LedgerError(
            f"no API tokens are configured: refusing to serve on {host}; configure [[api.tokens]] "
            "in the configuration file or pass --allow-unauthenticated"
        )
    require_port(host, port)
    db = services.open_ledger(settings)
    services.catch_up(db)
    app = create_app(db=db, config=config, cluster=cluster)
    typer.echo(f"dra-ledger API on http://{host}:{port}/v1 (OpenAPI at http://{host}:{port}/schema)", err=True)
    uvicorn.run(app, host=host, port=port, log_level="info")


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the CLI and make ``demo`` serve the API after it prints the ledger."""

    @app.command()
    def serve(
        host: Annotated[str, typer.Option(help="Address to bind; loopback unless told otherwise.")] = DEFAULT_HOST,
        port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port (1-65535).")] = DEFAULT_PORT,
        allow_unauthenticated: Annotated[
            bool, typer.Option("--allow-unauthenticated", help="Serve without tokens on a non-loopback address.")
        ] = False,
        config: Annotated[
            Path | None, typer.Option("--config", envvar="LEDGER_CONFIG", help="Configuration file (TOML or YAML).")
        ] = None,
        cluster: Annotated[str | None, typer.Option(help="Answer for this cluster only.")] = None,
        url: cli.UrlOpt = None,
        data_dir: cli.DataDirOpt = None,
    ) -> None:
        """Serve the read-only REST API (/v1, OpenAPI at /schema)."""
        settings = cli.settings_from(url, data_dir)
        if config is not None:
            settings = settings.model_copy(update={"config": config})
        try:
            serve_api(settings, host=host, port=port, allow_open=allow_unauthenticated, cluster=cluster)
        except LedgerError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e

    def serve_demo(settings: Settings, port: int) -> None:
        typer.echo(
            f"Serving the API for the demo ledger; try: curl -s "
            f"'http://{DEFAULT_HOST}:{port}/v1/occupancy?at=2026-11-02T09:30:00Z'  (Ctrl-C stops)",
            err=True,
        )
        serve_api(settings, host=DEFAULT_HOST, port=port, allow_open=False, cluster=cli.DEMO_CLUSTER)

    cli.DEMO_FOLLOWUPS.append(serve_demo)
