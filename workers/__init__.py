"""Watch workers (kubernetes-asyncio) and scheduled jobs (APScheduler).

Not built yet: live watches will hand watch events to ``ledger.services.ingest``, the same path a
recorded-file replay takes today.
"""
