"""ARCPolicy on its own: vLLM 0.33's ARC variant (semantics doc §3.3)."""

from __future__ import annotations

import pytest
from support import ready, victims

from kvsim.core.context import RequestContext
from kvsim.policies.arc import ARCPolicy
from kvsim.policies.base import Chunk

CTX = RequestContext("t")


def state(p):
    return list(p.t1), list(p.t2), list(p.b1), list(p.b2)


def test_insert_goes_to_t1_and_removes_ghosts():
    p = ARCPolicy(4)
    ready(p, [1, 2])
    assert victims(p, 1) == [1]
    assert state(p) == ([2], [], [1], [])
    ready(p, [1])
    assert state(p) == ([2, 1], [], [], [])


def test_touch_promotes_ready_and_keeps_pending_in_t1():
    p = ARCPolicy(4)
    ready(p, [1, 2])
    p.insert(3, Chunk(5), CTX)  # pending
    p.touch([1, 3], CTX)  # reversed: 3 re-inserted at T1 MRU, then 1 -> T2
    assert state(p)[:2] == ([2, 3], [1])
    p.touch([1], CTX)
    assert state(p)[:2] == ([2, 3], [1])


def test_finish_promotes_reuse_and_keeps_insertions_in_t1():
    p = ARCPolicy(4)
    ready(p, [1, 2, 3])
    p.on_request_finished(([1, 2, 3],), {1, 2}, {3}, CTX)
    assert state(p)[:2] == ([2, 1], [3])  # inserted-only: moved to T1 MRU tail first


def test_ghost_adaptation_uses_float_ratios_and_caps():
    p = ARCPolicy(4)
    p.b1.update(dict.fromkeys([1]))
    p.b2.update(dict.fromkeys([5, 6, 7]))
    p.on_store_miss([1], CTX)
    assert p.p == 3.0  # max(1, |B2|/|B1|) = 3
    p.on_store_miss([1], CTX)
    assert p.p == 4.0  # capped at capacity
    p.on_store_miss([5], CTX)  # B2 hit: p -= max(1, 1/3)
    assert p.p == 3.0
    p.b1.update(dict.fromkeys([2, 3, 4, 8, 9, 10]))
    p.on_store_miss([6], CTX)  # p -= 7/3
    assert p.p == pytest.approx(3.0 - 7 / 3)
    assert list(p.b2)[-1] == 6  # moved to the ghost MRU


def test_evict_prefers_t1_while_vt1_reaches_int_p():
    p = ARCPolicy(4)
    ready(p, [1, 2, 3, 4])
    p.on_request_finished(([3, 4],), set(), {3, 4}, CTX)  # T2 = [4, 3]
    p.p = 1.9  # int(p) = 1: |T1| = 2 >= 1, then 1 >= 1, then 0 < 1
    assert victims(p, 3) == [1, 2, 4]
    assert state(p) == ([], [3], [1, 2], [4])


def test_t1_fallback_and_atomic_failure():
    p = ARCPolicy(4)
    ready(p, [1, 2, 3])
    p.on_request_finished(([3],), set(), {3}, CTX)  # T1 = [1, 2], T2 = [3]
    p.p = 4.0
    p.get(3).ref_cnt = 1  # T2 has nothing evictable: fall back to T1
    assert victims(p, 1) == [1]
    before = state(p)
    assert victims(p, 2) is None  # only 2 is evictable
    assert state(p) == before


def test_ghost_lists_are_capped_separately_at_capacity():
    p = ARCPolicy(2)
    for i in range(5):
        ready(p, [10 + 2 * i, 11 + 2 * i])
        assert len(victims(p, 2)) == 2
    assert list(p.b1) == [18, 19] and len(p.b2) == 0


def test_clear_resets_p_and_ghosts():
    p = ARCPolicy(2)
    ready(p, [1, 2])
    victims(p, 1)
    p.p = 1.5
    p.clear()
    assert (state(p), p.p, len(p), p.get(2)) == (([], [], [], []), 0.0, 0, None)
