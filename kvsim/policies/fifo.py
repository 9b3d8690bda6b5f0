"""FIFO: evict the oldest stored chunk; a reuse changes nothing."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.policies.queue import QueuePolicy


class FIFOPolicy(QueuePolicy):
    """Evict in insertion order: the baseline that ignores reuse."""

    name = "fifo"
    description = "FIFO: evict the oldest stored chunk; reuse changes nothing"

    def _reset(self) -> None:
        self._queue: OrderedDict[ChunkKey, None] = OrderedDict()  # insertion order, oldest first

    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        self._queue[key] = None

    def _on_remove(self, key: ChunkKey) -> None:
        del self._queue[key]

    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        key = self._first_usable_of(self._queue, protected)
        del self._queue[key]
        return key
