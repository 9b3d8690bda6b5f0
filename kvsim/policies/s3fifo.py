"""S3-FIFO (Yang et al., SOSP'23), with libCacheSim's parameters and choices.

Three FIFO queues: a small one (10 % of the capacity), a main one (the rest) and a ghost
queue of evicted keys (90 % of the capacity, keys only). A new chunk enters the small
queue, or the main queue when its key is a ghost (or, before the first eviction, when
the small queue is full). A hit raises a 2-bit frequency (capped at 3).

Evicting from the small queue: its oldest chunk moves to main if it was hit at least
``move_to_main_threshold`` (2) times, else it leaves and its key joins the ghost queue.
Evicting from main: a chunk with frequency f > 0 is re-queued with f - 1, else it leaves.
Main is chosen when it is over its share or the small queue is empty. This follows
libCacheSim 0.3.5's ``S3FIFO`` so miss counts match on an object stream of capacity
>= 20 (below that libCacheSim refuses to place objects in a small queue of size < 2;
kvsim keeps a small queue of at least one chunk).

Pinned or protected chunks are rotated to the back of their queue unchanged.
Ghost hits are learnt in ``on_store_miss`` (before any eviction, as libCacheSim learns
them in its lookup), so the key cannot fall out of the ghost queue before it is stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.policies.queue import QueuePolicy


class S3FIFOPolicy(QueuePolicy):
    """S3-FIFO: a small FIFO filters one-hit wonders before they reach the main queue."""

    name = "s3fifo"
    description = (
        "S3-FIFO: small + main FIFO queues and a ghost queue (SOSP'23, libCacheSim sizing)"
    )

    def __init__(
        self,
        capacity: int,
        small_ratio: float = 0.1,
        ghost_ratio: float = 0.9,
        move_to_main_threshold: int = 2,
    ) -> None:
        self.small_capacity = max(1, int(capacity * small_ratio))
        self.main_capacity = capacity - self.small_capacity
        self.ghost_capacity = int(capacity * ghost_ratio)
        self.move_to_main_threshold = move_to_main_threshold
        super().__init__(capacity)

    def _reset(self) -> None:
        self._small: OrderedDict[ChunkKey, None] = OrderedDict()
        self._main: OrderedDict[ChunkKey, None] = OrderedDict()
        self._ghost: OrderedDict[ChunkKey, None] = OrderedDict()
        self._freq: dict[ChunkKey, int] = {}
        self._ghost_hits: set[ChunkKey] = set()
        self._has_evicted = False

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        ghost = self._ghost
        if not ghost:
            return
        for key in keys:
            if key in ghost:
                del ghost[key]
                self._ghost_hits.add(key)
        if len(self._ghost_hits) > self.capacity:  # learnt but never stored: forget the oldest
            self._ghost_hits = set(list(self._ghost_hits)[-self.capacity :])

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        hit = key in self._ghost_hits
        if hit:
            self._ghost_hits.discard(key)
        elif key in self._ghost:
            del self._ghost[key]
            hit = True
        if hit or (not self._has_evicted and len(self._small) >= self.small_capacity):
            self._main[key] = None
        else:
            self._small[key] = None
        self._freq[key] = 0

    def _on_hit(self, key: ChunkKey) -> None:
        f = self._freq[key]
        if f < 3:
            self._freq[key] = f + 1

    def _on_remove(self, key: ChunkKey) -> None:
        if key in self._small:
            del self._small[key]
        else:
            del self._main[key]
        del self._freq[key]

    def _add_ghost(self, key: ChunkKey) -> None:
        if self.ghost_capacity <= 0:
            return
        ghost = self._ghost
        ghost[key] = None
        if len(ghost) > self.ghost_capacity:
            ghost.popitem(last=False)

    def _evict_small(self, protected: AbstractSet[ChunkKey]) -> ChunkKey | None:
        small, main, freq = self._small, self._main, self._freq
        usable = self._usable
        threshold = self.move_to_main_threshold
        for _ in range(len(small)):
            key = next(iter(small))
            del small[key]
            if not usable(key, protected):
                small[key] = None
            elif freq[key] >= threshold:
                main[key] = None
                freq[key] = 0
            else:
                del freq[key]
                self._add_ghost(key)
                return key
        return None

    def _evict_main(self, protected: AbstractSet[ChunkKey]) -> ChunkKey | None:
        main, freq = self._main, self._freq
        usable = self._usable
        for _ in range(4 * len(main) + 1):
            if not main:
                return None
            key = next(iter(main))
            del main[key]
            if not usable(key, protected):
                main[key] = None
                continue
            f = freq[key]
            if f:
                main[key] = None
                freq[key] = min(f, 3) - 1
            else:
                del freq[key]
                return key
        return None

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        self._has_evicted = True
        if len(self._main) > self.main_capacity or not self._small:
            order = (self._evict_main, self._evict_small, self._evict_main)
        else:
            order = (self._evict_small, self._evict_main, self._evict_small)
        for step in order:
            key = step(protected)
            if key is not None:
                return key
        raise AssertionError("no evictable chunk although evict() checked there was one")
