"""The event heap: the one place where equal-time events get their order.

Events are keyed ``(time, phase, sequence)``:

* ``time``: clock seconds;
* ``phase``: at equal times, transfer wake-ups come first (so a step sees finished
  copies), then arrivals (so a step at time t schedules requests that arrived at t),
  then engine steps;
* ``sequence``: insertion order, so equal (time, phase) events stay FIFO (arrivals keep
  trace order).

Nothing else in the engine compares event times.
"""

from __future__ import annotations

import heapq
from typing import Any

PHASE_TRANSFER = 0
PHASE_ARRIVAL = 1
PHASE_STEP = 2

EventKey = tuple[float, int]  # (time, phase): what orders two events


def earliest(a: EventKey | None, b: EventKey | None) -> EventKey | None:
    """The sooner of two event keys; None stands for no event."""
    if a is None:
        return b
    return a if b is None or a <= b else b


def step_due_before(time: float, limit: EventKey | None) -> bool:
    """Whether a step event at ``time`` comes before the event keyed ``limit`` (None: no
    event, so always)."""
    return limit is None or (time, PHASE_STEP) < limit


class EventQueue:
    """A min-heap of ``(time, phase, sequence, payload)``."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, time: float, phase: int, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, phase, self._seq, payload))

    def pop(self) -> tuple[float, int, Any]:
        time, phase, _, payload = heapq.heappop(self._heap)
        return time, phase, payload

    def peek_key(self) -> tuple[float, int] | None:
        """``(time, phase)`` of the next event, or None."""
        if not self._heap:
            return None
        head = self._heap[0]
        return head[0], head[1]

    def has_phase(self, phase: int) -> bool:
        """Whether any queued event is of ``phase``."""
        return any(e[1] == phase for e in self._heap)

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
