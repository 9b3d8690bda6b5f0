"""Textbook ARC (Megiddo & Modha, FAST'03), as libCacheSim implements it.

vLLM's own variant keeps the name ``arc`` (see ``arc.py``); this one is ``arc-textbook``.
T1 holds chunks seen once, T2 chunks hit at least once; B1 and B2 are their ghosts.

* hit: move to the MRU end of T2;
* ghost hit (learnt in ``on_store_miss``, before any eviction): ``p`` (a float) grows
  by ``max(|B2| / |B1|, 1)`` on a B1 hit and shrinks by ``max(|B1| / |B2|, 1)`` on a B2
  hit; the chunk is later inserted into T2;
* new key: inserted into T1;
* each eviction is the paper's case IV (trim B1 when ``|T1| + |B1|`` reaches the
  capacity, or B2 when the directory reaches twice the capacity, then REPLACE), or a
  plain REPLACE when it makes room for a ghost hit;
* REPLACE: evict T1's LRU into B1 if ``|T1| > p`` (or ``== p`` for a B2 ghost hit) or
  T2 is empty, else T2's LRU into B2. Case IV trims B1 whenever ``|T1| + |B1|`` reaches
  the capacity and B1 is not empty (libCacheSim's test, equivalent to ``|T1| < c`` for
  unit sizes), else evicts T1's LRU without a ghost.

In prefix mode one ``evict(n)`` makes room for several keys; ghost hits announced by
``on_store_miss`` are consumed one per eviction, first come first served. Pinned or
protected chunks are passed over; when one list has none left the other is used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.policies.queue import QueuePolicy


class TextbookARCPolicy(QueuePolicy):
    """The paper's ARC (libCacheSim's), to compare vLLM's variant against."""

    name = "arc-textbook"
    description = "textbook ARC (FAST'03, libCacheSim's version); vLLM's variant is 'arc'"

    def _reset(self) -> None:
        self.p = 0.0
        self.t1: OrderedDict[ChunkKey, None] = OrderedDict()
        self.t2: OrderedDict[ChunkKey, None] = OrderedDict()
        self.b1: OrderedDict[ChunkKey, None] = OrderedDict()
        self.b2: OrderedDict[ChunkKey, None] = OrderedDict()
        self._incoming: OrderedDict[ChunkKey, int] = (
            OrderedDict()
        )  # ghost hits not yet stored: key -> 1 (B1) or 2 (B2)
        self._unreplaced: OrderedDict[ChunkKey, int] = (
            OrderedDict()
        )  # ghost hits whose room is not made yet

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        b1, b2 = self.b1, self.b2
        if not b1 and not b2:
            return
        c = self.capacity
        for key in keys:
            if key in b1:
                self.p = min(self.p + max(len(b2) / len(b1), 1.0), c)
                del b1[key]
                self._incoming[key] = self._unreplaced[key] = 1
            elif key in b2:
                self.p = max(self.p - max(len(b1) / len(b2), 1.0), 0.0)
                del b2[key]
                self._incoming[key] = self._unreplaced[key] = 2
        for pending in (self._incoming, self._unreplaced):
            while len(pending) > c:  # learnt but never stored: forget the oldest
                pending.popitem(last=False)

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        ghost = self._incoming.pop(key, 0)
        self._unreplaced.pop(key, None)
        for lost in (self.b1, self.b2):  # a ghost hit nobody announced (no on_store_miss)
            if key in lost:
                del lost[key]
                ghost = 1
        (self.t2 if ghost else self.t1)[key] = None

    def _on_hit(self, key: ChunkKey) -> None:
        if key in self.t1:
            del self.t1[key]
        else:
            del self.t2[key]
        self.t2[key] = None

    def _on_remove(self, key: ChunkKey) -> None:
        if key in self.t1:
            del self.t1[key]
        else:
            del self.t2[key]

    def _replace(self, x_in_b2: bool, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        t1 = self.t1
        from_t1 = (
            len(t1) > 0 and (len(t1) > self.p or (x_in_b2 and len(t1) == self.p))
        ) or not self.t2
        first, second = (t1, self.t2) if from_t1 else (self.t2, t1)
        key = self._first_usable(first, protected)
        if key is None:
            first, second = second, first
            key = self._first_usable_of(first, protected)
        del first[key]
        (self.b1 if first is t1 else self.b2)[key] = None
        return key

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        c = self.capacity
        unreplaced = self._unreplaced
        if unreplaced:  # make room for a ghost hit: a plain REPLACE
            kind = unreplaced.pop(next(iter(unreplaced)))
            victim = self._replace(kind == 2, protected)
        elif len(t1) + len(b1) >= c:
            if b1:
                b1.popitem(last=False)
                victim = self._replace(False, protected)
            else:
                oldest = self._first_usable(t1, protected)
                if oldest is None:
                    victim = self._replace(False, protected)
                else:
                    del t1[oldest]
                    victim = oldest
        else:
            if len(t1) + len(b1) + len(t2) + len(b2) >= 2 * c and b2:
                b2.popitem(last=False)
            victim = self._replace(False, protected)
        while len(t1) + len(b1) > c and b1:
            b1.popitem(last=False)
        while len(t1) + len(t2) + len(b1) + len(b2) > 2 * c and b2:
            b2.popitem(last=False)
        return victim
