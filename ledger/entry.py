"""The ``dra-ledger`` console script: the CLI imported under a Ctrl-C and SIGTERM guard.

Why a module of its own: importing :mod:`ledger.cli` (SQLAlchemy, pydantic, Rich, Typer) takes about a second,
and a Ctrl-C in that second printed a traceback of whatever module was importing, while a SIGTERM (a pod stopped, a
CronJob's deadline) ended the process without a word. Only the standard library is imported before the guard.
"""

from __future__ import annotations

import signal
import sys


def main() -> None:
    """Run ``dra-ledger``: exit code 130 and one line for a Ctrl-C while the CLI loads, as inside a command.

    SIGTERM raises :class:`~ledger.interrupts.Terminated` for the whole run (:func:`~ledger.interrupts.sigterm_raises`):
    while the CLI loads it ends with ``terminated (SIGTERM)`` and exit code 143, and in a command it takes Ctrl-C's
    way out (the command's clean-up runs, and it says what was kept). The servers (``serve``, ``watch``, ``jobs``)
    install their own SIGTERM handling for a graceful stop.

    Once the command has ended, its answer written and its exit code chosen, SIGTERM is ignored: what is left is
    the interpreter's teardown (0.4 to 1 s: finalizers, connections closed), where the default action ended the
    process with status -15 in place of that exit code.
    """
    from ledger.interrupts import sigterm_raises, stopped_by

    try:
        with sigterm_raises():
            try:
                from ledger.cli import main as run
            except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's Terminated
                word, code = stopped_by(e)
                sys.stderr.write(f"{word}\n")
                raise SystemExit(code) from None
            run()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
