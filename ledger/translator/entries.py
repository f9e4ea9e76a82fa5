"""The translator's entries held as compact JSON bytes, decoded only when a line reads one.

Why: a watch worker keeps one entry per live claim, pod, pool and ResourceSlice of its cluster for as
long as it runs. As decoded dicts and lists an entry costs five to six times its JSON text (a claim
with its allocation results: ~3 KiB of objects for ~540 bytes of text; a pool of GPUs and their MIG
partitions: ~17 KiB for ~5 KiB), so the 145,182 entries of a 61,000-device fleet with 74,558 live
claims took 619 MiB of RSS. Held as the bytes they are stored as, the same entries take about their
text (88 MiB), and a line pays for decoding only the one or two entries it touches.

A pool's ``published`` device views are, once a translation ends, exactly the device views of its
counting slices (:func:`counting_slices`, :func:`published_devices`), so its packed form leaves them
out and a read rebuilds them: they were half of a pool's text. What remains of a pool is compressed
(:data:`POOL_COMPRESSION`): its device views repeat the same names. The packed form is private to this
process: what ``translator_state`` stores is unchanged (:meth:`StateEntries.load_json` takes that form in,
``entries[key]`` gives it back).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence

import msgspec

from ledger.translator.normalize import copy_json
from ledger.types import JSONObject, JSONValue

POOL_PREFIX = "pool:"
"""State key prefix of a pool entry (``pool:<driver>/<pool>``): packed without its derived part, compressed."""

POOL_COMPRESSION = 1
"""zlib level of a packed pool entry.

Why pools only: a pool's device views repeat the same attribute, capacity and counter names for every
device, so level 1 shrank the pools of the 10 M-event ledger 6x (24.9 -> 4.1 MiB; level 6 gave 3.9),
for ~20 us to pack and ~13 us to read the largest (18 KB), on slice events only. Claims, read on
most lines, shrank only 1.45x."""

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def as_int(value: JSONValue) -> int:
    """Return ``value`` when it is an integer (not a bool), else 0 (a position or generation not yet set)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def counting_slices(slices: Mapping[str, JSONValue]) -> tuple[int | None, list[JSONObject]]:
    """Return the pool generation that counts and the views of its slices, sorted by slice name.

    DESIGN §11.4: the generation that counts is the highest among the slices that exist *now*, so a
    driver restarting its generations from 1 is followed once the old slices are gone.

    Args:
        slices: a pool entry's ``slices`` (slice uid -> view with ``name``, ``generation``, ...).

    Returns:
        ``(None, [])`` for a pool without slices; otherwise the generation and its views (ties in name
        keep the order of ``slices``).

    Raises:
        KeyError: a view lacks ``generation`` or ``name`` (the translator writes both).
    """
    views = [v for v in slices.values() if isinstance(v, dict)]
    generation = max((as_int(v["generation"]) for v in views), default=None)
    current = [v for v in views if as_int(v["generation"]) == generation]
    return generation, sorted(current, key=lambda v: str(v["name"]))


def published_devices(current: Sequence[JSONObject]) -> JSONObject:
    """Return device name -> view over the counting slices, a later slice (by name) winning a repeated name.

    Args:
        current: the views from :func:`counting_slices`, in its order.

    Raises:
        KeyError: a view lacks ``devices``.
        TypeError: a view's ``devices`` is not a mapping.
    """
    wanted: JSONObject = {}
    for view in current:
        devices = view["devices"]
        if not isinstance(devices, dict):
            raise TypeError(f"devices of slice {view.get('name')!r} is {type(devices).__name__}, not a mapping")
        wanted.update(devices)
    return wanted


