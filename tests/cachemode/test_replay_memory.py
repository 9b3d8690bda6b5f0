"""Cache-mode replay memory is bounded by the cache state, not by the trace length."""

from __future__ import annotations

import tracemalloc

import pytest

from kvsim.cachemode import CacheReplay
from kvsim.options.offload import OffloadOptions
from kvsim.traces import Request


def _churn(n: int):
    # a shared 4-block prefix plus 4 fresh blocks: the tier fills and evicts every request
    for i in range(n):
        yield Request(i, float(i), 8 * 512, 10, (0, 1, 2, 3, *range(4 + 4 * i, 8 + 4 * i)))


def _hot(n: int):
    # the same 8 blocks again and again: every request reloads and re-ranks them, nothing
    # is ever evicted, so recency bookkeeping must not pile up
    for i in range(n):
        yield Request(i, float(i), 8 * 512, 10, tuple(range(8)))


def _peak_bytes(stream, n: int, policy: str) -> int:
    name, _, tier = policy.partition("/")
    cfg = OffloadOptions(cpu_chunks=500, model=None, gpu_blocks=200, policy=name).resolve(512)
    run = CacheReplay(cfg, fused=False if tier == "protocol" else None)
    tracemalloc.start()
    run.run(stream(n))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert run.totals["requests"] == n
    return peak


@pytest.mark.parametrize("policy", ["lru", "lru/protocol", "arc", "arc/protocol"])
@pytest.mark.parametrize("stream", [_churn, _hot])
def test_peak_memory_does_not_grow_with_the_trace(stream, policy):
    short, long = _peak_bytes(stream, 1_000, policy), _peak_bytes(stream, 8_000, policy)
    assert long < 1.3 * short, (short, long)
