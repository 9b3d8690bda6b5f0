"""Miniature-simulation curves for any policy: exact at rate 1, LRU-corrected, bounded error."""

from __future__ import annotations

import numpy as np
import pytest
from support import SAMPLE, SYNTHETIC

from kvsim.cachemode.miniature import (
    MIN_CHUNKS,
    base_rate,
    forced_keys,
    miniature_config,
    miniature_error,
    miniature_grid,
    miniature_mrc,
    point_rate,
    replay_hit_ratio,
    sample_requests,
)
from kvsim.cachemode.mrc import key_sampler
from kvsim.core.errors import InputError
from kvsim.options.offload import CacheConfig
from kvsim.traces import as_trace
from kvsim.traces.model import Request


@pytest.fixture(scope="module")
def requests():
    return list(as_trace(SYNTHETIC, limit=600))


def config(requests, policy: str = "s3fifo", **kw) -> CacheConfig:
    bt = as_trace(SYNTHETIC, limit=1).block_tokens
    return CacheConfig(num_chunks=100, block_tokens=bt, chunk_tokens=bt, policy=policy, **kw)


@pytest.mark.parametrize("protocol", ["prefix", "object"])
@pytest.mark.parametrize("policy", ["s3fifo", "sieve", "arc", "belady"])
def test_rate_one_is_a_full_replay_at_every_capacity(requests, policy, protocol):
    cfg = config(requests, policy)
    curve = miniature_mrc(requests, cfg, [50, 400, 3000], sample_rate=1.0, protocol=protocol)
    for capacity, estimate in zip(curve.table["capacity"], curve.table["hit_ratio"]):
        exact = replay_hit_ratio(requests, miniature_config(cfg, capacity, 1.0), protocol)
        full = replay_hit_ratio(
            requests, CacheConfig(**{**cfg.as_dict(), "num_chunks": capacity}), protocol
        )
        assert estimate == pytest.approx(exact, abs=1e-12) == pytest.approx(full, abs=1e-12)


@pytest.mark.parametrize("protocol", ["prefix", "object"])
def test_lru_corrected_by_itself_is_exact(requests, protocol):
    """The control variate: LRU's miniature minus LRU's miniature leaves LRU's exact ratio."""
    cfg = config(requests, "lru")
    kw = {"sample_rate": 0.2, "protocol": protocol, "min_chunks": 0, "min_keys": 0}
    err = miniature_error(requests, cfg, [30, 300, 3000], **kw)
    assert (err["sample_rate"] == 0.2).all() and err["error"].abs().max() < 1e-12
    raw = miniature_mrc(requests, cfg, [30], control=False, **kw)
    assert raw.table["hit_ratio"][0] == raw.table["uncorrected"][0]


def test_error_within_a_hundredth_at_ten_percent_on_a_bundled_trace():
    """The issue's goal, on the whole synthetic Mooncake trace (44k chunk keys): capacities
    from 1% to 30% of the distinct keys, 10% sampling."""
    requests = list(as_trace(SYNTHETIC))
    cfg = config(requests, "s3fifo")
    err = miniature_error(requests, cfg, [439, 1317, 4392, 13177], sample_rate=0.1)
    assert err["error"].abs().max() <= 0.01
    assert (err["full"].diff().dropna() > 0).all()  # a real curve, not a flat line


def test_point_rate_doubles_until_the_miniature_is_big_enough():
    assert point_rate(10_000, 0.1, 256) == 0.1  # 1,000 chunks: the asked rate
    assert point_rate(2_000, 0.1, 256) == 0.2  # 200 -> 400 chunks
    assert point_rate(700, 0.1, 256) == 0.4  # 70 -> 140 -> 280
    assert point_rate(300, 0.1, 256) == 1.0  # 0.8 holds 240: a full replay
    assert point_rate(30, 0.1, 0) == 0.1  # the rule off
    for c in (1, 50, 257, 999, 5000):
        r = point_rate(c, 0.1, 256)
        assert r == 1.0 or c * r >= 256


def test_sampled_traces_nest_across_rates(requests):
    """The rates of one curve share one hash: a key kept at 0.1 is kept at 0.2."""
    cfg = config(requests)
    low, _ = sample_requests(requests, cfg, 0.1, seed=2)
    high, _ = sample_requests(requests, cfg, 0.2, seed=2)
    assert sum(len(r.block_hashes) for r in low) < sum(len(r.block_hashes) for r in high)
    for a, b in zip(low, high):
        assert set(a.block_hashes) <= set(b.block_hashes)


