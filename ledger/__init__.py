"""dra-ledger: an event-sourced allocation ledger for Kubernetes DRA (``resource.k8s.io``).

The domain lives here: the translator (watch events to domain events), the event store, the
projections (read models) and the use cases in :mod:`ledger.services`.
"""
