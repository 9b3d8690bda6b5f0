"""The lockstep run (real.lockstep): real copies on the simulated schedule, so its hit
decisions and jobs are the simulation's whatever the machine's load."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_model import get_link
from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob, TransferResult
from real import check_goals
from real.device import Device
from real.lockstep import LockstepBackend
from real.validate import ValidationSpec, default_trace, run_validation

LINK = get_link("pcie5")


class SlowReal:
    """A real backend whose copies finish only when waited on (a machine so loaded that
    no copy is done before the engine asks), and whose job 2 fails."""

    def __init__(self) -> None:
        self.device = SimpleNamespace(clock=lambda: 123.0)
        self.submitted: list[int] = []
        self.waited: list[int] = []
        self.records: list[SimpleNamespace] = []

    def submit(self, job: TransferJob, now: float) -> None:
        self.submitted.append(job.job_id)

    def wait(self, ids, now):
        for i in ids:
            if i not in self.waited:
                self.waited.append(i)
                self.records.append(SimpleNamespace(job_id=i, success=i != 2))
        return now, []

    def poll(self, now: float) -> list[TransferResult]:
        return []


def _job(i: int, direction: str, t: float) -> TransferJob:
    return TransferJob(i, direction, [i], [i], 4 << 20, 2, submit_time=t)


def test_jobs_are_reported_at_their_simulated_times_once_really_done():
    real = SlowReal()
    lock, sim = LockstepBackend(LINK, real), SimulatedTransferBackend(LINK)
    for b in (lock, sim):
        b.submit(_job(1, STORE, 0.0), 0.0)
        b.submit(_job(2, LOAD, 0.0), 0.0)
    assert real.submitted == [1, 2]
    first = sim.next_completion_time()
    assert first is not None and lock.next_completion_time() == first
    assert lock.poll(first / 2) == sim.poll(first / 2) == []
    assert real.waited == []  # nothing waited on before its simulated time
    t, done = lock.wait([1, 2], 0.0)
    t_sim, done_sim = sim.wait([1, 2], 0.0)
    assert t == t_sim and sorted(real.waited) == [1, 2]
    times = {r.job_id: (r.start_time, r.end_time) for r in done}
    assert times == {r.job_id: (r.start_time, r.end_time) for r in done_sim}
    assert {r.job_id: r.success for r in done} == {1: True, 2: False}  # the real copy failed
    # reported again by the next poll, as the simulated backend does, still failed
    assert {r.job_id: r.success for r in lock.poll(t)} == {1: True, 2: False}


@pytest.mark.parametrize("kind", ["eager", "deferred"])
def test_lockstep_matches_the_simulation_where_the_wall_clock_run_cannot_keep_up(kind):
    """Arrivals 1000x faster than the trace, so the wall-clock run falls far behind the
    modelled schedule (its decisions are not asserted); the lockstep run makes the
    simulation's decisions and jobs, and loads every byte intact."""
    spec = replace(ValidationSpec.small_for_tests(), time_scale=0.001, noise_jobs=0)
    rep = run_validation(default_trace(), spec, device=Device("cpu", mode=kind, seed=5))
    s = rep.summary()
    assert s["lockstep_hit_decisions_identical"] and s["lockstep_first_difference"] is None
    assert s["lockstep_jobs_identical"] and rep.lockstep["jobs"] == rep.lockstep["real_jobs"]
    assert s["lockstep_checked_blocks"] > 50 and s["lockstep_mismatched_bytes"] == 0
    assert rep.lockstep["failed_jobs"] == 0


def test_a_lockstep_difference_fails_the_gpu_check_a_wall_clock_one_does_not():
    ok = {"integrity_mismatched_bytes": 0, "hit_decisions_identical": False}
    same = {"lockstep_hit_decisions_identical": True, "lockstep_jobs_identical": True}
    sections = ("validation",)
    assert check_goals.exit_status({"validation": {**ok, **same}}, sections) == 0
    assert check_goals.exit_status({"validation": ok}, sections) == 0  # no lockstep run
    for key in same:
        bad = {**ok, **same, key: False}
        assert check_goals.exit_status({"validation": bad}, sections) == 1
    bytes_bad = {**ok, **same, "lockstep_mismatched_bytes": 8}
    assert check_goals.exit_status({"validation": bytes_bad}, sections) == 1
