"""Differential tests: kvsim's OffloadManager against vLLM 0.33's own CPUOffloadingManager.

Random operation sequences (lookups, stores, completions, loads, touches, request
finishes, failed stores, resets) run through both managers; every return value, every
event and every gauge must be identical. The golden scenarios (tests/manager_scenarios.py)
also run against vLLM through the same adapter, which proves their hard-coded
expectations are vLLM's. Skipped when vLLM is not importable (run with
``PYTHONPATH=/path/to/vllm/site``).
"""

from __future__ import annotations

import random
from collections import Counter

import manager_scenarios as golden
import pytest
from support import kvsim_key, need_vllm, vllm_key

vllm_manager = need_vllm("vllm.v1.kv_offload.cpu.manager")
vllm_base = need_vllm("vllm.v1.kv_offload.base")

from kvsim.core.context import RequestContext  # noqa: E402
from kvsim.manager.offload import LookupResult, OffloadingEvent, PrepareStoreOutput  # noqa: E402
from kvsim.report.metric_names import (  # noqa: E402
    CPU_ALLOCATION_SIZE,
    CPU_CACHE_READ_USAGE_PERC,
    CPU_CACHE_USAGE_PERC,
    CPU_CACHE_WRITE_USAGE_PERC,
    STORES_SKIPPED,
)

pytestmark = pytest.mark.vllm

_LOOKUP = {
    "MISS": LookupResult.MISS,
    "HIT": LookupResult.HIT,
    "HIT_PENDING": LookupResult.HIT_PENDING,
}


class VllmManager:
    """vLLM's CPUOffloadingManager behind kvsim's manager API (int keys, RequestContext)."""

    def __init__(
        self,
        num_chunks: int,
        policy: str = "lru",
        store_threshold: int = 0,
        max_tracker_size: int = 64_000,
    ) -> None:
        self.num_chunks = num_chunks
        self.inner = vllm_manager.CPUOffloadingManager(
            num_chunks,
            policy,
            enable_events=True,
            store_threshold=store_threshold if store_threshold >= 2 else 1,
            max_tracker_size=max_tracker_size,
        )
        self._contexts: dict[int, tuple[RequestContext, object]] = {}

    def _rc(self, ctx: RequestContext):
        entry = self._contexts.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            entry = (ctx, vllm_base.ReqContext(str(ctx.req_id)))
            self._contexts[id(ctx)] = entry
        rc = entry[1]
        for key, pos in ctx.positions.items():
            rc.set_offload_key_position(vllm_key(key), pos)
        return rc

    def on_new_request(self, ctx):
        self.inner.on_new_request(self._rc(ctx))

    def lookup(self, key, ctx=None):
        ctx = ctx or RequestContext("lookup")
        return _LOOKUP[self.inner.lookup(vllm_key(key), self._rc(ctx)).name]

    def prepare_load(self, keys, ctx):
        return [
            int(i)
            for i in self.inner.prepare_load([vllm_key(k) for k in keys], self._rc(ctx)).block_ids
        ]

    def complete_load(self, keys, ctx=None):
        ctx = ctx or RequestContext("complete")
        self.inner.complete_load([vllm_key(k) for k in keys], self._rc(ctx))

    def prepare_store(self, keys, ctx):
        out = self.inner.prepare_store([vllm_key(k) for k in keys], self._rc(ctx))
        if out is None:
            return None
        return PrepareStoreOutput(
            [kvsim_key(k) for k in out.keys_to_store],
            [int(i) for i in out.store_spec.block_ids],
            [kvsim_key(k) for k in out.evicted_keys],
        )

    def complete_store(self, keys, ctx=None, success=True):
        ctx = ctx or RequestContext("complete")
        self.inner.complete_store([vllm_key(k) for k in keys], self._rc(ctx), success=success)

    def touch(self, keys, ctx):
        self.inner.touch([vllm_key(k) for k in keys], self._rc(ctx))

    def on_request_finished(self, ctx):
        self.inner.on_request_finished(self._rc(ctx))

    def take_events(self):
        for e in self.inner.take_events():
            yield OffloadingEvent([kvsim_key(k) for k in e.keys], e.removed, e.metadata_only)

    def reset_cache(self):
        self.inner.reset_cache()

    def get_stats(self) -> dict:
        data = self.inner.get_stats().data["data"]
        return {
            CPU_CACHE_USAGE_PERC: data[CPU_CACHE_USAGE_PERC][()],
            CPU_CACHE_WRITE_USAGE_PERC: data[CPU_CACHE_WRITE_USAGE_PERC][()],
            CPU_CACHE_READ_USAGE_PERC: data[CPU_CACHE_READ_USAGE_PERC][()],
            CPU_ALLOCATION_SIZE: list(data.get(CPU_ALLOCATION_SIZE, {}).get((), [])),
            STORES_SKIPPED: data.get(STORES_SKIPPED, {}).get((), 0),
        }

    def gauges(self) -> dict:
        inner = self.inner
        n = self.num_chunks
        used = (
            inner._num_allocated_chunks - len(inner._free_list) - inner._num_evictable_cache_chunks
        )
        usage = used / n if n else 0.0
        write = inner._num_write_pending_chunks / n if n else 0.0
        return {
            CPU_CACHE_USAGE_PERC: usage,
            CPU_CACHE_WRITE_USAGE_PERC: write,
            CPU_CACHE_READ_USAGE_PERC: max(usage - write, 0.0),
        }


