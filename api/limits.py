"""Limits of one API process, apart from :mod:`api.deps` so that the CLI can name them in ``serve --help``
without importing Litestar (every ``dra-ledger`` command builds that help)."""

from __future__ import annotations

from typing import Final

DEFAULT_REPORT_SLOTS: Final = 2
"""Whole-fleet reports one API process computes at once (:class:`api.deps.ReportSlots`). A process runs its Python
on one core at a time, so more at once finish no sooner and each holds its working set meanwhile. Measured with 24
clients asking ``/v1/pending`` and ``/v1/quotas`` at random instants of the simulated 1,000-node day, one worker
for 90 s, in one hour: unbounded 3.19 answers/s at a peak of 369 MiB RSS; 15 slots 2.62/s, 520 MiB; 2 slots
4.31/s, 229 MiB; 1 slot 4.07/s, 193 MiB. Two rather than one, so that one slow report (a busy instant of a large
fleet) does not hold every other up."""
MAX_REPORT_SLOTS: Final = 15
"""Most report slots ``serve`` takes: the connections of a worker's pool (SQLAlchemy's 5 plus 10 overflow). A report
holds one while it runs, so more slots would only move the wait from the slot to the pool, where it ends in a 503
that blames the connections, and leave none for the other endpoints."""
REPORT_WAIT_S: Final = 30.0
"""Seconds a request waits for a report slot before it is answered 503 with ``Retry-After``."""
REBUILD_WAIT_S: Final = 5.0
"""Seconds a request waits for the read models while a rebuild holds them (``dra-ledger rebuild``, or a first build
of a large history, until it commits) before it is answered 503 with ``Retry-After`` (the same seconds). Short
rebuilds stay invisible: a seed-lab-sized rebuild holds the read models for well under a second, a 57,845-event
one for about 2 s. A long one (a fleet's year: minutes) would otherwise keep every request waiting, each holding
one of the process's 15 pooled connections, until later requests found none and got 503 only after the pool's
30 s timeout."""
