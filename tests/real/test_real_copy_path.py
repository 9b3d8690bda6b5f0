"""The batched copy path (vLLM's ``cuMemcpyBatchAsync`` per job) driven on CPU through an
emulated driver entry point with the same C signature and the same contract: the copies
complete when their stream reaches them (late, on the deferred device), in any order
within a batch, and a source read out of stream order (``SRC_ACCESS_ORDER_ANY``) may be
read at the call itself. So descriptor arrays, access orders and chunking are checked byte
for byte, and an ordering fault corrupts bytes instead of passing."""

from __future__ import annotations

import ctypes
import random

import pytest
import torch

from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
from real import copy_path
from real.copy_path import (
    BATCH_FUNC_TYPE,
    SRC_ACCESS_ORDER_ANY,
    SRC_ACCESS_ORDER_STREAM,
    BatchCopy,
    MemcpyAttributes,
    TorchCopy,
    descriptor_arrays,
)
from real.device import Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.transfer import RealTransferBackend

pytestmark = pytest.mark.parametrize("kind", ["eager", "deferred"])


class EmulatedDriver:
    """``cuMemcpyBatchAsync`` on host memory, holding to the driver's contract and no more.

    The call reads the descriptor arrays at once (the caller may free them when it returns)
    and enqueues the copies on the stream its handle names, so they happen when that stream
    gets there: later than the call, and out of order across streams, on the deferred
    device. Within a batch the copies run in a random order (seeded). With
    ``SRC_ACCESS_ORDER_STREAM`` a source is read when the copy runs; with
    ``SRC_ACCESS_ORDER_ANY`` it is read at the call, the earliest moment the contract
    allows (before earlier work on the stream, e.g. a wait for the store still writing it).
    """

    def __init__(self, fail: bool = False, seed: int = 0) -> None:
        self.calls: list[tuple[int, int]] = []  # (count, srcAccessOrder)
        self.fail = fail
        self.rng = random.Random(seed)
        self.streams: dict[int, object] = {}
        self.fn = BATCH_FUNC_TYPE(self._call)  # through ctypes, as the real entry point

    def handle(self, stream) -> int:
        """The stream's ``CUstream`` stand-in (``BatchCopy``'s ``handle_of``)."""
        self.streams[id(stream)] = stream
        return id(stream)

    def _call(self, dsts, srcs, sizes, count, attrs, attr_idx, num_attrs, fail_idx, stream):
        table = [
            list((ctypes.c_uint64 * count).from_address(a)) for a in (dsts, srcs, sizes)
        ]  # read during the call, as the driver does
        assert num_attrs == 1 and ctypes.c_size_t.from_address(attr_idx).value == 0
        order = MemcpyAttributes.from_address(attrs).srcAccessOrder
        self.calls.append((count, order))
        if self.fail:
            ctypes.c_size_t.from_address(fail_idx).value = 1
            return 1
        copies = list(zip(*table))
        self.rng.shuffle(copies)
        early = (
            [ctypes.create_string_buffer(ctypes.string_at(s, z), z) for _, s, z in copies]
            if order == SRC_ACCESS_ORDER_ANY
            else None
        )

        def run() -> None:
            for i, (d, s, z) in enumerate(copies):
                ctypes.memmove(d, early[i] if early is not None else s, z)

        self.streams[stream].run(run)
        return 0


def make(kind, layout, driver, **kw):
    dev = Device("cpu", mode=kind)
    dev.set_copy_path(BatchCopy(driver.fn, handle_of=driver.handle, **kw))
    geom = KVGeometry(4, 64)
    gpu = GpuKVCache(geom, 16, layout, dev.torch_device)
    host = HostPool(HostLayout(geom, 2, layout), 8)
    return dev, gpu, RealTransferBackend(dev, gpu, host)


def job(jid, direction, blocks, chunks, keys):
    return TransferJob(jid, direction, blocks, chunks, 0, len(blocks), keys)


