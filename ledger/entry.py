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

    Once the command has ended, its answer written and its exit code chosen, SIGTERM and Ctrl-C are ignored: what
    is left is the interpreter's teardown (0.4 to 1 s: finalizers, connections closed), where SIGTERM's default
    action ended the process with status -15 in place of that exit code. A Ctrl-C that reaches here came after the
    command said how it stopped, or answered (a second one, while the command's exit was on its way out): the exit
    code the command chose stands, with no second line, where the process ended by SIGINT (status -2).
    """
    from ledger.interrupts import error_chain, interrupt_behind, sigterm_raises, stopped_by

    try:
        with sigterm_raises():
            try:
                from ledger.cli import main as run
            except BaseException as e:  # Ctrl-C, or SIGTERM's Terminated, bare or wrapped (interrupt_behind)
                interrupt = interrupt_behind(e)
                if interrupt is None:
                    raise
                word, code = stopped_by(interrupt)
                sys.stderr.write(f"{word}\n")
                raise SystemExit(code) from None
            run()
    except KeyboardInterrupt as e:
        # Raised while the command's SystemExit was on its way out: the exit code it chose stands.
        chosen = next((link for link in error_chain(e) if isinstance(link, SystemExit)), None)
        raise SystemExit(chosen.code if chosen is not None else stopped_by(e)[1]) from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
