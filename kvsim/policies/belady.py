"""Belady's MIN for the prefix cache: evict the chunk whose next use is farthest away.

The replay hands over the trace before it starts (``prepare_future``); one backward pass
records, for every request and each of its chunk keys, the index of the next request
whose chunk keys contain that key (memory O(total chunk keys), acceptable for this one
offline policy). Time is the trace index of the request being served, read from the
request context's ``req_id``; when it advances, the resident keys of the requests
reached get their new next use.

Victims, in order: chunks never used again (farthest of all), then farther next use
first; ties go to the deeper chunk (larger token position: a chunk is worthless once its
prefix is gone, and a child is never needed sooner than its parent, since every request
holding a chunk holds its whole prefix), then to the older insertion.

On the object protocol, ``prepare_stream`` takes the block stream itself (time = access
index). Without either call (e.g. the contract suite) every key counts as never reused,
so the policy evicts deepest-first, then oldest-first.

Optimal for an object cache (it matches libCacheSim's ``Belady``); in prefix mode it is
MIN's rule under vLLM's constraints (all-or-nothing stores, protected offers, no
bypass), the reference point the curves are drawn against.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey, KeyLayout
from kvsim.policies.queue import QueuePolicy

if TYPE_CHECKING:
    from kvsim.traces.model import Request

NEVER = 1 << 62


def _plan(key_lists: list[list[ChunkKey]]) -> list[list[int]]:
    """For each time step and each of its keys: the next step holding the key, or NEVER."""
    last: dict[ChunkKey, int] = {}
    nexts: list[list[int]] = [[]] * len(key_lists)
    for t in range(len(key_lists) - 1, -1, -1):
        keys = key_lists[t]
        nexts[t] = [last.get(k, NEVER) for k in keys]
        for k in keys:
            last[k] = t
    return nexts


class BeladyPolicy(QueuePolicy):
    """Belady's MIN: the offline optimum, the bound the online policies are measured against."""

    name = "belady"
    description = "Belady's MIN (offline optimum): evict the chunk used farthest in the future"
    needs_future = True

    def __init__(self, capacity: int) -> None:
        self._keys_at: list[list[ChunkKey]] = []
        self._next_at: list[list[int]] = []
        self._time_of: dict[Hashable, int] | None = None  # req_id -> time step
        super().__init__(capacity)

    def _reset(self) -> None:
        self._heap: list[tuple[int, int, int, ChunkKey]] = []
        self._entry: dict[ChunkKey, tuple[int, int, int, ChunkKey]] = {}
        self._pos: dict[ChunkKey, int] = {}
        self._next: dict[ChunkKey, int] = {}
        self._seq = 0
        self._now = -1

    # --- the future ---

    def prepare_future(self, requests: Iterable[Request], layout: KeyLayout) -> None:
        """Learn the trace (cache mode): time = the request's index in trace order."""
        keys_at: list[list[ChunkKey]] = []
        time_of: dict[Hashable, int] = {}
        for t, req in enumerate(requests):
            keys = layout.chunk_keys(layout.unit_keys(req.block_hashes, req.input_tokens))
            keys_at.append(list(dict.fromkeys(keys)))
            time_of[req.request_id] = t
        self._set_plan(keys_at, time_of)

    def prepare_stream(self, keys: Sequence[ChunkKey]) -> None:
        """Learn a block stream (object protocol): time = access index = ``ctx.req_id``."""
        self._set_plan([[k] for k in keys], None)

    def _set_plan(self, keys_at: list[list[ChunkKey]], time_of: dict[Hashable, int] | None) -> None:
        self._keys_at = keys_at
        self._next_at = _plan(keys_at)
        self._time_of = time_of
        self.clear()

    def _advance(self, ctx: RequestContext | None) -> None:
        if ctx is None or not self._keys_at:
            return
        t = self._time_of.get(ctx.req_id) if self._time_of is not None else ctx.req_id
        if not isinstance(t, int) or t <= self._now or t >= len(self._keys_at):
            return
        nxt, chunks, push = self._next, self.chunks, self._push
        for u in range(self._now + 1, t + 1):
            for key, when in zip(self._keys_at[u], self._next_at[u]):
                nxt[key] = when
                if key in chunks:
                    push(key)
        self._now = t

    # --- heap ---

    def _push(self, key: ChunkKey) -> None:
        self._seq += 1
        entry = (-self._next.get(key, NEVER), -self._pos.get(key, 0), self._seq, key)
        self._entry[key] = entry
        heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._heap = list(self._entry.values())
            heapify(self._heap)

    # --- hooks ---

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        self._advance(ctx)
        if ctx is not None:
            self._pos[key] = ctx.positions.get(key, 0)
        self._push(key)

    def _on_remove(self, key: ChunkKey) -> None:
        del self._entry[key]
        self._pos.pop(key, None)

    def touch(self, keys: Iterable[ChunkKey], ctx: RequestContext) -> None:
        self._advance(ctx)

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        self._advance(ctx)

    def on_request_access(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        self._advance(ctx)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[ChunkKey]],
        insertion_only: AbstractSet[ChunkKey],
        reused: AbstractSet[ChunkKey],
        ctx: RequestContext,
    ) -> None:
        self._advance(ctx)

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        heap, entries, usable = self._heap, self._entry, self._usable
        deferred = []
        try:
            while True:
                entry = heappop(heap)
                key = entry[3]
                if entries.get(key) is not entry:
                    continue  # stale
                if usable(key, protected):
                    del entries[key]
                    self._pos.pop(key, None)
                    return key
                deferred.append(entry)
        finally:
            for entry in deferred:
                heappush(heap, entry)
