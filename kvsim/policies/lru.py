"""vLLM 0.33's LRU: request-scoped recency with provisional ranks.

Ranks order chunks oldest-first. vLLM uses tuples ``(counter, -end_position)`` in a lazy
heap; here a rank is the int ``counter * POSITION_SPAN - end_position`` (same order), and
the order is kept without a heap, which gives the same victims much faster:

* *committed* keys carry a fresh rank ``(++counter, 0)``; fresh ranks only grow, so an
  insertion-ordered dict holds them in rank order;
* a running request's keys carry its provisional rank ``(request counter, -position)``
  from its first access; they live in one small group per request, tail oldest;
* eviction walks the merge of the committed order and the groups, in increasing rank,
  skipping pinned, pending and protected chunks in place (``ref_cnt != 0``);
* ``on_request_finished`` commits fresh ranks tail first, so the head ends most recent;
* an access never demotes a chunk (ranks only rise); recency is independent of pinning.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from heapq import merge
from itertools import chain, islice
from operator import attrgetter

from kvsim.context import RequestContext, order_request_keys
from kvsim.policies.base import Chunk, ChunkMapPolicy, Key

POSITION_SPAN = 1 << 40
_REF = attrgetter("ref_cnt")


class LRUPolicy(ChunkMapPolicy):
    name = "lru"
    description = "vLLM 0.33 LRU: request-scoped recency, provisional ranks, tail evicted before head"
    tracks_evictability = False  # eviction reads ref_cnt directly

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._rank: dict[Key, int] = {}
        self._committed: OrderedDict[Key, None] = OrderedDict()
        # request rank base -> its provisional keys; a key is provisional iff its rank is
        # not a multiple of POSITION_SPAN, and its group is its rank rounded up to one.
        self._groups: dict[int, dict[Key, None]] = {}
        self._counter = 0
        self._generation = 0

    # --- ranks ---

    def _request_base(self, ctx: RequestContext) -> int:
        state = ctx.state.get(self)
        if state is None or state[0] != self._generation:
            self._counter += 1
            state = (self._generation, self._counter * POSITION_SPAN)
            ctx.state[self] = state
        return state[1]

    def _detach(self, key: Key) -> None:
        rank = self._rank[key]
        if rank % POSITION_SPAN == 0:
            del self._committed[key]
        else:
            base = -(-rank // POSITION_SPAN) * POSITION_SPAN
            group = self._groups[base]
            del group[key]
            if not group:
                del self._groups[base]

    def _refresh(self, keys_newest_last: Iterable[Key]) -> None:
        """Fresh ranks in the order given: the last key becomes the most recent."""
        chunks = self.chunks
        present = list(filter(chunks.__contains__, keys_newest_last))
        if not present:
            return
        rank = self._rank
        committed = self._committed
        groups = self._groups
        if len(groups) == 1:
            ((base, group),) = groups.items()
            if len(group) == len(present) and group.keys() == set(present):
                # the finishing request's own group is exactly what it commits (cache mode)
                del groups[base]
                groups = None
        provisional = [k for k in present if rank[k] % POSITION_SPAN] if groups else ()
        if groups is None:
            pass
        elif provisional:
            leaving = set(provisional)
            for base, group in list(groups.items()):
                if group.keys() <= leaving:
                    del groups[base]  # usually the finishing request's whole group
                else:
                    for key in leaving.intersection(group):
                        del group[key]
                    if not group:
                        del groups[base]
            if len(provisional) < len(present):
                pop = committed.pop
                for key in present:
                    if key not in leaving:
                        pop(key)
        else:
            pop = committed.pop
            for key in present:
                pop(key)
        committed.update(dict.fromkeys(present))
        first = self._counter + 1
        self._counter += len(present)
        rank.update(zip(present, range(first * POSITION_SPAN, (self._counter + 1) * POSITION_SPAN, POSITION_SPAN)))

    def _place_provisional(self, key: Key, base: int, position: int) -> None:
        group = self._groups.get(base)
        if group is None:
            group = self._groups[base] = {}
        group[key] = None
        self._rank[key] = base - position

    # --- interface ---

    def insert(self, key: Key, chunk: Chunk, ctx: RequestContext) -> None:
        self.insert_many((key,), (chunk,), ctx)

    def insert_many(self, keys: Sequence[Key], chunks: Sequence[Chunk], ctx: RequestContext) -> None:
        resident = self.chunks
        resident.update(zip(keys, chunks))
        positions = ctx.positions
        if positions.keys() >= set(keys):  # the connector always knows positions
            base = self._request_base(ctx)
            group = self._groups.get(base)
            if group is None:
                group = self._groups[base] = {}
            group.update(dict.fromkeys(keys))
            self._rank.update(zip(keys, map(base.__sub__, map(positions.__getitem__, keys))))
            return
        base = None
        for key in keys:
            position = positions.get(key)
            if position is None:
                self._counter += 1
                self._rank[key] = self._counter * POSITION_SPAN
                self._committed[key] = None
            else:
                if base is None:
                    base = self._request_base(ctx)
                self._place_provisional(key, base, position)

    def remove(self, key: Key) -> None:
        del self.chunks[key]
        self._detach(key)  # reads the rank
        del self._rank[key]

    def touch(self, keys: Iterable[Key], ctx: RequestContext) -> None:
        self._refresh(reversed(list(keys)))

    def on_store_miss(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        """vLLM's default (``touch``) only re-ranks resident keys; store misses never are."""

    def on_request_access(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        base = self._request_base(ctx)  # the request's rank dates from its first access
        chunks = self.chunks
        positions = ctx.positions
        rank = self._rank
        resident = list(filter(chunks.__contains__, keys))
        if not resident:
            return
        raised = [k for k in resident if k in positions and rank[k] < base - positions[k]]
        if not raised:
            return
        committed = self._committed
        for key in raised:
            if rank[key] % POSITION_SPAN:
                self._detach(key)
            else:
                del committed[key]
        group = self._groups.get(base)
        if group is None:
            group = self._groups[base] = {}
        group.update(dict.fromkeys(raised))
        rank.update([(k, base - positions[k]) for k in raised])

    def on_request_finished(self, key_groups, insertion_only, reused, ctx) -> None:
        keys = key_groups[0] if len(key_groups) == 1 else order_request_keys(key_groups, ctx)
        self._refresh(reversed(keys))

    def clear(self) -> None:
        self.chunks.clear()
        self._rank.clear()
        self._committed.clear()
        self._groups.clear()
        self._counter = 0
        self._generation += 1

    def _committed_all_older(self) -> bool:
        """Every committed key is older than every provisional one (always so in cache mode).

        A provisional rank ``base - position`` with ``0 < position < POSITION_SPAN`` lies
        strictly between ``base - POSITION_SPAN`` and ``base``, so comparing the newest
        committed rank with the oldest group's base decides it.
        """
        committed = self._committed
        return not committed or self._rank[next(reversed(committed))] <= min(self._groups) - POSITION_SPAN

    def _in_rank_order(self) -> Iterator[Key]:
        committed = self._committed
        if not self._groups:
            return iter(committed)
        rank = self._rank
        if self._committed_all_older():
            # every committed key is older than every provisional one (always so in cache mode)
            tail = sorted((rank[k], k) for g in self._groups.values() for k in g)
            return chain(committed, (k for _, k in tail))
        streams = [((rank[k], k) for k in self._committed)]
        for group in self._groups.values():
            streams.append(sorted((rank[k], k) for k in group))
        return (k for _, k in merge(*streams))

    def eviction_order(self) -> list[Key]:
        """Resident keys oldest first (for tests and inspection)."""
        return list(self._in_rank_order())

    def evict(self, n: int, protected: set) -> list[tuple[Key, Chunk]] | None:
        if n <= 0:
            return []
        chunks = self.chunks
        committed = self._committed
        rank = self._rank
        if len(committed) >= n and (not self._groups or self._committed_all_older()):
            # Fast path: the n oldest committed keys, if all evictable and unprotected.
            head = list(islice(committed, n))
            if (len(head) == n and protected.isdisjoint(head)
                    and list(map(_REF, map(chunks.__getitem__, head))).count(0) == n):
                for _ in range(n):
                    committed.popitem(last=False)
                deque(map(rank.pop, head), maxlen=0)
                return list(zip(head, map(chunks.pop, head)))
        picked: list[Key] = []
        for key in self._in_rank_order():
            if chunks[key].ref_cnt == 0 and key not in protected:
                picked.append(key)
                if len(picked) == n:
                    break
        else:
            return None
        victims = []
        for key in picked:
            self._detach(key)
            del rank[key]
            victims.append((key, chunks.pop(key)))
        return victims
