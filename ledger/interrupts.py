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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from signal import _HANDLER
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


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what caused it (``__cause__``, else ``__context__``), and so on; each once (a chain can loop)."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        yield link
        seen.add(id(link))
        link = link.__cause__ or link.__context__


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The ``KeyboardInterrupt`` (Ctrl-C, or :class:`Terminated` for SIGTERM) that is ``error`` or in its chain
    (:func:`error_chain`), or ``None``.

    Why: an interrupt often surfaces as another error. Ctrl-C that stops psycopg mid-result can leave the
    connection unable to roll back, and the rollback's error carries the interrupt only as its context; Python 3.11
    wraps one raised while a class is made (in a ``__set_name__``, during an import) in a ``RuntimeError``.
    """
    return next((link for link in error_chain(error) if isinstance(link, KeyboardInterrupt)), None)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread instead of ending the process.

    The default action ends the process at once and runs no clean-up. The first SIGTERM raises; later
    ones are ignored, so that a second signal cannot cut a clean-up short (SIGKILL still ends it). The previous
    handler is restored on the way out, unless a SIGTERM was taken in the block or in one inside it (SIGTERM is
    ignored then, :func:`_leave`): the process is on its way out, and a second signal in its last clean-up or its
    exit ended it with the default action, status -15 in place of the exit code the first one chose. Outside the
    main thread, where Python cannot install handlers, the block runs with SIGTERM as it was.

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

    def terminate() -> None:
        raise Terminated

    hook = sys.unraisablehook
    with sigterm_calls(terminate):  # the once-then-ignored handler and its restore, shared with sigterm_calls
        handler = signal.getsignal(signal.SIGTERM)

        def lost_in_a_finalizer(unraisable: UnraisableHookArgs) -> None:
            if isinstance(unraisable.exc_value, Terminated):
                signal.signal(signal.SIGTERM, handler)
                # Sent from another thread: raised here, in the hook, it would be lost the same way. The main thread
                # takes it at its first check after the finalizer has returned (within the interpreter's switch
                # interval). (_thread: threading.Thread.start waits for the thread to run, and the signal would land
                # in that wait.)
                _thread.start_new_thread(os.kill, (os.getpid(), signal.SIGTERM))
                return
            hook(unraisable)

        sys.unraisablehook = lost_in_a_finalizer
        try:
            yield
        finally:
            sys.unraisablehook = hook


def _leave(previous: _HANDLER) -> None:
    """Put back the SIGTERM handler ``previous`` on leaving a block that installed its own, unless SIGTERM is ignored
    now: a handler of this module took a signal (it ignores later ones, so that the command's clean-up and its
    "terminated" line are not cut short), and the command is ending; armed again, a second SIGTERM in the last
    clean-up raised once more or, once the console script was done, ended the process with status -15."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigterm_calls(act: Callable[[], None]) -> Iterator[Callable[[], bool]]:
    """While the block runs, the first SIGTERM calls ``act`` (later ones are ignored, and stay ignored after the block:
    :func:`_leave`); the block gets a function that says whether SIGTERM arrived. :func:`sigterm_raises` is this
    with an ``act`` that raises :class:`Terminated`.

    For an event loop's main task: ``act`` cancels it, as ``asyncio.run`` does for Ctrl-C, so that the task stops
    at its next ``await`` and what it awaited on a thread (a chunk committing) finishes first; a
    :class:`Terminated` raised inside the loop would end it mid-step. ``act`` runs in the main thread between two
    bytecodes, wherever it is, and must only schedule work: ``task.cancel()`` and
    ``loop.call_soon_threadsafe(...)`` to wake the loop from its wait. (``loop.add_signal_handler`` would do the
    same, but closing the loop sets SIGTERM back to the default action, not to the handler before it.) Outside the
    main thread, the block runs with SIGTERM as it was.
    """
    arrived = False

    def taken() -> bool:
        return arrived

    if threading.current_thread() is not threading.main_thread():
        yield taken
        return

    def call(signum: int, frame: FrameType | None) -> None:
        nonlocal arrived
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up on the way out is not interrupted
        arrived = True
        act()

    previous = signal.signal(signal.SIGTERM, call)
    try:
        yield taken
    finally:
        _leave(previous)
