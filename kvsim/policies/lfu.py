"""LFU: evict the chunk with the fewest uses.

Frequency is 1 at insertion and grows by one per reuse (a hit); it is forgotten when the
chunk leaves (no history). **Tie-break (documented):** among chunks of equal frequency
the least recently used one goes first, i.e. the one whose last insert or hit is oldest.
Frequencies live in buckets (frequency -> keys in recency order), so a hit is O(1) and a
victim search visits the lowest non-empty buckets only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.policies.queue import QueuePolicy


class LFUPolicy(QueuePolicy):
    """Evict the least-used chunk (ties: least recent), so hot shared prefixes stay."""

    name = "lfu"
    description = "LFU: fewest uses first; ties broken least-recently-used first"

    def _reset(self) -> None:
        self._freq: dict[ChunkKey, int] = {}
        self._buckets: dict[int, OrderedDict[ChunkKey, None]] = {}

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        self._freq[key] = 1
        self._buckets.setdefault(1, OrderedDict())[key] = None

    def _unlink(self, key: ChunkKey) -> int:
        f = self._freq.pop(key)
        bucket = self._buckets[f]
        del bucket[key]
        if not bucket:
            del self._buckets[f]
        return f

    def _on_hit(self, key: ChunkKey) -> None:
        f = self._unlink(key) + 1
        self._freq[key] = f
        self._buckets.setdefault(f, OrderedDict())[key] = None

    def _on_remove(self, key: ChunkKey) -> None:
        self._unlink(key)

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        usable = self._usable
        buckets = self._buckets
        for f in sorted(buckets):
            for key in buckets[f]:
                if usable(key, protected):
                    self._unlink(key)
                    return key
        raise AssertionError("no evictable chunk although evict() checked there was one")
