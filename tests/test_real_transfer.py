"""The real backend on CPU tensors: byte-exact round trips, ordering, failures."""

from __future__ import annotations

import pytest
import torch

from kvsim.engine.transfer_protocol import EXPEDITED, LOAD, STORE, TransferJob
from real.device import Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.transfer import RealTransferBackend, coalesce

GEOM = KVGeometry(num_layers=3, page_bytes=40)  # 120-byte blocks: rows are padded to 4096


def make(
    layout: str,
    *,
    upc: int = 2,
    gpu_blocks: int = 16,
    chunks: int = 8,
    eager: bool = True,
    fault=None,
    geometry: KVGeometry = GEOM,
):
    dev = Device("cpu", eager=eager)
    gpu = GpuKVCache(geometry, gpu_blocks, layout, dev.torch_device)
    host = HostPool(HostLayout(geometry, upc, layout), chunks)
    return dev, gpu, host, RealTransferBackend(dev, gpu, host, fault=fault)


def job(jid, direction, blocks, chunks, keys, nbytes=0):
    return TransferJob(
        jid, direction, tuple(blocks), tuple(chunks), nbytes, len(blocks), tuple(keys)
    )


@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
@pytest.mark.parametrize("geometry", [GEOM, KVGeometry(2, 13)])  # 13-byte pages: uint8 path
def test_round_trip_is_byte_exact(layout, geometry):
    _dev, gpu, host, be = make(layout, geometry=geometry)
    assert host.layout.row_bytes == 4096 and host.layout.raw_chunk_bytes < 4096
    keys = ["a", "b", "c"]
    host.data.fill_(0x5A)  # a sentinel in every row, padding included
    # 6 blocks into 3 chunks, non-consecutive GPU ids and chunk ids
    src_blocks = [3, 4, 5, 9, 1, 2]
    be.submit(job(1, STORE, src_blocks, [6, 0, 3], keys), 0.0)
    [res] = be.poll(0.0)
    assert res.success and res.job_id == 1
    # the host rows hold exactly the key patterns, and the padding was never written
    for i in range(len(src_blocks)):
        c, sub = [6, 0, 3][i // 2], i % 2
        assert torch.equal(host.block_view(c, sub), gpu.expected((keys[i // 2], sub)))
    used = host.layout.raw_chunk_bytes // geometry.word_bytes
    for c in (6, 0, 3):
        assert torch.all(host.row(c)[used:] == 0x5A)  # padding untouched
    gpu.data.zero_()
    dst = [10, 11, 12, 13, 14, 15]
    be.submit(job(2, LOAD, dst, [6, 0, 3], keys), 0.0)
    [res] = be.poll(0.0)
    assert res.success
    assert be.integrity.checked_blocks == 6 and be.integrity.mismatched_bytes == 0
    for i, b in enumerate(dst):
        assert torch.equal(gpu.block_view(b), gpu.expected((keys[i // 2], i % 2)))


def test_partial_first_chunk_skips_its_head():
    _dev, gpu, _host, be = make(BLOCK_FIRST, upc=2)
    be.submit(job(1, STORE, [0, 1, 2, 3], [4, 5], ["x", "y"]), 0.0)
    be.poll(0.0)
    be.submit(job(2, LOAD, [7, 8, 9], [4, 5], ["x", "y"]), 0.0)  # loads x/1, y/0, y/1
    be.poll(0.0)
    assert torch.equal(gpu.block_view(7), gpu.expected(("x", 1)))
    assert torch.equal(gpu.block_view(9), gpu.expected(("y", 1)))
    assert be.integrity.mismatched_blocks == 0 and be.integrity.checked_blocks == 3
    with pytest.raises(ValueError):
        be.submit(job(3, LOAD, [1], [4, 5], ["x", "y"]), 0.0)  # skips a whole chunk


def test_coalescing_merges_contiguous_runs():
    assert coalesce([(0, 10, 4), (4, 14, 4), (9, 18, 1), (10, 19, 2)]) == [(0, 10, 8), (9, 18, 3)]
    _, _, _, be = make(BLOCK_FIRST, upc=4, geometry=KVGeometry(4, 1024))  # 4 KiB blocks: no padding
    be.submit(job(1, STORE, [0, 1, 2, 3, 4, 5, 6, 7], [2, 3], ["p", "q"]), 0.0)
    be.poll(0.0)
    rec = be.records[-1]
    assert rec.descriptors == 32 and rec.copies == 1  # two rows back to back, one copy
    _, _, _, be = make(LAYER_MAJOR, upc=4, geometry=KVGeometry(4, 1024))
    be.submit(job(1, STORE, [0, 1, 2, 3], [2], ["p"]), 0.0)
    be.poll(0.0)
    assert be.records[-1].copies == 4  # one run per layer


def test_completions_wait_for_events_and_stay_in_order():
    _dev, _gpu, _host, be = make(BLOCK_FIRST, eager=False)
    be.submit(job(1, STORE, [0, 1], [0], ["k0"]), 0.0)
    be.submit(job(2, STORE, [2, 3], [1], ["k1"]), 0.0)
    assert be.poll(0.0) == []  # nothing ran yet
    # only the second job's event is forced: FIFO means the first completes too,
    # and poll reports them in submission order
    be._by_id[2].end.synchronize()
    assert [r.job_id for r in be.poll(0.0)] == [1, 2]
    assert be.in_flight == 0


def test_load_reads_a_chunk_only_after_its_store_lands():
    _dev, _gpu, _host, be = make(BLOCK_FIRST, eager=False)
    be.submit(job(1, STORE, [0, 1], [5], ["k"]), 0.0)
    # the store has not run; a load of the same chunk on another stream must wait for it
    be.submit(job(2, EXPEDITED, [8, 9], [5], ["k"]), 0.0)
    _, results = be.wait([2], 0.0)
    assert [r.job_id for r in results] == [2] and results[0].success
    assert be.integrity.mismatched_blocks == 0 and be.integrity.checked_blocks == 2
    assert [r.job_id for r in be.poll(0.0)] == [1, 2]  # poll still reports both, once
    assert be.poll(0.0) == []


def test_gpu_block_not_overwritten_while_a_store_reads_it():
    dev, gpu, host, be = make(BLOCK_FIRST, eager=False)
    be.submit(job(1, STORE, [0, 1], [0], ["old"]), 0.0)
    be.submit(job(2, STORE, [2, 3], [1], ["new"]), 0.0)
    dev.run_pending()
    be.poll(0.0)
    be.submit(job(3, STORE, [0, 1], [2], ["old"]), 0.0)  # pending: reads blocks 0, 1
    be.submit(job(4, LOAD, [0, 1], [1], ["new"]), 0.0)  # writes blocks 0, 1
    dev.run_pending()
    res = be.poll(0.0)
    assert sorted(r.job_id for r in res) == [3, 4]
    assert torch.equal(host.block_view(2, 0), gpu.expected(("old", 0)))  # store saw old bytes
    assert be.integrity.mismatched_blocks == 0


def test_compute_waits_for_loads():
    dev, gpu, _host, be = make(BLOCK_FIRST, eager=False)
    be.submit(job(1, STORE, [0, 1], [0], ["k"]), 0.0)
    be.submit(job(2, LOAD, [5, 6], [0], ["k"]), 0.0)
    be.order_compute_after_loads()
    seen = []
    dev.compute_stream.run(lambda: seen.append(gpu.mismatched_bytes(5, ("k", 0))))
    dev.compute_stream.synchronize()  # runs the wait on the load first
    assert seen == [0]


def test_failed_copy_reports_failure_and_keeps_order():
    fail_ids = {2}
    _dev, _gpu, _host, be = make(BLOCK_FIRST, fault=lambda j: j.job_id in fail_ids)
    be.submit(job(1, STORE, [0, 1], [0], ["a"]), 0.0)
    be.submit(job(2, STORE, [2, 3, 4, 5], [1, 2], ["b", "c"]), 0.0)
    be.submit(job(3, STORE, [6, 7], [3], ["d"]), 0.0)
    res = be.poll(0.0)
    assert [(r.job_id, r.success) for r in res] == [(1, True), (2, False), (3, True)]
    assert "injected" in be.records[1].error
    assert be.in_flight == 0 and not be._touching
