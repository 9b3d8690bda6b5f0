"""Arrival times: the trace's timestamps scaled, or a seeded Poisson re-timing."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from kvsim.traces.model import Request


def arrival_times(
    requests: Iterable[Request],
    time_scale: float = 1.0,
    poisson_rate: float | None = None,
    seed: int = 0,
) -> Iterator[tuple[float, Request]]:
    """``(arrival_s, request)`` in trace order. Poisson keeps the order, redraws the gaps."""
    if poisson_rate is None:
        for req in requests:
            yield req.arrival_s * time_scale, req
        return
    rng = random.Random(seed)
    t = 0.0
    first = True
    for req in requests:
        if not first:
            t += rng.expovariate(poisson_rate)
        first = False
        yield t, req
