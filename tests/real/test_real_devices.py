"""The CPU stand-ins for a GPU: deferred (out of order across streams, seeded), threaded
(asynchronous), the stream pool that repeats after 32 like torch's, and the spin-clock
rate that keeps re-measuring itself."""

from __future__ import annotations

import threading
import time

import pytest

from real.calibrate import BOTH, measure
from real.device import STREAM_POOL_SIZE, Device
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, GpuKVCache, KVGeometry
from real.sleep_clock import SleepRate
from real.transfer import RealTransferBackend


def test_deferred_device_completes_later_and_out_of_order_across_streams():
    orders = set()
    for seed in range(12):
        dev = Device("cpu", mode="deferred", seed=seed)
        a, b = dev.stream("a"), dev.stream("b")
        seen: list[str] = []
        a.run(lambda seen=seen: seen.append("a"))
        b.run(lambda seen=seen: seen.append("b"))
        ev = dev.new_event()
        ev.record(b)
        assert seen == []  # nothing runs when enqueued
        while not ev.query():  # each query lets a few random operations run
            pass
        dev.run_pending()
        orders.add(tuple(seen))
    assert orders == {("a", "b"), ("b", "a")}


def test_deferred_device_never_breaks_a_cross_stream_wait():
    for seed in range(20):
        dev = Device("cpu", mode="deferred", seed=seed)
        a, b = dev.stream("a"), dev.stream("b")
        seen: list[str] = []
        a.run(lambda seen=seen: seen.append("a"))
        b.wait_stream(a)
        b.run(lambda seen=seen: seen.append("b"))
        ev = dev.new_event()
        ev.record(b)
        ev.synchronize()  # runs b, and a first because b waits for it
        assert seen == ["a", "b"]


def test_threaded_device_runs_streams_asynchronously_and_in_order():
    dev = Device("cpu", mode="threaded")
    a, b = dev.stream("a"), dev.stream("b")
    gate = threading.Event()
    seen: list[str] = []
    a.run(gate.wait)
    a.run(lambda: seen.append("a"))
    b.wait_stream(a)
    b.run(lambda: seen.append("b"))
    ev = dev.new_event()
    ev.record(b)
    time.sleep(0.01)
    assert not ev.query() and seen == []  # the host went on; the streams wait
    gate.set()
    ev.synchronize()
    assert seen == ["a", "b"] and ev.time() > 0
    a.run(lambda: 1 / 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        dev.run_pending()


def test_emulated_compute_on_a_threaded_device_ends_at_its_deadline():
    dev = Device("cpu", mode="threaded")
    t0 = dev.clock()
    dev.compute_stream.run(lambda: time.sleep(0.01))  # e.g. a pattern fill queued before
    dev.sleep(dev.compute_stream, 0.03, until=t0 + 0.03)
    dev.compute_stream.synchronize()
    assert 0.03 <= dev.clock() - t0 < 0.03 + 0.02  # absorbed, not 0.04


def test_stream_pool_repeats_after_32_but_named_streams_stay_distinct():
    """Fault 8: ``torch.cuda.Stream()`` repeats after 32 draws, so drawing fresh streams
    for every backend and calibration would, in a long process (the GPU check, the test
    suite), hand a live backend's stream to a calibration. Named streams are drawn once."""
    dev = Device("cpu", mode="deferred")
    drawn = [dev.new_stream() for _ in range(STREAM_POOL_SIZE + 1)]
    assert drawn[0] is drawn[STREAM_POOL_SIZE]  # the stand-in repeats like torch's pool
    geom = KVGeometry(2, 64)
    first = None
    for _ in range(12):
        gpu = GpuKVCache(geom, 4, BLOCK_FIRST, dev.torch_device)
        be = RealTransferBackend(dev, gpu, HostPool(HostLayout(geom, 1), 4))
        first = first or be
        measure(dev, sizes=(4096,), counts=(1,), max_bytes=4096, repeats=1, directions=(BOTH,))
    used = {id(s) for s in dev._named.values()} | {id(dev.compute_stream)}
    assert len(used) == len(dev._named) + 1  # pairwise distinct
    assert dev._pool_next <= STREAM_POOL_SIZE + 1 + 8  # the 33 draws above + a handful
    calib = {id(dev.stream("calibrate-h2d")), id(dev.stream("calibrate-d2h"))}
    assert not calib & {id(s) for s in first.streams.values()}


def test_sleep_rate_settles_after_the_clock_ramps_and_keeps_learning():
    """Fault 8: the spin rate is measured after warm-up until stable, then updated."""
    readings = iter([0.5e9, 0.8e9, 1.0e9, 1.01e9, 9.9e9])
    rate = SleepRate.settled(lambda: next(readings))
    assert rate.cycles_per_s == pytest.approx(1.01e9)
    assert rate.cycles(0.01) == int(0.01 * 1.01e9)
    for _ in range(20):  # the GPU clock drops to half: spins now take twice as long
        c = rate.cycles(0.01)
        rate.observe(c, c / 0.505e9)
    assert rate.cycles_per_s == pytest.approx(0.505e9, rel=1e-3)
    now = [0.0]
    rate = SleepRate(1e9, refresh_s=0.5, wall=lambda: now[0])
    assert not rate.due()
    now[0] = 0.6
    assert rate.due()
