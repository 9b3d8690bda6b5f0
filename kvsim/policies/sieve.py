"""SIEVE (Zhang et al., NSDI'24): a FIFO queue, one visited bit, and a hand.

New chunks enter at the head; a hit sets the visited bit. The hand walks from the tail
(oldest) toward the head: a visited chunk loses its bit and is passed over, the first
unvisited one is evicted and the hand stays at its newer neighbour; past the head it
wraps to the tail. This is libCacheSim's ``Sieve`` step for step, so miss counts match
on an object stream. Pinned or protected chunks are passed over without losing the bit.
"""

from __future__ import annotations

from kvsim.context import RequestContext
from kvsim.policies.base import Key
from kvsim.policies.queue import QueuePolicy


class SievePolicy(QueuePolicy):
    name = "sieve"
    description = "SIEVE: FIFO with a visited bit and a sweeping hand (NSDI'24)"

    def _reset(self) -> None:
        self._newer: dict[Key, Key | None] = {}
        self._older: dict[Key, Key | None] = {}
        self._head: Key | None = None  # newest
        self._tail: Key | None = None  # oldest
        self._hand: Key | None = None
        self._visited: set = set()

    def _on_insert(self, key: Key, ctx: RequestContext | None) -> None:
        head = self._head
        self._older[key] = head
        self._newer[key] = None
        if head is None:
            self._tail = key
        else:
            self._newer[head] = key
        self._head = key

    def _on_hit(self, key: Key) -> None:
        self._visited.add(key)

    def _unlink(self, key: Key) -> None:
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

    def _on_remove(self, key: Key) -> None:
        self._unlink(key)

    def _pick_victim(self, protected: set) -> Key:
        visited = self._visited
        newer = self._newer
        usable = self._usable
        key = self._hand if self._hand is not None else self._tail
        while True:
            if usable(key, protected):
                if key not in visited:
                    break
                visited.discard(key)
            nxt = newer[key]
            key = nxt if nxt is not None else self._tail
        self._hand = newer[key]
        self._unlink(key)
        return key
