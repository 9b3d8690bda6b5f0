"""vLLM's LRU fused for requests that run one at a time (see :mod:`kvsim.replay.fused_tier`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from kvsim.keys import ChunkKey
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.replay.fused_tier import FusedTier


class FusedLRUTier(FusedTier):
    """vLLM's LRU (§3.2) one request at a time.

    * a running request's keys are newer than every committed key (its provisional rank
      dates from its first access), and among themselves the tail is oldest;
    * eviction takes committed keys oldest first, then the request's own keys tail first;
    * at finish the request's resident keys are committed tail first, so the head is newest.

    So the state is one ordered dict of committed keys, least recent first, and the set of
    the running request's resident keys, which leave the dict while the request runs.
    (Plain loops beat ``map`` over an OrderedDict's methods here.)
    """

    name = "fused-lru"

    def __init__(
        self,
        num_chunks: int,
        chunk_tokens: int,
        prefill_step: int | None,
        admission: AdmissionPolicy | None = None,
    ) -> None:
        super().__init__(num_chunks, chunk_tokens, prefill_step, admission)
        self._order: OrderedDict[ChunkKey, None] = (
            OrderedDict()
        )  # committed keys, least recent first
        self._mine: set[ChunkKey] = set()  # the running request's resident keys (provisional ranks)
        # the common case (every offer admitted, one offer per request) has its own path
        self._plain = not (self._records or self._filters or prefill_step)

    def serve(
        self,
        req_id: Hashable,
        keys: list[ChunkKey],
        local_tokens: int,
        store_chunks: int,
        input_tokens: int,
    ) -> tuple[int, int, int, int, int]:
        """:meth:`FusedTier.serve` in one function when every offer is admitted at once
        (no admission filter, no chunked prefill): the same decisions, for the replay loop
        that dominates a ``kvsim replay``; anything rarer takes the general path."""
        if not self._plain:
            return super().serve(req_id, keys, local_tokens, store_chunks, input_tokens)
        tpc = self.chunk_tokens
        order = self._order
        counters = self.counters
        start = next_store = cpu_hit_tokens = 0
        if len(keys) * tpc - local_tokens >= tpc:
            start = local_tokens // tpc
            count = 0
            for key in keys[start:] if start else keys:
                if key not in order:
                    break
                count += 1
            hit_tokens = tpc * (start + count) - local_tokens
            if hit_tokens >= tpc:
                next_store = start + count
                for key in keys[start:next_store]:  # loaded: raised to provisional
                    del order[key]
                counters.loaded_chunks += count
                cpu_hit_tokens = hit_tokens
        if store_chunks <= next_store:  # nothing to offer: commit the loads, head newest
            for key in reversed(keys[start:next_store]) if cpu_hit_tokens else ():
                order[key] = None
            return cpu_hit_tokens, 0, 0, 0, 0
        offer = keys[next_store:store_chunks]
        to_store = offer
        if any(map(order.__contains__, offer)):  # resident keys offered again are reuse
            found = list(filter(order.__contains__, offer))
            for key in found:
                del order[key]
            reused = set(found)
            to_store = [k for k in offer if k not in reused]
        n = len(to_store)
        if n:
            counters.allocation_sizes.observe(n)
            mine = store_chunks - (start if cpu_hit_tokens else 0) - n  # provisional keys
            need = n - (self.num_chunks - len(order) - mine)
            if need > 0:
                if need > len(order):  # the request's own keys too: the general path
                    self._mine.update(
                        keys[start if cpu_hit_tokens else next_store : store_chunks]
                    )
                    self._mine.difference_update(to_store)
                    if not self._evict(need, offer, keys):
                        counters.allocation_failures += 1
                        self._finish(keys)
                        return cpu_hit_tokens, 0, 0, 1, 0
                    self._insert(to_store)
                    counters.stored_chunks += n
                    counters.evicted_chunks += need
                    self._finish(keys)
                    return cpu_hit_tokens, n, need, 0, 0
                popitem = order.popitem
                for _ in range(need):
                    popitem(False)
                counters.evicted_chunks += need
            else:
                need = 0
            counters.stored_chunks += n
        else:
            need = 0
        # commit tail first, so the head is the most recent
        for key in reversed(keys[start if cpu_hit_tokens else next_store : store_chunks]):
            order[key] = None
        return cpu_hit_tokens, n, need, 0, 0

    @property
    def num_resident(self) -> int:
        return len(self._order) + len(self._mine)

    def resident_keys(self) -> list[ChunkKey]:
        return list(self._order)  # between requests every resident key is committed

    def _lookup(self, keys: Sequence[ChunkKey]) -> int:
        order = self._order
        count = 0
        for key in keys:
            if key not in order:
                break
            count += 1
        return count

    def _load(self, keys: Sequence[ChunkKey]) -> None:
        order = self._order
        for key in keys:  # raised to provisional
            del order[key]
        self._mine.update(keys)

    def _offer(self, offer: list[ChunkKey], retry: bool) -> list[ChunkKey]:
        order = self._order
        mine = self._mine
        reused = any(map(order.__contains__, offer))
        if reused:  # resident ready keys are reuse: raised to provisional
            found = list(filter(order.__contains__, offer))
            for key in found:
                del order[key]
            mine.update(found)
        # an offer holds keys of this request only after reuse or a failed offer
        return [k for k in offer if k not in mine] if reused or retry else offer

    def _evict(self, need: int, offer: Sequence[ChunkKey], keys: Sequence[ChunkKey]) -> bool:
        order = self._order
        if need <= len(order):  # the common case: the least recent committed keys
            popitem = order.popitem
            for _ in range(need):
                popitem(False)
            return True
        mine = self._mine
        protected = set(offer)
        own = [k for k in reversed(keys) if k in mine and k not in protected]  # tail first
        rest = need - len(order)
        if len(own) < rest:
            return False
        order.clear()
        mine.difference_update(own[:rest])
        return True

    def _insert(self, keys: list[ChunkKey]) -> None:
        self._mine.update(keys)

    def _finish(self, keys: Sequence[ChunkKey]) -> None:
        mine = self._mine
        if not mine:
            return
        order = self._order
        if len(mine) == len(keys):  # commit tail first, so the head is the most recent
            for key in reversed(keys):
                order[key] = None
        else:
            for key in reversed(keys):
                if key in mine:
                    order[key] = None
        mine.clear()
