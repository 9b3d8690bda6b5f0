"""vLLM 0.33's manager and its policies, fused for requests that run one at a time.

Cache mode never overlaps two requests, and that collapses most of the protocol's
bookkeeping: between requests every resident chunk is ready and unpinned, and when a
request prepares a store its loads are complete, so nothing is pinned and only the offer
is protected. Ref counts, pending writes, chunk ids and per-request access records reduce
to a few sets, and each request costs a few C-level dict operations per chunk instead of
a dozen protocol calls.

:class:`FusedTier` does the steps of the connector's per-request sequence
(:meth:`kvsim.cachemode.tier.Tier.serve`) on a policy's state: the load, and each offer's
admission and all-or-nothing allocation; a subclass keeps one policy's state and makes the
decisions of :class:`~kvsim.manager.offload.OffloadManager` with that policy.
``tests/cachemode/test_replay_fused.py`` checks rows, summary, final eviction order and
counters against the protocol tier on random traces and configurations (and against
vLLM's own manager when it is importable).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

from kvsim.cachemode.tier import Tier
from kvsim.core.context import RequestContext, chunk_positions
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import ManagerCounters
from kvsim.policies.admission.base import AdmissionPolicy


class FusedTier(Tier):
    """The CPU tier of cache-mode replay, one request at a time; subclasses add a policy."""

    name: ClassVar[str] = "fused"

    def __init__(
        self,
        num_chunks: int,
        chunk_tokens: int,
        prefill_step: int | None,
        admission: AdmissionPolicy | None = None,
    ) -> None:
        if num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {num_chunks}")
        self.num_chunks = num_chunks
        self.chunk_tokens = chunk_tokens
        self.prefill_step = prefill_step
        self.admission = admission if admission is not None else AdmissionPolicy()
        self._records = self.admission.records_offers
        self._filters = self.admission.filters
        self.counters: ManagerCounters = ManagerCounters()

    # --- the policy's part ---

    @property
    @abstractmethod
    def num_resident(self) -> int: ...

    @abstractmethod
    def resident_keys(self) -> list[ChunkKey]:
        """Resident keys in eviction order (the next victim first)."""

    @abstractmethod
    def _lookup(self, keys: Sequence[ChunkKey], ctx: Any = None) -> int:
        """How many leading keys are resident (the connector's scan)."""

    @abstractmethod
    def _reuse(self, keys: Sequence[ChunkKey]) -> None:
        """The request loads these resident keys (recorded as reuse)."""

    @abstractmethod
    def _offer(self, offer: list[ChunkKey], retry: bool) -> list[ChunkKey]:
        """Record the offer's resident keys as reuse; return the others (store candidates).
        ``retry``: an offer of this request failed before."""

    def _candidates(self, keys: Sequence[ChunkKey]) -> None:
        """The admitted store candidates of one offer, before allocation (a store miss);
        only policies that learn from store misses (ARC's ghosts) need it."""

    @abstractmethod
    def _evict(self, need: int, offer: Sequence[ChunkKey], keys: Sequence[ChunkKey]) -> bool:
        """Free ``need`` chunks, all or nothing, never one of ``offer``."""

    @abstractmethod
    def _insert(self, keys: Sequence[ChunkKey]) -> None:
        """The admitted keys of a successful offer enter the tier."""

    @abstractmethod
    def _finish(self, keys: Sequence[ChunkKey], ctx: Any = None) -> None:
        """Commit the request's accesses; ``keys`` are all its chunk keys, head first."""

    # --- the connector's steps ---

    def _begin(self, req_id: Hashable, keys: list[ChunkKey]) -> Hashable:
        return req_id  # the admission's context is built only when one filters

    def _load(self, keys: Sequence[ChunkKey], ctx: Any, first_tokens: int) -> None:
        self._reuse(keys)
        self.counters.loaded_chunks += len(keys)

    def _store(
        self, offer: list[ChunkKey], retry: bool, keys: list[ChunkKey], ctx: Any
    ) -> tuple[int, int] | None:
        """One offer as the manager makes it: admission of the non-resident keys, then
        an all-or-nothing allocation that evicts what it must."""
        counters = self.counters
        if self._records:
            self.admission.record_offer(offer)
        to_store = self._offer(offer, retry)
        if self._filters and to_store:
            candidates = len(to_store)
            to_store = self.admission.admit(to_store, self._context(ctx, keys))
            counters.stores_skipped += candidates - len(to_store)
        if not to_store:
            return 0, 0
        self._candidates(to_store)
        n = len(to_store)
        counters.allocation_sizes.observe(n)
        resident = self.num_resident
        need = n - (self.num_chunks - resident)
        if need > 0:
            if need > resident or not self._evict(need, offer, keys):
                counters.allocation_failures += 1
                return None
            counters.evicted_chunks += need
        else:
            need = 0
        self._insert(to_store)
        counters.stored_chunks += n
        return n, need

    def _context(self, req_id: Hashable, keys: Sequence[ChunkKey]) -> RequestContext:
        return RequestContext(req_id, chunk_positions(keys, self.chunk_tokens))
