"""vLLM 0.33's LRU: request-scoped recency with provisional ranks (semantics doc §3.2).

Every resident key has a rank; the smallest rank is the least recent and is evicted first.
Ranks are vLLM's pairs, compared in order, drawn from one counter ``n``:

* a *committed* key has a fresh rank ``(n, 0)``: inserted without a known position,
  touched, or committed when a request that observed it finished;
* a running request takes its own ``n`` at its first access (or positioned insert), and
  each key it stores or accesses gets the provisional rank ``(n, -end_position)``: the
  request is as old as its first access and its tail is older than its head. An access
  only ever raises a rank, so an older request cannot demote a newer one's chunk.

At a request's finish its keys are committed tail first, so the head ends most recent.
Fresh ranks only grow, so committed keys live in one ``OrderedDict``, least recent first,
and committing is a move to its end. Provisional keys (those of running requests) are
sorted only when eviction reaches them, and merged with the committed order when a running
request is older than a commit. Eviction passes over pinned, pending and protected chunks
in place (``ref_cnt != 0``), so recency is independent of pinning, and is atomic: when
``n`` victims cannot be found nothing changes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from heapq import merge
from itertools import chain, islice

from kvsim.core.context import RequestContext, order_request_keys
from kvsim.core.keys import ChunkKey
from kvsim.policies.base import Chunk, ChunkMapPolicy

Rank = tuple[int, int]  # (counter, -end_position); a committed key's is (counter, 0)


class LRUPolicy(ChunkMapPolicy):
    """vLLM 0.33's ``lru``, decision for decision (the default, the reference for the others)."""

    name = "lru"
    description = (
        "vLLM 0.33 LRU: request-scoped recency, provisional ranks, tail evicted before head"
    )
    tracks_evictability = False  # eviction reads ref_cnt directly

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._committed: OrderedDict[ChunkKey, int] = OrderedDict()  # key -> counter, oldest first
        self._provisional: dict[ChunkKey, Rank] = {}  # running requests' keys
        # the smallest counter among the provisional ranks, None when not known (recomputed
        # by eviction; cheap to keep, where taking it each time costs a pass over them all)
        self._oldest_running: int | None = None
        self._counter = 0
        self._generation = 0  # bumped by clear(), so requests take a new rank afterwards

    # --- ranks ---

    def _request_rank(self, ctx: RequestContext) -> int:
        """The request's counter, taken the first time this policy sees it (per generation)."""
        state = ctx.state.get(self)
        if state is None or state[0] != self._generation:
            self._counter += 1
            state = ctx.state[self] = (self._generation, self._counter)
        return state[1]

    def _rank(self, key: ChunkKey) -> Rank:
        n = self._committed.get(key)
        return (n, 0) if n is not None else self._provisional[key]

    def _commit(self, key: ChunkKey) -> None:
        """A fresh rank: ``key`` becomes the most recent of all."""
        self._unrank(self._provisional.pop(key, None))
        self._committed.pop(key, None)
        self._counter += 1
        self._committed[key] = self._counter

    def _make_provisional(self, key: ChunkKey, rank: Rank) -> None:
        self._committed.pop(key, None)
        self._unrank(self._provisional.get(key))
        self._provisional[key] = rank
        oldest = self._oldest_running
        if oldest is not None and rank[0] < oldest:
            self._oldest_running = rank[0]

    def _unrank(self, rank: Rank | None) -> None:
        """A provisional rank leaves: the cached oldest may have gone with it."""
        if rank is not None and rank[0] == self._oldest_running:
            self._oldest_running = None

    def _forget(self, key: ChunkKey) -> None:
        if self._committed.pop(key, None) is None:
            self._unrank(self._provisional.pop(key))

    # --- interface ---

    def insert(self, key: ChunkKey, chunk: Chunk, ctx: RequestContext) -> None:
        self.chunks[key] = chunk
        position = ctx.positions.get(key)
        if position is None:
            self._commit(key)
        else:
            self._make_provisional(key, (self._request_rank(ctx), -position))

    def remove(self, key: ChunkKey) -> None:
        del self.chunks[key]
        self._forget(key)

    def touch(self, keys: Iterable[ChunkKey], ctx: RequestContext) -> None:
        """Fresh ranks in reverse, so the first key ends most recent; absent keys are ignored."""
        chunks = self.chunks
        for key in reversed(list(keys)):
            if key in chunks:
                self._commit(key)

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """vLLM's default (``touch``) re-ranks only resident keys, and store misses never are."""

    def on_request_access(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        request = self._request_rank(ctx)  # the request dates from its first access
        chunks, positions = self.chunks, ctx.positions
        for key in keys:
            position = positions.get(key)
            if position is None or key not in chunks:
                continue
            rank = (request, -position)
            if rank > self._rank(key):  # raise only: never demote
                self._make_provisional(key, rank)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[ChunkKey]],
        insertion_only: AbstractSet[ChunkKey],
        reused: AbstractSet[ChunkKey],
        ctx: RequestContext,
    ) -> None:
        keys = key_groups[0] if len(key_groups) == 1 else order_request_keys(key_groups, ctx)
        self.touch(keys, ctx)  # tail first, so the head ends most recent; a store is a use too

    def clear(self) -> None:
        self.chunks.clear()
        self._committed.clear()
        self._provisional.clear()
        self._oldest_running = None
        self._counter = 0
        self._generation += 1

    # --- eviction ---

    def _oldest_first(self) -> Iterator[ChunkKey]:
        committed = self._committed
        provisional = self._provisional
        if not provisional:
            return iter(committed)
        oldest = self._oldest_running
        if oldest is None:
            oldest = self._oldest_running = min(provisional.values())[0]
        if not committed or next(reversed(committed.values())) < oldest:
            # the usual case: every running request started after the last commit, so the
            # provisional keys are sorted only if eviction gets past every committed one
            # (requests waiting on promotions can hold thousands of them)
            return chain(committed, self._provisional_oldest_first())
        running = sorted((rank, key) for key, rank in provisional.items())
        ranked = (((n, 0), key) for key, n in committed.items())
        return (key for _, key in merge(ranked, running))

    def _provisional_oldest_first(self) -> Iterator[ChunkKey]:
        """A generator: nothing is sorted until the first key is asked for."""
        for _, key in sorted((rank, key) for key, rank in self._provisional.items()):
            yield key

    def eviction_order(self) -> list[ChunkKey]:
        """Resident keys, least recent first (for tests and inspection)."""
        return list(self._oldest_first())

    def evict(
        self, n: int, protected: AbstractSet[ChunkKey]
    ) -> list[tuple[ChunkKey, Chunk]] | None:
        if n <= 0:
            return []
        chunks = self.chunks
        usable = (k for k in self._oldest_first() if chunks[k].ref_cnt == 0 and k not in protected)
        picked = list(islice(usable, n))
        if len(picked) < n:
            return None
        for key in picked:
            self._forget(key)
        return [(key, chunks.pop(key)) for key in picked]
