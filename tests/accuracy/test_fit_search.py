"""The fit's search (``kvsim.accuracy.search``) on losses whose minimum is known: it finds
a minimum along a diagonal valley that coordinate descent alone crawls along, keeps to the
bounds and the evaluation budget, and never returns worse than its start."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.accuracy.search import _Best, _coordinate_descent, search
from kvsim.engine.phase_compute import PhaseProfile, shipped_profile

SPACE = {
    "weight_bandwidth_efficiency": (0.3, 1.0, 1.1, "mul"),
    "step_overhead_s": (0.0, 0.02, 0.0005, "add"),
    "request_overhead_s": (0.0, 0.05, 0.004, "add"),
}
TARGET = {
    "weight_bandwidth_efficiency": 0.92,
    "step_overhead_s": 0.0016,
    "request_overhead_s": 0.008,
}


def _start() -> PhaseProfile:
    base = shipped_profile("h100")
    assert base is not None
    return PhaseProfile.from_dict(
        {
            **base.to_dict(),
            "weight_bandwidth_efficiency": 0.8,
            "step_overhead_s": 0.001,
            "request_overhead_s": 0.0,
        }
    )


def _valley(target: dict[str, float]):
    """Errors of a step time that a faster weight stream and a larger fixed cost trade
    against: a steep error across the valley, a shallow one along it, and one error that
    only the request overhead moves."""
    calls: list[PhaseProfile] = []

    def evaluate(p: PhaseProfile) -> tuple[float, np.ndarray, None]:
        calls.append(p)
        w = math.log(p.weight_bandwidth_efficiency / target["weight_bandwidth_efficiency"]) / 0.0953
        s = (p.step_overhead_s - target["step_overhead_s"]) / 0.0005
        r = (p.request_overhead_s - target["request_overhead_s"]) / 0.004
        errors = np.array([0.3 * (s - w), 0.01 * (s + w), 0.05 * r, -0.05 * r])
        return float(np.mean(np.abs(errors))), errors, None

    return evaluate, calls


def test_the_search_finds_a_diagonal_valleys_minimum_that_coordinate_descent_crawls_along():
    evaluate, calls = _valley(TARGET)
    best, loss, _ = search(_start(), SPACE, evaluate, max_evals=60)
    assert len(calls) <= 60
    assert best.weight_bandwidth_efficiency == pytest.approx(0.92, rel=0.01)
    assert best.step_overhead_s == pytest.approx(0.0016, rel=0.02)
    assert best.request_overhead_s == pytest.approx(0.008, rel=0.02)
    assert loss < 0.002
    # the same budget spent on coordinate descent alone ends far up the valley
    evaluate, calls = _valley(TARGET)
    start = _start()
    first = evaluate(start)
    alone = _coordinate_descent(
        _Best(start, first[0], first[1], None),
        SPACE,
        lambda p, _: evaluate(p),
        60,
        lambda: len(calls),
    )
    assert alone.loss > 5 * loss


def test_the_search_keeps_to_the_bounds_and_the_budget():
    """A minimum beyond the upper bound: the search stops at the bound, and every profile it
    evaluates is inside the bounds."""
    evaluate, calls = _valley(
        {**TARGET, "weight_bandwidth_efficiency": 1.3, "step_overhead_s": 0.004}
    )
    best, _, _ = search(_start(), SPACE, evaluate, max_evals=25)
    assert len(calls) <= 25
    assert best.weight_bandwidth_efficiency == pytest.approx(1.0, abs=0.02)
    for p in calls:
        for name, (low, high, _, _) in SPACE.items():
            assert low <= getattr(p, name) <= high


@pytest.mark.parametrize("max_evals", [1, 2, 5])
def test_the_search_never_returns_worse_than_its_start(max_evals):
    evaluate, calls = _valley(TARGET)
    start = _start()
    start_loss = evaluate(start)[0]
    calls.clear()
    best, loss, _ = search(start, SPACE, evaluate, max_evals=max_evals)
    assert len(calls) <= max_evals
    assert loss <= start_loss
    assert loss == evaluate(best)[0]  # the loss returned is the profile's own
