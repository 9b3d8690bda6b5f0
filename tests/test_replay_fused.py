"""The fused LRU tier makes the full protocol's decisions, request by request.

The protocol tier (kvsim's OffloadManager + LRUPolicy, itself checked against vLLM's
manager in test_vllm_differential.py) is the reference. Random prefix-chained traces
and configurations push the fused tier through evictions of its own request's chunks,
failed and retried offers, admission filters, the GPU prefix cache and chunked prefill.
"""

from __future__ import annotations

import random

import pytest

from kvsim.config import OffloadOptions
from kvsim.replay import CacheReplay
from kvsim.replay_fused import FusedLRUTier
from kvsim.replay_protocol import ProtocolTier
from kvsim.traces import Request, open_trace

BLOCK = 16


def _trace(rng: random.Random, n: int, max_blocks: int) -> list[Request]:
    """Requests that extend a random prefix of an earlier request with fresh ids."""
    fresh = iter(range(1, 10**9))
    prompts: list[tuple[int, ...]] = []
    out = []
    for i in range(n):
        base = rng.choice(prompts) if prompts and rng.random() < 0.8 else ()
        keep = base[: rng.randint(0, len(base))]
        ids = keep + tuple(next(fresh) for _ in range(rng.randint(0 if keep else 1, max_blocks)))
        prompts.append(ids)
        tokens = len(ids) * BLOCK - rng.choice((0, 0, 1, BLOCK - 1))
        out.append(Request(i, float(i), max(tokens, 1), 1, ids))
    return out


def _options(rng: random.Random) -> OffloadOptions:
    admission = rng.choice(["always"] * 4 + ["length:64", "tinylfu:64", "probabilistic:0.5"])
    threshold = rng.choice([0, 0, 0, 2, 3]) if admission == "always" else 0
    return OffloadOptions(
        cpu_chunks=rng.choice([1, 2, 3, 5, 8, 13, 30, 80]),
        model=None,
        chunk_tokens=rng.choice([8, 16, 16, 32, 64]),
        gpu_blocks=rng.choice([0, 0, 4, 12, 40]),
        prefill_chunk_tokens=rng.choice([None, None, 16, 40, 64]),
        admission=admission,
        store_threshold=threshold,
        max_tracker_size=rng.choice([3, 20, 64_000]),
        seed=rng.randint(0, 9),
    )


def _replay(requests, cfg, fused: bool):
    run = CacheReplay(cfg, fused=fused)
    rows: list[tuple] = []
    summary = run.run(requests, rows.append)
    summary.pop("tier")
    c = run.tier.counters
    counters = (c.stored_chunks, c.evicted_chunks, c.loaded_chunks, c.stores_skipped,
                c.allocation_failures, c.allocation_sizes.counts, c.allocation_sizes.sum)
    return rows, summary, run.tier.resident_keys(), counters


@pytest.mark.parametrize("seed", range(300))
def test_fused_lru_equals_the_protocol(seed: int) -> None:
    rng = random.Random(seed)
    options = _options(rng)
    requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
    cfg = options.resolve(BLOCK)
    fused = _replay(requests, cfg, True)
    reference = _replay(requests, cfg, False)
    assert fused[0] == reference[0], options  # per-request rows
    assert fused[1] == reference[1], options  # summary
    assert fused[2] == reference[2], options  # resident keys in eviction order
    assert fused[3] == reference[3], options  # counters and allocation histogram


def test_the_random_cases_reach_the_rare_paths() -> None:
    """Guard the test above: its cases evict own chunks, fail offers and skip stores."""
    evicted = failed = skipped = own = 0
    for seed in range(300):
        rng = random.Random(seed)
        options = _options(rng)
        requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
        rows, summary, _, _ = _replay(requests, options.resolve(BLOCK), True)
        evicted += summary["chunks_evicted"] > 0
        failed += summary["allocation_failures"] > 0
        skipped += summary["chunks_skipped_by_threshold"] > 0
        # a request evicting at least as many chunks as were resident before it
        own += any(r[7] > 0 and r[6] >= options.cpu_chunks for r in rows)
    assert min(evicted, failed, skipped, own) >= 10, (evicted, failed, skipped, own)


@pytest.mark.parametrize("cpu_chunks", [64, 1024])
def test_fused_lru_equals_the_protocol_on_a_real_trace(cpu_chunks: int) -> None:
    requests = list(open_trace("traces/samples/mooncake_small.jsonl"))
    cfg = OffloadOptions(cpu_chunks=cpu_chunks, model=None, gpu_blocks=200).resolve(512)
    assert _replay(requests, cfg, True) == _replay(requests, cfg, False)


def test_the_tier_is_chosen_by_policy() -> None:
    lru = OffloadOptions(cpu_chunks=4, model=None).resolve(BLOCK)
    assert isinstance(CacheReplay(lru).tier, FusedLRUTier)
    assert isinstance(CacheReplay(lru, fused=False).tier, ProtocolTier)
    arc = OffloadOptions(cpu_chunks=4, model=None, policy="arc").resolve(BLOCK)
    assert isinstance(CacheReplay(arc).tier, ProtocolTier)
    with pytest.raises(ValueError, match="fused tier runs kvsim's own 'lru'"):
        CacheReplay(arc, fused=True)


@pytest.mark.vllm
def test_fused_lru_makes_vllms_decisions() -> None:
    pytest.importorskip("vllm.v1.kv_offload.cpu.manager")
    from kvsim.vllm_driver import VllmManagerDriver

    skipped = 8  # the driver does not count skipped stores; every other column must agree
    for seed in range(100):
        rng = random.Random(seed)
        options = _options(rng)
        if options.admission != "always":
            options = options.with_(admission="always")  # vLLM has the threshold rule only
        requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
        cfg = options.resolve(BLOCK)
        ours, theirs = [], []
        CacheReplay(cfg, fused=True).run(requests, ours.append)
        driver = VllmManagerDriver(cfg.num_chunks, "lru", cfg.store_threshold, cfg.max_tracker_size)
        CacheReplay(cfg, manager=driver).run(requests, theirs.append)
        assert [r[:skipped] + r[skipped + 1:] for r in ours] == \
            [r[:skipped] + r[skipped + 1:] for r in theirs], (seed, options)
