"""vLLM's LRU fused for requests that run one at a time (see :mod:`kvsim.cachemode.fused_tier`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvsim.cachemode.fused_tier import FusedTier
from kvsim.cachemode.tier import Emit, ReplayLoop, RunTotals
from kvsim.core.keys import ChunkKey, KeyLayout
from kvsim.policies.admission.base import AdmissionPolicy

if TYPE_CHECKING:  # numpy stays unloaded for a cached trace
    from kvsim.traces.columns import Record


class FusedLRUTier(FusedTier):
    """vLLM's LRU (§3.2) one request at a time.

    * a running request's keys are newer than every committed key (its provisional rank
      dates from its first access), and among themselves the tail is oldest;
    * eviction takes committed keys oldest first, then the request's own keys tail first;
    * at finish the request's resident keys are committed tail first, so the head is newest.

    So the state is one ordered dict of committed keys, least recent first, and the set of
    the running request's resident keys, which leave the dict while the request runs
    (:meth:`run_whole_blocks` leaves its loaded keys in place instead, and evicts after
    the commit).
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
        # the common case (every offer admitted, one offer per request) has its own loop
        self._plain = not (self._records or self._filters or prefill_step)

    def whole_run_loop(self) -> ReplayLoop | None:
        """:meth:`run_whole_blocks` for a plain tier (every offer admitted at once: no
        admission filter, no chunked prefill), else None."""
        return self.run_whole_blocks if self._plain else None

    def run_whole_blocks(
        self,
        records: Iterable[Record],
        emit: Emit,
    ) -> RunTotals:
        """Replay ``records`` where a chunk is one trace block and nothing sits before the
        CPU tier (no GPU prefix cache): :meth:`serve` with ``local_tokens=0`` and every
        complete chunk offered, inlined into one loop, since per-request calls cost as
        much as the dict operations themselves on a typical trace. Each request's row
        (the driver's ``REQUEST_COLUMNS``) goes to ``emit``. Only for a plain tier
        (:meth:`whole_run_loop`); the rare store that evicts the request's own keys
        takes :meth:`_store_evicting_own`, by the general rules.

        This is the one other copy of :meth:`Tier.serve`'s sequence, kept because it
        earns its keep on the command users run most (``docs/speed.md``);
        ``tests/cachemode/test_replay_fused.py`` checks it against the protocol tier."""
        assert self._plain
        unit_keys = KeyLayout(self.chunk_tokens, self.chunk_tokens).unit_keys  # a chunk is a block
        order = self._order
        resident = order.keys()  # a live view
        popitem = order.popitem
        move_to_end = order.move_to_end
        take_reused = self._take_reused
        capacity = self.num_chunks
        sizes: list[int] = []
        n_req = n_tokens = n_blocks = n_hit = n_stored = n_evicted = n_failed = 0
        for request_id, arrival_s, input_tokens, _, block_hashes, _ in records:
            keys: Sequence[ChunkKey] = unit_keys(block_hashes, input_tokens)
            n = len(keys)
            count = 0  # the connector's scan: the resident prefix, loaded
            for key in keys:
                if key not in order:
                    break
                count += 1
            stored = need = failed = 0
            if n > count:
                offer = keys[count:]
                to_store = offer if resident.isdisjoint(offer) else take_reused(offer)
                stored = len(to_store)
                if stored:
                    sizes.append(stored)
                    committed = len(order) - count  # the loaded keys are provisional
                    # keys that are not new are the request's provisional keys
                    need = stored - (capacity - committed - (n - stored))
                    if need > committed:
                        stored, need, failed = self._store_own(keys, count, to_store, need)
                        keys = offer = ()  # committed, its victims evicted
                    elif need < 0:
                        need = 0
                for key in reversed(offer):  # commit tail first: the head is newest
                    order[key] = None
            for key in reversed(keys[:count]):
                move_to_end(key)
            if keys:
                # the victims: the least recent committed keys. Evicting them after the
                # commit rather than before (as serve does) takes the same keys, since
                # every key of this request is now newer than every committed one
                for _ in range(need):
                    popitem(False)
            n_req += 1
            n_tokens += input_tokens
            n_blocks += n
            n_hit += count
            n_stored += stored
            n_evicted += need
            n_failed += failed
            emit((request_id, arrival_s, input_tokens, n, 0, count, stored, need, 0, failed > 0))
        counters = self.counters
        counters.loaded_chunks += n_hit
        counters.stored_chunks += n_stored
        counters.evicted_chunks += n_evicted
        counters.allocation_sizes.observe_all(sizes)
        return n_req, n_tokens, n_blocks, 0, n_hit, n_stored, n_evicted, n_failed

    def _take_reused(self, offer: Sequence[ChunkKey]) -> Sequence[ChunkKey]:
        """Resident keys offered again are reuse (raised to provisional); the rest."""
        order = self._order
        if not any(map(order.__contains__, offer)):
            return offer
        found = list(filter(order.__contains__, offer))
        for key in found:
            del order[key]
        reused = set(found)
        return [k for k in offer if k not in reused]

    def _store_own(
        self, keys: Sequence[ChunkKey], count: int, to_store: Sequence[ChunkKey], need: int
    ) -> tuple[int, int, int]:
        """:meth:`_store_evicting_own` for :meth:`run_whole_blocks`, whose ``count`` loaded
        keys are still in the dict: they leave it first, as :meth:`serve` has them.
        Returns ``(stored, evicted, failed)``."""
        order = self._order
        for key in keys[:count]:
            del order[key]
        if self._store_evicting_own(keys, keys[count:], to_store, 0, len(keys), need):
            return 0, 0, 1
        return len(to_store), need, 0

    def _store_evicting_own(
        self,
        keys: Sequence[ChunkKey],
        offer: Sequence[ChunkKey],
        to_store: Sequence[ChunkKey],
        first: int,
        end: int,
        need: int,
    ) -> int:
        """The rare store that must evict the request's own keys too, by the general
        path's rules, and the request's finish; returns 1 if the allocation failed (the
        caller counts what was stored and evicted)."""
        mine = self._mine
        mine.update(keys[first:end])
        mine.difference_update(to_store)
        counters = self.counters
        failed = not self._evict(need, offer, keys)
        if failed:
            counters.allocation_failures += 1
        else:
            self._insert(to_store)
        self._finish(keys)
        return int(failed)

    @property
    def num_resident(self) -> int:
        return len(self._order) + len(self._mine)

    def resident_keys(self) -> list[ChunkKey]:
        return list(self._order)  # between requests every resident key is committed

    def _lookup(self, keys: Sequence[ChunkKey], ctx: Any = None) -> int:
        order = self._order
        count = 0
        for key in keys:
            if key not in order:
                break
            count += 1
        return count

    def _reuse(self, keys: Sequence[ChunkKey]) -> None:
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

    def _insert(self, keys: Sequence[ChunkKey]) -> None:
        self._mine.update(keys)

    def _finish(self, keys: Sequence[ChunkKey], ctx: Any = None) -> None:
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
