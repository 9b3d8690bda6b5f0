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

    The offload manager (:class:`kvsim.manager.offload.OffloadManager`) drives a policy
    through one chunk's life: :meth:`insert` when a store is prepared (the chunk is pending,
    ``ref_cnt == -1``); :meth:`mark_evictable` when its copy completes or its last load ends
    (``ref_cnt`` became 0); :meth:`mark_non_evictable` when a load pins it; :meth:`remove`
    when its copy failed; and out through :meth:`evict`. Around those, the hooks tell the
    policy about requests: :meth:`on_store_miss` and :meth:`on_request_access` while a
    request runs, :meth:`on_request_finished` when it is done.

    Invariants the policy keeps: its resident keys are exactly the manager's (insert adds
    one, remove and evict take them away, nothing else does); it reads ``Chunk.ref_cnt``
    and never writes it; it never allocates chunk ids, reads a clock or blocks. Every key
    argument is hashable and comparable only (an ``int`` here, vLLM's ``bytes`` when the
    policy runs inside vLLM through :mod:`kvsim.integrations.vllm`).

    Subclasses implement the abstract methods (:class:`ChunkMapPolicy` gives ``get`` and
    ``keys`` for a policy that keeps its chunks in one dict; ``fifo.py`` on ``queue.py`` is
    the smallest complete one). A registered policy is checked by
    ``tests/policies/test_policy_contract.py``.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: True when the policy needs the future of the trace (it then implements
    #: :class:`FuturePolicy`, and the replay hands it the trace before it runs).
    needs_future: ClassVar[bool] = False

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def get(self, key: ChunkKey) -> Chunk | None:
        """The resident chunk for ``key``, or None. No side effects (no recency change)."""

    @abstractmethod
    def insert(self, key: ChunkKey, chunk: Chunk, ctx: RequestContext) -> None:
        """Add a newly allocated chunk, write pending.

        Args:
            key: a key that is not resident.
            chunk: its chunk, ``ref_cnt == -1``; ``get(key)`` returns this very object after.
            ctx: the storing request; ``ctx.positions.get(key)`` is the chunk's end token
                position when the connector recorded one.
        """

    @abstractmethod
    def remove(self, key: ChunkKey) -> None:
        """Drop a resident, still pending chunk whose store failed. Not an eviction: no
        ghost entry is made for it (the key was never stored)."""

    @abstractmethod
    def touch(self, keys: Iterable[ChunkKey], ctx: RequestContext) -> None:
        """Record a use of ``keys`` now. Recency policies make the first key the most
        recent (they apply the keys tail first) and ignore keys that are not resident (ARC
        learns from the ones in its ghost lists); Belady only advances its clock.

        Still used: the object protocol (``cachemode/object_protocol.py``) calls it for
        every hit, the default :meth:`on_store_miss` and :meth:`on_request_finished` call it
        (vLLM's defaults), and vLLM's ``CachePolicy`` interface requires it. The offload
        manager itself commits recency through :meth:`on_request_finished`.
        """

    @abstractmethod
    def evict(
        self, n: int, protected: AbstractSet[ChunkKey]
    ) -> list[tuple[ChunkKey, Chunk]] | None:
        """Choose and remove ``n`` victims, atomically.

        Args:
            n: how many chunks to free (``>= 0``; 0 returns ``[]``).
            protected: keys that must stay (the offer being stored).

        Returns:
            Exactly ``n`` ``(key, chunk)`` pairs, each with ``chunk.ref_cnt == 0`` and
            ``key`` not in ``protected``, now removed from the policy, in the order the
            policy evicted them; or None when there are fewer than ``n`` such chunks, and
            then nothing has changed.
        """

    @abstractmethod
    def clear(self) -> None:
        """Forget everything, including ghost and adaptive state (vLLM's cache reset)."""

    @abstractmethod
    def keys(self) -> Iterable[ChunkKey]:
        """Resident keys, in no promised order (for tests and gauges; not on the hot path)."""

    def __len__(self) -> int:
        return sum(1 for _ in self.keys())

    # --- optional hooks (vLLM defaults) ---

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """A request offers keys the tier does not hold, before they are inserted.

        Args:
            keys: the admitted, not resident keys of one ``prepare_store`` that this
                request had not offered before, in offer order (head first). Called before
                the eviction that makes their room, so none of them is resident yet.
            ctx: the storing request.

        The default calls :meth:`touch` (vLLM's default, a no-op on absent keys for most
        policies); ARC overrides it to adapt its target when a key is in a ghost list.
        """
        self.touch(keys, ctx)

    def on_request_access(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """A running request observes ``keys`` for the first time: the keys of a load, or
        of an offer (new ones included, just before they are inserted), each reported
        once per request, in observation order. Nothing is committed yet (vLLM's LRU gives
        them provisional ranks); the default does nothing."""

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[ChunkKey]],
        insertion_only: AbstractSet[ChunkKey],
        reused: AbstractSet[ChunkKey],
        ctx: RequestContext,
    ) -> None:
        """Commit one request's accesses, once, when it finishes.

        Args:
            key_groups: one sequence per KV-cache group (kvsim's manager passes exactly
                one), each holding every key the request observed, once, head to tail:
                sorted by ``ctx.positions`` when every key has a position, else in the
                order the request first observed them. Some keys may no longer be resident
                (evicted meanwhile, or their store failed) and some may still be pending:
                a policy skips or handles them.
            insertion_only: keys this request inserted (its ``prepare_store`` allocated
                them) and did not reuse: a store is no frequency hit.
            reused: keys this request found ready and used (loaded, or offered while
                already stored) and had not inserted itself.
            ctx: the finished request.

        ``insertion_only`` and ``reused`` are disjoint; a key in neither was observed only
        (its store found no room). The default touches each group (vLLM's default: every
        observed key counts as used, the head most recent).
        """
        for group in key_groups:
            self.touch(group, ctx)

    def mark_evictable(self, key: ChunkKey) -> None:
        """The resident chunk of ``key`` reached ``ref_cnt == 0`` (its store completed or
        its last load ended): it may be evicted now."""

    def mark_non_evictable(self, key: ChunkKey) -> None:
        """The resident chunk of ``key`` left ``ref_cnt == 0`` (a load pinned it)."""

    # --- batch forms: the manager calls these; override them for speed ---

    #: False when ``mark_evictable`` / ``mark_non_evictable`` do nothing (the manager skips them).
    tracks_evictability: ClassVar[bool] = True

    def insert_many(
        self, keys: Sequence[ChunkKey], chunks: Sequence[Chunk], ctx: RequestContext
    ) -> None:
        """:meth:`insert` of each key with its chunk (co-indexed), in order."""
        for key, chunk in zip(keys, chunks):
            self.insert(key, chunk, ctx)

    def mark_evictable_many(self, keys: Iterable[ChunkKey]) -> None:
        """:meth:`mark_evictable` of each key, in order."""
        for key in keys:
            self.mark_evictable(key)

    def mark_non_evictable_many(self, keys: Iterable[ChunkKey]) -> None:
        """:meth:`mark_non_evictable` of each key, in order."""
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
