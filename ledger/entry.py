"""The ``dra-ledger`` console script: the CLI imported under a Ctrl-C guard.

Why a module of its own: importing :mod:`ledger.cli` (SQLAlchemy, pydantic, Rich, Typer) takes about a second,
and a Ctrl-C in that second printed a traceback of whatever module was importing. Only the standard library is
imported before the guard.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run ``dra-ledger``: exit code 130 and one line for a Ctrl-C while the CLI loads, as inside a command."""
    try:
        from ledger.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    run()