def make_vllm(num_chunks, policy="lru", store_threshold=0, max_tracker_size=64_000):
    return VllmManager(num_chunks, policy, store_threshold, max_tracker_size)


# --- the golden scenarios, run against vLLM -------------------------------------------


@pytest.mark.parametrize("scenario", sorted(golden.SCENARIOS), ids=str)
def test_golden_scenario_holds_for_vllm(scenario):
    """The expectations hard-coded in the golden tests are exactly vLLM's behaviour."""
    golden.SCENARIOS[scenario](make_vllm)


@pytest.mark.parametrize("order", ["forward", "reverse", "split"])
def test_golden_completion_orders_hold_for_vllm(order):
    golden.scenario_finish_orders_lru_prefix_independent_of_store_completion(make_vllm, order)
    golden.scenario_finish_orders_lru_prefix_independent_of_load_completion(make_vllm, order)


# --- random differential sequences ------------------------------------------------------


def _events(m) -> list:
    return [(tuple(e.keys), e.removed, e.metadata_only) for e in m.take_events()]


class _DiffRun:
    """Both managers under one random op sequence, compared after every op."""

    def __init__(self, seed: int, policy: str, threshold: int, seen: Counter) -> None:
        self.seed = seed
        self.seen = seen
        self.rng = rng = random.Random(seed)
        capacity = rng.choice([2, 3, 4, 6, 8])
        tracker = rng.choice([2, 3, 5, 64])
        self.ours = golden.make_kvsim(capacity, policy, threshold, tracker)
        self.theirs = make_vllm(capacity, policy, threshold, tracker)
        # Prefix-chained "requests": key = prefix_id * 100 + chunk index, positions (i+1)*16.
        self.prefixes = [[p * 100 + i for i in range(rng.randint(1, 6))] for p in range(1, 6)]
        self.running: list[tuple[RequestContext, list[int]]] = []
        self.stores: list[tuple[list[int], RequestContext]] = []  # pending store jobs
        self.loads: list[tuple[list[int], RequestContext]] = []  # pending load jobs
        self.compared = 0
        self.next_req = 0

    def both(self, name, *args, **kw):
        a = getattr(self.ours, name)(*args, **kw)
        b = getattr(self.theirs, name)(*args, **kw)
        return a, b

    def step(self) -> None:
        """One random op; every op but a new request is followed by the full comparison."""
        op = self.rng.random()
        if not self.running or op < 0.12:
            self.new_request()
            return
        ctx, keys = self.rng.choice(self.running)
        self.apply(op, ctx, keys)
        self.compare_state()

    def new_request(self) -> None:
        rng = self.rng
        prefix = rng.choice(self.prefixes)
        n = rng.randint(1, len(prefix))
        keys = prefix[:n]
        positioned = rng.random() < 0.85
        ctx = RequestContext(
            f"r{self.next_req}", {k: (i + 1) * 16 for i, k in enumerate(keys)} if positioned else {}
        )
        self.next_req += 1
        self.both("on_new_request", ctx)
        self.running.append((ctx, keys))

    def apply(self, op: float, ctx: RequestContext, keys: list[int]) -> None:
        rng = self.rng
        if op < 0.30:
            self.store(ctx, keys)
        elif op < 0.45 and self.stores:
            job = self.stores.pop(rng.randrange(len(self.stores)))
            success = rng.random() < 0.9
            self.both("complete_store", job[0], job[1], success=success)
        elif op < 0.60:
            self.lookup_and_load(ctx, keys)
        elif op < 0.72 and self.loads:
            job = self.loads.pop(rng.randrange(len(self.loads)))
            self.both("complete_load", job[0], job[1])
        elif op < 0.84:
            self.running.remove((ctx, keys))
            self.both("on_request_finished", ctx)
        elif op < 0.90:
            self.both("touch", rng.sample(keys, rng.randint(1, len(keys))), ctx)
        elif op < 0.91:
            self.both("reset_cache")
            self.stores.clear()  # the scheduler ignores pre-reset jobs
            self.loads.clear()
        else:
            a, b = self.both("get_stats")
            assert a == b, (self.seed, "get_stats")

    def store(self, ctx: RequestContext, keys: list[int]) -> None:
        rng = self.rng
        lo = rng.randint(0, len(keys) - 1)
        hi = rng.randint(lo + 1, len(keys))
        offer = keys[lo:hi]
        if rng.random() < 0.2:
            offer = list(reversed(offer))
        a, b = self.both("prepare_store", offer, ctx)
        assert a == b, (self.seed, "prepare_store", offer)
        self.seen[
            "store_failed"
            if a is None
            else "evicted"
            if a.evicted_keys
            else "stored"
            if a.keys_to_store
            else "store_empty"
        ] += 1
        if a is not None and a.keys_to_store:
            self.stores.append((list(a.keys_to_store), ctx))

    def lookup_and_load(self, ctx: RequestContext, keys: list[int]) -> None:
        hits = []
        for k in keys:
            a, b = self.both("lookup", k, ctx)
            assert a == b, (self.seed, "lookup", k)
            self.seen[a.name] += 1
            self.compared += 1
            if a != LookupResult.HIT:
                break
            hits.append(k)
        if hits:
            a, b = self.both("prepare_load", hits, ctx)
            assert a == b, (self.seed, "prepare_load", hits)
            self.loads.append((hits, ctx))

    def compare_state(self) -> None:
        ga, gb = self.both("gauges")
        assert ga == gb, (self.seed, "gauges")
        ea, eb = _events(self.ours), _events(self.theirs)
        assert ea == eb, (self.seed, "events")
        self.seen["events"] += len(ea)
        self.compared += 1


