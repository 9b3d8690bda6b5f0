"""vLLM 0.33's manager with its LRU, fused for requests that run one at a time.

Cache mode never overlaps two requests, and that collapses most of the protocol's
bookkeeping: between requests every resident chunk is ready and unpinned and carries a
committed rank; during a request only its own chunks are provisional. So the whole state
is one ordered dict of committed keys (least recent first) plus the running request's
resident keys, and each request costs a few C-level dict operations per chunk instead of
a dozen protocol calls. The decisions are those of :class:`~kvsim.offload.OffloadManager`
with :class:`~kvsim.policies.lru.LRUPolicy` (vLLM's LRU, §3.2):

* a running request's keys are newer than every committed key (its provisional rank
  dates from its first access), and among themselves the tail is oldest;
* eviction takes committed keys oldest first, then the request's own keys tail first,
  never one of the current offer (all chunks are unpinned when a store is prepared);
* at finish the request's resident keys are committed tail first, so the head is newest.

``tests/test_replay_fused.py`` checks that rows and final order equal the protocol
tier's on random traces and configurations (and vLLM's own manager's when importable).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvsim.context import RequestContext
from kvsim.offload import ManagerCounters
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.base import Key
from kvsim.replay_protocol import offer_bounds


class FusedLRUTier:
    """The CPU tier of cache-mode replay with vLLM's LRU, one request at a time."""

    def __init__(self, num_chunks: int, chunk_tokens: int, prefill_step: int | None,
                 admission: AdmissionPolicy | None = None) -> None:
        if num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {num_chunks}")
        self.num_chunks = num_chunks
        self.chunk_tokens = chunk_tokens
        self.prefill_step = prefill_step
        self.admission = admission if admission is not None else AdmissionPolicy()
        self._records = self.admission.records_offers
        self._filters = type(self.admission).admit is not AdmissionPolicy.admit
        self.counters = ManagerCounters()
        self._order: OrderedDict[Key, None] = OrderedDict()  # committed keys, least recent first

    @property
    def num_resident(self) -> int:
        return len(self._order)

    def resident_keys(self) -> list[Key]:
        """Resident keys, least recently used first (the eviction order)."""
        return list(self._order)

    def serve(self, req_id: object, keys: Sequence[Key], local_tokens: int, store_chunks: int,
              input_tokens: int) -> tuple[int, int, int, int, int]:
        """Returns ``(cpu_hit_tokens, stored, evicted, failed_offers, skipped)`` in chunks."""
        order = self._order
        tpc = self.chunk_tokens
        counters = self.counters
        n_chunks = len(keys)
        mine: set | None = None  # the request's resident keys (provisional ranks)
        next_store = 0
        cpu_hit_tokens = 0
        if n_chunks * tpc - local_tokens >= tpc:
            start = local_tokens // tpc
            count = 0
            for key in keys[start:] if start else keys:
                if key not in order:
                    break
                count += 1
            hit_tokens = tpc * (start + count) - local_tokens
            if hit_tokens >= tpc:
                loaded = keys[start : start + count]
                for key in loaded:  # raised to provisional (a plain loop beats map on an OrderedDict)
                    del order[key]
                mine = set(loaded)
                counters.loaded_chunks += count
                cpu_hit_tokens = hit_tokens
                next_store = start + count

        stored = evicted = failed = skipped = 0
        if store_chunks > next_store:
            bounds = (store_chunks,) if not self.prefill_step else offer_bounds(
                store_chunks, local_tokens + cpu_hit_tokens, input_tokens, tpc, self.prefill_step)
            for upto in bounds:
                if upto <= next_store:
                    continue
                offer = keys[next_store:upto]
                if self._records:
                    self.admission.record_offer(offer)
                reused = any(map(order.__contains__, offer))
                if reused:
                    # resident ready keys are reuse: recorded, raised to provisional
                    found = list(filter(order.__contains__, offer))
                    for key in found:
                        del order[key]
                    if mine is None:
                        mine = set()
                    mine.update(found)
                # an offer holds keys of this request only after reuse or a failed offer
                to_store = [k for k in offer if k not in mine] if (reused or failed) and mine else offer
                if self._filters and to_store:
                    candidates = len(to_store)
                    to_store = self.admission.admit(to_store, self._context(req_id, keys))
                    if candidates != len(to_store):
                        skipped += candidates - len(to_store)
                        counters.stores_skipped += candidates - len(to_store)
                if not to_store:
                    next_store = upto
                    continue
                n = len(to_store)
                counters.allocation_sizes.observe(n)
                resident = len(order) + (len(mine) if mine else 0)
                need = n - (self.num_chunks - resident)
                if need > 0:
                    if need <= len(order):  # the common case: the least recent committed keys
                        popitem = order.popitem
                        for _ in range(need):
                            popitem(False)
                    elif need > resident or not self._evict(need, mine, offer, keys):
                        counters.allocation_failures += 1
                        failed += 1
                        continue
                    evicted += need
                    counters.evicted_chunks += need
                if mine is None:
                    mine = set(to_store)
                else:
                    mine.update(to_store)
                stored += n
                counters.stored_chunks += n
                next_store = upto

        if mine:  # commit tail first, so the head is the most recent
            if len(mine) == n_chunks:
                for key in reversed(keys):
                    order[key] = None
            else:
                for key in reversed(keys):
                    if key in mine:
                        order[key] = None
        return cpu_hit_tokens, stored, evicted, failed, skipped

    def _evict(self, need: int, mine: set | None, offer: Sequence[Key], keys: Sequence[Key]) -> bool:
        """Free ``need`` (more than the committed) chunks, all or nothing: every committed
        key, then the running request's own keys tail first, never one of the current offer."""
        order = self._order
        if not mine:
            return False
        protected = set(offer)
        own = [k for k in reversed(keys) if k in mine and k not in protected]  # tail first
        rest = need - len(order)
        if len(own) < rest:
            return False
        order.clear()
        mine.difference_update(own[:rest])
        return True

    def _context(self, req_id: object, keys: Sequence[Key]) -> RequestContext:
        tpc = self.chunk_tokens
        return RequestContext(req_id, dict(zip(keys, range(tpc, (len(keys) + 1) * tpc, tpc))))
