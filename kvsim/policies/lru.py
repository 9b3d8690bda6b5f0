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
        # the same keys grouped by their request's counter: request -> {key: end position}.
        # Eviction walks the requests oldest first and sorts only the groups it reaches (a
        # few dozen keys each), where sorting every provisional key cost a fifth of a run
        self._groups: dict[int, dict[ChunkKey, int]] = {}
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
        self._unrank(key, self._provisional.pop(key, None))
        self._committed.pop(key, None)
        self._counter += 1
        self._committed[key] = self._counter

    def _make_provisional(self, key: ChunkKey, rank: Rank) -> None:
        self._committed.pop(key, None)
        self._unrank(key, self._provisional.get(key))
        self._provisional[key] = rank
        group = self._groups.get(rank[0])
        if group is None:
            group = self._groups[rank[0]] = {}
        group[key] = -rank[1]

    def _unrank(self, key: ChunkKey, rank: Rank | None) -> None:
        """``key`` leaves its request's group (if it had a provisional rank)."""
        if rank is not None:
            group = self._groups[rank[0]]
            del group[key]
            if not group:
                del self._groups[rank[0]]

    def _forget(self, key: ChunkKey) -> None:
        if self._committed.pop(key, None) is None:
            self._unrank(key, self._provisional.pop(key))

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
        self._groups.clear()
        self._counter = 0
        self._generation += 1

    # --- eviction ---

    def _oldest_first(self) -> Iterator[ChunkKey]:
        committed = self._committed
        if not self._groups:
            return iter(committed)
        requests = sorted(self._groups)  # the running requests' counters, oldest first
        if not committed or next(reversed(committed.values())) < requests[0]:
            # every running request started after the last commit: its keys come after all
            # committed ones (and are sorted only if eviction gets that far)
            return chain(committed, self._requests_oldest_first(requests))
        return self._merged(requests)

    def _requests_oldest_first(self, requests: list[int]) -> Iterator[ChunkKey]:
        """The keys of these requests' groups, in rank order: a generator, so a group is
        sorted only when eviction reaches it (tail first; equal positions by key)."""
        groups = self._groups
        for n in requests:
            for _, key in sorted((-pos, key) for key, pos in groups[n].items()):
                yield key

    def _merged(self, requests: list[int]) -> Iterator[ChunkKey]:
        """Committed keys and running requests' keys, in rank order: a request's group comes
        just before the first committed key that is newer than the request."""
        i, last = 0, len(requests)
        for key, n in self._committed.items():
            if i < last and requests[i] < n:
                j = i + 1
                while j < last and requests[j] < n:
                    j += 1
                yield from self._requests_oldest_first(requests[i:j])
                i = j
            yield key
        if i < last:
            yield from self._requests_oldest_first(requests[i:])

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
