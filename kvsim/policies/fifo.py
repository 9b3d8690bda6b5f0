"""FIFO: evict the oldest stored chunk; a reuse changes nothing."""

from __future__ import annotations

from collections import OrderedDict

from kvsim.context import RequestContext
from kvsim.policies.base import Key
from kvsim.policies.queue import QueuePolicy


class FIFOPolicy(QueuePolicy):
    name = "fifo"
    description = "FIFO: evict the oldest stored chunk; reuse changes nothing"

    def _reset(self) -> None:
        self._queue: OrderedDict[Key, None] = OrderedDict()  # insertion order, oldest first

    def _on_insert(self, key: Key, ctx: RequestContext | None) -> None:
        self._queue[key] = None

    def _on_remove(self, key: Key) -> None:
        del self._queue[key]

    def _pick_victim(self, protected: set) -> Key:
        key = self._first_usable(self._queue, protected)  # evict() checked that one exists
        del self._queue[key]
        return key
