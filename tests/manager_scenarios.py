"""The offload manager's golden scenarios: exact victims, chunk ids and events.

The expectations come from docs/vllm-offload-semantics.md (§2.3, §3.2, §3.3, §4, §7, §8.1)
and were confirmed by running the same calls through vLLM 0.33's CPUOffloadingManager.
Each ``scenario_*`` function takes a manager factory ``make(num_chunks, policy,
store_threshold=0, max_tracker_size=64000)`` and asserts only through the manager API, so
one list (``SCENARIOS``) runs on kvsim's manager (``tests/manager/test_manager_golden.py``)
and on vLLM's (``tests/vllm/test_vllm_differential.py``).
"""

from __future__ import annotations

from kvsim.core.context import RequestContext
from kvsim.manager.offload import LookupResult, OffloadManager
from kvsim.policies.registry import make_admission, make_eviction_policy
from kvsim.report.metric_names import (
    CPU_ALLOCATION_SIZE,
    CPU_CACHE_READ_USAGE_PERC,
    CPU_CACHE_USAGE_PERC,
    CPU_CACHE_WRITE_USAGE_PERC,
    STORES_SKIPPED,
)

MISS, HIT, PENDING = LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING
TPC = 16  # tokens per chunk used for key positions


def make_kvsim(num_chunks, policy="lru", store_threshold=0, max_tracker_size=64_000):
    admission = (
        make_admission(store_threshold=store_threshold, max_tracker_size=max_tracker_size)
        if store_threshold >= 2
        else None
    )
    return OffloadManager(
        num_chunks, make_eviction_policy(policy, num_chunks), admission, enable_events=True
    )


def ctx_for(name, keys=(), start=0):
    """A request whose chunk keys end at (start+i+1)*TPC tokens."""
    return RequestContext(name, {k: (start + i + 1) * TPC for i, k in enumerate(keys)})


def events(m):
    return [(list(e.keys), e.removed, e.metadata_only) for e in m.take_events()]


def store(m, keys, ctx=None, complete=True):
    """prepare_store (+ complete_store); returns (keys_to_store, chunk_ids, evicted)."""
    ctx = ctx if ctx is not None else RequestContext(f"store{keys}")
    out = m.prepare_store(keys, ctx)
    assert out is not None, f"store of {keys} failed"
    if complete and out.keys_to_store:
        m.complete_store(out.keys_to_store, ctx)
    return list(out.keys_to_store), list(out.chunk_ids), list(out.evicted_keys)


def gauges(m):
    g = m.gauges()
    return (g[CPU_CACHE_USAGE_PERC], g[CPU_CACHE_WRITE_USAGE_PERC], g[CPU_CACHE_READ_USAGE_PERC])


# --- §2.3 and §8.1 test_cpu_manager -----------------------------------------------------


def scenario_id_allocation(make):
    """§2.3: fresh ids first, then the LIFO free list."""
    m = make(4, "lru")
    assert store(m, [1, 2]) == ([1, 2], [0, 1], [])
    m.touch([1], RequestContext("t"))
    assert store(m, [2, 3, 4, 5], complete=False) == ([3, 4, 5], [2, 3, 0], [1])


