"""One trace cache entry on disk: a trace's columns in one file, written batch by batch.

Layout: a magic line, the header length (4 bytes, little-endian), a JSON header (the entry's
key, the row count, and each array's name, dtype and length), the arrays one after the other
(each padded to 8 bytes), and a trailer: the CRC-32 of everything before it and ``b"done"``.
A reader checks the magic, the key, the exact file size and the CRC before it uses one value,
so a truncated, corrupt or foreign file is refused (:class:`BadEntry`), never half read. Row
``i``'s block ids are counted in ``lengths`` (offsets are their running sum), and ``hashes``
is 32-bit when every id fits, halving what is written and read for most traces.

An entry reads two ways: as columns (:func:`read`, numpy arrays over the file's bytes) for
whoever wants a table, and as plain records (:func:`read_records`, Python lists cast from
the same bytes) for a replay loop, which then never imports numpy.
"""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from .columns import Record, TraceColumns

MAGIC = b"kvsim trace columns\n"
TRAILER = b"done"


class BadEntry(ValueError):
    """The file is not a sound entry for the key asked for."""


def _lengths(c: TraceColumns) -> np.ndarray:
    import numpy as np

    return np.diff(c.offsets)


#: stored array -> (dtypes it may have, how to get it from a batch)
_ARRAYS: dict[str, tuple[tuple[str, ...], Callable[[TraceColumns], np.ndarray]]] = {
    "arrival_s": (("<f8",), lambda c: c.arrival_s),
    "prompt_tokens": (("<i8",), lambda c: c.prompt_tokens),
    "output_tokens": (("<i8",), lambda c: c.output_tokens),
    "lengths": (("<i8",), _lengths),
    "hashes": (("<i4", "<i8"), lambda c: c.hashes),
    "session_id": (("<i8",), lambda c: c.session_id),
    "has_session": (("|b1",), lambda c: c.has_session),
}

#: stored dtype -> (bytes per value, :mod:`struct` format of a little-endian machine)
_PLAIN = {"<f8": (8, "d"), "<i8": (8, "q"), "<i4": (4, "i"), "|b1": (1, "?")}


def _pad(n: int) -> int:
    return -n % 8


def _hash_dtype(parts: Sequence[TraceColumns]) -> str:
    """``<i4`` when every id fits 32 bits, else ``<i8``."""
    filled = [p.hashes for p in parts if len(p.hashes)]
    if not filled:
        return "<i4"
    lo = min(int(h.min()) for h in filled)
    hi = max(int(h.max()) for h in filled)
    return "<i4" if lo >= -(2**31) and hi < 2**31 else "<i8"


def write(f: IO[bytes], key: dict[str, Any], parts: Sequence[TraceColumns]) -> None:
    """Write ``parts`` (consecutive batches of one trace, 64-bit columns) as one entry."""
    rows = sum(len(p) for p in parts)
    dtypes = {name: kinds[0] for name, (kinds, _) in _ARRAYS.items()}
    dtypes["hashes"] = _hash_dtype(parts)
    counts = {name: rows for name in _ARRAYS}
    counts["hashes"] = sum(len(p.hashes) for p in parts)
    header = json.dumps(
        {
            "key": key,
            "rows": rows,
            "arrays": [[name, dtypes[name], counts[name]] for name in _ARRAYS],
        },
        sort_keys=True,
    ).encode()
    crc = 0

    def put(data: Any) -> None:
        nonlocal crc
        f.write(data)
        crc = zlib.crc32(data, crc)

    put(MAGIC + len(header).to_bytes(4, "little") + header)
    put(b"\0" * _pad(len(MAGIC) + 4 + len(header)))
    import numpy as np

    for name, (_, get) in _ARRAYS.items():
        nbytes = 0
        for part in parts:
            array = np.ascontiguousarray(get(part), dtype=dtypes[name])
            put(array)
            nbytes += array.nbytes
        put(b"\0" * _pad(nbytes))
    f.write(crc.to_bytes(4, "little") + TRAILER)


#: where each stored array lies in an entry: (name, dtype, count, byte offset)
Layout = list[tuple[str, str, int, int]]


#: the most header bytes an entry may declare (a real header is a few hundred)
_MAX_HEADER = 1 << 16


