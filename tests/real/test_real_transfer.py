"""The real backend on CPU tensors: byte-exact round trips, ordering, failures.

Every test runs on the eager device and on the deferred one (work completes later and out
of submission order across streams, like a GPU), so an ordering fault fails here."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvsim.engine.step_batch import StepBatch
from kvsim.engine.transfer_protocol import EXPEDITED, LOAD, STORE, TransferJob
from real.compute import EmulatedCompute
from real.device import Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.transfer import RealTransferBackend, coalesce

pytestmark = pytest.mark.parametrize("kind", ["eager", "deferred"])

GEOM = KVGeometry(num_layers=3, page_bytes=40)  # 120-byte blocks: rows are padded to 4096


def make(
    layout: str,
    kind: str,
    *,
    upc: int = 2,
    gpu_blocks: int = 16,
    chunks: int = 8,
    fault=None,
    geometry: KVGeometry = GEOM,
    seed: int = 0,
    **pool_kw,
):
    dev = Device("cpu", mode=kind, seed=seed)
    gpu = GpuKVCache(geometry, gpu_blocks, layout, dev.torch_device)
    host = HostPool(HostLayout(geometry, upc, layout), chunks, **pool_kw)
    return dev, gpu, host, RealTransferBackend(dev, gpu, host, fault=fault)


def job(jid, direction, blocks, chunks, keys, nbytes=0):
    return TransferJob(
        jid, direction, tuple(blocks), tuple(chunks), nbytes, len(blocks), tuple(keys)
    )


def finish(be):
    """Every result not reported yet, once all work ran (poll first, then drain)."""
    return be.poll(0.0) + be.drain()


@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
@pytest.mark.parametrize("geometry", [GEOM, KVGeometry(2, 13)])  # 13-byte pages: uint8 path
def test_round_trip_is_byte_exact(kind, layout, geometry):
    _dev, gpu, host, be = make(layout, kind, geometry=geometry)
    assert host.layout.row_bytes == 4096 and host.layout.raw_chunk_bytes < 4096
    keys = ["a", "b", "c"]
    host.data.fill_(0x5A)  # a sentinel in every row, padding included
    # 6 blocks into 3 chunks, non-consecutive GPU ids and chunk ids
    src_blocks = [3, 4, 5, 9, 1, 2]
    be.submit(job(1, STORE, src_blocks, [6, 0, 3], keys), 0.0)
    [res] = finish(be)
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
    [res] = finish(be)
    assert res.success
    assert be.integrity.checked_blocks == 6 and be.integrity.mismatched_bytes == 0
    for i, b in enumerate(dst):
        assert torch.equal(gpu.block_view(b), gpu.expected((keys[i // 2], i % 2)))


def test_partial_first_chunk_skips_its_head(kind):
    _dev, gpu, _host, be = make(BLOCK_FIRST, kind, upc=2)
    be.submit(job(1, STORE, [0, 1, 2, 3], [4, 5], ["x", "y"]), 0.0)
    be.submit(job(2, LOAD, [7, 8, 9], [4, 5], ["x", "y"]), 0.0)  # loads x/1, y/0, y/1
    finish(be)
    assert torch.equal(gpu.block_view(7), gpu.expected(("x", 1)))
    assert torch.equal(gpu.block_view(9), gpu.expected(("y", 1)))
    assert be.integrity.mismatched_blocks == 0 and be.integrity.checked_blocks == 3
    with pytest.raises(ValueError):
        be.submit(job(3, LOAD, [1], [4, 5], ["x", "y"]), 0.0)  # skips a whole chunk


def test_coalescing_merges_contiguous_runs(kind):
    assert coalesce([(0, 10, 4), (4, 14, 4), (9, 18, 1), (10, 19, 2)]) == [(0, 10, 8), (9, 18, 3)]
    geom = KVGeometry(4, 1024)  # 4 KiB blocks: no padding
    _, _, _, be = make(BLOCK_FIRST, kind, upc=4, geometry=geom)
    be.submit(job(1, STORE, [0, 1, 2, 3, 4, 5, 6, 7], [2, 3], ["p", "q"]), 0.0)
    finish(be)
    rec = be.records[-1]
    assert rec.descriptors == 32 and rec.copies == 1  # two rows back to back, one copy
    _, _, _, be = make(LAYER_MAJOR, kind, upc=4, geometry=geom)
    be.submit(job(1, STORE, [0, 1, 2, 3], [2], ["p"]), 0.0)
    finish(be)
    assert be.records[-1].copies == 4  # one run per layer


def test_completions_wait_for_events_and_stay_in_order(kind):
    _dev, _gpu, _host, be = make(BLOCK_FIRST, kind)
    be.submit(job(1, STORE, [0, 1], [0], ["k0"]), 0.0)
    be.submit(job(2, STORE, [2, 3], [1], ["k1"]), 0.0)
    if kind == "deferred":
        assert not be._by_id[2].end._done  # nothing ran at submission
    # only the second job's event is forced: FIFO means the first completes too,
    # and poll reports them in submission order
    be._by_id[2].end.synchronize()
    assert [r.job_id for r in be.poll(0.0)] == [1, 2]
    assert be.in_flight == 0


def test_load_reads_a_chunk_only_after_its_store_lands(kind):
    _dev, _gpu, _host, be = make(BLOCK_FIRST, kind)
    be.submit(job(1, STORE, [0, 1], [5], ["k"]), 0.0)
    # the store may not have run; a load of the same chunk on another stream must wait for it
    be.submit(job(2, EXPEDITED, [8, 9], [5], ["k"]), 0.0)
    _, results = be.wait([2], 0.0)
    assert [r.job_id for r in results] == [2] and results[0].success
    assert be.integrity.mismatched_blocks == 0 and be.integrity.checked_blocks == 2
    assert [r.job_id for r in be.poll(0.0)] == [1, 2]  # poll still reports both, once
    assert be.poll(0.0) == []


def test_gpu_block_not_overwritten_while_a_store_reads_it(kind):
    _dev, gpu, host, be = make(BLOCK_FIRST, kind)
    be.submit(job(1, STORE, [0, 1], [0], ["old"]), 0.0)
    be.submit(job(2, STORE, [2, 3], [1], ["new"]), 0.0)
    finish(be)
    be.submit(job(3, STORE, [0, 1], [2], ["old"]), 0.0)  # reads blocks 0, 1
    be.submit(job(4, LOAD, [0, 1], [1], ["new"]), 0.0)  # writes blocks 0, 1
    assert sorted(r.job_id for r in finish(be)) == [3, 4]
    assert torch.equal(host.block_view(2, 0), gpu.expected(("old", 0)))  # store saw old bytes
    assert be.integrity.mismatched_blocks == 0


@pytest.mark.parametrize("seed", range(4))
def test_each_load_is_checked_before_a_later_load_into_its_blocks(kind, seed):
    """Fault 1: two loads into the same blocks back to back; each must be checked against
    its own key, not against whatever a later load left there."""
    _dev, _gpu, _host, be = make(BLOCK_FIRST, kind, seed=seed)
    be.submit(job(1, STORE, [0, 1], [0], ["a"]), 0.0)
    be.submit(job(2, STORE, [2, 3], [1], ["b"]), 0.0)
    finish(be)
    be.submit(job(3, LOAD, [8, 9], [0], ["a"]), 0.0)
    be.submit(job(4, LOAD, [8, 9], [1], ["b"]), 0.0)  # same stream, same destination
    be.submit(job(5, EXPEDITED, [8, 9], [0], ["a"]), 0.0)  # other stream, same destination
    assert [r.job_id for r in finish(be)] == [3, 4, 5]
    assert be.integrity.checked_blocks == 6 and be.integrity.mismatched_blocks == 0


def test_load_waits_for_compute_writing_its_blocks(kind):
    """Fault 4: pending compute writes (vLLM: zeroing) to a load's destination come first."""
    dev, gpu, _host, be = make(BLOCK_FIRST, kind)
    be.submit(job(1, STORE, [0, 1], [0], ["k"]), 0.0)
    finish(be)
    dev.compute_stream.run(lambda: gpu.data[5:7].zero_())  # queued before the load
    be.submit(job(2, LOAD, [5, 6], [0], ["k"]), 0.0)
    be.wait([2], 0.0)  # runs the load (and what it depends on) only
    dev.run_pending()
    assert torch.equal(gpu.block_view(5), gpu.expected(("k", 0)))
    assert be.integrity.mismatched_blocks == 0


