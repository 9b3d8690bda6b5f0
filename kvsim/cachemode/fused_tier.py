"""vLLM 0.33's manager and its policies, fused for requests that run one at a time.

Cache mode never overlaps two requests, and that collapses most of the protocol's
bookkeeping: between requests every resident chunk is ready and unpinned, and when a
request prepares a store its loads are complete, so nothing is pinned and only the offer
is protected. Ref counts, pending writes, chunk ids and per-request access records reduce
to a few sets, and each request costs a few C-level dict operations per chunk instead of
a dozen protocol calls.

:class:`FusedTier` is the connector's per-request sequence (lookup, load, offers with
admission and all-or-nothing allocation, finish) written once; a subclass keeps one
policy's state and makes the decisions of :class:`~kvsim.manager.offload.OffloadManager` with
that policy. ``tests/cachemode/test_replay_fused.py`` checks rows, summary, final eviction order
and counters against the protocol tier on random traces and configurations (and against
vLLM's own manager when it is importable).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import ClassVar

from kvsim.cachemode.protocol_tier import offer_bounds
from kvsim.core.context import RequestContext, chunk_positions
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import ManagerCounters
from kvsim.policies.admission.base import AdmissionPolicy


class FusedTier(ABC):
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
        self._filters = type(self.admission).admit is not AdmissionPolicy.admit
        self.counters = ManagerCounters()

    # --- the policy's part ---

    @property
    @abstractmethod
    def num_resident(self) -> int: ...

    @abstractmethod
    def resident_keys(self) -> list[ChunkKey]:
        """Resident keys in eviction order (the next victim first)."""

    @abstractmethod
    def _lookup(self, keys: Sequence[ChunkKey]) -> int:
        """How many leading keys are resident (the connector's scan)."""

    def resident_prefix(self, keys: Sequence[ChunkKey]) -> int:
        """How many leading keys are resident, touching nothing (a fleet's router asks)."""
        return self._lookup(keys)

    @abstractmethod
    def _load(self, keys: Sequence[ChunkKey]) -> None:
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
    def _finish(self, keys: Sequence[ChunkKey]) -> None:
        """Commit the request's accesses; ``keys`` are all its chunk keys, head first."""

    # --- the connector's part ---

    def serve(
        self,
        req_id: Hashable,
        keys: list[ChunkKey],
        local_tokens: int,
        store_chunks: int,
        input_tokens: int,
    ) -> tuple[int, int, int, int, int]:
        """Returns ``(cpu_hit_tokens, stored, evicted, failed_offers, skipped)`` in chunks."""
        tpc = self.chunk_tokens
        counters = self.counters
        next_store = 0
        cpu_hit_tokens = 0
        if len(keys) * tpc - local_tokens >= tpc:
            start = local_tokens // tpc
            count = self._lookup(keys[start:] if start else keys)
            hit_tokens = tpc * (start + count) - local_tokens
            if hit_tokens >= tpc:
                self._load(keys[start : start + count])
                counters.loaded_chunks += count
                cpu_hit_tokens = hit_tokens
                next_store = start + count

        stored = evicted = failed = skipped = 0
        if store_chunks > next_store:
            for upto in offer_bounds(
                store_chunks, local_tokens + cpu_hit_tokens, input_tokens, tpc, self.prefill_step
            ):
                if upto <= next_store:
                    continue
                offer = keys[next_store:upto]
                if self._records:
                    self.admission.record_offer(offer)
                to_store = self._offer(offer, failed > 0)
                if self._filters and to_store:
                    candidates = len(to_store)
                    to_store = self.admission.admit(to_store, self._context(req_id, keys))
                    if candidates != len(to_store):
                        skipped += candidates - len(to_store)
                        counters.stores_skipped += candidates - len(to_store)
                if not to_store:
                    next_store = upto
                    continue
                self._candidates(to_store)
                n = len(to_store)
                counters.allocation_sizes.observe(n)
                resident = self.num_resident
                need = n - (self.num_chunks - resident)
                if need > 0:
                    if need > resident or not self._evict(need, offer, keys):
                        counters.allocation_failures += 1
                        failed += 1
                        continue
                    evicted += need
                    counters.evicted_chunks += need
                self._insert(to_store)
                stored += n
                counters.stored_chunks += n
                next_store = upto
        self._finish(keys)
        return cpu_hit_tokens, stored, evicted, failed, skipped

    def _context(self, req_id: Hashable, keys: Sequence[ChunkKey]) -> RequestContext:
        return RequestContext(req_id, chunk_positions(keys, self.chunk_tokens))
