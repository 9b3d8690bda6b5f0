"""Arrival times: the trace's timestamps scaled, or a seeded Poisson re-timing; or an
:class:`ArrivalSource` whose arrivals depend on the run (a closed loop of clients)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Protocol

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


class ArrivalSource(Protocol):
    """Arrivals that may depend on the run (a closed loop of clients): the engine asks for
    the next one at the start, after each arrival it handles and after each finish it
    reports, while no request arrival is pending (``kvsim.workloads.source``)."""

    @property
    def done(self) -> bool:
        """Nothing more will be sent."""
        ...

    def next_arrival(self, now: float) -> tuple[float, Request | None] | None:
        """``(t, request)``: sent at ``t`` (never before an earlier answer; before ``now``
        when a step has passed it, as a trace's arrivals may be); ``(t, None)``: ask again
        at ``t``; None: nothing until a request finishes."""
        ...

    def finished(self, request_id: int, t: float) -> None:
        """Request ``request_id`` finished (or was refused) at ``t``."""
        ...


class TraceArrivals:
    """A trace's fixed arrivals as an :class:`ArrivalSource` that needs no finishes."""

    wants_finishes = False

    def __init__(self, arrivals: Iterator[tuple[float, Request]]) -> None:
        self._it = arrivals
        self.done = False

    def next_arrival(self, now: float) -> tuple[float, Request | None] | None:
        nxt = next(self._it, None)
        self.done = nxt is None
        return nxt

    def finished(self, request_id: int, t: float) -> None:
        pass
