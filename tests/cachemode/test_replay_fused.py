"""The fused tiers (lru, arc) make the full protocol's decisions, request by request.

The protocol tier (kvsim's OffloadManager + LRUPolicy / ARCPolicy, themselves checked
against vLLM's manager in test_vllm_differential.py) is the reference. Random prefix-chained traces
and configurations push the fused tier through evictions of its own request's chunks,
failed and retried offers, admission filters, the GPU prefix cache and chunked prefill.
"""

from __future__ import annotations

import itertools
import random

import pytest
from support import SAMPLE, need_vllm

from kvsim.cachemode import CacheReplay
from kvsim.cachemode.fused_arc import FusedARCTier
from kvsim.cachemode.fused_lru import FusedLRUTier
from kvsim.cachemode.protocol_tier import ProtocolTier
from kvsim.options.offload import OffloadOptions
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


def _policy_state(run: CacheReplay) -> tuple:
    """ARC's lists and target (the fused tier names them as ARCPolicy does); () for LRU."""
    arc = run.tier if run.manager is None else run.manager.policy
    if not hasattr(arc, "b1"):
        return ()
    return list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2), arc.p


def _replay(requests, cfg, fused: bool):
    run = CacheReplay(cfg, fused=fused)
    rows: list[tuple] = []
    summary = run.run(requests, rows.append)
    summary.pop("tier")
    c = run.tier.counters
    counters = (
        c.stored_chunks,
        c.evicted_chunks,
        c.loaded_chunks,
        c.stores_skipped,
        c.allocation_failures,
        c.allocation_sizes.counts,
        c.allocation_sizes.sum,
    )
    return rows, summary, run.tier.resident_keys(), counters, _policy_state(run)


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(300))
def test_fused_tier_equals_the_protocol(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    options = _options(rng).with_(policy=policy)
    requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
    cfg = options.resolve(BLOCK)
    fused = _replay(requests, cfg, True)
    reference = _replay(requests, cfg, False)
    assert fused[0] == reference[0], options  # per-request rows
    assert fused[1] == reference[1], options  # summary
    assert fused[2] == reference[2], options  # resident keys (LRU: in eviction order)
    assert fused[3] == reference[3], options  # counters and allocation histogram
    assert fused[4] == reference[4], options  # ARC: T1, T2, B1, B2 in order, and p


def test_the_random_cases_reach_the_rare_paths() -> None:
    """Guard the test above: its cases evict own chunks, fail offers, skip stores, and
    (for ARC) move p both ways and promote to T2."""
    evicted = failed = skipped = own = p_up = p_down = promoted = 0
    for seed in range(300):
        rng = random.Random(seed)
        options = _options(rng)
        arc_run = CacheReplay(options.with_(policy="arc").resolve(BLOCK), fused=True)
        tier = arc_run.tier
        ps = [0.0]

        def watch(row, tier=tier, ps=ps):
            ps.append(tier.p)

        arc_run.run(_trace(random.Random(seed), 60, 8), watch)
        p_up += any(b > a for a, b in itertools.pairwise(ps))
        p_down += any(b < a for a, b in itertools.pairwise(ps))
        promoted += len(tier.t2) > 0
        requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
        rows, summary, *_ = _replay(requests, options.resolve(BLOCK), True)
        evicted += summary["chunks_evicted"] > 0
        failed += summary["allocation_failures"] > 0
        skipped += summary["chunks_skipped_by_threshold"] > 0
        # a request evicting at least as many chunks as were resident before it
        own += any(r[7] > 0 and r[6] >= options.cpu_chunks for r in rows)
    counts = evicted, failed, skipped, own, p_up, p_down, promoted
    assert min(counts) >= 10, counts


def _whole_run_options(rng: random.Random) -> OffloadOptions:
    """Configurations the fused LRU tier replays in one loop (a chunk is a block, no GPU
    cache, every offer admitted at once)."""
    return OffloadOptions(
        cpu_chunks=rng.choice([1, 2, 3, 5, 8, 13, 30, 80]), model=None, chunk_tokens=BLOCK
    )


@pytest.mark.parametrize("seed", range(200))
def test_the_whole_run_loop_equals_the_protocol(seed: int) -> None:
    rng = random.Random(seed)
    cfg = _whole_run_options(rng).resolve(BLOCK)
    run = CacheReplay(cfg)
    assert run._replay_loop() == run.tier.run_whole_blocks  # the loop under test
    requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
    assert _replay(requests, cfg, True) == _replay(requests, cfg, False)


def test_the_whole_run_cases_reach_the_rare_paths() -> None:
    """Guard the test above: requests that evict their own chunks, and failed stores."""
    own = failed = 0
    for seed in range(200):
        rng = random.Random(seed)
        options = _whole_run_options(rng)
        requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
        rows, summary, *_ = _replay(requests, options.resolve(BLOCK), True)
        failed += summary["allocation_failures"] > 0
        own += any(r[7] > 0 and r[6] >= options.cpu_chunks for r in rows)
    assert min(own, failed) >= 10, (own, failed)


@pytest.mark.parametrize("cpu_chunks", [64, 1024])
def test_the_whole_run_loop_equals_the_protocol_on_a_file_trace(cpu_chunks: int) -> None:
    """A file trace's records carry lists of block ids (a list of requests, tuples)."""
    cfg = OffloadOptions(cpu_chunks=cpu_chunks, model=None).resolve(512)
    run = CacheReplay(cfg)
    assert run._replay_loop() == run.tier.run_whole_blocks
    assert _replay(open_trace(SAMPLE), cfg, True) == _replay(open_trace(SAMPLE), cfg, False)


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("cpu_chunks", [64, 1024])
def test_fused_tier_equals_the_protocol_on_a_real_trace(cpu_chunks: int, policy: str) -> None:
    requests = list(open_trace(SAMPLE))
    cfg = OffloadOptions(cpu_chunks=cpu_chunks, model=None, gpu_blocks=200, policy=policy).resolve(
        512
    )
    assert _replay(requests, cfg, True) == _replay(requests, cfg, False)


def test_the_tier_is_chosen_by_policy() -> None:
    def tier(policy: str, fused: bool | None = None):
        return CacheReplay(
            OffloadOptions(cpu_chunks=4, model=None, policy=policy).resolve(BLOCK), fused=fused
        ).tier

    assert isinstance(tier("lru"), FusedLRUTier) and isinstance(tier("LRU"), FusedLRUTier)
    assert isinstance(tier("kvsim.policies.lru:LRUPolicy"), FusedLRUTier)
    assert isinstance(tier("arc"), FusedARCTier)
    assert isinstance(tier("lru", False), ProtocolTier) and isinstance(
        tier("arc", False), ProtocolTier
    )
    assert isinstance(tier("s3fifo"), ProtocolTier)
    with pytest.raises(ValueError, match="fused tier runs kvsim's own 'lru' and 'arc' only"):
        tier("s3fifo", True)


@pytest.mark.vllm
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_fused_tier_makes_vllms_decisions(policy: str) -> None:
    need_vllm("vllm.v1.kv_offload.cpu.manager")
    from kvsim.integrations.from_vllm import VllmManagerDriver

    skipped = 8  # the driver does not count skipped stores; every other column must agree
    for seed in range(100):
        rng = random.Random(seed)
        options = _options(rng).with_(policy=policy)
        if options.admission != "always":
            options = options.with_(admission="always")  # vLLM has the threshold rule only
        requests = _trace(rng, rng.randint(1, 60), rng.choice([3, 8, 20]))
        cfg = options.resolve(BLOCK)
        ours, theirs = [], []
        CacheReplay(cfg, fused=True).run(requests, ours.append)
        driver = VllmManagerDriver(
            cfg.num_chunks, policy, cfg.store_threshold, cfg.max_tracker_size
        )
        CacheReplay(cfg, manager=driver).run(requests, theirs.append)
        assert [r[:skipped] + r[skipped + 1 :] for r in ours] == [
            r[:skipped] + r[skipped + 1 :] for r in theirs
        ], (seed, options)