@pytest.mark.parametrize("protocol", ["prefix", "object"])
def test_small_miniatures_are_replayed_at_a_higher_rate(requests, protocol):
    """On a 600-request trace a 10% miniature of 150 or 600 chunks would hold 15 or 60:
    the rule raises the rate (reported per point), and a capacity under the minimum is a
    full replay, so its estimate is exact, where the 10% miniature's is not."""
    cfg = config(requests, "sieve")
    caps = [150, 600, 2000, 2600]
    kw = {"sample_rate": 0.1, "protocol": protocol, "min_keys": 0}
    curve = miniature_mrc(requests, cfg, caps, min_chunks=256, **kw)
    t = curve.table
    assert list(t["sample_rate"]) == [1.0, 0.8, 0.2, 0.1]
    assert list(t["miniature_chunks"]) == [150, 480, 400, 260]
    assert curve.info["rates"] == [0.1, 0.2, 0.8, 1.0]
    full = replay_hit_ratio(requests, CacheConfig(**{**cfg.as_dict(), "num_chunks": 150}), protocol)
    assert t["hit_ratio"][0] == pytest.approx(full, abs=1e-12)
    assert t["uncorrected"][0] == pytest.approx(full, abs=1e-12)  # no control at rate 1
    assert curve.is_exact(150) and not curve.is_exact(600)  # marked exact, not `~`
    old = miniature_mrc(requests, cfg, caps, min_chunks=0, **kw)
    assert list(old.table["sample_rate"]) == [0.1] * 4
    assert abs(old.table["hit_ratio"][0] - full) > 1e-6  # the rule changed the estimate


def test_rule_lowers_the_error_of_small_miniatures():
    """The error the rule exists for: SIEVE (no size parameter to scale) at 1-10% of the
    synthetic trace's 40k distinct chunks, object protocol, 10% sampling. Without the rule
    its 40-400-chunk miniatures miss by more than 0.01; with it, every point is within."""
    requests = list(as_trace(SYNTHETIC))
    cfg = config(requests, "sieve")
    caps = [401, 1204]
    kw = {"sample_rate": 0.1, "protocol": "object"}
    with_rule = miniature_error(requests, cfg, caps, min_keys=0, **kw)
    without = miniature_error(requests, cfg, caps, min_chunks=0, min_keys=0, **kw)
    assert (with_rule["sample_rate"] > 0.1).all() and (without["sample_rate"] == 0.1).all()
    assert with_rule["error"].abs().max() <= 0.01 < without["error"].abs().max()


def test_seeds_average_independent_miniatures(requests):
    cfg = config(requests, "s3fifo")
    caps = [400, 1500]
    kw = {"sample_rate": 0.2, "min_chunks": 0, "min_keys": 0}
    one = [miniature_mrc(requests, cfg, caps, seed=s, **kw).table for s in (3, 4)]
    both = miniature_mrc(requests, cfg, caps, seed=3, seeds=2, **kw)
    mean = (one[0]["hit_ratio"] + one[1]["hit_ratio"]) / 2
    assert list(both.table["hit_ratio"]) == pytest.approx(list(mean), abs=1e-12)
    assert both.info["seeds"] == 2


def test_small_trace_is_sampled_at_a_larger_rate(requests):
    """A sample of a trace with few distinct keys is too small to estimate from: the base
    rate rises until it holds ``min_keys`` of them (reported), up to full replays."""
    assert base_rate(0.1, 200_000, 8192) == 0.1
    assert base_rate(0.1, 40_000, 8192) == pytest.approx(0.2048)
    assert base_rate(0.1, 5_000, 8192) == 1.0 and base_rate(0.1, 40_000, 0) == 0.1
    cfg = config(requests, "fifo")
    distinct = sample_requests(requests, cfg, 0.1, 0)[1]["distinct"]
    keys = distinct // 4  # a quarter of the keys: the rate is 0.25, then raised per point
    curve = miniature_mrc(requests, cfg, [5000], sample_rate=0.1, min_keys=keys, min_chunks=0)
    assert curve.info["base_rate"] == pytest.approx(keys / distinct)
    assert curve.table["sample_rate"][0] == pytest.approx(keys / distinct)
    assert curve.sample_rate == 0.1  # the asked rate, beside the one used


def test_default_grid_starts_at_the_smallest_miniature():
    """Below ``min_chunks`` a point is a full replay: the default grid starts there (and
    where a miniature holds one chunk, with the rule off)."""
    grid = miniature_grid(40_000, 0.1, 24)
    assert grid[0] == MIN_CHUNKS and grid[-1] == 40_001 and len(grid) <= 24
    assert miniature_grid(40_000, 0.1, 24, min_chunks=0)[0] == 10
    assert miniature_grid(40_000, 1.0, 24)[0] == 1
    assert miniature_grid(100, 0.1, 24)[0] == 101  # a trace smaller than the minimum