def test_compute_never_waits_for_in_flight_loads(kind):
    """Fault 4: a forward launched while a load is in flight does not wait for it (the
    engine only runs a request whose load it saw finish)."""
    dev, _gpu, _host, be = make(BLOCK_FIRST, kind)
    be.submit(job(1, STORE, [0, 1], [0], ["k"]), 0.0)
    finish(be)
    be.submit(job(2, LOAD, [5, 6], [0], ["k"]), 0.0)
    EmulatedCompute(lambda batch: 1e-4, dev)(StepBatch(1, 1, 16, 0, 0, 0.0))
    dev.compute_stream.synchronize()  # the forward completes...
    if kind == "deferred":
        assert dev.compute_stream.pending == 0
        assert not be._by_id[2].end._done  # ...without running the load
    finish(be)
    assert be.integrity.mismatched_blocks == 0


def _work(ops: list[str]) -> int:
    """Operations other than the copy path's (one ``copy_`` per run on CPU: fault 3)."""
    return sum(1 for op in ops if op not in ("aten.slice.Tensor", "aten.copy_.default"))


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
def test_fills_and_checks_are_batched_per_job(kind, layout):
    """Fault 5: a job's tensor work does not grow with its block count, and ``poll`` runs
    no tensor operation at all (no per-block kernels, no synchronising ``.item()``)."""
    geom = KVGeometry(4, 1024)  # 4 KiB blocks: consecutive ids make one run per layer
    counts = {}
    for n in (2, 12):
        _dev, _gpu, _host, be = make(layout, kind, upc=1, gpu_blocks=32, chunks=32, geometry=geom)
        keys = [f"k{i}" for i in range(n)]
        with _OpCounter() as store_ops:
            be.submit(job(1, STORE, range(n), range(n), keys), 0.0)
            be.drain()
        with _OpCounter() as load_ops:
            be.submit(job(2, LOAD, range(16, 16 + n), range(n), keys), 0.0)
            be.drain()
        with _OpCounter() as poll_ops:
            be.poll(0.0)
        assert poll_ops.ops == []
        assert be.integrity.checked_blocks == n and be.integrity.mismatched_blocks == 0
        counts[n] = (_work(store_ops.ops), _work(load_ops.ops))
        assert not any("_local_scalar_dense" in op for op in store_ops.ops + load_ops.ops)
    assert counts[2] == counts[12]


