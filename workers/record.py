"""``dra-ledger record``: write a cluster's live list/watch streams as a recorded history (the format
:mod:`ledger.recorded` reads: one ``{observedAt, type, object}`` JSON line per list item, event or bookmark).

The same list/watch loop as the ledger worker, with a file as the sink: every list item becomes an
ADDED line (MODIFIED when already seen), every watch event (BOOKMARKs included) one line
``{"observedAt", "type", "object"}``, and a relist after 410 adds a DELETED line, with the last object
seen, for each object that vanished. A line of a stream that is no watch event is written as it came,
so the replay rejects it with the reason the worker gives. Replaying the file therefore gives the
ledger the worker would have written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TextIO

from ledger.recorded import not_an_object
from ledger.types import JSONObject, JSONValue
from workers.k8s.client import KubeSource, Listed, ListPage, MalformedEvent, Received

log = logging.getLogger(__name__)


def _identity(obj: JSONObject) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    uid = meta.get("uid")
    return str(uid) if isinstance(uid, str) and uid else f"{meta.get('namespace') or ''}/{meta.get('name')}"


def _rfc3339(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class RecordSink:
    """Writes watch streams to ``out`` in the recorded format, one JSON object a line, flushed per burst.

    It keeps the last object seen per kind and uid (to write deletions after a relist) and the last
    resourceVersion per kind in memory: a restarted ``record`` lists everything again.
    """

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._seen: dict[str, dict[str, JSONObject]] = {}
        self.resource_versions: dict[str, str] = {}
        """Last resourceVersion written per kind (progress, for tests and logs)."""
        self.lines = 0
        """Lines written so far."""

    def _write(self, at: datetime, event_type: str, obj: JSONValue) -> None:
        self._out.write(json.dumps({"observedAt": _rfc3339(at), "type": event_type, "object": obj},
                                   ensure_ascii=False, separators=(",", ":")) + "\n")
        self.lines += 1

    def reset(self) -> None:
        """Nothing to forget: a recording has a single writer."""

    async def resume_from(self, source: KubeSource) -> str | None:
        """Where this recording's watch of the kind resumes (``None`` at first: list)."""
        return self.resource_versions.get(source.info.kind)

    async def relisted(self, source: KubeSource, pages: AsyncIterator[ListPage]) -> Listed:
        """Write the list as its pages arrive: ADDED (MODIFIED if seen before) per item, then DELETED for
        each object seen before that the whole list lacks (the sink keeps every object it saw anyway).

        Returns:
            The number of distinct objects listed (by uid, else namespace/name) and the list's resourceVersion.

        Raises:
            WatchExpired / TransientApiError / ApiError: from ``pages``; the lines already written stay, and
                so do their objects among those seen: the next list writes DELETED for those it lacks.
        """
        seen = self._seen.setdefault(source.info.kind, {})
        listed: set[str] = set()
        first: tuple[str, datetime] | None = None
        async for page in pages:
            first = first or (page.resource_version, page.received_at)
            for obj in page.items:
                if not isinstance(obj, dict):
                    # Written as listed: replay rejects the line ("object: not a JSON object"), as the ledger's own
                    # worker stores the item as rejected.
                    log.warning("writing a list item that is no object (%s) as listed", not_an_object(obj),
                                extra={"resource": source.info.plural, "resourceVersion": None})
                    self._write(first[1], "ADDED", obj)
                    continue
                key = _identity(obj)
                self._write(first[1], "MODIFIED" if key in seen else "ADDED", obj)
                # Seen as soon as written, as the ledger worker commits each page: kept only until the list
                # ended, an object written ADDED by a list that a 410 cut short never got its DELETED line.
                seen[key] = obj
                listed.add(key)
            self._out.flush()
        if first is None:
            raise RuntimeError(f"relist {source.info.kind}: the list yielded no page")
        version, received_at = first
        for key in sorted(set(seen) - listed):
            self._write(received_at, "DELETED", seen.pop(key))
        self.resource_versions[source.info.kind] = version
        self._out.flush()
        return Listed(count=len(listed), resource_version=version)

    async def observed(self, source: KubeSource, events: Sequence[Received], resource_version: str) -> None:
        """Write each event as received (BOOKMARKs too); a line that is no event, as its text alone."""
        seen = self._seen.setdefault(source.info.kind, {})
        for event in events:
            if isinstance(event, MalformedEvent):
                log.warning("writing a line that is no watch event (%s) as received", event.reason,
                            extra={"resource": source.info.plural, "resourceVersion": None})
                self._out.write(event.text + "\n")
                self.lines += 1
                continue
            self._write(event.received_at, event.type, event.object)
            if event.type in ("ADDED", "MODIFIED"):
                seen[_identity(event.object)] = event.object
            elif event.type == "DELETED":
                seen.pop(_identity(event.object), None)
        self.resource_versions[source.info.kind] = resource_version
        self._out.flush()