def _random_run(seed: int, policy: str, threshold: int, steps: int, seen: Counter) -> int:
    """Drive both managers with one random op sequence; returns the number of ops compared.

    ``seen`` counts the interesting outcomes, so the test can prove they were exercised.
    """
    run = _DiffRun(seed, policy, threshold, seen)
    for _ in range(steps):
        run.step()
    return run.compared


CONFIGS = [("lru", 0), ("arc", 0), ("lru", 2), ("arc", 2), ("arc", 3)]
SEQUENCES_PER_CONFIG = 300
STEPS = 120


@pytest.mark.parametrize("policy,threshold", CONFIGS)
def test_random_sequences_match_vllm(policy, threshold):
    total = 0
    seen: Counter = Counter()
    for seed in range(SEQUENCES_PER_CONFIG):
        total += _random_run(seed * 7919 + threshold, policy, threshold, STEPS, seen)
    print(
        f"{policy} threshold={threshold}: {SEQUENCES_PER_CONFIG} sequences, "
        f"{total} comparisons, {dict(sorted(seen.items()))}"
    )
    assert total >= SEQUENCES_PER_CONFIG * STEPS
    for outcome in ("store_failed", "evicted", "stored", "HIT", "HIT_PENDING", "MISS"):
        assert seen[outcome] > 10, outcome  # the sequences reach every interesting branch
