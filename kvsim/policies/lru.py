"""vLLM 0.33's LRU: request-scoped recency with provisional ranks.

Ranks order chunks oldest-first. vLLM uses tuples ``(counter, -end_position)`` in a lazy
heap; here a rank is the int ``counter * POSITION_SPAN - end_position`` (same order), and
the order is kept without a heap, which gives the same victims much faster:

* *committed* keys carry a fresh rank ``(++counter, 0)``. Fresh ranks only grow, so an
  append-only log of ``(rank, key)`` holds them in rank order; an entry whose rank is no
  longer the key's rank is stale and skipped (ranks are never reused), so re-ranking a
  key is one append and nothing is deleted in the middle;
* a running request's keys carry its provisional rank ``(request counter, -position)``
  from its first access; they live in one small group per request, tail oldest;
* eviction walks the committed log merged with the groups, in increasing rank, skipping
  pinned, pending and protected chunks in place (``ref_cnt != 0``);
* ``on_request_finished`` commits fresh ranks tail first, so the head ends most recent;
* an access never demotes a chunk (ranks only rise); recency is independent of pinning.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from heapq import merge
from itertools import chain, islice
from operator import attrgetter, itemgetter

from kvsim.context import RequestContext, order_request_keys
from kvsim.policies.base import Chunk, ChunkMapPolicy, Key

POSITION_SPAN = 1 << 40
_REF = attrgetter("ref_cnt")
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


class LRUPolicy(ChunkMapPolicy):
    name = "lru"
    description = "vLLM 0.33 LRU: request-scoped recency, provisional ranks, tail evicted before head"
    tracks_evictability = False  # eviction reads ref_cnt directly

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._rank: dict[Key, int] = {}
        self._log: deque[tuple[int, Key]] = deque()  # committed (rank, key), oldest first; lazy
        # request rank base -> its provisional keys; a key is provisional iff its rank is
        # not a multiple of POSITION_SPAN, and its group is its rank rounded up to one.
        self._groups: dict[int, dict[Key, None]] = {}
        self._counter = 0
        self._newest_committed = 0  # the largest fresh rank handed out (an upper bound)
        self._generation = 0

    # --- ranks ---

    def _request_base(self, ctx: RequestContext) -> int:
        state = ctx.state.get(self)
        if state is None or state[0] != self._generation:
            self._counter += 1
            state = (self._generation, self._counter * POSITION_SPAN)
            ctx.state[self] = state
        return state[1]

    def _leave_group(self, key: Key, rank: int) -> None:
        base = -(-rank // POSITION_SPAN) * POSITION_SPAN
        group = self._groups[base]
        del group[key]
        if not group:
            del self._groups[base]

    def _commit(self, keys: list[Key]) -> None:
        """Give ``keys`` (resident, not provisional any more) fresh ranks, last = newest."""
        first = self._counter + 1
        self._counter += len(keys)
        ranks = range(first * POSITION_SPAN, (self._counter + 1) * POSITION_SPAN, POSITION_SPAN)
        self._rank.update(zip(keys, ranks))
        self._newest_committed = self._counter * POSITION_SPAN
        log = self._log
        log.extend(zip(ranks, keys))
        if len(log) > 2 * len(self.chunks) + 1024:
            rank = self._rank
            self._log = deque(e for e in log if rank.get(e[1]) == e[0])

    def _refresh(self, keys_newest_last: Iterable[Key]) -> None:
        """Fresh ranks in the order given: the last key becomes the most recent."""
        present = list(filter(self.chunks.__contains__, keys_newest_last))
        if not present:
            return
        groups = self._groups
        if groups:
            if len(groups) == 1:
                ((base, group),) = groups.items()
                if len(group) == len(present) and group.keys() == set(present):
                    # the finishing request's own group is exactly what it commits (cache mode)
                    groups.clear()
                    self._commit(present)
                    return
            rank = self._rank
            for key in present:
                r = rank[key]
                if r % POSITION_SPAN:
                    self._leave_group(key, r)
        self._commit(present)

    # --- interface ---

    def insert(self, key: Key, chunk: Chunk, ctx: RequestContext) -> None:
        self.insert_many((key,), (chunk,), ctx)

    def insert_many(self, keys: Sequence[Key], chunks: Sequence[Chunk], ctx: RequestContext) -> None:
        self.chunks.update(zip(keys, chunks))
        positions = ctx.positions
        if positions.keys() >= set(keys):  # the connector always knows positions
            base = self._request_base(ctx)
            group = self._groups.get(base)
            if group is None:
                group = self._groups[base] = {}
            group.update(dict.fromkeys(keys))
            self._rank.update(zip(keys, map(base.__sub__, map(positions.__getitem__, keys))))
            return
        for key in keys:
            position = positions.get(key)
            if position is None:
                self._commit([key])
            else:
                base = self._request_base(ctx)
                self._groups.setdefault(base, {})[key] = None
                self._rank[key] = base - position

    def remove(self, key: Key) -> None:
        del self.chunks[key]
        r = self._rank.pop(key)
        if r % POSITION_SPAN:
            self._leave_group(key, r)

    def touch(self, keys: Iterable[Key], ctx: RequestContext) -> None:
        self._refresh(reversed(list(keys)))

    def on_store_miss(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        """vLLM's default (``touch``) only re-ranks resident keys; store misses never are."""

    def on_request_access(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        base = self._request_base(ctx)  # the request's rank dates from its first access
        resident = list(filter(self.chunks.__contains__, keys))
        if not resident:
            return
        positions = ctx.positions
        rank = self._rank
        raised = [k for k in resident if k in positions and rank[k] < base - positions[k]]
        if not raised:
            return
        for key in raised:
            r = rank[key]
            if r % POSITION_SPAN:
                self._leave_group(key, r)
            # a committed key's log entry goes stale once its rank changes below
        group = self._groups.get(base)
        if group is None:
            group = self._groups[base] = {}
        group.update(dict.fromkeys(raised))
        rank.update(zip(raised, map(base.__sub__, map(positions.__getitem__, raised))))

    def on_request_finished(self, key_groups, insertion_only, reused, ctx) -> None:
        keys = key_groups[0] if len(key_groups) == 1 else order_request_keys(key_groups, ctx)
        self._refresh(reversed(keys))

    def clear(self) -> None:
        self.chunks.clear()
        self._rank.clear()
        self._log.clear()
        self._groups.clear()
        self._counter = 0
        self._newest_committed = 0
        self._generation += 1

    # --- eviction ---

    def _committed_in_order(self) -> Iterator[Key]:
        rank = self._rank
        return (k for r, k in self._log if rank.get(k) == r)

    def _committed_all_older(self) -> bool:
        """Every committed key is older than every provisional one (always so in cache mode).

        Committed ranks are at most the newest fresh rank handed out; a provisional rank
        ``base - position`` (``0 < position < POSITION_SPAN``) exceeds ``base - POSITION_SPAN``.
        """
        return self._newest_committed <= min(self._groups) - POSITION_SPAN

    def _in_rank_order(self) -> Iterator[Key]:
        if not self._groups:
            return self._committed_in_order()
        rank = self._rank
        if self._committed_all_older():
            tail = sorted((rank[k], k) for g in self._groups.values() for k in g)
            return chain(self._committed_in_order(), (k for _, k in tail))
        streams = [((rank[k], k) for k in self._committed_in_order())]
        for group in self._groups.values():
            streams.append(sorted((rank[k], k) for k in group))
        return (k for _, k in merge(*streams))

    def eviction_order(self) -> list[Key]:
        """Resident keys oldest first (for tests and inspection)."""
        return list(self._in_rank_order())

    def _evict_oldest_committed(self, n: int, protected: set) -> list[tuple[Key, Chunk]] | None:
        """Fast path: the n oldest committed keys, if all are evictable and unprotected."""
        log, rank, chunks = self._log, self._rank, self.chunks
        head = list(islice(log, n))
        if len(head) == n:
            keys = list(map(_SECOND, head))
            if (list(map(rank.get, keys)) == list(map(_FIRST, head)) and protected.isdisjoint(keys)
                    and list(map(_REF, map(chunks.__getitem__, keys))).count(0) == n):
                for _ in range(n):
                    log.popleft()
                deque(map(rank.__delitem__, keys), maxlen=0)
                return list(zip(keys, map(chunks.pop, keys)))
        picked: list[Key] = []
        popped = 0
        for r, k in log:
            popped += 1
            if rank.get(k) != r:
                continue  # stale
            if chunks[k].ref_cnt or k in protected:
                return None
            picked.append(k)
            if len(picked) == n:
                break
        else:
            return None
        for _ in range(popped):
            log.popleft()
        for k in picked:
            del rank[k]
        return list(zip(picked, map(chunks.pop, picked)))

    def evict(self, n: int, protected: set) -> list[tuple[Key, Chunk]] | None:
        if n <= 0:
            return []
        if not self._groups or self._committed_all_older():
            victims = self._evict_oldest_committed(n, protected)
            if victims is not None:
                return victims
        chunks = self.chunks
        picked: list[Key] = []
        for key in self._in_rank_order():
            if chunks[key].ref_cnt == 0 and key not in protected:
                picked.append(key)
                if len(picked) == n:
                    break
        else:
            return None
        rank = self._rank
        victims = []
        for key in picked:
            r = rank.pop(key)
            if r % POSITION_SPAN:
                self._leave_group(key, r)
            victims.append((key, chunks.pop(key)))
        return victims
