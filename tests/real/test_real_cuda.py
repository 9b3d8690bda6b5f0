"""The real backend on a CUDA device: what the CPU stand-ins cannot show. Skipped without
CUDA (this project's CI has no GPU); ``python -m real.gpu_check`` runs them on the GPU
(its ``tests`` section), where none may skip but the Triton ones when Triton is absent."""

from __future__ import annotations

import pytest
import torch

from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
from real.copy_path import KernelLoadCopy, default_copy_path, resolve_batch_copy
from real.device import Device
from real.host_pool import HostLayout, HostPool, host_pinned
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.lifetime import release_when_idle
from real.transfer import RealTransferBackend
from real.triton_load import GatherKernel, resolve_gather_kernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cuda() -> Device:
    return Device("cuda")


def test_the_pool_is_pinned_by_torchs_own_rule_and_the_pools(cuda):
    """Issue 29, fault 1 on the hardware: ``is_pinned()`` asks about the storage base,
    which now starts on the registered page, for the whole pool and any view of it."""
    pool = HostPool(HostLayout(KVGeometry(4, 2048), 2, LAYER_MAJOR), 64, pin=True, require_pin=True)
    views = [pool.data, pool.row(7), pool.block_view(9, 1), pool.data[4096:]]
    assert pool.pinned and all(v.is_pinned() and host_pinned(v) for v in views)
    cuda.run_pending()
    pool.close()
    assert not pool.data.is_pinned() and not host_pinned(pool.data)


@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
def test_round_trip_is_byte_exact_and_timed_between_events(cuda, layout):
    geom = KVGeometry(8, 16 * 1024)
    gpu = GpuKVCache(geom, 64, layout, cuda)
    host = HostPool(HostLayout(geom, 1, layout), 64, pin=True, require_pin=True)
    be = RealTransferBackend(cuda, gpu, host)
    try:
        keys = [f"k{i}" for i in range(16)]
        be.submit(TransferJob(1, STORE, list(range(16)), list(range(40, 56)), 0, 16, keys), 0.0)
        be.drain()
        gpu.data.zero_()
        into = list(range(63, 47, -1))
        be.submit(TransferJob(2, LOAD, into, list(range(40, 56)), 0, 16, keys), 0.0)
        be.drain()
        assert [r.success for r in be.records] == [True, True], [r.error for r in be.records]
        assert be.integrity.checked_blocks == 16 and be.integrity.mismatched_bytes == 0
        for b, k in zip(into, keys):
            assert torch.equal(gpu.block_view(b), gpu.expected((k, 0)))
        for r in be.records:
            assert 0 < r.duration < 1.0 and r.start_time <= r.end_time
        assert be.staging.allocations == 1 and be.staging.grows == 0
    finally:
        release_when_idle(cuda, host, gpu, be)


def test_the_batched_copy_and_the_gather_kernel_resolve(cuda):
    batch, why = resolve_batch_copy()
    assert batch is not None, why
    pytest.importorskip("triton")
    kernel, why = resolve_gather_kernel(cuda)
    assert kernel is not None, why
    assert isinstance(default_copy_path(cuda), KernelLoadCopy)


def test_small_page_loads_go_through_the_kernel_compiled_at_start(cuda):
    """Issue 29, faults 1 and 3 on the hardware: a load of 32 pages of 16 KiB from the
    registered pool takes the kernel (vLLM's rule), whose tile was compiled when the
    backend started, and comes back byte-exact."""
    pytest.importorskip("triton")
    kernel, why = resolve_gather_kernel(cuda)
    assert kernel is not None, why
    path = default_copy_path(cuda, load="auto")
    assert isinstance(path, KernelLoadCopy)
    geom = KVGeometry(8, 16 * 1024)
    gpu = GpuKVCache(geom, 32, LAYER_MAJOR, cuda)
    host = HostPool(HostLayout(geom, 1, LAYER_MAJOR), 32, pin=True, require_pin=True)
    be = RealTransferBackend(cuda, gpu, host, copy_path=path)
    try:
        before = dict(path.jobs)
        unprepared = kernel.unprepared_launches
        keys = [f"s{i}" for i in range(4)]
        be.submit(TransferJob(1, STORE, [0, 1, 2, 3], [10, 3, 27, 8], 0, 4, keys), 0.0)
        be.drain()
        gpu.data.zero_()
        be.submit(TransferJob(2, LOAD, [31, 20, 9, 15], [10, 3, 27, 8], 0, 4, keys), 0.0)
        be.drain()
        assert path.jobs[GatherKernel.name] == before[GatherKernel.name] + 1
        assert kernel.unprepared_launches == unprepared
        assert be.integrity.checked_blocks == 4 and be.integrity.mismatched_bytes == 0
    finally:
        release_when_idle(cuda, host, gpu, be)


def test_event_durations_agree_with_torchs_own(cuda):
    stream = cuda.stream("test-timing")
    start, end = cuda.new_event(), cuda.new_event()
    start.record(stream)
    stream.run(lambda: torch.cuda._sleep(2_000_000))
    end.record(stream)
    end.synchronize()
    measured = end.seconds_since(start)
    assert measured > 0
    raw = start._ev.elapsed_time(end._ev) / 1e3  # type: ignore[attr-defined]
    assert measured == pytest.approx(raw)
