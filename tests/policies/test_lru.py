"""LRUPolicy on its own: vLLM 0.33's request-scoped recency (semantics doc §3.2)."""

from __future__ import annotations

from support import ready, victims

from kvsim.core.context import RequestContext
from kvsim.policies.base import Chunk
from kvsim.policies.lru import LRUPolicy


def test_insertion_order_without_positions():
    p = LRUPolicy(8)
    ready(p, [1, 2, 3, 4])
    assert victims(p, 2) == [1, 2]
    assert sorted(p.keys()) == [3, 4] and len(p) == 2


def test_touch_makes_first_key_most_recent():
    p = LRUPolicy(8)
    ready(p, [1, 2, 3, 4])
    p.touch([2, 1], RequestContext("t"))  # head = MRU: 2 newest, then 1
    p.touch([99], RequestContext("t"))  # non-resident keys are ignored
    assert victims(p, 4) == [3, 4, 1, 2]


def test_running_request_evicts_tail_first_then_commits_at_finish():
    p = LRUPolicy(8)
    ctx = RequestContext("r", {1: 16, 2: 32, 3: 48})
    ready(p, [1, 2, 3], ctx)
    ready(p, [9])  # a fresh rank after the request's first access: newer than all of r
    assert victims(p, 1) == [3]
    p.on_request_finished(([1, 2],), {1, 2}, set(), ctx)  # commit: tail first, head newest
    assert victims(p, 3) == [9, 2, 1]


def test_access_never_demotes():
    p = LRUPolicy(8)
    old = RequestContext("old", {1: 16})
    ready(p, [1], old)  # old's request rank is taken here
    new = RequestContext("new", {2: 16, 3: 32})
    ready(p, [2, 3], new)
    old.set_key_position(3, 32)
    p.on_request_access([3], old)  # older request: would be a demotion, ignored
    assert victims(p, 3) == [1, 3, 2]


def test_access_raises_an_older_chunk():
    p = LRUPolicy(8)
    ready(p, [1, 2])
    newer = RequestContext("n", {1: 16})
    p.on_request_access([1], newer)
    assert victims(p, 2) == [2, 1]


def test_evict_skips_pinned_pending_and_protected():
    p = LRUPolicy(8)
    ready(p, [1, 2, 3, 4])
    p.get(1).ref_cnt = 2  # pinned by two loads
    p.mark_non_evictable(1)
    p.insert(5, Chunk(9), RequestContext("x"))  # pending write (ref -1)
    assert victims(p, 2, protected=[2]) == [3, 4]
    assert victims(p, 1, protected=[2]) is None


def test_recency_is_independent_of_pinning():
    p = LRUPolicy(8)
    ready(p, [1, 2, 3])
    p.get(1).ref_cnt = 1
    p.mark_non_evictable(1)
    assert victims(p, 1) == [2]
    p.get(1).ref_cnt = 0
    p.mark_evictable(1)  # unpinned later, but still the oldest
    assert victims(p, 1) == [1]


def test_failed_evict_is_atomic():
    p = LRUPolicy(8)
    ready(p, [1, 2, 3])
    p.get(2).ref_cnt = 1
    p.mark_non_evictable(2)
    before = sorted(p.keys())
    assert victims(p, 3) is None
    assert sorted(p.keys()) == before
    assert victims(p, 2) == [1, 3]  # the order survived the failed attempt


def test_remove_and_clear():
    p = LRUPolicy(4)
    ctx = RequestContext("r", {1: 16, 2: 32})
    p.insert(1, Chunk(0), ctx)
    p.insert(2, Chunk(1), ctx)
    p.remove(2)  # a failed store of a provisional chunk
    assert p.get(2) is None and list(p.keys()) == [1]
    p.clear()
    assert len(p) == 0 and p.get(1) is None and victims(p, 1) is None
    ready(p, [5])
    ctx.set_key_position(7, 16)
    ready(p, [7], ctx)  # the pre-clear request rank is forgotten: 7 is newer than 5
    assert victims(p, 2) == [5, 7]


