"""Segmented LRU (Karedla et al., 1994): a probationary and a protected LRU segment.

New chunks enter the probationary segment; a hit there promotes the chunk to the MRU end
of the protected segment (80 % of the capacity); when the protected segment overflows its
LRU chunk drops back to the MRU end of the probationary one. Victims come from the
probationary LRU end, then from the protected LRU end. kvsim ships SLRU rather than 2Q.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.policies.queue import QueuePolicy


def segmented_hit(
    probation: OrderedDict[ChunkKey, None],
    protected: OrderedDict[ChunkKey, None],
    key: ChunkKey,
    protected_capacity: int,
) -> None:
    """A reuse in a segmented LRU: to the protected MRU end; the protected segment's LRU
    chunk drops back to the probationary MRU end when it overflows. (W-TinyLFU's main
    region is the same SLRU.)"""
    if key in protected:
        protected.move_to_end(key)
        return
    del probation[key]
    protected[key] = None
    if len(protected) > protected_capacity:
        demoted, _ = protected.popitem(last=False)
        probation[demoted] = None


class SLRUPolicy(QueuePolicy):
    """Segmented LRU: a reuse protects a chunk, so one pass of new prefixes cannot flush it."""

    name = "slru"
    description = "segmented LRU: probation + protected (80%) segments, promotion on reuse"

    def __init__(self, capacity: int, protected_ratio: float = 0.8) -> None:
        self.protected_capacity = max(1, int(capacity * protected_ratio))
        super().__init__(capacity)

    def _reset(self) -> None:
        self._probation: OrderedDict[ChunkKey, None] = OrderedDict()
        self._protected: OrderedDict[ChunkKey, None] = OrderedDict()

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        self._probation[key] = None

    def _on_hit(self, key: ChunkKey) -> None:
        segmented_hit(self._probation, self._protected, key, self.protected_capacity)

    def _on_remove(self, key: ChunkKey) -> None:
        if key in self._probation:
            del self._probation[key]
        else:
            del self._protected[key]

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        usable = self._usable
        for segment in (self._probation, self._protected):
            for key in segment:
                if usable(key, protected):
                    del segment[key]
                    return key
        raise AssertionError("no evictable chunk although evict() checked there was one")
