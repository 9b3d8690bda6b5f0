"""A trace file's requests, from the trace cache when it has them, else parsed (and then
stored there): the reader behind every :class:`~kvsim.traces.model.Trace` that
:func:`~kvsim.traces.readers.open_trace` opens.

Requests come in column batches (:class:`~kvsim.traces.columns.TraceColumns`); iterating
the trace turns them into :class:`Request` objects, and hot loops read the batches
themselves (:func:`request_records`). The parsed columns stay with the source, so a second
pass over the same :class:`Trace` (a policy that reads the future, the timed engine's
arrival check) reads memory, not the file.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from . import cache
from .model import Request, Trace, TraceInfo

if TYPE_CHECKING:  # numpy loads with the first table, not with a replay (see records)
    from .columns import Record, TraceColumns

#: parse a whole file as batches: (path, format, block_tokens) -> batches; raises
#: InputError at the first bad line, after yielding the batches before it
BatchReader = Callable[[str, str, int], "Iterator[TraceColumns]"]


class FileSource:
    """Reads ``path`` (a regular file) as ``fmt`` with ``block_tokens``-token blocks."""

    def __init__(self, path: str, fmt: str, block_tokens: int, read: BatchReader) -> None:
        self.path = path
        self.format = fmt
        self.block_tokens = block_tokens
        self._read = read
        self._parts: Sequence[TraceColumns] | None = None  # the whole file, once read

    def __call__(self, info: TraceInfo, limit: int | None = None) -> Iterator[Request]:
        """The requests, as :class:`Trace` iterates them."""
        for batch in self.batches(limit):
            yield from batch.requests()

    def columns(self) -> TraceColumns:
        """All the requests as one table: loaded from the cache, or parsed (and stored)."""
        if self._parts is None:
            for _ in self.batches():
                pass
        assert self._parts is not None
        if len(self._parts) != 1:
            from .columns import concat

            self._parts = [concat(self._parts)]
        return self._parts[0]

    def records(self, limit: int | None = None) -> Iterator[Record]:
        """The first ``limit`` requests (all when None) as plain records: from memory when
        this source (or the cache's in-memory copy) has them, else straight from the cache
        entry's bytes without numpy (a replay's common case), else parsed (and stored)."""
        if self._parts is None and limit != 0:
            state = cache.file_state(self.path)  # before hashing: see _parse
            digest = cache.file_digest(self.path)
            self._parts = cache.remembered(digest, self.format, self.block_tokens)
            if self._parts is None:
                found = cache.lookup_records(digest, self.format, self.block_tokens, limit)
                if found is not None:
                    return found
                parsed = self._parse(limit, digest, state)
                return itertools.chain.from_iterable(b.records() for b in parsed)
        return itertools.chain.from_iterable(b.records() for b in self.batches(limit))

    def batches(self, limit: int | None = None) -> Iterator[TraceColumns]:
        """The first ``limit`` requests (all when None), in batches."""
        if limit == 0:
            return
        state = digest = None
        if self._parts is None:
            state = cache.file_state(self.path)  # before hashing: see _parse
            digest = cache.file_digest(self.path)
            self._parts = cache.lookup(digest, self.format, self.block_tokens)
        if self._parts is None:
            yield from self._parse(limit, digest, state)
            return
        left = limit
        for part in self._parts:
            if left is not None and left <= 0:
                return
            yield from part.batches(left)
            left = None if left is None else left - len(part)

    def _parse(
        self, limit: int | None, digest: str | None, state: cache.FileState | None
    ) -> Iterator[TraceColumns]:
        """Parse the file; once it has been read to the end without error, keep its columns
        and store them under ``digest``, the hash of the bytes the file had in ``state``,
        unless its state has changed since (then the bytes parsed may not be those)."""
        parts: list[TraceColumns] = []
        n = 0
        for batch in self._read(self.path, self.format, self.block_tokens):
            if limit is not None and n + len(batch) > limit:
                yield batch.slice(0, limit - n)
                return  # the rest of the file stays unread
            yield batch
            parts.append(batch)
            n += len(batch)
            if n == limit:
                return
        self._parts = parts
        if digest is not None and state is not None and cache.file_state(self.path) == state:
            cache.store(digest, self.format, self.block_tokens, parts, self.path)


def _source(trace: Iterable[Request]) -> FileSource | None:
    reader = getattr(trace, "_reader", None) if isinstance(trace, Trace) else None
    return reader if isinstance(reader, FileSource) else None


def trace_columns(trace: Trace) -> TraceColumns:
    """The trace's requests (up to its limit) as one column table: a file trace's as read
    (from the cache when it has them), any other's built from its requests."""
    source = _source(trace)
    if source is not None:
        return source.columns().head(trace.limit)
    from .columns import from_requests

    return from_requests(list(trace))


def request_records(requests: Iterable[Request]) -> Iterator[Record]:
    """``(request_id, arrival_s, prompt_tokens, output_tokens, block_hashes, session_id)``
    per request, in order: for a file trace read from its columns, without building a
    :class:`Request` per row (what a replay loop wants); else from the requests."""
    source = _source(requests)
    if source is not None:
        assert isinstance(requests, Trace)
        return source.records(requests.limit)
    return (
        (r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes, r.session_id)
        for r in requests
    )
