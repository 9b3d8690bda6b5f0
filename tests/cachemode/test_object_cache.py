"""The object-cache protocol, and kvsim's policies against libCacheSim on the same stream."""

from __future__ import annotations

import random

import pytest
from support import SAMPLE, SYNTHETIC

from kvsim.api import replay
from kvsim.cachemode.object_protocol import ObjectCache, block_stream, object_replay
from kvsim.core.keys import KeyLayout
from kvsim.options.config import CacheConfig
from kvsim.policies.registry import make_eviction_policy
from kvsim.traces import as_trace

# kvsim name -> libCacheSim class name. All six match exactly (see docs/policies.md).
MATCHED = {
    "lru": "LRU",
    "fifo": "FIFO",
    "arc-textbook": "ARC",
    "sieve": "Sieve",
    "s3fifo": "S3FIFO",
    "belady": "Belady",
}

# Misses on the fixed stream below at capacities 20, 64, 300 (kvsim == libCacheSim 0.3.5).
GOLDEN = {
    "lru": [8028, 6553, 4187],
    "fifo": [8299, 6975, 4598],
    "arc-textbook": [7049, 5756, 4012],
    "sieve": [6995, 5827, 4651],
    "s3fifo": [6911, 5647, 4039],
    "belady": [5961, 4495, 2728],
}
CAPACITIES = (20, 64, 300)


def mixed_stream() -> list[int]:
    """Zipf popularity, a scan, then a shifted popularity: exercises ghosts and promotion."""
    rng = random.Random(11)
    w1 = [1 / (i**0.8) for i in range(1, 1501)]
    w2 = [1 / (i**1.0) for i in range(1, 1501)]
    first = rng.choices(range(1500), weights=w1, k=5000)
    scan = list(range(5000, 5400))
    second = [700 + k for k in rng.choices(range(1500), weights=w2, k=4600)]
    return first + scan + second


def kvsim_misses(policy: str, keys: list[int], capacity: int) -> int:
    cache = ObjectCache(make_eviction_policy(policy, capacity), capacity)
    cache.prepare(keys)
    return cache.run(keys).misses


def libcachesim_misses(lcs, name: str, keys: list[int], capacity: int) -> int:
    cache = getattr(lcs, name)(capacity)
    nxt: dict[int, int] = {}
    future = [0] * len(keys)
    for i in range(len(keys) - 1, -1, -1):
        future[i] = nxt.get(keys[i], 1 << 62)
        nxt[keys[i]] = i
    misses = 0
    for key, when in zip(keys, future):
        req = lcs.Request()
        req.obj_id, req.obj_size, req.next_access_vtime = key, 1, when
        misses += not cache.get(req)
    return misses


@pytest.mark.parametrize("policy", sorted(GOLDEN))
def test_golden_misses(policy):
    keys = mixed_stream()
    assert [kvsim_misses(policy, keys, c) for c in CAPACITIES] == GOLDEN[policy]


@pytest.mark.parametrize("policy", sorted(MATCHED))
def test_same_misses_as_libcachesim(policy):
    lcs = pytest.importorskip("libcachesim")
    keys = mixed_stream()
    for capacity in CAPACITIES:
        assert kvsim_misses(policy, keys, capacity) == libcachesim_misses(
            lcs, MATCHED[policy], keys, capacity
        )


def test_same_misses_as_libcachesim_on_a_trace_block_stream():
    lcs = pytest.importorskip("libcachesim")
    tr = as_trace(SYNTHETIC, limit=300)
    keys = list(block_stream(tr, KeyLayout(tr.block_tokens, tr.block_tokens)))
    for policy, name in MATCHED.items():
        assert kvsim_misses(policy, keys, 500) == libcachesim_misses(lcs, name, keys, 500), policy


def test_accounting_and_capacity():
    keys = [1, 2, 1, 3, 4, 1, 5, 2]
    cache = ObjectCache(make_eviction_policy("lru", 3), 3)
    stats = cache.run(keys)
    assert (stats.accesses, stats.hits, stats.evictions) == (8, 2, 3)
    assert len(cache.policy) == 3


def test_object_replay_summary_and_api():
    tr = as_trace(SAMPLE)
    layout = KeyLayout(tr.block_tokens, tr.block_tokens)
    s = object_replay(tr, CacheConfig(400, tr.block_tokens, tr.block_tokens, policy="sieve"))
    assert s["accesses"] == sum(1 for _ in block_stream(tr, layout))
    assert s["hits"] + s["misses"] == s["accesses"]
    r = replay(tr, cpu_chunks=400, policy="sieve", protocol="object")
    assert r.summary["hits"] == s["hits"] and r.summary["protocol"] == "object"


def test_cli_object_protocol(capsys):
    from kvsim.cli import main

    with pytest.raises(SystemExit) as exc:
        main(
            [
                "replay",
                SAMPLE,
                "--cpu-chunks",
                "300",
                "--policy",
                "s3fifo",
                "--admission",
                "tinylfu",
                "--protocol",
                "object",
                "--json",
            ]
        )
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert '"protocol": "object"' in out and '"bypassed"' in out