def scenario_cpu_manager(make):
    """§8.1 test_cpu_manager steps 1-9 (LRU, capacity 4, no positions)."""
    m = make(4, "lru")
    # 1. store [1,2]: pending until complete_store, then a stored event.
    c1 = RequestContext("s1")
    out = m.prepare_store([1, 2], c1)
    assert (out.keys_to_store, list(out.chunk_ids), out.evicted_keys) == ([1, 2], [0, 1], [])
    assert [m.lookup(k) for k in (1, 2, 3)] == [PENDING, PENDING, MISS]
    m.complete_store([1, 2], c1)
    assert [m.lookup(k) for k in (1, 2)] == [HIT, HIT]
    assert events(m) == [([1, 2], False, False)]
    # 2. store [2,3,4,5]: 2 is resident, 1 is evicted, ids [2,3,0].
    c2 = RequestContext("s2")
    out = m.prepare_store([2, 3, 4, 5], c2)
    assert (out.keys_to_store, list(out.chunk_ids), out.evicted_keys) == ([3, 4, 5], [2, 3, 0], [1])
    # 3. [1,6] needs 2 chunks but only chunk 2 is evictable (3,4,5 pending).
    assert m.prepare_store([1, 6], RequestContext("s3")) is None
    # 4. after completion, load [2,3] -> ids [1,2].
    m.complete_store([3, 4, 5], c2)
    load_ctx = RequestContext("load")
    assert list(m.prepare_load([2, 3], load_ctx)) == [1, 2]
    # 5. [6,7,8] cannot evict while 2 and 3 are pinned.
    assert m.prepare_store([6, 7, 8], RequestContext("s5")) is None
    # 6. after complete_load and finish, the prefix [2,3] is refreshed tail first.
    m.complete_load([2, 3], load_ctx)
    m.on_request_finished(load_ctx)
    c6 = RequestContext("s6")
    out = m.prepare_store([6, 7, 8], c6)
    assert (out.keys_to_store, list(out.chunk_ids), out.evicted_keys) == (
        [6, 7, 8],
        [2, 0, 3],
        [4, 5, 3],
    )
    m.complete_store([6, 7, 8], c6)
    # 7. touch([2,6,7]) leaves 8 the oldest.
    m.touch([2, 6, 7], RequestContext("touch"))
    c7 = RequestContext("s7")
    out = m.prepare_store([9], c7)
    assert (out.keys_to_store, list(out.chunk_ids), out.evicted_keys) == ([9], [3], [8])
    # 8. a failed store drops only the pending key.
    m.complete_store([7, 9], c7, success=False)
    assert (m.lookup(7), m.lookup(9)) == (HIT, MISS)
    # 9. the event list, in order.
    assert events(m) == [
        ([1], True, False),
        ([3, 4, 5], False, False),
        ([4, 5, 3], True, False),
        ([6, 7, 8], False, False),
        ([8], True, False),
        ([9], True, True),
    ]
    assert events(m) == []


def scenario_already_stored_chunk_not_evicted(make):
    """§2.3: a re-offered resident chunk is protected from its own offer's eviction."""
    for policy in ("lru", "arc"):
        m = make(2, policy)
        store(m, [1, 2])
        assert store(m, [1, 3]) == ([3], [1], [2])
        assert m.lookup(1) == HIT


def scenario_prepare_load_preserves_key_order(make):
    m = make(4, "lru")
    store(m, [10, 11, 12, 13])  # ids 0..3
    for perm in ([13, 10, 12, 11], [11, 13], [12]):
        ctx = RequestContext(f"l{perm}")
        assert list(m.prepare_load(perm, ctx)) == [k - 10 for k in perm]
        m.complete_load(perm, ctx)


# --- §3.2/§3.3 the running-request example -----------------------------------------------


def _running_request_setup(m):
    a_keys, b_keys = [10, 11, 12, 13], [20, 21]
    a = ctx_for("A", a_keys)
    store(m, a_keys, a)  # A keeps running
    b = ctx_for("B", b_keys)
    store(m, b_keys, b)
    m.on_request_finished(b)
    c = ctx_for("C", [30])
    return a, c, store(m, [30], c)


def scenario_lru_running_request(make):
    """LRU: C evicts a3 (A's tail); after A finishes, D's two stores evict b1 then b0."""
    m = make(6, "lru")
    a, _c, out = _running_request_setup(m)
    assert out[2] == [13]
    m.on_request_finished(a)
    d = ctx_for("D", [40, 41])
    assert store(m, [40], d)[2] == [21]
    assert store(m, [41], d)[2] == [20]


def scenario_arc_running_request(make):
    """ARC: C evicts a0, the head of the running request (T1 is insertion ordered)."""
    m = make(6, "arc")
    _, _, out = _running_request_setup(m)
    assert out[2] == [10]


# --- §3.3 ARC fallback table ---------------------------------------------------------------

ARC_TABLE = [
    # pinned, protected, new keys, evicted
    ([], [], [7, 8, 9], [6, 5, 3]),
    ([], [], [7, 8, 9, 10], [6, 5, 3, 4]),
    ([5, 6], [], [7, 8], [3, 4]),
    ([], [5, 6], [7, 8], [3, 4]),
    ([5, 6], [3], [7], [4]),
    ([5, 6], [3], [7, 8], None),
]