@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
def test_one_batched_call_per_job_and_byte_exact(kind, layout):
    driver = EmulatedDriver()
    _dev, gpu, be = make(kind, layout, driver)
    keys = ["a", "b"]
    be.submit(job(1, STORE, [3, 7, 1, 2], [5, 0], keys), 0.0)
    be.poll(0.0)
    be.drain()
    gpu.data.zero_()
    be.submit(job(2, LOAD, [9, 10, 11, 12], [5, 0], keys), 0.0)
    be.drain()
    assert [r.success for r in be.records] == [True, True]
    assert be.integrity.checked_blocks == 4 and be.integrity.mismatched_bytes == 0
    for i, b in enumerate([9, 10, 11, 12]):
        assert torch.equal(gpu.block_view(b), gpu.expected((keys[i // 2], i % 2)))
    # one call per job; stores read in stream order, loads of settled chunks may not
    copies = [r.copies for r in be.records]
    assert driver.calls == [
        (copies[0], SRC_ACCESS_ORDER_STREAM),
        (copies[1], SRC_ACCESS_ORDER_ANY),
    ]


def test_load_behind_an_in_flight_store_reads_in_stream_order(kind):
    driver = EmulatedDriver()
    _dev, _gpu, be = make(kind, BLOCK_FIRST, driver)
    be.submit(job(1, STORE, [0, 1], [3], ["k"]), 0.0)
    be.submit(job(2, LOAD, [4, 5], [3], ["k"]), 0.0)  # the chunk may still be written
    be.drain()
    assert [order for _, order in driver.calls] == [SRC_ACCESS_ORDER_STREAM] * 2
    assert be.integrity.mismatched_bytes == 0


def test_load_into_blocks_a_store_still_reads_may_read_its_source_early(kind):
    """Only a write to the *source* chunks forces stream order on a load's reads."""
    driver = EmulatedDriver()
    _dev, gpu, be = make(kind, BLOCK_FIRST, driver)
    be.submit(job(1, STORE, [0, 1], [3], ["k"]), 0.0)
    be.drain()
    be.submit(job(2, STORE, [4, 5], [6], ["j"]), 0.0)  # reads blocks 4, 5
    be.submit(job(3, LOAD, [4, 5], [3], ["k"]), 0.0)  # overwrites them: waits for job 2
    be.drain()
    orders = [order for _, order in driver.calls]
    assert orders == [SRC_ACCESS_ORDER_STREAM, SRC_ACCESS_ORDER_STREAM, SRC_ACCESS_ORDER_ANY]
    assert be.integrity.mismatched_bytes == 0
    assert torch.equal(gpu.block_view(5), gpu.expected(("k", 1)))


def test_large_jobs_are_split_and_driver_errors_fail_the_job(kind):
    driver = EmulatedDriver()
    _dev, _gpu, be = make(kind, LAYER_MAJOR, driver, max_descriptors=5)
    be.submit(job(1, STORE, [0, 2, 4], [1, 6], ["p", "q"]), 0.0)  # 12 scattered pages
    be.drain()
    assert be.records[0].copies == 12 and [c for c, _ in driver.calls] == [5, 5, 2]
    bad = EmulatedDriver(fail=True)
    _dev, _gpu, be = make(kind, BLOCK_FIRST, bad)
    be.submit(job(1, STORE, [0, 1], [0], ["k"]), 0.0)
    [res] = be.poll(0.0) + be.drain()
    assert not res.success and "cuMemcpyBatchAsync failed" in be.records[0].error


class AlwaysAnyOrder(BatchCopy):
    """A faulty batch path: lets every load read its source out of stream order."""

    def copy(self, dst, src, runs, *, stream, stable_source, page_words=None):
        super().copy(dst, src, runs, stream=stream, stable_source=True, page_words=page_words)


def test_the_driver_catches_a_load_reading_its_source_out_of_order(kind):
    """With the deferred device the store below has not run when the load is submitted: a
    path that let the load read its chunk out of stream order (``ANY``) reads it before the
    store lands, and the emulated driver makes that a corrupted load, not a pass."""
    driver = EmulatedDriver()
    _dev, _gpu, be = make(kind, BLOCK_FIRST, driver)
    be.copy_path = AlwaysAnyOrder(driver.fn, handle_of=driver.handle)
    be.submit(job(1, STORE, [0, 1], [3], ["k"]), 0.0)
    be.submit(job(2, LOAD, [4, 5], [3], ["k"]), 0.0)
    be.drain()
    if kind == "deferred":
        assert be.integrity.mismatched_blocks == 2
    else:  # eager: the store ran at submission, so even an early read sees its bytes
        assert be.integrity.mismatched_bytes == 0


@pytest.mark.parametrize("seed", range(3))
def test_copies_complete_late_and_in_any_order_within_a_batch(kind, seed):
    """The driver returns before any byte moved (deferred), copies within one call in a
    shuffled order, and the job is still exact once its end event completes."""
    driver = EmulatedDriver(seed=seed)
    dev, gpu, be = make(kind, LAYER_MAJOR, driver)
    keys = [f"k{i}" for i in range(4)]
    be.submit(job(1, STORE, [0, 5, 2, 7, 9, 11, 13, 15], [1, 4, 6, 2], keys), 0.0)
    if kind == "deferred":
        assert not be.host.data.any()  # the call returned; nothing was copied yet
    be.drain()
    gpu.data.zero_()
    be.submit(job(2, LOAD, [14, 12, 10, 8, 6, 4, 3, 1], [1, 4, 6, 2], keys), 0.0)
    be.drain()
    assert be.integrity.checked_blocks == 8 and be.integrity.mismatched_bytes == 0
    assert dev.pending == 0


def test_descriptor_arrays_are_byte_pointers(kind):
    d, s, z = descriptor_arrays(1000, 5000, [(0, 2, 3), (10, 20, 1)], 8)
    assert d.tolist() == [1000, 1080] and s.tolist() == [5016, 5160] and z.tolist() == [24, 8]


def test_cpu_never_touches_the_cuda_driver(kind, monkeypatch):
    def boom():
        raise AssertionError("resolved cuMemcpyBatchAsync on a CPU device")

    monkeypatch.setattr(copy_path, "resolve_batch_copy", boom)
    dev = Device("cpu", mode=kind)
    assert isinstance(dev.copy_path(), TorchCopy)
    assert isinstance(copy_path.default_copy_path(dev, prefer="auto"), TorchCopy)