class StateEntries(MutableMapping[str, JSONObject]):
    """Translator state entries by state key, each packed as compact JSON bytes.

    Reading an entry decodes a new object every time, so a caller owns what it gets and may edit it
    without changing the entry; writing one encodes it at once. An entry the encoder refuses (a string
    with a lone surrogate, which ``jsonb`` refuses as well) is kept as a private copy instead.
    Encoding is the one the store uses (msgspec), so an entry read back is the value a restarted worker
    would load: a NaN would come back as ``None`` in both, and the readers reject NaN before it gets here.
    """

    __slots__ = ("_items",)

    def __init__(self, entries: Mapping[str, JSONObject] | None = None) -> None:
        self._items: dict[str, bytes | JSONObject] = {}
        if entries:
            self.update(entries)

    def __getitem__(self, key: str) -> JSONObject:
        return _unpack(key, self._items[key])

    def get(self, key: str, default: JSONObject | None = None) -> JSONObject | None:  # type: ignore[override]
        # Mapping.get is typed with overloads for any default type; callers here pass none or an entry.
        item = self._items.get(key)
        return default if item is None else _unpack(key, item)

    def __setitem__(self, key: str, value: JSONObject) -> None:
        self._items[key] = _pack(key, value)

    def __delitem__(self, key: str) -> None:
        del self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def replace(self, written: Mapping[str, JSONObject], *, removed: Iterable[str] = ()) -> None:
        """Store every entry of ``written`` and forget the keys in ``removed`` (absent ones are skipped).

        All or nothing: every entry is packed before any is stored.

        Raises:
            RecursionError: an entry is nested too deeply to encode; nothing changed.
        """
        packed = {key: _pack(key, value) for key, value in written.items()}
        for key in removed:
            self._items.pop(key, None)
        self._items.update(packed)

    def load_json(self, key: str, text: str) -> None:
        """Store the entry ``key`` given as JSON text in its stored form (a ``translator_state.state``).

        Other entries than pools are kept as that text without its whitespace, never built as objects.

        Raises:
            msgspec.DecodeError: ``text`` is not JSON.
        """
        if key.startswith(POOL_PREFIX):
            value = _DECODER.decode(text)
            if not isinstance(value, dict):
                raise msgspec.DecodeError(f"the entry of {key} is not a JSON object")
            self[key] = value
        else:
            self._items[key] = msgspec.json.format(text.encode(), indent=-1)

    def packed_json(self, key: str) -> str | None:
        """Return the entry ``key`` as the JSON text it is stored as, when it is held as exactly that text.

        ``None`` for a pool (packed compressed, without its ``published`` views) or an entry kept as objects: encode
        ``self[key]`` then. Saves a decode and an encode per entry written back to ``translator_state``.

        Raises:
            KeyError: no entry ``key``.
        """
        item = self._items[key]
        return item.decode() if isinstance(item, bytes) and not key.startswith(POOL_PREFIX) else None


def _pack(key: str, value: JSONObject) -> bytes | JSONObject:
    if not key.startswith(POOL_PREFIX):
        try:
            return _ENCODER.encode(value)
        except (TypeError, UnicodeEncodeError, OverflowError):
            return copy_json(value)
    derived = _derivable(value)
    packed = {k: v for k, v in value.items() if k != "published"} if derived else value
    try:
        return (_DERIVED if derived else _AS_WRITTEN) + zlib.compress(_ENCODER.encode(packed), POOL_COMPRESSION)
    except (TypeError, UnicodeEncodeError, OverflowError):
        return copy_json(value)


def _unpack(key: str, item: bytes | JSONObject) -> JSONObject:
    if not isinstance(item, bytes):
        return copy_json(item)
    if not key.startswith(POOL_PREFIX):
        decoded: JSONObject = _DECODER.decode(item)
        return decoded
    value: JSONObject = _DECODER.decode(zlib.decompress(item[1:]))
    if item[:1] == _DERIVED:
        slices = value.get("slices")
        assert isinstance(slices, dict)  # _derivable checked it before leaving the views out
        value["published"] = published_devices(counting_slices(slices)[1])
    return value


_DERIVED = b"d"
"""First byte of a packed pool whose ``published`` views were left out (a read rebuilds them)."""
_AS_WRITTEN = b"w"
"""First byte of a packed pool kept whole, e.g. a row whose ``published`` differs or is missing."""


def _derivable(pool: JSONObject) -> bool:
    """True when a pool entry's ``published`` views are those :func:`published_devices` rebuilds."""
    published, slices = pool.get("published"), pool.get("slices")
    if not isinstance(published, dict) or not isinstance(slices, dict):
        return False
    try:
        return published == published_devices(counting_slices(slices)[1])
    except (KeyError, TypeError):
        return False