def test_miniature_shrinks_cache_and_tracker(requests):
    cfg = config(requests, "s3fifo", store_threshold=2, max_tracker_size=5000)
    mini = miniature_config(cfg, 1234, 0.1)
    assert (mini.num_chunks, mini.max_tracker_size) == (123, 500)
    assert mini.block_tokens == cfg.chunk_tokens and mini.gpu_blocks == 0
    assert miniature_config(cfg, 3, 0.1).num_chunks == 1


def test_sampled_trace_keeps_whole_chunks_in_prompt_order(requests):
    cfg = config(requests)
    sampled, counts = sample_requests(requests, cfg, 0.3, seed=4)
    keep = key_sampler(0.3, 4)
    assert len(sampled) == len(requests)
    for full, mini in zip(requests, sampled):
        keys = list(full.block_hashes[: full.input_tokens // cfg.block_tokens])
        assert list(mini.block_hashes) == [k for k in keys if keep(k)]
        assert mini.input_tokens == len(mini.block_hashes) * cfg.chunk_tokens
    assert counts["sampled"] == sum(len(r.block_hashes) for r in sampled)


def test_sampler_is_spatial_and_unbiased_on_consecutive_ids():
    """Trace ids are small consecutive integers; the hottest are the smallest. The filter
    must keep the rate on them and not keep id 0 at every seed."""
    ids = range(200_000)
    for seed in range(3):
        keep = key_sampler(0.1, seed)
        kept = sum(1 for k in ids if keep(k))
        assert 0.098 < kept / len(ids) < 0.102
        assert [keep(k) for k in range(50)] == [keep(k) for k in range(50)]
    assert not all(key_sampler(0.1, s)(0) for s in range(20))
    assert key_sampler(1.0, 0) is None


def test_bad_requests_are_one_line_errors(requests):
    cfg = config(requests)
    with pytest.raises(InputError, match="sample-rate"):
        miniature_mrc(requests, cfg, [10], sample_rate=0.0)
    with pytest.raises(InputError, match="capacities"):
        miniature_mrc(requests, cfg, [])
    with pytest.raises(InputError, match="gpu-blocks"):
        miniature_mrc(requests, config(requests, gpu_blocks=100), [10])
    with pytest.raises(InputError, match="chunked prefill"):
        miniature_mrc(requests, config(requests, prefill_chunk_tokens=1024), [10])
    with pytest.raises(InputError, match="min-chunks"):
        miniature_mrc(requests, cfg, [10], min_chunks=-1)
    with pytest.raises(InputError, match="seeds"):
        miniature_mrc(requests, cfg, [10], seeds=0)
    with pytest.raises(InputError, match="kept none"):
        miniature_mrc(requests[:1], cfg, [10], sample_rate=1e-6, heavy_share=0)
    with pytest.raises(InputError, match="heavy-share"):
        miniature_mrc(requests, cfg, [10], heavy_share=-1)
    # at such a rate any key would weigh more than the trace: every key is forced
    tiny = miniature_mrc(requests[:1], cfg, [10], sample_rate=1e-6, min_chunks=0, min_keys=0)
    assert tiny.info["forced_keys"] == tiny.info["prompt_units"] > 0


def test_api_mrc_for_any_policy_matches_replays_at_rate_one():
    """`kvsim.mrc(policy=...)` at sample rate 1 replays every capacity: each --cpu-gib point
    is `kvsim.replay`'s own hit ratio at that size."""
    import kvsim

    curve = kvsim.mrc(
        SYNTHETIC,
        policy="s3fifo",
        sample_rate=1.0,
        limit=300,
        model="llama-3.1-8b",
        cpu_gib=[4, 32],
    )
    assert curve.info["method"] == "miniature" and curve.points is not None
    for row in curve.points.itertuples(index=False):
        s = kvsim.replay(
            SYNTHETIC,
            limit=300,
            model="llama-3.1-8b",
            cpu_gib=row.cpu_gib_asked,
            policy="s3fifo",
            per_request=False,
        ).summary
        assert row.hit_ratio == pytest.approx(s["cpu_hit_ratio"], abs=1e-12)
        assert bool(row.exact)
    sampled = kvsim.mrc(SYNTHETIC, policy="s3fifo", limit=300)
    assert sampled.sample_rate == 0.1 and len(sampled.table) <= 24


def _hot_key_trace(n: int = 4000) -> tuple[list[Request], int]:
    """A RAG-like trace whose every request starts with one key (10 % of all accesses)
    that seed 0 does not sample at 10 %: a 6-chunk document (of 1,500, the first ones
    likelier, none in over 1 % of requests), then 3 fresh chunks."""
    keep = key_sampler(0.1, 0)
    assert keep is not None
    hot = next(k for k in range(10**6, 10**7) if not keep(k))
    rng = np.random.default_rng(7)
    docs = (1500 * rng.random(n) ** 1.5).astype(int)
    out, fresh = [], 10**8
    for i, d in enumerate(docs):
        keys = (hot, *range(int(d) * 6, int(d) * 6 + 6), *range(fresh, fresh + 3))
        fresh += 3
        out.append(Request(i, float(i), len(keys) * 16, 1, keys))
    return out, hot


def test_a_key_in_every_request_is_forced_into_the_miniature():
    """A key that starts every request, missed by the sample, biases every miniature:
    uncorrected by about its share of hits (arc, prefix protocol); LRU's correction leaves
    part of it (Belady, object protocol: > 0.01). Forced into every miniature and weighted
    by the rate, it is estimated as well as the rest."""
    requests, hot = _hot_key_trace()
    assert forced_keys({hot: 4000, 1: 39}, 40_000, 0.1) == {hot}
    caps = [1000, 3000]
    kw = {"sample_rate": 0.1, "min_keys": 0, "min_chunks": 0}
    for protocol, policy, control, bound, bias in [
        ("prefix", "arc", False, 0.02, 0.05),
        ("object", "belady", True, 0.01, 0.01),
    ]:
        cfg = CacheConfig(num_chunks=100, block_tokens=16, chunk_tokens=16, policy=policy)
        forced = miniature_error(requests, cfg, caps, protocol=protocol, control=control, **kw)
        plain = miniature_error(
            requests, cfg, caps, protocol=protocol, control=control, heavy_share=0, **kw
        )
        assert list(forced["forced_keys"]) == [1, 1] and list(plain["forced_keys"]) == [0, 0]
        assert forced["error"].abs().max() <= bound and plain["error"].abs().max() > bias
    curve = miniature_mrc(requests, cfg, caps, protocol="object", **kw)
    assert curve.info["forced_keys"] == 1
    assert list(curve.table["miniature_chunks"]) == [101, 301]  # + 0.9 slot for the hot key


@pytest.mark.parametrize("policy", ["s3fifo", "belady"])
def test_counting_forced_hits_keeps_every_decision(requests, policy):
    """The object protocol counts a forced key's hits by running the stream in pieces split
    at it: the cache's hits and accesses are those of one uncut replay."""
    from kvsim.cachemode.miniature import _object_counts, _prefix_counts
    from kvsim.cachemode.object_protocol import replay_config

    cfg = CacheConfig(**{**config(requests, policy).as_dict(), "num_chunks": 3000})
    counts: dict[int, int] = {}
    for r in requests:
        for k in r.block_hashes:
            counts[k] = counts.get(k, 0) + 1
    hot = frozenset(sorted(counts, key=counts.__getitem__)[-3:])
    hits, accesses, f_hits, f_accesses = _object_counts(requests, cfg, hot)
    whole = replay_config(requests, cfg, "object")
    assert (hits, accesses) == (whole["hits"], whole["accesses"])
    assert 0 < f_hits <= f_accesses <= sum(counts[k] for k in hot)
    hits, accesses, f_hits, f_accesses = _prefix_counts(requests, cfg, hot)
    assert 0 < f_hits <= f_accesses and hits > f_hits


def test_mrc_averages_seeds_from_the_api_and_the_cli(tmp_path, capsys):
    """``seeds`` reaches the miniatures; lru, one exact pass, refuses it."""
    import json

    from support import run_main

    import kvsim

    two = kvsim.mrc(SYNTHETIC, policy="s3fifo", limit=300, seeds=2)
    assert two.info["seeds"] == 2  # as miniature_mrc ran it (its averaging: tested above)
    assert kvsim.mrc(SYNTHETIC, policy="s3fifo", limit=300).info["seeds"] == 1
    code, out, err = run_main(
        ["mrc", SYNTHETIC, "--policy", "s3fifo", "--limit", "300", "--seeds", "2", "--json"],
        capsys,
    )
    assert code == 0 and json.loads(out)["seeds"] == 2, err
    code, _, err = run_main(["mrc", SYNTHETIC, "--seeds", "2"], capsys)
    assert code == 2 and "--seeds" in err and "lru" in err


def test_the_api_counts_a_miniature_curves_replays_for_a_progress_bar():
    import kvsim

    ticks: list[int] = []
    curve = kvsim.mrc(SAMPLE, policy="arc", seeds=2, progress=ticks.append)
    assert sum(ticks) == 2 * len(curve.table) and set(ticks) == {1}
