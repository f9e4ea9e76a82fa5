"""SIGTERM as Ctrl-C (ledger.interrupts): a signal is never lost, even one that lands in a finalizer."""

from __future__ import annotations

import signal
import subprocess
import sys

from ledger.interrupts import sigterm_calls, sigterm_raises

# A weakref callback (a finalizer the garbage collector may run anywhere) that sends SIGTERM and keeps running, so
# that Python runs the handler inside it, where an exception cannot propagate. The main code then spins for at most
# 60 s; the signal must end it as Terminated.
FINALIZER = """
import os, signal, time, weakref
from ledger.interrupts import Terminated, sigterm_raises

class Thing:
    pass

def callback(_):
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100_000):
        pass

try:
    with sigterm_raises():
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pass
        print("ran to the end; SIGTERM handler:", signal.getsignal(signal.SIGTERM))
except Terminated:
    print("terminated")
print("ignored after the block:", signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
"""


def test_a_sigterm_that_lands_in_a_finalizer_is_raised_after_it_not_lost() -> None:
    # The handler raised Terminated inside the callback: Python printed "Exception ignored in ..." and went on, with
    # SIGTERM left ignored, so the command ran to its end (1 signal in ~250 in a user's trial).
    done = subprocess.run([sys.executable, "-c", FINALIZER], capture_output=True, text=True, timeout=120,
                          check=False)

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == ["terminated", "ignored after the block: True"]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_a_block_no_sigterm_reached_puts_the_handler_before_it_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_raises():
        inside = signal.getsignal(signal.SIGTERM)
    with sigterm_calls(lambda: None) as arrived:
        calling = signal.getsignal(signal.SIGTERM)

    assert inside is not before and calling is not before  # each installed its own
    assert signal.getsignal(signal.SIGTERM) is before
    assert not arrived()


def test_a_second_sigterm_after_the_first_was_taken_is_ignored_to_the_end() -> None:
    # The first SIGTERM, taken in a block inside another (a command's inside the console script's), was said; the
    # inner block armed the outer one's handler again and the outer one put back the default action, so a second
    # signal in the clean-up or the exit ended the process with status -15 in place of 143.
    done = _run("""
import os, signal, sys, time
from ledger.interrupts import Terminated, sigterm_raises

try:
    with sigterm_raises():
        with sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
except Terminated:
    print("terminated")
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print("the second went by")
sys.exit(143)
""")

    assert (done.returncode, done.stderr) == (143, "")
    assert done.stdout.splitlines() == ["terminated", "the second went by"]


def test_sigterm_under_sigterm_calls_cancels_the_main_task_and_wakes_its_loop() -> None:
    # The loop waits in a 600 s sleep: unless the handler wakes it, the cancel is seen only when the sleep ends, and
    # the run outlives the 120 s the test gives it. The signal is sent from another thread while the loop waits.
    done = _run("""
import asyncio, os, signal, threading
from ledger.interrupts import sigterm_calls

async def main():
    task, loop = asyncio.current_task(), asyncio.get_running_loop()

    def cancel():
        task.cancel()
        loop.call_soon_threadsafe(lambda: None)

    with sigterm_calls(cancel) as arrived:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            print("cancelled; arrived:", arrived())

asyncio.run(main())
print("ignored after:", signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
""")

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == ["cancelled; arrived: True", "ignored after: True"]


def test_sigterm_after_the_console_script_answered_leaves_its_exit_code() -> None:
    # The answer written and the exit code chosen, the interpreter tears down for 0.4 to 1 s; a SIGTERM then took the
    # default action (status -15). Here it arrives from an exit handler, which runs in that teardown.
    done = _run("""
import atexit, os, signal, sys, time

def late():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print("teardown went on")

atexit.register(late)
sys.argv = ["dra-ledger", "--version"]
from ledger.entry import main
main()
""")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "teardown went on"
    assert done.stdout.splitlines()[0].startswith("dra-ledger ")


def test_a_second_ctrl_c_as_the_command_exits_leaves_its_exit_code() -> None:
    # The command has chosen its exit code (here the answer to --version, 0; after a first Ctrl-C, 130) when a
    # second Ctrl-C comes: the KeyboardInterrupt it raised reached the top and the process ended by SIGINT (-2).
    done = _run("""
import os, signal, sys, time
import ledger.cli

answer = ledger.cli.main

def main():
    try:
        answer()
    finally:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

ledger.cli.main = main
sys.argv = ["dra-ledger", "--version"]
from ledger.entry import main
main()
""")

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("dra-ledger ")
