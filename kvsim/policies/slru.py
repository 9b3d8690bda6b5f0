"""Segmented LRU (Karedla et al., 1994): a probationary and a protected LRU segment.

New chunks enter the probationary segment; a hit there promotes the chunk to the MRU end
of the protected segment (80 % of the capacity); when the protected segment overflows its
LRU chunk drops back to the MRU end of the probationary one. Victims come from the
probationary LRU end, then from the protected LRU end. kvsim ships SLRU rather than 2Q.
"""

from __future__ import annotations

from collections import OrderedDict

from kvsim.context import RequestContext
from kvsim.policies.base import Key
from kvsim.policies.fifo import QueuePolicy


class SLRUPolicy(QueuePolicy):
    name = "slru"
    description = "segmented LRU: probation + protected (80%) segments, promotion on reuse"

    def __init__(self, capacity: int, protected_ratio: float = 0.8) -> None:
        self.protected_capacity = max(1, int(capacity * protected_ratio))
        super().__init__(capacity)

    def _reset(self) -> None:
        self._probation: OrderedDict[Key, None] = OrderedDict()
        self._protected: OrderedDict[Key, None] = OrderedDict()

    def _on_insert(self, key: Key, ctx: RequestContext | None) -> None:
        self._probation[key] = None

    def _on_hit(self, key: Key) -> None:
        protected = self._protected
        if key in protected:
            del protected[key]
            protected[key] = None
            return
        del self._probation[key]
        protected[key] = None
        if len(protected) > self.protected_capacity:
            demoted = next(iter(protected))
            del protected[demoted]
            self._probation[demoted] = None

    def _on_remove(self, key: Key) -> None:
        if key in self._probation:
            del self._probation[key]
        else:
            del self._protected[key]

    def _pick_victim(self, protected: set) -> Key:
        usable = self._usable
        for segment in (self._probation, self._protected):
            for key in segment:
                if usable(key, protected):
                    del segment[key]
                    return key
        raise AssertionError("no evictable chunk although evict() checked there was one")
