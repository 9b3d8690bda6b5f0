"""Failure injection through the real backend and the real manager: a failed store frees
its chunk, leaves nothing loadable or corrupted, and the chunk is reused cleanly."""

from __future__ import annotations

import pytest
import torch

from kvsim.core.context import RequestContext
from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
from kvsim.manager.offload import LookupResult, OffloadManager
from kvsim.policies.registry import make_eviction_policy
from real.device import Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, GpuKVCache, KVGeometry
from real.transfer import RealTransferBackend

pytestmark = pytest.mark.parametrize("kind", ["eager", "deferred"])

GEOM = KVGeometry(2, 64)


def setup(fail_ids, kind):
    dev = Device("cpu", mode=kind)
    gpu = GpuKVCache(GEOM, 8, BLOCK_FIRST, dev.torch_device)
    host = HostPool(HostLayout(GEOM, 1, BLOCK_FIRST), 2)
    be = RealTransferBackend(dev, gpu, host, fault=lambda j: j.job_id in fail_ids)
    mgr = OffloadManager(2, make_eviction_policy("lru", 2))
    return dev, gpu, host, be, mgr


def store(be, mgr, jid, keys, blocks):
    ctx = RequestContext(f"r{jid}", {k: (i + 1) * 16 for i, k in enumerate(keys)})
    mgr.on_new_request(ctx)
    out = mgr.prepare_store(keys, ctx)
    be.submit(
        TransferJob(jid, STORE, blocks, out.chunk_ids, 0, len(blocks), out.keys_to_store), 0.0
    )
    return ctx, out


def finish(be, mgr, ctx, out, dev):
    dev.run_pending()
    [res] = be.poll(0.0) + be.drain()
    mgr.complete_store(out.keys_to_store, ctx, success=res.success)
    mgr.on_request_finished(ctx)
    return res


def test_failed_store_frees_chunk_and_reuse_is_clean(kind):
    dev, gpu, _host, be, mgr = setup({1}, kind)
    ctx, out = store(be, mgr, 1, ["a", "b"], [0, 1])
    assert mgr.lookup("a") == LookupResult.HIT_PENDING  # write pending while in flight
    res = finish(be, mgr, ctx, out, dev)
    assert not res.success and "injected" in be.records[0].error
    # the manager is consistent: nothing resident, both chunks free, no pending writes
    assert mgr.lookup("a") == LookupResult.MISS and mgr.lookup("b") == LookupResult.MISS
    assert (
        mgr.num_free == 2 and mgr.num_write_pending == 0 and mgr.counters.failed_store_chunks == 2
    )
    assert be.in_flight == 0 and not be._touching
    # the freed chunks are reused by a good store; a load of it is byte exact
    ctx, out = store(be, mgr, 2, ["c", "d"], [2, 3])
    assert sorted(out.chunk_ids) == [0, 1]
    assert finish(be, mgr, ctx, out, dev).success
    lctx = RequestContext("reader", {"c": 16, "d": 32})
    mgr.on_new_request(lctx)
    ids = mgr.prepare_load(["c", "d"], lctx)
    be.submit(TransferJob(3, LOAD, [6, 7], ids, 0, 2, ["c", "d"]), 0.0)
    dev.run_pending()
    [res] = be.poll(0.0) + be.drain()
    mgr.complete_load(["c", "d"], lctx)
    assert res.success and be.integrity.checked_blocks == 2 and be.integrity.mismatched_bytes == 0
    assert torch.equal(gpu.block_view(7), gpu.expected(("d", 0)))


def test_partially_written_chunk_is_never_loadable(kind):
    """The injected fault copies half the runs; the half-written chunk must not be served."""
    dev, _gpu, _host, be, mgr = setup({1}, kind)
    ctx, out = store(be, mgr, 1, ["a", "b"], [0, 2])  # two runs: the first lands, then failure
    finish(be, mgr, ctx, out, dev)
    assert mgr.lookup_prefix(["a", "b"]) == (0, False)


def test_bad_job_raises_before_touching_memory(kind):
    dev, _gpu, host, be, _mgr = setup(set(), kind)
    before = host.data.clone()
    try:
        be.submit(TransferJob(9, STORE, [0, 99], [0, 1], 0, 2, ["x", "y"]), 0.0)
    except ValueError as exc:
        assert "out of range" in str(exc)
    else:
        raise AssertionError("an out-of-range block must be rejected")
    dev.run_pending()
    assert be.in_flight == 0 and torch.equal(host.data, before)