def _open(path: str, key: dict[str, Any]) -> tuple[bytes, Layout, int]:
    """The entry's bytes, where its arrays lie and its row count, once the magic, key,
    size and CRC are checked; FileNotFoundError when there is none, BadEntry when the
    file is anything but a sound entry for that key.

    Nothing is read whole before it is known to be an entry of the right size: the file
    must be a regular file (opened without blocking, so a FIFO or a device put in its
    place is refused at once), and its header must say a size equal to the file's."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BadEntry("not a regular file")
        head = f.read(len(MAGIC) + 4)
        if not head.startswith(MAGIC) or len(head) < len(MAGIC) + 4:
            raise BadEntry("not an entry")
        start = len(MAGIC) + 4
        size = int.from_bytes(head[len(MAGIC) : start], "little")
        if size > _MAX_HEADER or start + size > st.st_size:
            raise BadEntry("bad header size")
        header_bytes = f.read(size)
        try:
            header = json.loads(header_bytes)
            if header["key"] != key:
                raise BadEntry("an entry for another key")
            specs = [(str(n), str(d), int(c)) for n, d, c in header["arrays"]]
            rows = int(header["rows"])
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise BadEntry(f"bad header ({e})") from None
        if [n for n, _, _ in specs] != list(_ARRAYS) or any(
            d not in _ARRAYS[n][0] for n, d, _ in specs
        ):
            raise BadEntry("unexpected arrays")
        if any(c < 0 for _, _, c in specs):
            raise BadEntry("bad array length")
        at = start + size + _pad(start + size)
        layout: Layout = []
        for name, dtype, count in specs:
            nbytes = count * _PLAIN[dtype][0]
            layout.append((name, dtype, count, at))
            at += nbytes + _pad(nbytes)
        if st.st_size != at + 4 + len(TRAILER):
            raise BadEntry("wrong size")
        raw = head + header_bytes + f.read()
    if len(raw) != at + 4 + len(TRAILER) or raw[at + 4 :] != TRAILER:
        raise BadEntry("wrong size")
    if zlib.crc32(memoryview(raw)[:at]) != int.from_bytes(raw[at : at + 4], "little"):
        raise BadEntry("checksum mismatch")
    return raw, layout, rows


def read(path: str, key: dict[str, Any]) -> TraceColumns:
    """The entry at ``path`` for ``key`` as columns (errors as :func:`_open`)."""
    import numpy as np

    from .columns import TraceColumns

    raw, layout, rows = _open(path, key)
    arrays = {
        name: np.frombuffer(raw, dtype=dtype, count=count, offset=place)
        for name, dtype, count, place in layout
    }
    lengths = arrays.pop("lengths")
    if len(lengths) != rows or (len(lengths) and int(lengths.min()) < 0):
        raise BadEntry("bad lengths")
    offsets = np.zeros(rows + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    columns = TraceColumns(
        arrival_s=arrays["arrival_s"],
        prompt_tokens=arrays["prompt_tokens"],
        output_tokens=arrays["output_tokens"],
        offsets=offsets,
        hashes=arrays["hashes"],
        session_id=arrays["session_id"],
        has_session=arrays["has_session"],
    )
    if not columns.check():
        raise BadEntry("inconsistent arrays")
    return columns


def read_records(path: str, key: dict[str, Any], limit: int | None = None) -> Iterator[Record]:
    """The entry's first ``limit`` rows (all when None) as :meth:`TraceColumns.records`
    gives them, from plain lists: no numpy (errors as :func:`_open`, raised before the
    first record). Only a little-endian machine reads the bytes as they lie."""
    if sys.byteorder != "little":
        return read(path, key).head(limit).records()
    raw, layout, rows = _open(path, key)
    view: Any = memoryview(raw)  # cast to a format chosen at run time
    lists: dict[str, list[Any]] = {}
    for name, dtype, count, place in layout:
        size, code = _PLAIN[dtype]
        lists[name] = view[place : place + count * size].cast(code).tolist()
    lengths = lists["lengths"]
    if any(len(v) != rows for k, v in lists.items() if k != "hashes"):
        raise BadEntry("inconsistent arrays")
    if rows and min(lengths) < 0:
        raise BadEntry("bad lengths")
    bounds = list(itertools.accumulate(lengths, initial=0))
    if bounds[-1] != len(lists["hashes"]):
        raise BadEntry("inconsistent arrays")
    n = rows if limit is None else min(limit, rows)
    has = lists["has_session"][:n]
    sessions: Iterator[int | None] | list[int | None]
    if not any(has):
        sessions = itertools.repeat(None, n)
    else:
        sessions = [s if h else None for s, h in zip(lists["session_id"], has)]
    flat = lists["hashes"]
    return zip(
        range(n),
        lists["arrival_s"][:n],
        lists["prompt_tokens"][:n],
        lists["output_tokens"][:n],
        map(flat.__getitem__, map(slice, bounds, bounds[1 : n + 1])),
        sessions,
    )
