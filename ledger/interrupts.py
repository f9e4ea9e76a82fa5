"""SIGTERM as Ctrl-C: the exception it raises and the handler that raises it.

Why a module of its own, importing only the standard library: the ``dra-ledger`` console script
(:mod:`ledger.entry`) installs the handler before it imports the command line, which takes a second or two
(SQLAlchemy, pydantic, Rich, Typer); a SIGTERM then ended the process without a word. The commands use the same
exception (``ledger.cli_typer.LedgerCommand``, ``ledger.cli.interrupt_said``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGTERM_EXIT = 128 + signal.SIGTERM
"""Exit code of a command ended by SIGTERM (143), as a shell reports a process the signal killed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while :func:`sigterm_raises` was in force.

    A ``KeyboardInterrupt``, so that every clean-up written for Ctrl-C runs for it too: ``except Exception`` does not
    swallow it, ``finally`` and ``except BaseException`` clean-ups (a temporary file's removal) run on the way out,
    and psycopg cancels the statement running on the server before the transaction rolls back. Handlers that say
    which signal it was catch it before ``KeyboardInterrupt``.
    """


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread instead of ending the process.

    The default action ends the process at once and runs no clean-up. The first SIGTERM raises; later
    ones until the block is left are ignored, so that a second signal cannot cut a clean-up short (SIGKILL
    still ends it). The previous handler is restored on the way out. Outside the main thread, where Python
    cannot install handlers, the block runs with SIGTERM as it was.

    Raises:
        Terminated: from the block, once SIGTERM arrived.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up on the way out is not interrupted
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
