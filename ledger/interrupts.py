"""SIGTERM as Ctrl-C: the exception it raises and the handler that raises it.

Why a module of its own, importing only the standard library: the ``dra-ledger`` console script
(:mod:`ledger.entry`) installs the handler before it imports the command line, which takes a second or two
(SQLAlchemy, pydantic, Rich, Typer); a SIGTERM then ended the process without a word. The commands use the same
exception (``ledger.cli_typer.LedgerCommand``, ``ledger.cli.interrupt_said``).
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sys import UnraisableHookArgs

SIGTERM_EXIT = 128 + signal.SIGTERM
"""Exit code of a command ended by SIGTERM (143), as a shell reports a process the signal killed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while :func:`sigterm_raises` was in force.

    A ``KeyboardInterrupt``, so that every clean-up written for Ctrl-C runs for it too: ``except Exception`` does not
    swallow it, ``finally`` and ``except BaseException`` clean-ups (a temporary file's removal) run on the way out,
    and psycopg cancels the statement running on the server before the transaction rolls back. Handlers that say
    which signal it was catch it before ``KeyboardInterrupt``.
    """


def stopped_by(interrupt: KeyboardInterrupt) -> tuple[str, int]:
    """The word a command stopped by ``interrupt`` says and its exit code: ``("terminated (SIGTERM)", 143)`` for
    :class:`Terminated`, else ``("interrupted", 130)`` (Ctrl-C), as a shell reports a process each signal killed."""
    return ("terminated (SIGTERM)", SIGTERM_EXIT) if isinstance(interrupt, Terminated) else ("interrupted", 130)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread instead of ending the process.

    The default action ends the process at once and runs no clean-up. The first SIGTERM raises; later
    ones until the block is left are ignored, so that a second signal cannot cut a clean-up short (SIGKILL
    still ends it). The previous handler is restored on the way out. Outside the main thread, where Python
    cannot install handlers, the block runs with SIGTERM as it was.

    Python runs a signal handler wherever the main thread is, a finalizer too (a ``__del__``, a weakref callback
    that the garbage collector calls), and an exception raised there cannot propagate: Python reports it as
    "Exception ignored in ..." and goes on. A :class:`Terminated` lost so is caught by ``sys.unraisablehook``
    (replaced for the block, the previous hook kept for anything else), which installs the handler again and has
    another thread send SIGTERM once more, so that it is raised after the finalizer, without the report. Without
    that, one signal in a few hundred left SIGTERM ignored and the command ran on to its end.

    Raises:
        Terminated: from the block, once SIGTERM arrived.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up on the way out is not interrupted
        raise Terminated

    hook = sys.unraisablehook

    def lost_in_a_finalizer(unraisable: UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, Terminated):
            signal.signal(signal.SIGTERM, terminate)
            # Sent from another thread: raised here, in the hook, it would be lost the same way. The main thread
            # takes it at its first check after the finalizer has returned (within the interpreter's switch interval).
            # (_thread: threading.Thread.start waits for the thread to run, and the signal would land in that wait.)
            _thread.start_new_thread(os.kill, (os.getpid(), signal.SIGTERM))
            return
        hook(unraisable)

    previous = signal.signal(signal.SIGTERM, terminate)
    sys.unraisablehook = lost_in_a_finalizer
    try:
        yield
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGTERM, previous)
