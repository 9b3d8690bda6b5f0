"""When a client plans to send each request of a stage, relative to the stage's start.

A stage's plan is a list of offsets (seconds from the stage's start, non-decreasing), or
none for a closed-loop stage that sends as long as its duration lasts. The plan is drawn
once, seeded, before the run; the run then sends request j of the stage at
``max(stage start + offset_j, previous send, a free slot)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.core.errors import InputError
from kvsim.workloads.spec import Load, LoadStage

__all__ = ["StagePlan", "plan_stages"]


@dataclass(frozen=True)
class StagePlan:
    """One stage as the client runs it.

    Attributes:
        offsets: planned send times from the stage's start, non-decreasing; None: as many
            as ``duration`` allows (a closed loop by duration).
        duration: the stage's length (s); a stage with ``offsets`` ends with its last send,
            a rate stage's next one (ideal timing) starts ``duration`` after its start.
        cap: at most this many requests in flight (None: no cap).
    """

    offsets: np.ndarray | None
    duration: float | None
    cap: int | None

    @property
    def count(self) -> int | None:
        return None if self.offsets is None else len(self.offsets)


def _scaled_exponential(rng: np.random.Generator, rate: float, span: float, n: int) -> np.ndarray:
    """inference-perf's ``ConstantLoadTimer`` (and ``vllm bench serve``'s gamma gaps at
    burstiness 1): ``n`` exponential gaps at ``rate``, scaled to sum to ``span``; the
    send times are their running sums, the last one at ``span``."""
    if n == 0:
        return np.zeros(0)
    gaps = rng.exponential(1.0 / rate, n)
    return np.cumsum(gaps * (span / gaps.sum()))


def _rate_offsets(load: Load, stage: LoadStage, rng: np.random.Generator) -> np.ndarray:
    rate, duration = float(stage.rate or 0), float(stage.duration or 0)
    n = int(rate * duration + 1e-9)
    if load.timing == "inference-perf":
        if load.type == "constant":
            return _scaled_exponential(rng, rate, duration, n)
        # PoissonLoadTimer: a Poisson count per whole second, spread over that second
        out: list[np.ndarray] = []
        second, have = 0, 0
        while have < n:
            count = int(rng.poisson(rate))
            if count:
                times = second + _scaled_exponential(rng, count, 1.0, count)
                out.append(times[: n - have])
                have += len(out[-1])
            second += 1
        return np.concatenate(out) if out else np.zeros(0)
    if load.type == "constant":
        return np.arange(n) / rate
    # a Poisson process on [0, duration): exponential gaps from the stage's start
    sends: list[float] = []
    t = float(rng.exponential(1.0 / rate))
    while t < duration:
        sends.append(t)
        t += float(rng.exponential(1.0 / rate))
    return np.asarray(sends)


#: the most requests a load may send: 50M is days of simulation, and its send times
#: already take 400 MB
MAX_SENDS = 50_000_000


def plan_stages(load: Load, seed: int) -> list[StagePlan]:
    """Every stage's plan, drawn from one generator seeded by ``seed`` (a stream apart
    from the workload's, so the same seed gives a workload its tool's lengths)."""
    sends = sum(
        float(s.rate or 0) * float(s.duration or 0)
        if load.type != "concurrency"
        else float(s.num_requests or 0)
        for s in load.stages
    )
    if sends > MAX_SENDS:  # its send times alone would not fit in memory
        raise InputError(
            f"the load sends about {sends:,.0f} requests, more than kvsim plans "
            f"({MAX_SENDS:,}): shorten its stages or lower their rates"
        )
    rng = np.random.default_rng([seed, 1])
    plans: list[StagePlan] = []
    for stage in load.stages:
        if load.type != "concurrency":
            plans.append(StagePlan(_rate_offsets(load, stage, rng), stage.duration, None))
            continue
        n = stage.num_requests
        if n is None:
            offsets = None
        elif load.timing == "inference-perf":
            # every request is queued with a time within the stage's first second
            offsets = _scaled_exponential(rng, float(n), 1.0, n)
        else:
            offsets = np.zeros(n)
        plans.append(StagePlan(offsets, stage.duration, stage.concurrency))
    return plans
