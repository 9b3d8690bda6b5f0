"""GpuBlockPool: vLLM v1 block-pool semantics (free-queue LRU, lazy eviction, tail-first free)."""

from __future__ import annotations

import pytest

from kvsim.cachemode import CacheReplay
from kvsim.manager.gpu_cache import GpuBlockPool
from kvsim.options.offload import CacheConfig
from kvsim.traces.model import Request


def run_request(pool, keys):
    """Allocate, cache and free one request's full blocks."""
    blocks = pool.allocate(len(keys))
    pool.cache_blocks(blocks, keys)
    pool.free(blocks)
    return blocks


def test_allocation_pops_least_recently_freed():
    pool = GpuBlockPool(4)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) is None  # only 2 free: nothing taken
    assert pool.num_free == 2
    pool.free([0, 1])  # no hashes: tail first (1 then 0) to the front, reused first (LIFO)
    assert pool.allocate(4) == [1, 0, 2, 3]


def test_uncached_blocks_are_reused_before_cached_ones():
    """vLLM BlockPool.free_blocks: a block that can never be hit goes to the front of the
    free queue, a cached one to the back, so freeing keeps the prefix cache warm."""
    pool = GpuBlockPool(6)
    blocks = pool.allocate(4)
    pool.cache_blocks(blocks[:2], [100, 101])  # the last two hold a partial/unique tail
    pool.free(blocks)
    # front: the uncached tail (3, 2), then never-used 4, 5, then the cached 1, 0 (tail first)
    assert pool.allocate(6) == [3, 2, 4, 5, 1, 0]


def test_lazy_eviction_keeps_hashes_until_reuse():
    pool = GpuBlockPool(3)
    run_request(pool, [100, 101, 102])
    assert pool.num_cached == 3 and pool.match_prefix([100, 101, 102], 3) == 3
    # freed tail first: 102 (block 2) is the next to be reused, then 101, then 100
    pool.allocate(1)
    assert pool.match_prefix([100, 101, 102], 3) == 2 and pool.evictions == 1
    pool.allocate(1)
    assert pool.match_prefix([100, 101, 102], 3) == 1 and pool.evictions == 2


def test_hit_takes_blocks_out_of_the_free_queue():
    pool = GpuBlockPool(3)
    run_request(pool, [1, 2])
    held = pool.acquire_cached([1, 2])
    assert held == [0, 1] and pool.num_free == 1
    assert pool.allocate(2) is None
    pool.free(held)
    assert pool.num_free == 3 and pool.match_prefix([1, 2], 2) == 2


def test_match_prefix_is_limited_and_side_effect_free():
    pool = GpuBlockPool(4)
    run_request(pool, [1, 2, 3])
    assert pool.match_prefix([1, 2, 3], 2) == 2
    assert pool.match_prefix([1, 9, 3], 3) == 1
    assert pool.num_free == 4


def test_reset_and_validation():
    pool = GpuBlockPool(2)
    run_request(pool, [1, 2])
    pool.reset()
    assert pool.num_cached == 0 and pool.match_prefix([1], 1) == 0
    assert not GpuBlockPool(0).enabled and GpuBlockPool(0).usage() == 0.0
    with pytest.raises(ValueError):
        GpuBlockPool(-1)


def test_replay_never_hits_the_whole_prompt():
    """The same 2-block prompt twice: the GPU hit stops one block short (last token recomputed)."""
    cfg = CacheConfig(num_chunks=8, block_tokens=16, chunk_tokens=16, gpu_blocks=8)
    req = [Request(i, 0.0, 32, 1, (1, 2)) for i in range(2)]
    rows = []
    CacheReplay(cfg).run(req, rows.append)
    gpu_hits = [r[4] for r in rows]
    assert gpu_hits == [0, 1]
    # one more token makes a partial third block: both full blocks can then hit
    req = [Request(i, 0.0, 33, 1, (1, 2, 3)) for i in range(2)]
    rows = []
    CacheReplay(cfg).run(req, rows.append)
    assert [r[4] for r in rows] == [0, 2]
