"""The eviction-policy contract, run against every registered policy.

Parametrised over ``EVICTION_POLICIES`` at collection time, so a newly registered policy
is enrolled automatically. The policy is driven directly with Chunk objects, the way the
offload manager drives it (semantics doc §3.1): get/insert/remove, atomic evict(n,
protected) that returns exactly n evictable unprotected chunks or None with no change,
clear, keys/len, and the optional hooks with and without key positions.
"""

from __future__ import annotations

import random

import pytest
from support import ready

from kvsim.core.context import RequestContext
from kvsim.policies.base import Chunk, EvictionPolicy
from kvsim.policies.registry import EVICTION_POLICIES

POLICIES = sorted(EVICTION_POLICIES)


@pytest.fixture(params=POLICIES)
def policy_cls(request) -> type[EvictionPolicy]:
    return EVICTION_POLICIES[request.param]


def ctx_with_positions(name, keys):
    return RequestContext(name, {k: (i + 1) * 16 for i, k in enumerate(keys)})


def snapshot(policy):
    keys = list(policy.keys())
    return keys, {k: (policy.get(k).chunk_id, policy.get(k).ref_cnt) for k in keys}


def test_registered_under_its_name(policy_cls):
    assert issubclass(policy_cls, EvictionPolicy)
    assert policy_cls.name and EVICTION_POLICIES[policy_cls.name] is policy_cls
    assert isinstance(policy_cls.description, str) and policy_cls.description


@pytest.mark.parametrize("positions", [False, True])
def test_get_insert_remove(policy_cls, positions):
    p = policy_cls(8)
    keys = [11, 12, 13]
    ctx = ctx_with_positions("r", keys) if positions else RequestContext("r")
    chunks = [Chunk(i) for i in range(3)]
    for key, chunk in zip(keys, chunks):
        p.insert(key, chunk, ctx)
    assert [p.get(k) for k in keys] == chunks  # the very objects, still pending
    assert p.get(99) is None
    assert sorted(p.keys()) == keys and len(p) == 3
    p.remove(12)  # a failed store
    assert p.get(12) is None and sorted(p.keys()) == [11, 13] and len(p) == 2
    assert p.evict(1, set()) is None  # pending chunks are never evictable


@pytest.mark.parametrize("positions", [False, True])
def test_evict_returns_exactly_n_evictable_unprotected(policy_cls, positions):
    p = policy_cls(8)
    keys = list(range(1, 9))
    ctx = ctx_with_positions("r", keys) if positions else RequestContext("r")
    for i, key in enumerate(keys):
        ready(p, [key], ctx, start_id=i)
    p.get(1).ref_cnt = 1
    p.mark_non_evictable(1)
    victims = p.evict(3, {2, 3})
    assert victims is not None and len(victims) == 3
    got = [k for k, _ in victims]
    assert len(set(got)) == 3 and not set(got) & {1, 2, 3}
    for key, chunk in victims:
        assert chunk.ref_cnt == 0 and chunk.chunk_id == key - 1
        assert p.get(key) is None
    assert len(p) == 5 and sorted(p.keys()) == sorted(set(keys) - set(got))
    assert p.evict(0, set()) == []


def test_evict_is_atomic_when_short(policy_cls):
    p = policy_cls(6)
    ctx = RequestContext("r")
    for i in range(6):
        ready(p, [i], ctx, start_id=i)
    p.insert(6, Chunk(6), ctx)  # one pending chunk on top (over capacity is the manager's concern)
    p.get(0).ref_cnt = 1
    p.mark_non_evictable(0)
    before = snapshot(p)
    assert p.evict(4, {1, 2}) is None  # only 3, 4, 5 qualify
    assert snapshot(p) == before
    got = sorted(k for k, _ in p.evict(3, {1, 2}))
    assert got == [3, 4, 5]


@pytest.mark.parametrize("seed", range(12))
def test_random_states_never_yield_ineligible_victims(policy_cls, seed):
    rng = random.Random(seed)
    cap = rng.randint(2, 10)
    p = policy_cls(cap)
    positioned = seed % 2 == 0
    next_id = 0
    for rnd in range(4):
        keys = [rnd * 100 + i for i in range(rng.randint(1, cap))]
        ctx = ctx_with_positions(f"r{rnd}", keys) if positioned else RequestContext(f"r{rnd}")
        for key in keys:
            if len(p) >= cap:
                break
            if rng.random() < 0.2:
                p.insert(key, Chunk(next_id), ctx)  # stays pending
            else:
                ready(p, [key], ctx, start_id=next_id)
            next_id += 1
        resident = list(p.keys())
        p.on_request_access(resident[: rng.randint(0, len(resident))], ctx)
        if rng.random() < 0.5:
            p.touch(rng.sample(resident, rng.randint(0, len(resident))), ctx)
        p.on_request_finished((resident[: rng.randint(0, len(resident))],), set(), set(), ctx)
        for key in resident:
            c = p.get(key)
            if c.ref_cnt == 0 and rng.random() < 0.3:
                c.ref_cnt = 1
                p.mark_non_evictable(key)
        protected = set(rng.sample(resident, rng.randint(0, len(resident))))
        eligible = {k for k in p.keys() if p.get(k).ref_cnt == 0 and k not in protected}  # noqa: SIM118
        n = rng.randint(1, cap)
        before = snapshot(p)
        victims = p.evict(n, protected)
        if n > len(eligible):
            assert victims is None and snapshot(p) == before
        else:
            assert victims is not None and len(victims) == n
            got = {k for k, _ in victims}
            assert len(got) == n and got <= eligible
            assert set(p.keys()) == set(before[0]) - got
        for key in list(p.keys()):  # unpin everything again
            c = p.get(key)
            if c.ref_cnt > 0:
                c.ref_cnt = 0
                p.mark_evictable(key)


def test_clear_resets_everything(policy_cls):
    p = policy_cls(4)
    ctx = ctx_with_positions("r", [1, 2, 3])
    for i, key in enumerate([1, 2, 3]):
        ready(p, [key], ctx, start_id=i)
    p.evict(1, set())  # leave some history (ghosts, frequencies, ...)
    p.clear()
    assert len(p) == 0 and list(p.keys()) == []
    assert p.get(2) is None and p.get(3) is None
    assert p.evict(1, set()) is None
    ready(p, [7], ctx, start_id=0)  # usable again after clear
    assert [k for k, _ in p.evict(1, set())] == [7]


def test_hooks_accept_contexts_with_and_without_positions(policy_cls):
    p = policy_cls(4)
    bare = RequestContext("bare")
    placed = ctx_with_positions("placed", [1, 2, 3, 4])
    for i, (key, ctx) in enumerate([(1, bare), (2, placed), (3, bare), (4, placed)]):
        ready(p, [key], ctx, start_id=i)
    for ctx in (bare, placed):
        p.on_store_miss([5, 6], ctx)
        p.on_request_access([1, 2, 9], ctx)
        p.touch([4, 3, 9], ctx)
        p.on_request_finished(([1, 2, 3, 4],), {1, 3}, {2, 4}, ctx)
    assert sorted(p.keys()) == [1, 2, 3, 4]
    assert sorted(k for k, _ in p.evict(4, set())) == [1, 2, 3, 4]


def test_works_without_prepare_future(policy_cls):
    """Policies that want the trace's future must still run (degraded) without it."""
    p = policy_cls(3)
    ctx = RequestContext("r")
    for i in range(3):
        ready(p, [i], ctx, start_id=i)
    assert len(p.evict(2, {0})) == 2
    assert list(p.keys()) == [0]
