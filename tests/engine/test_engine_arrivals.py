"""Timed mode rebases arrivals to the first one: a trace's origin (an epoch, a unit mistake)
changes nothing the engine reports, and timestamps too coarse to place between steps warn."""

from __future__ import annotations

import warnings

import pytest

from kvsim.core.errors import InputWarning
from kvsim.engine.arrivals import arrival_times
from kvsim.engine.bench import TwinKnobs, twin_engine
from kvsim.traces import Request, Trace

BT = 64


def requests(origin: float, gap: float = 0.25) -> list[Request]:
    """Twelve requests ``gap`` apart from ``origin``, sharing a prefix; gaps exact in binary,
    so they survive any origin whose floats are spaced by ``gap`` or finer."""
    return [Request(i, origin + i * gap, 3 * BT + 5 * i, 8 + i, (1, 2, 10 + i)) for i in range(12)]


def run(reqs: list[Request]):
    engine = twin_engine(TwinKnobs(block_tokens=BT, gpu_blocks=400, cpu_chunks=64))
    engine.run(Trace.from_requests(reqs, BT))
    return engine.recorder.request_table()


def test_an_epoch_origin_changes_nothing() -> None:
    """1.7e15 s (epoch nanoseconds read as Mooncake milliseconds): floats there are 0.25 s
    apart, so without rebasing every 10 ms step vanishes and TTFT reads 0 or 0.25 s."""
    base = run(requests(0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)
        shifted = run(requests(1.7e15))
    assert (base.ttft_s > 0).all()
    for col in ("arrival_s", "ttft_s", "e2e_s", "first_token_s", "finish_s", "preemptions"):
        assert list(shifted[col]) == list(base[col]), col


def test_timestamps_coarser_than_a_step_warn_once() -> None:
    with pytest.warns(InputWarning, match=r"0\.25 s apart") as caught:
        list(arrival_times(requests(1.7e15)))
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # epoch seconds: floats 2.4e-7 s apart, finer than any step, rebased to 0
        times = [t for t, _ in arrival_times(requests(1.7e9))]
        assert times[0] == 0.0 and times[-1] == pytest.approx(11 * 0.25)
        # --time-scale shrinks the grid with the times
        list(arrival_times(requests(1.7e12, gap=0.5), time_scale=2.0))
