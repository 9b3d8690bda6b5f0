"""vLLM 0.33's LRU: request-scoped recency with provisional ranks and a lazy heap.

Ranks order chunks oldest-first. vLLM uses tuples ``(counter, -end_position)``; here a
rank is the single int ``counter * POSITION_SPAN - end_position``, which orders exactly
like the tuple (positions are below ``POSITION_SPAN``) and compares faster.

* a fresh rank is ``(++counter, 0)``;
* a running request's chunks share the request's rank from its first access, so its
  tail is older than its head and the whole request is as old as that first access;
* ``on_request_finished`` commits fresh ranks tail first, so the head ends most recent;
* an access never demotes a chunk (ranks only rise);
* recency is independent of pinning: a pinned chunk keeps its rank and re-enters the
  heap when it becomes evictable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from heapq import heapify, heappop, heappush

from kvsim.context import RequestContext, order_request_keys
from kvsim.policies.base import Chunk, EvictionPolicy, Key

POSITION_SPAN = 1 << 40


class LRUPolicy(EvictionPolicy):
    name = "lru"
    description = "vLLM 0.33 LRU: request-scoped recency, provisional ranks, tail evicted before head"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.chunks: dict[Key, Chunk] = {}
        self._ranks: dict[Key, int] = {}
        self._evictable: set = set()
        self._heap: list[tuple[int, Key]] = []
        self._counter = 0
        self._generation = 0

    # --- ranks ---

    def _request_rank(self, ctx: RequestContext) -> int:
        state = ctx.state.get(self)
        if state is None or state[0] != self._generation:
            self._counter += 1
            state = (self._generation, self._counter)
            ctx.state[self] = state
        return state[1] * POSITION_SPAN

    def _refresh(self, keys_newest_last: Iterable[Key]) -> None:
        """Give fresh ranks in the order given (the last key becomes most recent)."""
        chunks = self.chunks
        ranks = self._ranks
        evictable = self._evictable
        counter = self._counter
        updated = []
        for key in keys_newest_last:
            if key in chunks:
                counter += 1
                ranks[key] = counter * POSITION_SPAN
                if key in evictable:
                    updated.append(key)
        self._counter = counter
        self._update_heap(updated)

    def _update_heap(self, updated: Sequence[Key]) -> None:
        if not updated:
            return
        if len(updated) >= max(64, len(self._evictable) // 4):
            self._rebuild_heap()
            return
        heap = self._heap
        ranks = self._ranks
        for key in updated:
            heappush(heap, (ranks[key], key))
        if len(heap) >= max(64, 2 * len(self._evictable)):
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        ranks = self._ranks
        self._heap = [(ranks[k], k) for k in self._evictable]
        heapify(self._heap)

    # --- interface ---

    def get(self, key: Key) -> Chunk | None:
        return self.chunks.get(key)

    def keys(self) -> Iterable[Key]:
        return self.chunks.keys()

    def __len__(self) -> int:
        return len(self.chunks)

    def insert(self, key: Key, chunk: Chunk, ctx: RequestContext) -> None:
        self.chunks[key] = chunk
        position = ctx.positions.get(key)
        if position is None:
            self._counter += 1
            self._ranks[key] = self._counter * POSITION_SPAN
        else:
            self._ranks[key] = self._request_rank(ctx) - position
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
            heappush(self._heap, (self._ranks[key], key))

    def remove(self, key: Key) -> None:
        del self.chunks[key]
        self._ranks.pop(key, None)
        self._evictable.discard(key)

    def touch(self, keys: Iterable[Key], ctx: RequestContext) -> None:
        self._refresh(reversed(list(keys)))

    def on_store_miss(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        """vLLM's default (``touch``) only re-ranks resident keys; store misses never are."""

    def on_request_access(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        base = self._request_rank(ctx)
        positions = ctx.positions
        chunks = self.chunks
        ranks = self._ranks
        evictable = self._evictable
        updated = []
        for key in keys:
            position = positions.get(key)
            if position is None or key not in chunks:
                continue
            rank = base - position
            if ranks[key] >= rank:
                continue
            ranks[key] = rank
            if key in evictable:
                updated.append(key)
        self._update_heap(updated)

    def on_request_finished(self, key_groups, insertion_only, reused, ctx) -> None:
        if len(key_groups) == 1:
            keys = key_groups[0]  # the manager already sorted it by position
        else:
            keys = order_request_keys(key_groups, ctx)
        self._refresh(reversed(keys))

    def clear(self) -> None:
        self.chunks.clear()
        self._ranks.clear()
        self._evictable.clear()
        self._heap.clear()
        self._counter = 0
        self._generation += 1

    def mark_evictable(self, key: Key) -> None:
        self._evictable.add(key)
        heap = self._heap
        heappush(heap, (self._ranks[key], key))
        if len(heap) >= 64 and len(heap) >= 2 * len(self._evictable):
            self._rebuild_heap()

    def mark_non_evictable(self, key: Key) -> None:
        self._evictable.remove(key)

    def evict(self, n: int, protected: set) -> list[tuple[Key, Chunk]] | None:
        if n == 0:
            return []
        heap = self._heap
        ranks = self._ranks
        evictable = self._evictable
        selected: list[tuple[int, Key]] = []
        selected_keys: set = set()
        deferred: list[tuple[int, Key]] = []
        while heap and len(selected) < n:
            entry = heappop(heap)
            rank, key = entry
            if key not in evictable or ranks.get(key) != rank or key in selected_keys:
                continue  # stale lazy entry, or a duplicate of a re-pinned key
            if key in protected:
                deferred.append(entry)
                continue
            selected.append(entry)
            selected_keys.add(key)
        if len(selected) < n:
            for entry in selected:
                heappush(heap, entry)
            for entry in deferred:
                heappush(heap, entry)
            return None
        for entry in deferred:
            heappush(heap, entry)
        chunks = self.chunks
        victims = []
        for _, key in selected:
            evictable.remove(key)
            del ranks[key]
            victims.append((key, chunks.pop(key)))
        if len(heap) >= 64 and len(heap) >= 2 * len(evictable):
            self._rebuild_heap()
        return victims