def arc_table_setup(make):
    """Capacity 4: T1 = [3,4], T2 = [6,5] (LRU first), B1 = [1,2], p = 3."""
    m = make(4, "arc")
    store(m, [1, 2, 3, 4], RequestContext("seed"))  # never finished: T1 = [1,2,3,4]
    assert store(m, [5, 6], RequestContext("s56"))[2] == [1, 2]  # p = 0: T1 LRU first
    reuse = ctx_for("reuse", [5, 6])
    m.prepare_load([5, 6], reuse)
    m.complete_load([5, 6], reuse)
    m.on_request_finished(reuse)  # tail first: T2 = [6,5]
    # Ghost hits on store misses raise p even though the stores fail (all pinned).
    pin = RequestContext("pin")
    m.prepare_load([3, 4, 5, 6], pin)
    assert m.prepare_store([1, 2], RequestContext("g1")) is None  # p: 0 -> 1 -> 2
    assert m.prepare_store([1], RequestContext("g2")) is None  # p: 2 -> 3
    m.complete_load([3, 4, 5, 6], pin)
    return m


def scenario_arc_table(make):
    for pinned, protected, new, expected in ARC_TABLE:
        m = arc_table_setup(make)
        if pinned:
            m.prepare_load(pinned, RequestContext("pinned"))
        out = m.prepare_store(protected + new, RequestContext("row"))
        got = None if out is None else list(out.evicted_keys)
        assert got == expected, (pinned, protected, new)
        if out is not None:
            assert list(out.keys_to_store) == new


# --- §4 store_threshold ------------------------------------------------------------------------


def scenario_filter_reused_manager(make):
    """threshold 2, tracker 3, capacity 4."""
    m = make(4, "lru", store_threshold=2, max_tracker_size=3)
    assert store(m, [1, 2]) == ([], [], [])
    assert store(m, [1, 2]) == ([1, 2], [0, 1], [])
    assert store(m, [3, 4]) == ([], [], [])  # tracker {1,2,3} -> drop 1 -> {2,3,4}
    assert m.get_stats()[STORES_SKIPPED] == 4
    # 1 is resident and ready: it bypasses the threshold (reuse, not skipped).
    assert store(m, [1]) == ([], [], [])
    assert m.get_stats()[STORES_SKIPPED] == 0
    # 5 is new: tracked at 1 and skipped; once more and it is stored.
    assert store(m, [5]) == ([], [], [])
    assert store(m, [5]) == ([5], [2], [])
    # 3 was dropped from the tracker by 1 and 5 (LRU), so it starts over.
    assert store(m, [3]) == ([], [], [])
    assert store(m, [3]) == ([3], [3], [])
    assert m.get_stats()[STORES_SKIPPED] == 2


def scenario_threshold_oversized_offer_progress(make):
    """4 keys against a tracker of 3: offers of the not-yet-stored keys store them all."""
    m = make(8, "lru", store_threshold=2, max_tracker_size=3)
    keys = [1, 2, 3, 4]
    outcomes = []
    for i in range(6):
        offer = [k for k in keys if m.lookup(k) == MISS]
        if not offer:
            break
        outcomes.append((offer, store(m, offer, RequestContext(f"o{i}"))[0]))
    assert outcomes == [
        ([1, 2, 3, 4], []),  # 4 is not tracked: the tracker is full of this offer's keys
        ([1, 2, 3, 4], [1, 2, 3]),
        ([4], []),  # 4 displaces the LRU tracked key
        ([4], [4]),
    ]
    assert all(m.lookup(k) == HIT for k in keys)


def scenario_threshold_counts_retries_after_failure(make):
    """A re-offer after an allocation failure counts again (§4)."""
    m = make(1, "lru", store_threshold=2)
    store(m, [1])
    store(m, [1])
    pin = RequestContext("pin")
    m.prepare_load([1], pin)
    r = RequestContext("r")
    assert store(m, [2], r) == ([], [], [])  # count 1: skipped (an empty output, not None)
    assert m.prepare_store([2], r) is None  # count 2: admitted, but nothing evictable
    m.complete_load([1], pin)
    assert store(m, [2], r, complete=False) == ([2], [0], [1])
    assert (m.lookup(2), m.lookup(1)) == (PENDING, MISS)


# --- named LRU tests (§8.1) ------------------------------------------------------------------


def _completion_batches(keys, order):
    if order == "forward":
        return [keys]
    if order == "reverse":
        return [[k] for k in reversed(keys)]
    return [keys[2:], keys[:2]]


