"""The eviction-policy interface, shaped like vLLM 0.33's ``CachePolicy``.

A policy organises resident chunks and picks victims. It never allocates chunk ids,
never reads a clock and never touches tensors; the offload manager does the accounting.
That is what lets one policy object run in the simulator, under the real backend, and
(through an adapter) inside vLLM itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, ClassVar, Protocol

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey, KeyLayout

if TYPE_CHECKING:
    from kvsim.traces.model import Request

#: The name policies used before :data:`kvsim.core.keys.ChunkKey`; kept for users' policies.
Key = ChunkKey


class Chunk:
    """One CPU chunk slot. ``ref_cnt``: -1 write pending, 0 evictable, >0 pinned by loads."""

    __slots__ = ("chunk_id", "ref_cnt")

    def __init__(self, chunk_id: int, ref_cnt: int = -1) -> None:
        self.chunk_id = chunk_id
        self.ref_cnt = ref_cnt

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"Chunk(id={self.chunk_id}, ref={self.ref_cnt})"


class EvictionPolicy(ABC):
    """Resident-chunk organisation plus victim selection.

    Subclasses must implement ``get``, ``insert``, ``remove``, ``touch``, ``evict`` and
    ``clear``. ``evict(n, protected)`` must be atomic: either exactly ``n`` chunks with
    ``ref_cnt == 0`` that are not in ``protected`` are removed and returned, or ``None``
    is returned and nothing changes.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: True when the policy needs the future of the trace (set by the replay driver).
    needs_future: ClassVar[bool] = False

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def get(self, key: ChunkKey) -> Chunk | None:
        """The resident chunk for ``key``, or None. No side effects."""

    @abstractmethod
    def insert(self, key: ChunkKey, chunk: Chunk, ctx: RequestContext) -> None:
        """Add a newly allocated (write-pending) chunk."""

    @abstractmethod
    def remove(self, key: ChunkKey) -> None:
        """Drop a chunk whose store failed."""

    @abstractmethod
    def touch(self, keys: Iterable[ChunkKey], ctx: RequestContext) -> None:
        """Legacy recency update; the first key ends up most recent."""

    @abstractmethod
    def evict(
        self, n: int, protected: AbstractSet[ChunkKey]
    ) -> list[tuple[ChunkKey, Chunk]] | None:
        """Atomically remove exactly ``n`` evictable, unprotected chunks."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything, including ghost and adaptive state."""

    @abstractmethod
    def keys(self) -> Iterable[ChunkKey]:
        """Resident keys (for tests and gauges; not on the hot path)."""

    def __len__(self) -> int:
        return sum(1 for _ in self.keys())

    # --- optional hooks (vLLM defaults) ---

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """Store candidates new to this request, before insertion (ARC ghost learning)."""
        self.touch(keys, ctx)

    def on_request_access(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """First observation of keys by a running request; no commitment yet."""

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[ChunkKey]],
        insertion_only: AbstractSet[ChunkKey],
        reused: AbstractSet[ChunkKey],
        ctx: RequestContext,
    ) -> None:
        """Commit one request's accesses, head-to-tail per group."""
        for group in key_groups:
            self.touch(group, ctx)

    def mark_evictable(self, key: ChunkKey) -> None:
        """The chunk's ref_cnt became 0."""

    def mark_non_evictable(self, key: ChunkKey) -> None:
        """The chunk's ref_cnt left 0."""

    # --- batch forms: the manager calls these; override them for speed ---

    #: False when ``mark_evictable`` / ``mark_non_evictable`` do nothing (the manager skips them).
    tracks_evictability: ClassVar[bool] = True

    def insert_many(
        self, keys: Sequence[ChunkKey], chunks: Sequence[Chunk], ctx: RequestContext
    ) -> None:
        for key, chunk in zip(keys, chunks):
            self.insert(key, chunk, ctx)

    def mark_evictable_many(self, keys: Iterable[ChunkKey]) -> None:
        for key in keys:
            self.mark_evictable(key)

    def mark_non_evictable_many(self, keys: Iterable[ChunkKey]) -> None:
        for key in keys:
            self.mark_non_evictable(key)


class FuturePolicy(Protocol):
    """What a policy with ``needs_future`` (Belady) adds: it learns the accesses to come,
    from the trace (cache mode) or from the block stream (object protocol)."""

    def prepare_future(self, requests: Iterable[Request], layout: KeyLayout) -> None: ...

    def prepare_stream(self, keys: Sequence[ChunkKey]) -> None: ...


class ChunkMapPolicy(EvictionPolicy):
    """A policy whose resident chunks live in one ``self.chunks`` dict (most of them)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.chunks: dict[ChunkKey, Chunk] = {}

    def get(self, key: ChunkKey) -> Chunk | None:
        return self.chunks.get(key)

    def keys(self) -> Iterable[ChunkKey]:
        return self.chunks.keys()

    def __len__(self) -> int:
        return len(self.chunks)
