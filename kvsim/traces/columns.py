"""A trace's requests as columns: a handful of numpy arrays instead of one object per request.

The columnar form is what the trace cache stores (:mod:`kvsim.traces.cache`), what the fast
JSONL decoder produces (:mod:`kvsim.traces.fast_jsonl`), and what hot loops read
(:meth:`TraceColumns.records`) without building a :class:`Request` per row. A file is read
as a stream of batches (one per block of lines), so a partial read stays cheap.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import Request

#: one request's plain values: (request_id, arrival_s, prompt_tokens, output_tokens,
#: block_hashes, session_id); the hashes are a list (a slice of the batch's flat list)
Record = tuple[int, float, int, int, Sequence[int], "int | None"]

#: one parsed record before it has an id: (arrival_s, prompt_tokens, output_tokens,
#: block_hashes, session_id)
Row = tuple[float, int, int, Sequence[int], "int | None"]

#: array name -> dtype, in the order they are stored
COLUMNS: dict[str, Any] = {
    "arrival_s": np.float64,
    "prompt_tokens": np.int64,
    "output_tokens": np.int64,
    "offsets": np.int64,
    "hashes": np.int64,
    "session_id": np.int64,
    "has_session": np.bool_,
}

#: rows per batch when a whole table is handed out (bounds the Python lists made at once)
BATCH_ROWS = 16384


@dataclass(frozen=True, eq=False)
class TraceColumns:
    """Requests ``first_id, first_id + 1, ...`` of one trace, column by column.

    Request ``i``'s block ids are ``hashes[offsets[i]:offsets[i + 1]]``; its session id is
    ``session_id[i]`` where ``has_session[i]``, else None. An integer column whose values do
    not all fit 64 bits holds Python ints (``object`` dtype): such a table is exact, but it
    is not stored in the cache.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    offsets: np.ndarray
    hashes: np.ndarray
    session_id: np.ndarray
    has_session: np.ndarray
    first_id: int = 0

    def __len__(self) -> int:
        return len(self.arrival_s)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in COLUMNS}

    def fixed_width(self) -> bool:
        """No column of Python ints (what the cache can store)."""
        return all(a.dtype != object for a in self.arrays().values())

    def check(self) -> bool:
        """Whether the arrays fit together (dtypes, lengths, offsets): what a loaded cache
        entry must pass before any of its values is used."""
        arrays = self.arrays()
        for name, a in arrays.items():
            allowed = (np.int32, np.int64) if name == "hashes" else (COLUMNS[name],)
            if a.ndim != 1 or a.dtype not in [np.dtype(t) for t in allowed]:
                return False
        n = len(self.arrival_s)
        if any(len(a) != n for k, a in arrays.items() if k not in ("offsets", "hashes")):
            return False
        offsets = self.offsets
        if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(self.hashes):
            return False
        return bool((np.diff(offsets) >= 0).all())

    def head(self, limit: int | None) -> TraceColumns:
        """The first ``limit`` rows (all when None)."""
        return self if limit is None or limit >= len(self) else self.slice(0, limit)

    def slice(self, start: int, stop: int) -> TraceColumns:
        """Rows ``start:stop`` (their ids stay theirs)."""
        stop = min(stop, len(self))
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return TraceColumns(
            self.arrival_s[start:stop],
            self.prompt_tokens[start:stop],
            self.output_tokens[start:stop],
            self.offsets[start : stop + 1] - lo,
            self.hashes[lo:hi],
            self.session_id[start:stop],
            self.has_session[start:stop],
            self.first_id + start,
        )

    def batches(self, limit: int | None = None, size: int = BATCH_ROWS) -> Iterator[TraceColumns]:
        """The first ``limit`` rows (all when None) in batches of ``size``."""
        end = len(self) if limit is None else min(limit, len(self))
        for start in range(0, end, size):
            yield self.slice(start, min(start + size, end))

    def _sessions(self) -> Iterable[int | None]:
        has = self.has_session
        if not has.any():
            return itertools.repeat(None, len(has))
        ids: list[int] = self.session_id.tolist()
        if has.all():
            return ids
        return [s if h else None for s, h in zip(ids, has.tolist())]

    def records(self) -> Iterator[Record]:
        """Every row as plain Python values, in order (ids from ``first_id``). Lazy: each
        row's hash list is sliced as it is reached, so a batch's lists never all live at
        once."""
        flat = self.hashes.tolist()
        bounds = self.offsets.tolist()
        return zip(
            range(self.first_id, self.first_id + len(self)),
            self.arrival_s.tolist(),
            self.prompt_tokens.tolist(),
            self.output_tokens.tolist(),
            map(flat.__getitem__, map(slice, bounds, bounds[1:])),
            self._sessions(),
        )

    def requests(self) -> Iterator[Request]:
        """Every row as a :class:`Request` (block ids as a tuple)."""
        for rid, arrival, n_in, n_out, hashes, sid in self.records():
            yield Request(rid, arrival, n_in, n_out, tuple(hashes), sid)


def _ints(values: list[int]) -> np.ndarray:
    """int64, or Python ints (``object``) when a value does not fit 64 bits."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def from_rows(rows: Sequence[Row], first_id: int) -> TraceColumns:
    """Columns of parsed records, the first one numbered ``first_id``."""
    n = len(rows)
    lengths = np.fromiter((len(r[3]) for r in rows), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    sessions = [r[4] for r in rows]
    return TraceColumns(
        arrival_s=np.array([r[0] for r in rows], dtype=np.float64),
        prompt_tokens=_ints([r[1] for r in rows]),
        output_tokens=_ints([r[2] for r in rows]),
        offsets=offsets,
        hashes=_ints(list(itertools.chain.from_iterable(r[3] for r in rows))),
        session_id=_ints([0 if s is None else s for s in sessions]),
        has_session=np.array([s is not None for s in sessions], dtype=np.bool_),
        first_id=first_id,
    )


def from_requests(requests: Sequence[Request]) -> TraceColumns:
    """Columns of :class:`Request` objects, numbered from the first one's id."""
    rows = [
        (r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes, r.session_id)
        for r in requests
    ]
    return from_rows(rows, requests[0].request_id if requests else 0)


def concat(batches: Sequence[TraceColumns]) -> TraceColumns:
    """One table of consecutive batches, numbered from the first batch's id."""
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return from_rows([], 0)
    offsets = [np.zeros(1, np.int64)]
    base = 0
    for b in batches:
        offsets.append(b.offsets[1:] + base)
        base += len(b.hashes)

    def joined(name: str) -> np.ndarray:
        return np.concatenate([getattr(b, name) for b in batches])

    return TraceColumns(
        arrival_s=joined("arrival_s"),
        prompt_tokens=joined("prompt_tokens"),
        output_tokens=joined("output_tokens"),
        offsets=np.concatenate(offsets),
        hashes=joined("hashes"),
        session_id=joined("session_id"),
        has_session=joined("has_session"),
        first_id=batches[0].first_id,
    )
