"""Golden scenarios for the offload manager, on kvsim's manager (``tests/manager_scenarios.py``
holds them; ``tests/vllm/test_vllm_differential.py`` runs the same ones on vLLM's), plus
checks of kvsim's policy internals and counters."""

from __future__ import annotations

import pytest
from manager_scenarios import (
    MISS,
    SCENARIOS,
    arc_ghost_setup,
    arc_table_setup,
    ctx_for,
    gauges,
    make_kvsim,
    scenario_finish_orders_lru_prefix_independent_of_load_completion,
    scenario_finish_orders_lru_prefix_independent_of_store_completion,
    store,
)

from kvsim.core.context import RequestContext


@pytest.fixture(params=["forward", "reverse", "split"])
def completion_order(request):
    return request.param


# --- the tests (kvsim) --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n in SCENARIOS if "independent_of" not in n))
def test_scenario(name):
    SCENARIOS[name](make_kvsim)


def test_finish_orders_prefix_independent_of_store_completion(completion_order):
    scenario_finish_orders_lru_prefix_independent_of_store_completion(make_kvsim, completion_order)


def test_finish_orders_prefix_independent_of_load_completion(completion_order):
    scenario_finish_orders_lru_prefix_independent_of_load_completion(make_kvsim, completion_order)


def test_arc_table_setup_state():
    m = arc_table_setup(make_kvsim)
    p = m.policy
    assert (list(p.t1), list(p.t2), list(p.b1), list(p.b2), p.p) == (
        [3, 4],
        [6, 5],
        [2, 1],
        [],
        3.0,
    )


def test_arc_counts_reuse_once_and_keeps_insertions_in_t1():
    m = make_kvsim(4, "arc")
    prefix = [1, 2, 3]
    seed = ctx_for("seed", prefix)
    store(m, prefix, seed)
    m.on_request_finished(seed)
    assert (list(m.policy.t1), list(m.policy.t2)) == ([3, 2, 1], [])
    reuse = ctx_for("reuse", prefix)
    m.prepare_load(prefix, reuse)
    m.prepare_load(prefix, reuse)
    assert m.num_evictable == 0
    m.complete_load(prefix, reuse)
    assert m.num_evictable == 0  # still pinned once
    m.complete_load(prefix, reuse)
    m.on_request_finished(reuse)
    assert (list(m.policy.t1), list(m.policy.t2)) == ([], [3, 2, 1])
    assert m.num_evictable == 3


def test_arc_ghost_adaptation_is_once_per_request():
    m, _pin = arc_ghost_setup(make_kvsim)
    p = m.policy
    assert (list(p.t1), list(p.t2), list(p.b1), p.p) == ([4, 5], [3], [1, 2], 0.0)
    r = RequestContext("r")
    m.prepare_store([1, 2], r)
    assert p.p == 2.0
    m.prepare_store([1, 2], r)
    assert p.p == 2.0
    m.prepare_store([1], RequestContext("r2"))  # another request adapts again
    assert p.p == 3.0


def test_threshold_retry_counts_twice():
    m = make_kvsim(1, "lru", store_threshold=3)
    store(m, [1, 1, 1])  # repeated keys in one offer count once
    assert m.admission.counts[1] == 1


def test_evictable_count_lifecycle():
    m = make_kvsim(3, "lru")
    r = RequestContext("r")
    m.prepare_store([1, 2], r)
    assert (m.num_evictable, m.num_write_pending) == (0, 2)
    m.complete_store([1, 2], r)
    assert (m.num_evictable, m.num_write_pending) == (2, 0)
    m.prepare_load([1], r)
    m.prepare_load([1], RequestContext("r2"))  # a double load decrements once
    assert m.num_evictable == 1
    m.complete_load([1], r)
    assert m.num_evictable == 1
    m.complete_load([1])
    assert m.num_evictable == 2
    m.prepare_store([3], r)
    m.complete_store([3], r, success=False)  # failed store: not evictable, not pending
    assert (m.num_evictable, m.num_write_pending, m.num_resident) == (2, 0, 2)


def test_fast_fail_skips_policy_evict():
    m = make_kvsim(2, "lru")
    calls = []
    evict = m.policy.evict
    m.policy.evict = lambda n, protected: calls.append(n) or evict(n, protected)
    r = RequestContext("r")
    m.prepare_store([1, 2], r)
    assert m.prepare_store([3], r) is None  # need 1 > evictable 0: the policy is not asked
    assert calls == []
    m.complete_store([1, 2], r)
    assert m.prepare_store([3], r).evicted_keys == [1]
    assert calls == [1]


def test_reset_cache_zeroes_counters_and_pool():
    m = make_kvsim(3, "arc", store_threshold=2)
    r = RequestContext("r")
    store(m, [1, 2])
    store(m, [1, 2])
    m.prepare_load([1], r)
    m.reset_cache()
    assert (m.num_evictable, m.num_write_pending, m.num_resident, m.num_free) == (0, 0, 0, 3)
    assert gauges(m) == (0.0, 0.0, 0.0)
    assert m.lookup(1) == MISS and len(m.policy) == 0
    # admission counts survive a reset (vLLM keeps its tracker): one offer stores again
    assert store(m, [1, 2]) == ([1, 2], [0, 1], [])


def test_lru_repeated_pin_cycles_do_not_change_recency():
    m = make_kvsim(4, "lru")
    store(m, [1, 2, 3, 4])
    for i in range(300):
        r = RequestContext(i)
        m.prepare_load([1, 2], r)
        m.complete_load([1, 2], r)
    assert m.num_evictable == 4
    assert store(m, [5])[2] == [1]  # pin cycles without a finish leave insertion order
    assert store(m, [6, 7])[2] == [2, 3]
