"""Miniature-simulation curves for any policy: exact at rate 1, LRU-corrected, bounded error."""

from __future__ import annotations

import pytest
from support import SYNTHETIC

from kvsim.config import CacheConfig
from kvsim.errors import InputError
from kvsim.replay.miniature import (
    miniature_config,
    miniature_error,
    miniature_mrc,
    replay_hit_ratio,
    sample_requests,
)
from kvsim.replay.mrc import key_sampler
from kvsim.traces import as_trace


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
    err = miniature_error(requests, cfg, [30, 300, 3000], sample_rate=0.2, protocol=protocol)
    assert err["error"].abs().max() < 1e-12
    raw = miniature_mrc(requests, cfg, [30], sample_rate=0.2, protocol=protocol, control=False)
    assert raw.table["hit_ratio"][0] == raw.table["uncorrected"][0]


def test_error_within_a_hundredth_at_ten_percent_on_a_bundled_trace():
    """The issue's goal, on the whole synthetic Mooncake trace (44k chunk keys): capacities
    from 1% to 30% of the distinct keys, 10% sampling."""
    requests = list(as_trace(SYNTHETIC))
    cfg = config(requests, "s3fifo")
    err = miniature_error(requests, cfg, [439, 1317, 4392, 13177], sample_rate=0.1)
    assert err["error"].abs().max() <= 0.01
    assert (err["full"].diff().dropna() > 0).all()  # a real curve, not a flat line


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
    with pytest.raises(InputError, match="kept none"):
        miniature_mrc(requests[:1], cfg, [10], sample_rate=1e-6)


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
