"""SIEVE (Zhang et al., NSDI'24): a FIFO queue, one visited bit, and a hand.

New chunks enter at the head; a hit sets the visited bit. The hand walks from the tail
(oldest) toward the head: a visited chunk loses its bit and is passed over, the first
unvisited one is evicted and the hand stays at its newer neighbour; past the head it
wraps to the tail. This is libCacheSim's ``Sieve`` step for step, so miss counts match
on an object stream. Pinned or protected chunks are passed over without losing the bit.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.policies.queue import QueuePolicy


class SievePolicy(QueuePolicy):
    """SIEVE: FIFO plus a visited bit; keeps reused chunks without moving them on a hit."""

    name = "sieve"
    description = "SIEVE: FIFO with a visited bit and a sweeping hand (NSDI'24)"

    def _reset(self) -> None:
        self._newer: dict[ChunkKey, ChunkKey | None] = {}
        self._older: dict[ChunkKey, ChunkKey | None] = {}
        self._head: ChunkKey | None = None  # newest
        self._tail: ChunkKey | None = None  # oldest
        self._hand: ChunkKey | None = None
        self._visited: set[ChunkKey] = set()

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        head = self._head
        self._older[key] = head
        self._newer[key] = None
        if head is None:
            self._tail = key
        else:
            self._newer[head] = key
        self._head = key

    def _on_hit(self, key: ChunkKey) -> None:
        self._visited.add(key)

    def _unlink(self, key: ChunkKey) -> None:
        newer = self._newer.pop(key)
        older = self._older.pop(key)
        if newer is None:
            self._head = older
        else:
            self._older[newer] = older
        if older is None:
            self._tail = newer
        else:
            self._newer[older] = newer
        self._visited.discard(key)
        if self._hand == key:
            self._hand = newer

    def _on_remove(self, key: ChunkKey) -> None:
        self._unlink(key)

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        visited = self._visited
        newer = self._newer
        usable = self._usable
        tail = self._tail  # the walk only reads the queue
        if tail is None:
            raise AssertionError("no evictable chunk although evict() checked there was one")
        key = self._hand if self._hand is not None else tail
        while True:
            if usable(key, protected):
                if key not in visited:
                    break
                visited.discard(key)
            nxt = newer[key]
            key = nxt if nxt is not None else tail
        self._hand = newer[key]
        self._unlink(key)
        return key
