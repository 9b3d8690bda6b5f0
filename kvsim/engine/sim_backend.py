"""The simulated transfer backend: three FIFO queues on a virtual link.

Implements :class:`kvsim.engine.transfer_protocol.TransferBackend`. Each job follows its
:class:`~kvsim.engine.transfer_model.CopyPlan` (DMA or, for small-page loads, the Triton
kernel). Its host time (driver call or kernel launch) runs from submission on the one
worker thread, after the host time of the jobs submitted before it, so it overlaps the
copies already queued. Each queue (store, load, expedited load) runs one job at a time in
submission order; the queues run concurrently. When its queue reaches a job and its host
time is over, the job spends its fixed latency (``overhead_s``), then moves its bytes at its
plan's rate. Rates are shared as on a real link: two loads (normal and expedited) split the
H2D rate evenly, and while both directions move bytes each runs at ``duplex_factor`` of its
rate. Alone on the link a job takes exactly ``DirectionParams.job_time``. State advances
lazily to the time of each call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import cast

from kvsim.engine.transfer_model import CopyPlan, TransferModelParams
from kvsim.engine.transfer_protocol import DIRECTIONS, STORE, TransferJob, TransferResult


class _Pending:
    """A submitted job waiting for its queue: its plan and when its host time ends."""

    __slots__ = ("host_done", "job", "plan")

    def __init__(self, job: TransferJob, plan: CopyPlan, host_done: float) -> None:
        self.job, self.plan, self.host_done = job, plan, host_done


class _Active:
    __slots__ = ("fixed_end", "h2d", "job", "rate", "remaining", "start")

    def __init__(self, pending: _Pending, start: float) -> None:
        self.job = job = pending.job
        self.start = start
        self.fixed_end = max(start, pending.host_done) + pending.plan.fixed_s
        self.remaining = float(job.nbytes)
        self.rate = pending.plan.rate
        self.h2d = job.direction != STORE

    def copy(self) -> _Active:
        other = _Active.__new__(_Active)
        other.job, other.start, other.fixed_end = self.job, self.start, self.fixed_end
        other.remaining, other.rate, other.h2d = self.remaining, self.rate, self.h2d
        return other


class SimulatedTransferBackend:
    """Cost-model backend on the engine's clock (times are passed in, never read)."""

    def __init__(self, params: TransferModelParams) -> None:
        self.params = params
        self._t = 0.0
        self._pending: dict[str, deque[_Pending]] = {d: deque() for d in DIRECTIONS}
        self._host_free = 0.0  # when the worker thread has submitted every job so far
        self._active: dict[str, _Active | None] = dict.fromkeys(DIRECTIONS)
        self._done: list[TransferResult] = []
        self._busy: set[int] = set()

    # --- protocol ---

    def submit(self, job: TransferJob, now: float) -> None:
        self._advance(now)
        dp = self.params.d2h if job.direction == STORE else self.params.h2d
        plan = dp.plan(job.nbytes, job.num_copies)
        # the host part runs from the call (``now``); the copy waits for ``job.submit_time``
        # too (a store for the forward that writes its blocks)
        self._host_free = max(self._host_free, now) + plan.host_s
        self._pending[job.direction].append(_Pending(job, plan, self._host_free))
        self._busy.add(job.job_id)
        self._start_idle(self._t)

    def host_free_time(self) -> float:
        return self._host_free

    def idle_at(self, now: float) -> bool:
        """Nothing submitted, moving or unreported, and the worker thread free by ``now``:
        a poll at ``now`` or later would only move the backend's time."""
        return not (self._busy or self._done) and self._host_free <= now

    def poll(self, now: float) -> list[TransferResult]:
        self._advance(now)
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: Sequence[int], now: float) -> tuple[float, list[TransferResult]]:
        self._advance(now)
        wanted = set(job_ids) & self._busy
        while wanted:
            t = self._next_event_time()
            if t is None:
                raise RuntimeError(f"wait: jobs {sorted(wanted)} were never submitted")
            self._advance(t)
            wanted &= self._busy
        ids = set(job_ids)
        return self._t, [r for r in self._done if r.job_id in ids]

    def next_completion_time(self) -> float | None:
        if not self._busy:
            return None
        saved = (
            self._t,
            {d: (a.copy() if a else None) for d, a in self._active.items()},
            {d: deque(q) for d, q in self._pending.items()},
            list(self._done),
            set(self._busy),
        )
        n = len(self._busy)
        while len(self._busy) == n:
            t = self._next_event_time()
            if t is None:
                break
            self._advance(t)
        first = self._t if len(self._busy) < n else None
        self._t, self._active, self._pending, self._done, self._busy = saved
        return first

    @property
    def busy(self) -> bool:
        return bool(self._busy)

    # --- fluid model ---

    def _start_idle(self, t: float) -> None:
        for d in DIRECTIONS:
            if self._active[d] is None and self._pending[d]:
                pending = self._pending[d].popleft()
                self._active[d] = _Active(pending, max(t, pending.job.submit_time))

    def _rates(self, t: float) -> dict[str, float]:
        moving = [(d, a) for d, a in self._active.items() if a is not None and a.fixed_end <= t]
        n_h2d = sum(1 for _, a in moving if a.h2d)
        n_d2h = len(moving) - n_h2d
        duplex = self.params.duplex_factor if n_h2d and n_d2h else 1.0
        return {d: a.rate * duplex / (n_h2d if a.h2d else n_d2h) for d, a in moving}

    def _next_event_time(self, rates: dict[str, float] | None = None) -> float | None:
        """The next completion or rate change; ``rates``: ``_rates`` at the current time."""
        t = self._t
        best = None
        if rates is None:
            rates = self._rates(t)
        for d, a in self._active.items():
            if a is None:
                continue
            e = a.fixed_end if d not in rates else t + a.remaining / rates[d]
            if best is None or e < best:
                best = e
        return best

    def _advance(self, until: float) -> None:
        if not self._busy:  # nothing queued or moving: only the time moves (most calls)
            if until > self._t:
                self._t = until
            return
        # only directions with a job in flight have a rate, so the ones read below are not None
        active = cast("dict[str, _Active]", self._active)
        while True:
            t = self._t
            rates = self._rates(t)
            nxt = self._next_event_time(rates)
            if nxt is None or nxt > until:
                for d, r in rates.items():
                    a = active[d]
                    a.remaining -= r * (until - t)
                if until > t:
                    self._t = until
                return
            dt = nxt - t
            finished = []
            for d, r in rates.items():
                a = active[d]
                if t + a.remaining / r <= nxt:
                    finished.append(d)
                a.remaining -= r * dt
            self._t = nxt
            for d in finished:
                a = active[d]
                job = a.job
                self._done.append(
                    TransferResult(
                        job.job_id, job.direction, True, job.nbytes, a.start, nxt, job.submit_time
                    )
                )
                self._busy.discard(job.job_id)
                self._active[d] = None
            self._start_idle(nxt)