def scenario_finish_orders_lru_prefix_independent_of_store_completion(make, order="forward"):
    m = make(4, "lru")
    keys = [1, 2, 3, 4]
    r = ctx_for("r", keys)
    assert m.prepare_store(keys, r) is not None
    for batch in _completion_batches(keys, order):
        m.complete_store(batch, r)
    m.on_request_finished(r)
    assert store(m, [5])[2] == [4]


def scenario_finish_orders_lru_prefix_independent_of_load_completion(make, order="forward"):
    m = make(5, "lru")
    keys = [1, 2, 3, 4]
    for k in keys:  # stored head first: without the request, 1 would be the oldest
        store(m, [k])
    r = ctx_for("r", keys)
    m.prepare_load(keys, r)
    for batch in _completion_batches(keys, order):
        m.complete_load(batch, r)
    m.on_request_finished(r)
    store(m, [5])
    assert store(m, [6])[2] == [4]


def scenario_older_request_does_not_demote_newer_shared_access(make):
    m = make(3, "lru")
    old = ctx_for("old", [1])
    store(m, [1], old)  # old's request rank is taken first
    new = ctx_for("new", [2, 3])
    store(m, [2, 3], new)
    old.set_key_position(3, 2 * TPC)
    assert store(m, [3], old) == ([], [], [])  # a reuse by the older request: no demotion
    assert store(m, [4, 5], RequestContext("x"))[2] == [1, 3]


def scenario_reset_discards_unfinished_request_recency(make):
    m = make(2, "lru")
    a = ctx_for("A", [1, 3])
    store(m, [1], a)
    m.reset_cache()
    assert m.lookup(1) == MISS
    b = ctx_for("B", [2])
    store(m, [2], b)
    store(m, [3], a)  # A's request rank is new after the reset: newer than B's
    assert store(m, [4], RequestContext("x"))[2] == [2]
    m.on_request_finished(a)  # commits only what A saw after the reset: 3 becomes newest
    assert store(m, [5], RequestContext("y"))[2] == [4]


def scenario_unfinished_prefix_evicted_tail_first(make):
    """A running request's chunks are evicted tail first, across store batches."""
    m = make(4, "lru")
    keys = [1, 2, 3, 4]
    r = ctx_for("r", keys)
    store(m, keys[:2], r)
    store(m, keys[2:], r)
    assert store(m, [5, 6], RequestContext("x"))[2] == [4, 3]


def scenario_failed_store(make):
    m = make(2, "lru")
    r = RequestContext("r")
    store(m, [1, 2], r, complete=False)
    m.complete_store([2], r, success=False)
    assert (m.lookup(1), m.lookup(2)) == (PENDING, MISS)
    assert gauges(m) == (0.5, 0.5, 0.0)
    m.complete_store([1], r)
    assert store(m, [3]) == ([3], [1], [])  # the failed chunk's id went back to the free list
    assert events(m) == [([2], True, True), ([1], False, False), ([3], False, False)]


def scenario_take_events_prunes_retried_cleanup(make):
    m = make(2, "lru")
    r = RequestContext("r")
    store(m, [1, 2], r, complete=False)
    m.complete_store([1, 2], r, success=False)
    store(m, [2], r)  # the retry re-owns 2 before the cleanup event is drained
    assert events(m) == [([1], True, True), ([2], False, False)]
    assert events(m) == []


# --- named ARC tests (§8.1) ---------------------------------------------------------------------


def scenario_arc_counts_reuse_once(make):
    """Insertions stay in T1: the reuse request's eviction order shows it (see kvsim test)."""
    m = make(4, "arc")
    prefix = [1, 2, 3]
    seed = ctx_for("seed", prefix)
    store(m, prefix, seed)
    m.on_request_finished(seed)
    reuse = ctx_for("reuse", prefix)
    m.prepare_load(prefix, reuse)
    m.prepare_load(prefix[:2], reuse)  # a duplicate pin: one access
    m.complete_load(prefix, reuse)
    m.complete_load(prefix[:2], reuse)
    m.on_request_finished(reuse)
    store(m, [4])  # T1 = [4], T2 = [3,2,1]
    assert store(m, [5, 6], RequestContext("x"))[2] == [4, 3]


