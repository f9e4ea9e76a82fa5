"""Log lines that carry the watch context: ``resource`` and ``resourceVersion`` (STYLE: logs carry them)."""

from __future__ import annotations

import logging

_CONTEXT = ("resource", "resourceVersion", "apiVersion", "items", "stream", "position")


class ContextFormatter(logging.Formatter):
    """Appends ``key=value`` for each context attribute a record carries (passed as ``extra=``)."""

    def format(self, record: logging.LogRecord) -> str:
        """Format as usual, then the context attributes present on the record."""
        text = super().format(record)
        pairs = [f"{k}={getattr(record, k)}" for k in _CONTEXT if getattr(record, k, None) is not None]
        return f"{text} {' '.join(pairs)}" if pairs else text


QUIET_LOGGERS = ("alembic",)
"""Loggers kept to warnings: Alembic says "Context impl PostgresqlImpl." and "Will assume transactional DDL." each
time a worker reads the schema's revision, two lines that opened every start and every error message."""


def configure_logging(level: int = logging.INFO) -> None:
    """Log to stderr as ``time level logger: message key=value...``; :data:`QUIET_LOGGERS` only from warnings on."""
    handler = logging.StreamHandler()
    handler.setFormatter(ContextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
