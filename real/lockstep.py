"""The lockstep run: real copies on the simulated schedule, so its hit decisions are a
function of the inputs alone.

The wall-clock run of :mod:`real.validate` steps when the host gets to it: a step started
late can put two requests in one step, or see a load a step later, and its hit decisions
then differ from the simulation's for a reason that is the machine's load, not the code's
(docs/real-backend.md). This run takes the timing out: the engine runs on the virtual
clock with the simulated backend's times (the link model, the same float steps as the
simulated run), while every job is also submitted to a :class:`RealTransferBackend`,
which moves and checks the real bytes. A job is reported done at its simulated time and
only once its real copy (and a load's byte check) has finished, so the engine never sees
a block free before the real copy left it. The batching is then the simulation's by
construction, and any difference in hit decisions, jobs or bytes is a difference between
the real backend and the simulated one given the same schedule: a bug, never load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pandas as pd

from kvsim.engine.recorder import TRANSFER_COLUMNS
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_model import TransferModelParams
from kvsim.engine.transfer_protocol import TransferJob, TransferResult
from real import compare
from real.transfer import RealTransferBackend
from real.validation_report import request_rows

#: what must be the same, job for job, in the simulated and the lockstep run (its times
#: too: the same schedule, the same float steps)
JOB_COLUMNS = list(TRANSFER_COLUMNS)


class LockstepBackend(SimulatedTransferBackend):
    """The simulated backend's times, the real backend's bytes (see the module docstring).

    A failed real copy is reported as a failed job at its simulated time, as the
    wall-clock run reports it at its real one."""

    def __init__(self, params: TransferModelParams, real: RealTransferBackend) -> None:
        super().__init__(params)
        self.real = real
        self._failed: set[int] = set()
        self._seen = 0  # real records already read for failures

    def submit(self, job: TransferJob, now: float) -> None:
        self.real.submit(job, now)
        super().submit(job, now)

    def poll(self, now: float) -> list[TransferResult]:
        return self._settled(super().poll(now))

    def wait(self, job_ids: Sequence[int], now: float) -> tuple[float, list[TransferResult]]:
        t, done = super().wait(job_ids, now)
        return t, self._settled(done)

    def _settled(self, done: list[TransferResult]) -> list[TransferResult]:
        """``done`` once each job's real copy and check have finished, marked failed where
        the real copy failed."""
        if not done:
            return done
        clock = self.real.device.clock
        self.real.wait([r.job_id for r in done], clock())
        self.real.poll(clock())  # hand out what wait left for the next poll
        records = self.real.records
        self._failed.update(r.job_id for r in records[self._seen :] if not r.success)
        self._seen = len(records)
        return [_failed(r) if r.job_id in self._failed else r for r in done]


def _failed(r: TransferResult) -> TransferResult:
    return dataclasses.replace(r, success=False)


def compared(
    sim_req: pd.DataFrame,
    sim_tr: pd.DataFrame,
    lock_req: pd.DataFrame,
    lock_tr: pd.DataFrame,
    real: RealTransferBackend,
) -> dict[str, Any]:
    """The lockstep run (its request and transfer tables, its real backend, drained)
    against the simulated run's tables: hit decisions, the jobs (every column, in order)
    and the bytes loaded."""
    hits = compare.hit_decisions(request_rows(sim_req), request_rows(lock_req))
    jobs_same = len(lock_tr) == len(sim_tr) and bool(
        (lock_tr[JOB_COLUMNS].to_numpy() == sim_tr[JOB_COLUMNS].to_numpy()).all()
    )
    return {
        "hit_decisions_identical": hits["all_identical"],
        "first_difference": hits["first_difference"],
        "jobs_identical": jobs_same,
        "jobs": len(lock_tr),
        "real_jobs": len(real.records),
        "failed_jobs": sum(1 for r in real.records if not r.success),
        "integrity": real.integrity.as_dict(),
    }
