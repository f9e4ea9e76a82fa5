"""Limits of one API process, apart from :mod:`api.deps` so that the CLI can name them in ``serve --help``
without importing Litestar (every ``dra-ledger`` command builds that help)."""

from __future__ import annotations

from typing import Final

DEFAULT_REPORT_SLOTS: Final = 2
"""Whole-fleet reports one API process computes at once (:class:`api.deps.ReportSlots`). A process runs its Python
on one core at a time, so more at once finish no sooner and each holds its working set meanwhile. Measured with 24
clients asking ``/v1/pending`` and ``/v1/quotas`` at random instants of the simulated 1,000-node day, one worker
for 90 s: unbounded 2.07 answers/s at a peak of 369 MiB RSS; 4 slots 2.76/s, 309 MiB; 2 slots 2.90/s, 250 MiB;
1 slot 3.22/s, 219 MiB. Two rather than one, so that one long report (a wide window of MIG pools) does not hold
every other up."""
MAX_REPORT_SLOTS: Final = 64
"""Most report slots ``serve`` takes: a larger number is a typo, not a tuning (each slot may hold a report's
working set, tens of MB at 12,000 devices, and one of the process's 15 pooled database connections)."""
REPORT_WAIT_S: Final = 30.0
"""Seconds a request waits for a report slot before it is answered 503 with ``Retry-After``."""