def test_poll_reads_no_device_memory_while_jobs_run(kind):
    _dev, _gpu, _host, be = make(BLOCK_FIRST, kind)
    be.submit(job(1, STORE, [0, 1], [0], ["k"]), 0.0)
    be.submit(job(2, LOAD, [4, 5], [0], ["k"]), 0.0)
    with _OpCounter() as ops:
        for _ in range(20):
            be.poll(0.0)  # on the deferred device the "GPU" makes progress meanwhile
    assert not any("_local_scalar_dense" in op for op in ops.ops)  # no .item()
    finish(be)
    assert be.integrity.mismatched_blocks == 0


def test_failed_copy_reports_failure_and_keeps_order(kind):
    fail_ids = {2}
    _dev, _gpu, _host, be = make(BLOCK_FIRST, kind, fault=lambda j: j.job_id in fail_ids)
    be.submit(job(1, STORE, [0, 1], [0], ["a"]), 0.0)
    be.submit(job(2, STORE, [2, 3, 4, 5], [1, 2], ["b", "c"]), 0.0)
    be.submit(job(3, STORE, [6, 7], [3], ["d"]), 0.0)
    res = finish(be)
    assert [(r.job_id, r.success) for r in res] == [(1, True), (2, False), (3, True)]
    assert "injected" in be.records[1].error
    assert be.in_flight == 0 and not be._touching


def test_copies_never_span_two_pinned_pieces(kind):
    """Fault 7: consecutive chunks on both sides of a registration boundary are two copies."""
    geom = KVGeometry(4, 1024)  # 4 KiB blocks = 4 KiB rows: consecutive ids would merge
    live: dict[int, int] = {}
    _dev, _gpu, host, be = make(
        BLOCK_FIRST,
        kind,
        upc=1,
        gpu_blocks=8,
        chunks=8,
        geometry=geom,
        pin=True,
        max_piece_bytes=3 * 4096,
        register=lambda p, n: live.__setitem__(p, n),
        unregister=lambda p: live.pop(p),
    )
    assert host.pinned and host.num_pieces == 3
    be.submit(job(1, STORE, range(8), range(8), [f"k{i}" for i in range(8)]), 0.0)
    be.submit(job(2, LOAD, range(8), range(8), [f"k{i}" for i in range(8)]), 0.0)
    finish(be)
    assert [r.copies for r in be.records] == [3, 3]  # rows 0-2, 3-5, 6-7
    assert be.integrity.checked_blocks == 8 and be.integrity.mismatched_blocks == 0
    host.close()
    assert live == {}
