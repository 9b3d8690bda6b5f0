"""Arrival times: the trace's timestamps scaled, or a seeded Poisson re-timing; or an
:class:`ArrivalSource` whose arrivals depend on the run (a closed loop of clients).

A trace's timestamps are rebased to its first arrival, so the engine's clock starts at 0
whatever the trace's origin: the engine adds step times of milliseconds to these values, and
a float near an epoch timestamp cannot hold them (at 1.7e15 s two floats are 0.25 s apart: a
10 ms forward vanishes and TTFT reads 0). What rebasing cannot restore is the spacing of the
timestamps themselves, rounded where they were read: when that is coarser than
:data:`ARRIVAL_RESOLUTION_S` a warning says so.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Iterable, Iterator
from typing import Protocol

from kvsim.core.errors import InputWarning
from kvsim.traces.model import Request

# A forward step takes milliseconds; arrivals on a coarser grid than this are placed
# between steps by rounding, not by the trace.
ARRIVAL_RESOLUTION_S = 1e-3


def arrival_times(
    requests: Iterable[Request],
    time_scale: float = 1.0,
    poisson_rate: float | None = None,
    seed: int = 0,
) -> Iterator[tuple[float, Request]]:
    """``(arrival_s, request)`` in trace order, the first at 0. The trace's times are
    rebased to its first arrival, then scaled; Poisson keeps the order, redraws the gaps.
    Warns (:class:`InputWarning`, once) when the timestamps as read are spaced more coarsely
    than :data:`ARRIVAL_RESOLUTION_S` after scaling."""
    if poisson_rate is None:
        origin: float | None = None
        warned = False
        for req in requests:
            raw = req.arrival_s
            if origin is None:
                origin = raw
            if not warned and math.ulp(raw) * time_scale > ARRIVAL_RESOLUTION_S:
                warned = True
                warnings.warn(_coarse(raw, time_scale), InputWarning, stacklevel=2)
            yield (raw - origin) * time_scale, req
        return
    rng = random.Random(seed)
    t = 0.0
    first = True
    for req in requests:
        if not first:
            t += rng.expovariate(poisson_rate)
        first = False
        yield t, req


def _coarse(raw: float, time_scale: float) -> str:
    step = math.ulp(raw) * time_scale
    return (
        f"arrival timestamps near {raw:.6g} s are {step:.3g} s apart at best (float "
        f"spacing), coarser than the {ARRIVAL_RESOLUTION_S * 1e3:g} ms steps of the engine: "
        "arrivals are rounded onto that grid; are the timestamps in the unit the format "
        "expects (Mooncake: milliseconds)?"
    )


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
