"""How many spin-kernel cycles make one second of emulated compute on a GPU.

``torch.cuda._sleep(cycles)`` spins for a number of SM clock cycles, and the SM clock
changes: it ramps up under load and drops when the GPU idles or heats. One measurement at
start-up (possibly before the clock ramped) would make every later forward too long or
too short, so :class:`SleepRate` warms the GPU, measures until two readings agree, and
then keeps re-measuring: every ``refresh_s`` one emulated forward is bracketed by timing
events, and its measured rate is folded in once those events complete (never waiting).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

CALIBRATION_CYCLES = 20_000_000


class SleepRate:
    """Spin cycles per second, updated from measurements (``observe``)."""

    def __init__(
        self,
        cycles_per_s: float,
        *,
        refresh_s: float = 0.5,
        weight: float = 0.5,
        wall: Callable[[], float] = time.perf_counter,
    ) -> None:
        if cycles_per_s <= 0:
            raise ValueError(f"cycles_per_s must be > 0, got {cycles_per_s}")
        self.cycles_per_s = cycles_per_s
        self.refresh_s = refresh_s
        self.weight = weight
        self._wall = wall
        self._last_probe = wall()
        self._probes: deque[tuple[Any, Any, int]] = deque()
        self.observations = 0

    @classmethod
    def settled(
        cls,
        measure: Callable[[], float],
        *,
        tolerance: float = 0.03,
        max_tries: int = 10,
        **kw: Any,
    ) -> SleepRate:
        """Measure (``measure()`` returns cycles per second) until two readings agree."""
        last = measure()
        for _ in range(max_tries - 1):
            now = measure()
            if abs(now - last) <= tolerance * now:
                return cls(now, **kw)
            last = now
        return cls(last, **kw)

    def cycles(self, seconds: float) -> int:
        return max(1, int(seconds * self.cycles_per_s))

    def observe(self, cycles: int, seconds: float) -> None:
        """Fold one measured spin (``cycles`` took ``seconds``) into the rate."""
        if seconds <= 0 or cycles <= 0:
            return
        self.cycles_per_s += self.weight * (cycles / seconds - self.cycles_per_s)
        self.observations += 1

    def due(self) -> bool:
        """Whether the next sleep should be timed (at most one probe in flight)."""
        return not self._probes and self._wall() - self._last_probe >= self.refresh_s

    def sleep(self, raw_stream: Any, seconds: float) -> None:
        """Enqueue a spin of ``seconds`` on a CUDA stream, sometimes timed (CUDA only)."""
        import torch

        self._harvest()
        cycles = self.cycles(seconds)
        probe = seconds >= 0.002 and self.due()
        with torch.cuda.stream(raw_stream):
            if probe:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record(raw_stream)
            torch.cuda._sleep(cycles)
            if probe:
                b.record(raw_stream)
                self._probes.append((a, b, cycles))
                self._last_probe = self._wall()

    def _harvest(self) -> None:
        while self._probes and self._probes[0][1].query():
            a, b, cycles = self._probes.popleft()
            self.observe(cycles, a.elapsed_time(b) / 1e3)


def cuda_sleep_rate(raw_stream: Any, warmup_s: float = 0.2) -> SleepRate:
    """Warm the SM clock up for ``warmup_s``, then measure until two readings agree."""
    import torch

    def measure() -> float:
        with torch.cuda.stream(raw_stream):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record(raw_stream)
            torch.cuda._sleep(CALIBRATION_CYCLES)
            b.record(raw_stream)
        b.synchronize()
        return CALIBRATION_CYCLES / (a.elapsed_time(b) / 1e3)

    rough = measure()
    with torch.cuda.stream(raw_stream):
        torch.cuda._sleep(max(1, int(rough * warmup_s)))
    return SleepRate.settled(measure)
