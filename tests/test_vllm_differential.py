"""Differential tests: kvsim's OffloadManager against vLLM 0.33's own CPUOffloadingManager.

Random operation sequences (lookups, stores, completions, loads, touches, request
finishes, failed stores, resets) run through both managers; every return value, every
event and every gauge must be identical. The golden scenarios of test_manager_golden.py
also run against vLLM through the same adapter, which proves their hard-coded
expectations are vLLM's. Skipped when vLLM is not importable (run with
``PYTHONPATH=/path/to/vllm/site``).
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections import Counter

import pytest
from support import need_vllm

vllm_manager = need_vllm("vllm.v1.kv_offload.cpu.manager")
vllm_base = need_vllm("vllm.v1.kv_offload.base")

from kvsim.context import RequestContext  # noqa: E402
from kvsim.metrics import (  # noqa: E402
    CPU_ALLOCATION_SIZE,
    CPU_CACHE_READ_USAGE_PERC,
    CPU_CACHE_USAGE_PERC,
    CPU_CACHE_WRITE_USAGE_PERC,
    STORES_SKIPPED,
)
from kvsim.offload import LookupResult, OffloadingEvent, OffloadManager, PrepareStoreOutput  # noqa: E402
from kvsim.policies.registry import make_admission, make_eviction_policy  # noqa: E402

pytestmark = pytest.mark.vllm

_LOOKUP = {
    "MISS": LookupResult.MISS,
    "HIT": LookupResult.HIT,
    "HIT_PENDING": LookupResult.HIT_PENDING,
}


def enc(key: int) -> bytes:
    """kvsim int key -> vLLM OffloadKey (8-byte hash + 4-byte group index 0)."""
    return key.to_bytes(8, "big") + (0).to_bytes(4, "big")


def dec(key: bytes) -> int:
    assert key[8:] == b"\0\0\0\0"
    return int.from_bytes(key[:8], "big")


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
            rc.set_offload_key_position(enc(key), pos)
        return rc

    def on_new_request(self, ctx):
        self.inner.on_new_request(self._rc(ctx))

    def lookup(self, key, ctx=None):
        ctx = ctx or RequestContext("lookup")
        return _LOOKUP[self.inner.lookup(enc(key), self._rc(ctx)).name]

    def prepare_load(self, keys, ctx):
        return [
            int(i) for i in self.inner.prepare_load([enc(k) for k in keys], self._rc(ctx)).block_ids
        ]

    def complete_load(self, keys, ctx=None):
        ctx = ctx or RequestContext("complete")
        self.inner.complete_load([enc(k) for k in keys], self._rc(ctx))

    def prepare_store(self, keys, ctx):
        out = self.inner.prepare_store([enc(k) for k in keys], self._rc(ctx))
        if out is None:
            return None
        return PrepareStoreOutput(
            [dec(k) for k in out.keys_to_store],
            [int(i) for i in out.store_spec.block_ids],
            [dec(k) for k in out.evicted_keys],
        )

    def complete_store(self, keys, ctx=None, success=True):
        ctx = ctx or RequestContext("complete")
        self.inner.complete_store([enc(k) for k in keys], self._rc(ctx), success=success)

    def touch(self, keys, ctx):
        self.inner.touch([enc(k) for k in keys], self._rc(ctx))

    def on_request_finished(self, ctx):
        self.inner.on_request_finished(self._rc(ctx))

    def take_events(self):
        for e in self.inner.take_events():
            yield OffloadingEvent([dec(k) for k in e.keys], e.removed, e.metadata_only)

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


def make_kvsim(num_chunks, policy="lru", store_threshold=0, max_tracker_size=64_000):
    admission = (
        make_admission(store_threshold=store_threshold, max_tracker_size=max_tracker_size)
        if store_threshold >= 2
        else None
    )
    return OffloadManager(
        num_chunks, make_eviction_policy(policy, num_chunks), admission, enable_events=True
    )


# --- the golden scenarios, run against vLLM -------------------------------------------


def _load_golden():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_manager_golden.py")
    spec = importlib.util.spec_from_file_location("_kvsim_golden_scenarios", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_golden = _load_golden()


@pytest.mark.parametrize("scenario", sorted(_golden.SCENARIOS), ids=str)
def test_golden_scenario_holds_for_vllm(scenario):
    """The expectations hard-coded in the golden tests are exactly vLLM's behaviour."""
    _golden.SCENARIOS[scenario](make_vllm)


