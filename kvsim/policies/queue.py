"""QueuePolicy: the base of kvsim's textbook (non-vLLM) policies.

The base maps the manager's request-scoped hooks onto the three events the cache
literature speaks of, so each textbook policy only writes ``_on_insert``, ``_on_hit``,
``_on_remove`` and ``_pick_victim``:

* insert: a store of a new chunk (a miss that the manager admitted);
* hit: a *reuse* of a resident chunk. In prefix mode that is a chunk a request loaded or
  re-offered while ready (vLLM's ``reused`` set), applied once per request when it
  finishes, tail first so the head ends most recent; ``touch`` is also a hit (the object
  protocol uses it for every hit);
* evict: ``evict(n, protected)`` first checks that ``n`` evictable, unprotected chunks
  exist (which keeps it atomic), then asks the subclass for ``n`` victims one at a time.
  Pinned or protected chunks are passed over and keep their metadata.

Evictability is tracked from ``insert`` (ref_cnt 0) and the ``mark_*`` hooks, as vLLM's
LRU does.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from kvsim.core.context import RequestContext, order_request_keys
from kvsim.core.keys import ChunkKey
from kvsim.policies.base import Chunk, ChunkMapPolicy


class QueuePolicy(ChunkMapPolicy):
    """Accounting shared by the textbook policies; subclasses pick victims."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._evictable: set[ChunkKey] = set()
        self._reset()

    # --- subclass hooks ---

    def _reset(self) -> None:
        """(Re)create the subclass's structures."""

    @abstractmethod
    def _on_insert(self, key: ChunkKey, ctx: RequestContext | None) -> None:
        """A new chunk entered."""

    def _on_hit(self, key: ChunkKey) -> None:
        """A resident chunk was reused (default: nothing, as in FIFO)."""

    @abstractmethod
    def _on_remove(self, key: ChunkKey) -> None:
        """A chunk left without being a victim (failed store)."""

    @abstractmethod
    def _pick_victim(self, protected: AbstractSet[ChunkKey]) -> ChunkKey:
        """Remove one evictable, unprotected key from the structures and return it.

        Called only when one exists."""

    def _usable(self, key: ChunkKey, protected: AbstractSet[ChunkKey]) -> bool:
        return key in self._evictable and key not in protected

    def _first_usable(
        self, keys: Iterable[ChunkKey], protected: AbstractSet[ChunkKey]
    ) -> ChunkKey | None:
        """The first of ``keys`` (a list's LRU end first) that may be evicted now, or None."""
        usable = self._usable
        for key in keys:
            if usable(key, protected):
                return key
        return None

    def _first_usable_of(
        self, keys: Iterable[ChunkKey], protected: AbstractSet[ChunkKey]
    ) -> ChunkKey:
        """:meth:`_first_usable` where ``evict()`` has checked that one exists."""
        key = self._first_usable(keys, protected)
        if key is None:
            raise AssertionError("no evictable chunk although evict() checked there was one")
        return key

    # --- EvictionPolicy ---

    def insert(self, key: ChunkKey, chunk: Chunk, ctx: RequestContext) -> None:
        if key in self.chunks:
            self.remove(key)
        self.chunks[key] = chunk
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
        self._on_insert(key, ctx)

    def remove(self, key: ChunkKey) -> None:
        if self.chunks.pop(key, None) is None:
            return
        self._evictable.discard(key)
        self._on_remove(key)

    def touch(self, keys: Iterable[ChunkKey], ctx: RequestContext) -> None:
        chunks = self.chunks
        for key in reversed(list(keys)):
            if key in chunks:
                self._on_hit(key)

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """A miss is learnt at insertion; policies with ghosts override this."""

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[ChunkKey]],
        insertion_only: AbstractSet[ChunkKey],
        reused: AbstractSet[ChunkKey],
        ctx: RequestContext,
    ) -> None:
        if not reused:
            return
        keys = key_groups[0] if len(key_groups) == 1 else order_request_keys(key_groups, ctx)
        chunks = self.chunks
        for key in reversed(keys):
            if key in reused and key in chunks:
                self._on_hit(key)

    def mark_evictable(self, key: ChunkKey) -> None:
        if key in self.chunks:
            self._evictable.add(key)

    def mark_non_evictable(self, key: ChunkKey) -> None:
        self._evictable.discard(key)

    def mark_evictable_many(self, keys: Iterable[ChunkKey]) -> None:
        chunks = self.chunks
        self._evictable.update(k for k in keys if k in chunks)

    def mark_non_evictable_many(self, keys: Iterable[ChunkKey]) -> None:
        self._evictable.difference_update(keys)

    def evict(
        self, n: int, protected: AbstractSet[ChunkKey]
    ) -> list[tuple[ChunkKey, Chunk]] | None:
        if n <= 0:
            return []
        evictable = self._evictable
        if len(evictable) < n:
            return None
        if protected:
            small, large = (
                (protected, evictable)
                if len(protected) < len(evictable)
                else (evictable, protected)
            )
            blocked = sum(1 for k in small if k in large)
            if len(evictable) - blocked < n:
                return None
        chunks = self.chunks
        victims = []
        for _ in range(n):
            key = self._pick_victim(protected)
            evictable.discard(key)
            victims.append((key, chunks.pop(key)))
        return victims

    def clear(self) -> None:
        self.chunks.clear()
        self._evictable.clear()
        self._reset()
