"""dra-ledger: an event-sourced allocation ledger for Kubernetes DRA (``resource.k8s.io``).

The domain lives here: the translator (watch events to domain events), the event store, the
projections (read models) and the use cases in :mod:`ledger.services`.
"""

DISTRIBUTION = "dra-ledger"
"""Distribution name (``[project].name`` in pyproject.toml) whose metadata gives :func:`version`."""


def version() -> str:
    """The installed release of dra-ledger, e.g. ``"0.2.0"`` (``[project].version`` of pyproject.toml, read
    from the package metadata).

    Raises:
        importlib.metadata.PackageNotFoundError: the package is not installed (run from a bare source tree).
    """
    import importlib.metadata  # here, not at the top: ``dra-ledger`` imports this package before its Ctrl-C guard

    return importlib.metadata.version(DISTRIBUTION)