@pytest.mark.parametrize("order", ["forward", "reverse", "split"])
def test_golden_completion_orders_hold_for_vllm(order):
    _golden.scenario_finish_orders_lru_prefix_independent_of_store_completion(make_vllm, order)
    _golden.scenario_finish_orders_lru_prefix_independent_of_load_completion(make_vllm, order)


# --- random differential sequences ------------------------------------------------------


def _events(m) -> list:
    return [(tuple(e.keys), e.removed, e.metadata_only) for e in m.take_events()]


def _random_run(seed: int, policy: str, threshold: int, steps: int, seen: Counter) -> int:
    """Drive both managers with one random op sequence; returns the number of ops compared.

    ``seen`` counts the interesting outcomes, so the test can prove they were exercised.
    """
    rng = random.Random(seed)
    capacity = rng.choice([2, 3, 4, 6, 8])
    tracker = rng.choice([2, 3, 5, 64])
    ours = make_kvsim(capacity, policy, threshold, tracker)
    theirs = make_vllm(capacity, policy, threshold, tracker)
    # Prefix-chained "requests": key = prefix_id * 100 + chunk index, positions (i+1)*16.
    prefixes = [[p * 100 + i for i in range(rng.randint(1, 6))] for p in range(1, 6)]
    running: list[tuple[RequestContext, list[int]]] = []
    stores: list[tuple[list[int], RequestContext]] = []  # pending store jobs
    loads: list[tuple[list[int], RequestContext]] = []  # pending load jobs
    compared = 0
    next_req = 0

    def both(name, *args, **kw):
        a = getattr(ours, name)(*args, **kw)
        b = getattr(theirs, name)(*args, **kw)
        return a, b

    for _ in range(steps):
        op = rng.random()
        if not running or op < 0.12:
            prefix = rng.choice(prefixes)
            n = rng.randint(1, len(prefix))
            keys = prefix[:n]
            positioned = rng.random() < 0.85
            ctx = RequestContext(
                f"r{next_req}", {k: (i + 1) * 16 for i, k in enumerate(keys)} if positioned else {}
            )
            next_req += 1
            both("on_new_request", ctx)
            running.append((ctx, keys))
            continue
        ctx, keys = rng.choice(running)
        if op < 0.30:
            lo = rng.randint(0, len(keys) - 1)
            hi = rng.randint(lo + 1, len(keys))
            offer = keys[lo:hi]
            if rng.random() < 0.2:
                offer = list(reversed(offer))
            a, b = both("prepare_store", offer, ctx)
            assert a == b, (seed, "prepare_store", offer)
            seen[
                "store_failed"
                if a is None
                else "evicted"
                if a.evicted_keys
                else "stored"
                if a.keys_to_store
                else "store_empty"
            ] += 1
            if a is not None and a.keys_to_store:
                stores.append((list(a.keys_to_store), ctx))
        elif op < 0.45 and stores:
            job = stores.pop(rng.randrange(len(stores)))
            success = rng.random() < 0.9
            both("complete_store", job[0], job[1], success=success)
        elif op < 0.60:
            hits = []
            for k in keys:
                a, b = both("lookup", k, ctx)
                assert a == b, (seed, "lookup", k)
                seen[a.name] += 1
                compared += 1
                if a != LookupResult.HIT:
                    break
                hits.append(k)
            if hits:
                a, b = both("prepare_load", hits, ctx)
                assert a == b, (seed, "prepare_load", hits)
                loads.append((hits, ctx))
        elif op < 0.72 and loads:
            job = loads.pop(rng.randrange(len(loads)))
            both("complete_load", job[0], job[1])
        elif op < 0.84:
            running.remove((ctx, keys))
            both("on_request_finished", ctx)
        elif op < 0.90:
            both("touch", rng.sample(keys, rng.randint(1, len(keys))), ctx)
        elif op < 0.91:
            both("reset_cache")
            stores.clear()  # the scheduler ignores pre-reset jobs
            loads.clear()
        else:
            a, b = both("get_stats")
            assert a == b, (seed, "get_stats")
        ga, gb = both("gauges")
        assert ga == gb, (seed, "gauges")
        ea, eb = _events(ours), _events(theirs)
        assert ea == eb, (seed, "events")
        seen["events"] += len(ea)
        compared += 1
    return compared


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
