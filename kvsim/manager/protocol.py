"""What "a manager" is to the code that drives one: vLLM 0.33's ``OffloadingManager`` calls,
as cache mode makes them.

:class:`kvsim.manager.offload.OffloadManager` (kvsim's CPU tier) and
:class:`kvsim.integrations.from_vllm.VllmManagerDriver` (vLLM's own manager behind kvsim's
int keys) both satisfy :class:`ManagerProtocol`, so cache mode runs either, and a test can
drive both with the same calls.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Protocol, TypeVar

from kvsim.core.keys import ChunkKey

_Ctx = TypeVar("_Ctx")


class StoreResult(Protocol):
    """What a manager's ``prepare_store`` returns when it succeeds (read-only).

    Invariants: ``keys_to_store`` is a sub-sequence of the offer, in offer order, and holds
    only keys that were not resident; ``evicted_keys`` are no longer resident and none of
    them is in the offer.
    """

    @property
    def keys_to_store(self) -> Sequence[ChunkKey]:
        """The offered keys that now have a chunk each, write pending: the keys to copy."""
        ...

    @property
    def evicted_keys(self) -> Sequence[ChunkKey]:
        """The keys evicted to make room for them."""
        ...


class ManagerProtocol(Protocol[_Ctx]):
    """The manager calls cache mode makes (vLLM's ``OffloadingManager`` interface), so that
    :class:`OffloadManager` and an adapter around vLLM's own manager are interchangeable.

    ``_Ctx`` is the manager's request context: :class:`~kvsim.core.context.RequestContext` for
    kvsim's manager, vLLM's ``ReqContext`` for the adapter. Arguments are positional.

    A request's calls come in this order: ``new_context``, ``on_new_request``, then any
    number of lookups, loads and stores (each ``prepare_*`` followed, possibly after other
    requests' calls, by its ``complete_*``), then ``on_request_finished``. A chunk is in one
    of three states: *pending* (a store was prepared, its copy has not completed: visible to
    lookups, not loadable, not evictable), *ready* (loadable; evictable while no load pins
    it) or *pinned* (ready, with loads in flight). Keys are only hashed and compared.
    """

    def new_context(self, req_id: Hashable, positions: dict[ChunkKey, int], /) -> _Ctx:
        """Make the context for one request.

        Args:
            req_id: the request's identity (unique among the requests in flight).
            positions: each of the request's chunk keys -> the token position its chunk
                ends at (chunk ``i`` of a prompt ends at ``(i + 1) * chunk_tokens``). Policies
                that order a request's keys (vLLM's LRU) read these; a key without a position
                is ordered by when the request first observed it.

        Returns:
            The context to pass to every later call for this request.
        """
        ...

    def on_new_request(self, ctx: _Ctx, /) -> None:
        """The request is seen for the first time: start recording its accesses. Called
        once, before any other call that takes ``ctx``."""
        ...

    def lookup_prefix(self, keys: Iterable[ChunkKey], /) -> tuple[int, bool]:
        """How much of a prompt's head is in the tier (the connector's scan). No side effects.

        Args:
            keys: the request's chunk keys, head first.

        Returns:
            ``(count, pending)``: ``count`` leading keys are resident (ready or pending; the
            scan stops at the first absent key), and ``pending`` says whether any of them is
            pending, in which case the caller waits and asks again rather than load.
        """
        ...

    def prepare_load(self, keys: Sequence[ChunkKey], ctx: _Ctx, /) -> list[int]:
        """Pin ready chunks for reading; each stays unevictable until its ``complete_load``.

        Args:
            keys: keys that a lookup found ready (all of them resident and ready).
            ctx: the loading request's context; the keys count as reused by it.

        Returns:
            The chunk id of each key, co-indexed with ``keys``.

        Raises:
            ProtocolError: (kvsim's manager) a key is absent or pending.
        """
        ...

    def complete_load(self, keys: Iterable[ChunkKey], ctx: _Ctx, /) -> None:
        """The copies of an earlier ``prepare_load`` are done: unpin each key once (a chunk
        whose last pin goes becomes evictable again)."""
        ...

    def prepare_store(self, keys: Iterable[ChunkKey], ctx: _Ctx, /) -> StoreResult | None:
        """Allocate chunks for the new keys of an offer: all of them, or none.

        Keys already resident (ready or pending) are not stored again; the admission policy
        may decline some new ones (counted as skipped stores). Room is made by evicting ready,
        unpinned chunks whose keys are not in the offer, as the eviction policy picks them.

        Args:
            keys: the offered keys, head first (a prompt's complete chunks past what is
                already stored).
            ctx: the storing request's context; the offer counts as its access (new keys
                as inserted, ready resident ones as reused).

        Returns:
            The keys to copy and the keys evicted (:class:`StoreResult`; both empty when
            nothing is new), or None when too few chunks could be freed: then nothing was
            allocated or evicted (the offer is still recorded as the request's access).
        """
        ...

    def complete_store(self, keys: Iterable[ChunkKey], ctx: _Ctx, /, success: bool = True) -> None:
        """The copies of an earlier ``prepare_store`` are done.

        Args:
            keys: keys of that store; keys that are not pending are ignored.
            ctx: the storing request's context.
            success: True: the pending chunks become ready (loadable, evictable). False: the
                copy failed; the pending chunks are dropped and their ids freed.
        """
        ...

    def on_request_finished(self, ctx: _Ctx, /) -> None:
        """The request is done: hand its recorded accesses to the eviction policy (its
        ``on_request_finished`` hook), exactly once; later calls do nothing."""
        ...
