"""Cache-mode replay with chunked-prefill store offers (``prefill_chunk_tokens``)."""

from __future__ import annotations

import pytest
from support import SAMPLE, need_vllm

from kvsim.cachemode import REQUEST_COLUMNS, CacheReplay
from kvsim.options.offload import OffloadOptions
from kvsim.traces import Request, open_trace


def _req(i: int, hashes: list[int], tokens: int) -> Request:
    return Request(i, float(i), tokens, 1, tuple(hashes))


@pytest.fixture(params=[True, False], ids=["fused", "protocol"])
def fused(request) -> bool:
    return request.param


def _run(requests, fused=None, **opts):
    cfg = OffloadOptions(**{"cpu_chunks": 4, "model": None, **opts}).resolve(16)
    run = CacheReplay(cfg, fused=fused)
    rows: list[tuple] = []
    summary = run.run(requests, rows.append)
    return run, summary, [dict(zip(REQUEST_COLUMNS, r)) for r in rows]


def test_one_offer_of_a_prompt_larger_than_the_tier_fails_whole(fused):
    _, summary, rows = _run([_req(0, list(range(1, 7)), 96)], fused)
    assert rows[0]["store_failed"] and rows[0]["stored_blocks"] == 0
    assert summary["allocation_failures"] == 1


def test_prefill_steps_store_incrementally_and_evict_own_tail_first(fused):
    run, summary, rows = _run([_req(0, list(range(1, 7)), 96)], fused, prefill_chunk_tokens=32)
    # steps offer [1,2], [3,4], [5,6]; the last must evict two of the request's own chunks,
    # and under vLLM's LRU a running request's tail is older than its head
    assert rows[0]["stored_blocks"] == 6 and rows[0]["evicted_blocks"] == 2
    assert not rows[0]["store_failed"]
    # committed tail first at finish: the head is the most recent
    assert run.tier.resident_keys() == [6, 5, 2, 1]
    assert summary["allocation_failures"] == 0


def test_steps_start_after_the_cached_prefix(fused):
    reqs = [_req(0, [1, 2], 32), _req(1, [1, 2, 3, 4, 5], 80)]
    run, _, rows = _run(reqs, fused, cpu_chunks=8, prefill_chunk_tokens=16)
    assert rows[1]["cpu_hit_blocks"] == 2 and rows[1]["stored_blocks"] == 3
    assert run.tier.resident_keys() == [5, 4, 3, 2, 1]


@pytest.mark.vllm
def test_prefill_offers_make_vllms_decisions():
    need_vllm("vllm.v1.kv_offload.cpu.manager")
    from kvsim.integrations.from_vllm import VllmManagerDriver

    requests = list(open_trace(SAMPLE))
    for policy in ("lru", "arc"):
        cfg = OffloadOptions(cpu_chunks=300, policy=policy, prefill_chunk_tokens=4096).resolve(512)
        ours: list = []
        theirs: list = []
        CacheReplay(cfg).run(requests, ours.append)
        CacheReplay(cfg, manager=VllmManagerDriver(300, policy)).run(requests, theirs.append)
        assert ours == theirs