def test_running_requests_interleave_with_commits_by_rank():
    """A running request is as old as its first access: commits before it are older, later
    ones newer, whatever is still running (§3.2)."""
    p = LRUPolicy(8)
    ready(p, [1])  # committed (1, 0)
    a = RequestContext("a", {10: 16, 11: 32})
    ready(p, [10, 11], a)  # a's rank 2: 11 (2, -32) before 10 (2, -16)
    ready(p, [2])  # (3, 0)
    b = RequestContext("b", {20: 16, 21: 32, 10: 48})
    ready(p, [20, 21], b)  # b's rank 4
    ready(p, [3])  # (5, 0)
    assert p.eviction_order() == [1, 11, 10, 2, 21, 20, 3]
    p.on_request_access([10], b)  # raised to (4, -48): older than b's own tail 21
    assert p.eviction_order() == [1, 11, 2, 10, 21, 20, 3]
    p.on_request_finished(([10, 11],), set(), set(), a)  # commits 11 then 10: both newest
    assert p.eviction_order() == [1, 2, 21, 20, 3, 11, 10]
    assert victims(p, 3, protected=[2]) == [1, 21, 20]


def test_eviction_order_is_the_rank_order_under_random_requests():
    """Random inserts, accesses, finishes, touches, removals and evictions by several
    interleaved requests: the eviction order is always every resident key sorted by rank
    (committed ``(n, 0)``, provisional ``(request, -position)``), so the shortcuts in
    ``_oldest_first`` (the cached oldest running request, the lazy sort) never reorder."""
    import random

    for seed in range(40):
        rng = random.Random(seed)
        p = LRUPolicy(10_000)
        requests: dict[int, tuple[RequestContext, list[int]]] = {}
        next_key = iter(range(1, 10**6))
        for _ in range(300):
            op = rng.random()
            if op < 0.25 or not requests:  # a request inserts its chunks with positions
                rid = len(requests) + 1000 * seed
                keys = [next(next_key) for _ in range(rng.randint(1, 6))]
                ctx = RequestContext(rid, {k: 16 * (i + 1) for i, k in enumerate(keys)})
                requests[rid] = (ctx, keys)
                ready(p, keys, ctx, start_id=keys[0] * 10)
            elif op < 0.35:  # a running request (maybe an old one) stores more chunks
                ctx, keys = rng.choice(list(requests.values()))
                more = [next(next_key) for _ in range(rng.randint(1, 3))]
                for i, k in enumerate(more):
                    ctx.positions[k] = 16 * (len(keys) + i + 1)
                keys.extend(more)
                ready(p, more, ctx, start_id=more[0] * 10)
            elif op < 0.45:  # a running request accesses keys (its own or resident others)
                ctx, keys = rng.choice(list(requests.values()))
                resident = list(p.keys())
                extra = rng.sample(resident, min(3, len(resident)))
                for i, k in enumerate(extra):
                    ctx.positions.setdefault(k, 16 * (len(keys) + i + 1))
                p.on_request_access(keys + extra, ctx)
            elif op < 0.65:  # a request finishes
                rid = rng.choice(list(requests))
                ctx, keys = requests.pop(rid)
                p.on_request_finished([[k for k in keys if k in p.chunks]], set(), set(), ctx)
            elif op < 0.75 and len(p):
                p.touch(rng.sample(list(p.keys()), 1), RequestContext("t"))
            elif op < 0.85 and len(p):
                p.remove(rng.choice(list(p.keys())))
            elif len(p):
                p.evict(rng.randint(1, 3), set())
            expected = sorted(p.keys(), key=p._rank)
            assert p.eviction_order() == expected, seed
            grouped = {
                key: (n, -pos) for n, group in p._groups.items() for key, pos in group.items()
            }
            assert grouped == p._provisional and all(p._groups.values()), seed
