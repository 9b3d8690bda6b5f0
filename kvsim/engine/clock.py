"""Clocks injected into the engine: virtual for simulation, monotonic for a real backend.

The engine only ever asks ``now()`` and ``wait_until(t)``. A virtual clock jumps; a
monotonic clock sleeps (that is how a real run emulates compute time).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What the engine needs of time, so simulation and a real run share one engine."""

    def now(self) -> float:
        """Seconds since the run started."""

    def wait_until(self, t: float) -> None:
        """Return once ``now() >= t`` (no-op when already past)."""


class VirtualClock:
    """Simulated time: ``wait_until`` moves time forward instantly, never back."""

    __slots__ = ("_t",)

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def wait_until(self, t: float) -> None:
        if t > self._t:
            self._t = t


class MonotonicClock:
    """Wall time from ``time.monotonic``, zero at construction; ``wait_until`` sleeps."""

    __slots__ = ("_origin",)

    def __init__(self) -> None:
        self._origin = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._origin

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)
