"""Issue 29, faults 2, 4 and 5 on the CPU stand-ins: job durations measured start to end
(not as differences of coarse absolute times), the key pattern built with the cache on the
compute stream, and one staging buffer reused safely instead of allocations per job."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
from real import staging
from real.calibrate import measure
from real.device import CpuEvent, Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.staging import StagingBuffer, host_words
from real.transfer import RealTransferBackend

GEOM = KVGeometry(4, 512)


class Float32Event(CpuEvent):
    """A CUDA event as the backend sees one: ``time()`` is float32 milliseconds since a
    reference (``cudaEventElapsedTime``), two minutes old here, so its quantum is ~8 us;
    ``seconds_since`` is measured between the two events and exact."""

    def time(self) -> float:
        return float(np.float32(super().time() * 1e3)) / 1e3

    def seconds_since(self, start) -> float:
        return CpuEvent.time(self) - CpuEvent.time(start)


class Float32Device(Device):
    def new_event(self):
        return Float32Event(self)


def aged_clock(step_s: float = 37e-6):
    """A clock 120 s past the reference that advances ``step_s`` at every reading."""
    ticks = itertools.count()
    return lambda: 120.0 + next(ticks) * step_s


def test_job_durations_are_measured_start_to_end():
    """Fault 2: a ~40 us job timed as a difference of two float32 times two minutes into a
    run is off by up to one 7.8 us quantum; measured start to end it is exact."""
    dev = Float32Device("cpu", clock=aged_clock())
    gpu = GpuKVCache(GEOM, 16, BLOCK_FIRST, dev)
    be = RealTransferBackend(dev, gpu, HostPool(HostLayout(GEOM, 1), 16))
    for i in range(12):
        be.submit(TransferJob(i, STORE, [i], [i], GEOM.block_bytes, 1, [f"k{i}"]), 0.0)
    be.drain()
    coarse, exact = [], []
    for rec in be.records:
        coarse.append(rec.end_time - rec.start_time)
        exact.append(rec.duration)
    assert all(d == pytest.approx(37e-6, rel=1e-6) for d in exact)  # one clock step each
    assert max(abs(c - e) for c, e in zip(coarse, exact)) > 1e-6  # what differences gave


def test_calibration_times_transfers_start_to_end():
    dev = Float32Device("cpu", clock=aged_clock())
    points, _ = measure(
        dev, sizes=(4096,), counts=(1, 2), kernel_counts=(), max_bytes=8192, repeats=1
    )
    one_way = [p for p in points if p.direction != "both"]
    assert one_way and all(p.seconds == pytest.approx(37e-6, rel=1e-6) for p in one_way)


class SpyDevice(Device):
    """Counts the compute-stream contexts entered (where construction work goes)."""

    entered = 0

    def on_compute_stream(self):
        SpyDevice.entered += 1
        return super().on_compute_stream()


@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
def test_the_pattern_is_built_with_the_cache_on_the_compute_stream(layout, monkeypatch):
    """Fault 4: built lazily, the pattern belonged to whichever stream asked first (a load
    stream's check), and the compute stream could read it before it was written."""
    made: list[bool] = []
    from real import kv_cache

    real_pattern = kv_cache.word_pattern

    def spy(page_words, device):
        made.append(SpyDevice.entered > 0)
        return real_pattern(page_words, device)

    monkeypatch.setattr(kv_cache, "word_pattern", spy)
    SpyDevice.entered = 0
    dev = SpyDevice("cpu", mode="deferred")
    gpu = GpuKVCache(GEOM, 8, layout, dev)
    assert made == [True]  # at construction, inside the compute stream's context
    be = RealTransferBackend(dev, gpu, HostPool(HostLayout(GEOM, 1, layout), 8))
    be.submit(TransferJob(1, STORE, [0, 1], [2, 3], 0, 2, ["a", "b"]), 0.0)
    be.submit(TransferJob(2, LOAD, [4, 5], [2, 3], 0, 2, ["a", "b"]), 0.0)
    be.drain()
    assert made == [True]  # never again, from any stream
    assert be.integrity.checked_blocks == 2 and be.integrity.mismatched_bytes == 0


class Fence:
    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def test_a_slice_is_reused_only_after_its_fence_and_its_reader():
    ring = StagingBuffer(host_words, 16)
    a = ring.take(10)
    fa = Fence()
    a.guard(fa)
    b = ring.take(6)
    b.guard(Fence(), hold=True)  # the host reads it after its fence
    c = ring.take(8)  # wraps onto a: a's fence is waited for, not skipped
    assert fa.waited == 1 and ring.waits == 1 and c.start == 0
    c.release()
    d = ring.take(12)  # would overlap b, which the host still holds: a new buffer
    assert ring.grows == 1 and ring.allocations == 2 and d.generation == 1
    assert b.words.data_ptr() != d.words.data_ptr()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", [LAYER_MAJOR, BLOCK_FIRST])
def test_one_staging_buffer_serves_every_job_even_when_it_wraps(layout, seed, monkeypatch):
    """Fault 5: block ids, seeds and counts go through one buffer allocated at start (no
    page-locked allocation inside a job); a ring far smaller than the jobs in flight, on a
    device that completes work late and out of order, still checks every byte right."""
    allocations: list[int] = []

    def counted(words: int) -> torch.Tensor:
        allocations.append(words)
        return host_words(words)

    monkeypatch.setattr(Device, "staging_allocator", lambda self: counted)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda *a, **k: pytest.fail("pinned per job"))
    dev = Device("cpu", mode="deferred", seed=seed)
    gpu = GpuKVCache(GEOM, 32, layout, dev)
    be = RealTransferBackend(dev, gpu, HostPool(HostLayout(GEOM, 1, layout), 32))
    assert allocations == [staging.DEFAULT_WORDS]  # once, when the backend started
    be.staging = StagingBuffer(host_words, 24)  # a few jobs' worth: it must wrap and wait
    for r in range(6):
        keys = [f"r{r}b{i}" for i in range(4)]
        chunks = [4 * r + i for i in range(4)]
        be.submit(TransferJob(2 * r, STORE, [0, 1, 2, 3], chunks, 0, 4, keys), 0.0)
        be.submit(TransferJob(2 * r + 1, LOAD, [8 + r, 16, 24, 31], chunks, 0, 4, keys), 0.0)
        be.poll(0.0)
    be.drain()
    assert be.integrity.checked_blocks == 24 and be.integrity.mismatched_bytes == 0
    assert be.staging.waits > 0  # the ring came round onto slices still in flight...
    assert be.staging.grows == 0  # ...and waited for them (reading held counts) instead
    assert allocations == [staging.DEFAULT_WORDS]
