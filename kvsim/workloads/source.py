"""A benchmark client as an arrival source: it decides each send from what the run has
done so far (a slot freed by a finish, a stage drained), so closed loops and stages that
wait for the previous one come out of the simulation.

The engine's side of the contract (:class:`kvsim.engine.arrivals.ArrivalSource`): it
calls :meth:`ClientSource.next_arrival` at the start, after each arrival it handles and
after each finish it reports (:meth:`ClientSource.finished`) while no request arrival is
pending. The answer is ``(t, request)`` (send at t, never before an earlier answer),
``(t, None)`` (nothing yet: ask again at t) or None (nothing until a request finishes, or
:attr:`ClientSource.done`).
"""

from __future__ import annotations

import bisect
import math

from kvsim.traces.model import Request
from kvsim.workloads.prompts import PromptSource
from kvsim.workloads.timing import StagePlan

__all__ = ["LEAD_S", "ClientSource"]

#: inference-perf queues a stage's requests 1 s before its first slot, then checks once a
#: second, from then on, whether they have all finished
LEAD_S = 1.0


class ClientSource:
    """The requests of a load's stages, sent one after another in order.

    Request j of a stage is sent at ``max(stage start + offset_j, previous send)``, or
    later, at the finish that leaves fewer than the stage's ``cap`` requests in flight; a
    stage by duration stops sending at its end. Request ids count sends over the run
    (0-based); ``stage_of[id]`` is the stage it was sent in.

    Args:
        plans: the stages (:func:`kvsim.workloads.timing.plan_stages`).
        prompts: what the i-th request sends.
        drain: inference-perf's stages: the next one starts once every request of this one
            has finished (seen at its once-a-second check) plus ``gap_s``, and the prompt
            index restarts at 0; else stages run back to back and the index counts on.
        gap_s: see ``drain``.
    """

    def __init__(
        self, plans: list[StagePlan], prompts: PromptSource, *, drain: bool, gap_s: float = 2.0
    ) -> None:
        self.plans = plans
        self.prompts = prompts
        self.drain = drain
        self.gap_s = gap_s
        self.stage_of: list[int] = []
        self.k = 0  # the stage now sending
        self.start: float | None = 0.0  # its start (None: waiting for the last one to drain)
        self.sent = 0  # requests the stage has sent
        self.last_send = 0.0
        self.in_flight = 0
        self.open = [0] * len(plans)  # per stage: sent and not finished
        self._wake: float | None = None
        self._finishes: list[float] = []  # every finish time so far, sorted
        self._last_finish = [-math.inf] * len(plans)  # per stage
        self._stage_start = 0.0
        # the plans' offsets as floats (numpy scalars cost more per send)
        self._offsets = [None if p.offsets is None else p.offsets.tolist() for p in plans]

    @property
    def done(self) -> bool:
        """Every stage has sent all it will send."""
        return self.k >= len(self.plans)

    @property
    def total(self) -> int | None:
        """The requests the load will send, when the plans fix it (no stage by duration
        in a closed loop)."""
        counts = [p.count for p in self.plans]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def next_arrival(self, now: float) -> tuple[float, Request | None] | None:
        """The next send, a wake-up time, or None (see the module)."""
        while not self.done:
            if self.start is None:
                return None  # the last stage is draining
            plan = self.plans[self.k]
            offsets = self._offsets[self.k]
            j = self.sent
            if offsets is not None and j >= len(offsets):
                self._end_stage()
                continue
            offset = offsets[j] if offsets is not None else 0.0
            t = max(self.start + offset, self.last_send)
            end = self.start + plan.duration if offsets is None and plan.duration else None
            free = self._slot_free(plan.cap)
            if free is None:  # every slot busy until a finish not seen yet
                if end is not None and now >= end:
                    self._end_stage()  # no finish before ``end``: the stage is over
                    continue
                if end is not None and self._wake != end:
                    self._wake = end  # the stage may end before a slot frees
                    return end, None
                return None
            t = max(t, free)
            if end is not None and t >= end:
                self._end_stage()
                continue
            return t, self._send(t)
        return None

    def _slot_free(self, cap: int | None) -> float | None:
        """When the next send finds fewer than ``cap`` requests in flight: the finish time
        that frees a slot (-inf: one is free already), or None (not before a finish that
        has not happened yet). Worked out from the finish times, so it holds whatever the
        order the engine reports them in."""
        if cap is None:
            return -math.inf
        m = len(self.stage_of) - cap + 1  # finishes needed before the next send
        if m <= 0:
            return -math.inf
        return self._finishes[m - 1] if m <= len(self._finishes) else None

    def finished(self, request_id: int, t: float) -> None:
        """Request ``request_id`` finished (or was refused) at ``t``."""
        stage = self.stage_of[request_id]
        self.in_flight -= 1
        self.open[stage] -= 1
        bisect.insort(self._finishes, t)
        self._last_finish[stage] = max(self._last_finish[stage], t)
        if self.start is None and stage == self.k - 1 and self.open[stage] == 0:
            self.start = self._drained_at(self._last_finish[stage])

    def _send(self, t: float) -> Request:
        rid = len(self.stage_of)
        index = self.sent if self.drain else rid
        p = self.prompts.prompt(index)
        self.stage_of.append(self.k)
        self.sent += 1
        self.last_send = t
        self.in_flight += 1
        self.open[self.k] += 1
        return Request(rid, t, p.prompt_tokens, p.output_tokens, p.block_hashes)

    def _end_stage(self) -> None:
        plan, start = self.plans[self.k], self.start or 0.0
        stage = self.k
        self._stage_start = start  # the stage that ends: inference-perf's checks count from it
        self.k += 1
        self.sent = 0
        if self.done:
            return
        if not self.drain:
            self.start = start + plan.duration if plan.duration else max(self.last_send, start)
        elif self.open[stage] == 0:
            self.start = self._drained_at(max(self._last_finish[stage], start))
        else:
            self.start = None

    def _drained_at(self, t: float) -> float:
        """The next stage's start: inference-perf sees the drain at its first check at or
        after ``t`` (checks every second from its stage's start minus the lead), then
        waits ``gap_s``."""
        origin = self._stage_start - LEAD_S
        seen = origin + math.ceil(max(t - origin, 0.0) - 1e-12)
        return seen + self.gap_s
