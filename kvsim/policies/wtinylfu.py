"""W-TinyLFU (Einziger et al., 2017; Caffeine's design): a small LRU window in front of
an SLRU main cache, with a TinyLFU sketch deciding who enters main.

* every access (a store miss announced by ``on_store_miss``, or a hit) counts in the
  frequency sketch (:class:`kvsim.policies.frequency_sketch.FrequencySketch`);
* new chunks enter the window (1 % of the capacity, at least one chunk); while main has
  room the window's overflow moves straight into main's probation segment;
* to evict, when the window is over its share its LRU chunk (the candidate) duels main's
  victim (probation LRU, else protected LRU): the candidate enters probation and the
  victim leaves if the candidate's estimated frequency is higher, else the candidate
  leaves;
* main is an SLRU: a hit in probation promotes to protected (80 % of main), whose
  overflow drops back to probation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.policies.frequency_sketch import FrequencySketch
from kvsim.policies.queue import QueuePolicy
from kvsim.policies.slru import segmented_hit


class WTinyLFUPolicy(QueuePolicy):
    """W-TinyLFU: an LRU window, then a frequency duel decides who enters the SLRU main cache."""

    name = "wtinylfu"
    description = "W-TinyLFU: 1% LRU window + SLRU main, frequency-sketch duel at admission"

    def __init__(
        self, capacity: int, window_ratio: float = 0.01, protected_ratio: float = 0.8, seed: int = 0
    ) -> None:
        self.window_capacity = max(1, int(capacity * window_ratio))
        self.main_capacity = max(0, capacity - self.window_capacity)
        self.protected_capacity = max(1, int(self.main_capacity * protected_ratio))
        self._seed = seed
        super().__init__(capacity)

    def _reset(self) -> None:
        self._window: OrderedDict[ChunkKey, None] = OrderedDict()
        self._probation: OrderedDict[ChunkKey, None] = OrderedDict()
        self._protected: OrderedDict[ChunkKey, None] = OrderedDict()
        self.sketch = FrequencySketch(max(16, self.capacity), seed=self._seed)

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        increment = self.sketch.increment
        for key in keys:
            increment(key)

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        window = self._window
        window[key] = None
        while (
            len(window) > self.window_capacity
            and len(self._probation) + len(self._protected) < self.main_capacity
        ):
            moved = next(iter(window))
            del window[moved]
            self._probation[moved] = None

    def _on_hit(self, key: ChunkKey) -> None:
        self.sketch.increment(key)
        window, protected = self._window, self._protected
        if key in window:
            del window[key]
            window[key] = None
        else:
            segmented_hit(self._probation, protected, key, self.protected_capacity)

    def _on_remove(self, key: ChunkKey) -> None:
        for segment in (self._window, self._probation, self._protected):
            if key in segment:
                del segment[key]
                return

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        window = self._window
        candidate = (
            self._first_usable(window, protected) if len(window) > self.window_capacity else None
        )
        victim_segment = self._probation
        victim = self._first_usable(victim_segment, protected)
        if victim is None:
            victim_segment = self._protected
            victim = self._first_usable(victim_segment, protected)
        if candidate is not None and victim is not None:
            estimate = self.sketch.estimate
            del window[candidate]
            if estimate(candidate) > estimate(victim):
                self._probation[candidate] = None
                del victim_segment[victim]
                return victim
            return candidate
        if victim is not None:
            del victim_segment[victim]
            return victim
        key = candidate if candidate is not None else self._first_usable_of(window, protected)
        del window[key]
        return key