def scenario_arc_pending_chunk_is_not_a_frequency_hit(make):
    m = make(2, "arc")
    a = ctx_for("A", [1])
    m.prepare_store([1], a)
    b = ctx_for("B", [1])
    assert m.prepare_store([1], b) == m.prepare_store([], b)  # pending: ignored
    m.complete_store([1], a)
    m.on_request_finished(b)
    m.on_request_finished(a)
    store(m, [2])  # T1 = [1, 2] if 1 was not promoted
    assert store(m, [3], RequestContext("x"))[2] == [1]


def arc_ghost_setup(make):
    """Capacity 3: T1 = [4,5], T2 = [3], B1 = [1,2], p = 0, everything pinned."""
    m = make(3, "arc")
    store(m, [1, 2, 3], RequestContext("seed"))
    reuse = RequestContext("reuse")
    m.prepare_load([3], reuse)
    m.complete_load([3], reuse)
    m.on_request_finished(reuse)
    assert store(m, [4, 5])[2] == [1, 2]
    pin = RequestContext("pin")
    m.prepare_load([3, 4, 5], pin)
    return m, pin


def scenario_arc_ghost_hit_adapts_once_per_request(make):
    m, pin = arc_ghost_setup(make)
    r = RequestContext("r")
    assert m.prepare_store([1, 2], r) is None  # two B1 ghost hits: p 0 -> 2
    assert m.prepare_store([1, 2], r) is None  # the retry does not adapt again
    m.complete_load([3, 4, 5], pin)
    # p = 2: |T1| = 2 >= 2 takes T1's LRU (4), then T2 (3). Had the retry adapted
    # again (p = 3) the order would be T2 first: [3, 4].
    assert store(m, [1, 2], r)[2] == [4, 3]


# --- metrics (§7.1) ----------------------------------------------------------------------------


def scenario_usage_gauges(make):
    m = make(4, "lru")
    assert gauges(m) == (0.0, 0.0, 0.0)
    r = RequestContext("r")
    m.prepare_store([1, 2], r)
    assert gauges(m) == (0.5, 0.5, 0.0)
    m.prepare_store([3, 4], r)
    assert gauges(m) == (1.0, 1.0, 0.0)
    m.complete_store([1, 2, 3, 4], r)
    assert gauges(m) == (0.0, 0.0, 0.0)  # resident but evictable: not "used"
    m.prepare_load([1], r)
    assert gauges(m) == (0.25, 0.0, 0.25)
    m.complete_store([3], r)  # already ready: ignored
    r2 = RequestContext("r2")
    m.prepare_load([2, 3], r2)
    m.complete_load([2, 3], r2)
    m.complete_load([1], r)
    assert store(m, [5, 6], RequestContext("s"), complete=False)[0] == [5, 6]
    m.prepare_load([3], r2)
    assert gauges(m) == (0.75, 0.5, 0.25)
    stats = m.get_stats()
    assert (
        stats[CPU_CACHE_USAGE_PERC],
        stats[CPU_CACHE_WRITE_USAGE_PERC],
        stats[CPU_CACHE_READ_USAGE_PERC],
    ) == (0.75, 0.5, 0.25)


def scenario_allocation_size_histogram(make):
    """Sampled for every allocating prepare_store, even failed ones; drained by get_stats."""
    m = make(2, "lru")
    r = RequestContext("r")
    m.prepare_store([1, 2], r)  # sample 2
    assert m.prepare_store([3], r) is None  # fast fail (nothing evictable): sample 1
    assert m.prepare_store([1], r).keys_to_store == []  # pending: no allocation, no sample
    assert m.get_stats()[CPU_ALLOCATION_SIZE] == [2, 1]
    assert m.get_stats()[CPU_ALLOCATION_SIZE] == []
    m.complete_store([1, 2], r)
    assert m.prepare_store([1, 2, 3], r) is None  # eviction failure (all protected): sampled
    assert m.get_stats()[CPU_ALLOCATION_SIZE] == [1]


def scenario_stores_skipped_counter(make):
    m = make(4, "lru", store_threshold=2)
    store(m, [1, 2, 3])
    assert m.get_stats()[STORES_SKIPPED] == 3
    assert m.get_stats()[STORES_SKIPPED] == 0


SCENARIOS = {
    name[len("scenario_") :]: fn
    for name, fn in globals().items()
    if name.startswith("scenario_") and callable(fn)
}
