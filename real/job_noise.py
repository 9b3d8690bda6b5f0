"""How much a measured job time varies on its own: the noise floor of a validation's errors.

A job-time error (model vs measurement) cannot be smaller than the spread of the measurement
itself. On a GPU that spread is a few percent; on the CPU stand-ins copies are memcpy on a
machine shared with other processes, and one job can take twice as long as the same job a
moment later. So after the real run a sample of its own jobs is replayed, each alone and
``repeats`` times, on the same memory, and the noise is reported beside the error: the
median over the jobs of the median ``|t - median(t)| / median(t)`` of one job's repeats,
the same statistic as the error, taken against the job's own typical time instead of the
model's. An error near the noise says the model is as good as the measurement can show.

The same replays split the rest of the error in two: how much longer the jobs took inside
the run than alone (the run's own interference), and the model's error against the jobs
alone (what calibration alone should get right).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from kvsim.engine.transfer_protocol import STORE, TransferJob
from real.device import Device
from real.host_pool import HostPool
from real.kv_cache import GpuKVCache
from real.transfer import JobRecord, RealTransferBackend

DEFAULT_JOBS = 24
DEFAULT_REPEATS = 5


def sample_jobs(
    records: Sequence[JobRecord], jobs: dict[int, TransferJob], count: int
) -> list[TransferJob]:
    """Up to ``count`` successful jobs, half stores and half loads where the run had both,
    spread evenly over each direction's sizes (smallest to largest)."""
    out: list[TransferJob] = []
    groups = [
        [r for r in records if r.success and (r.direction == STORE) == store]
        for store in (True, False)
    ]
    share = [count // 2 + count % 2, count // 2] if all(groups) else [count, count]
    for group, n in zip(groups, share):
        ranked = sorted(group, key=lambda r: (r.nbytes, r.job_id))
        if not ranked or n <= 0:
            continue
        picks = sorted({round(i * (len(ranked) - 1) / max(n - 1, 1)) for i in range(n)})
        out.extend(jobs[ranked[i].job_id] for i in picks if ranked[i].job_id in jobs)
    return out


def replay_alone(
    device: Device,
    gpu: GpuKVCache,
    host: HostPool,
    jobs: Sequence[TransferJob],
    repeats: int = DEFAULT_REPEATS,
) -> list[list[float]]:
    """Each job ``repeats`` times, alone (drained after each), on the same memory and copy
    path, no fills or checks (the memory holds whatever the run left); the repeats go round
    the jobs in turn, so the same bytes are never copied twice in a row (on the CPU
    stand-ins a second copy would find them in cache). Seconds per run, per job."""
    backend = RealTransferBackend(device, gpu, host, fill_on_store=False, verify_loads=False)
    next_id = max((j.job_id for j in jobs), default=0) + 1
    times: list[list[float]] = [[] for _ in jobs]
    for _ in range(repeats):
        for i, job in enumerate(jobs):
            backend.submit(dataclasses.replace(job, job_id=next_id, keys=()), device.clock())
            next_id += 1
            backend.drain()
            rec = backend.records[-1]
            if rec.success:
                times[i].append(rec.duration)
    device.run_pending()
    return times


def noise_stats(
    times: Sequence[Sequence[float]],
    in_run: Sequence[float] | None = None,
    modelled: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The spread of repeated measurements of the same jobs (see the module docstring).

    With ``in_run`` (each job's time in the run) and ``modelled`` (the link model's time
    for it), also: how much longer the jobs took in the run than alone (the run's own
    interference: the other direction, the engine's host thread, on CPU the neighbours),
    and the model's error against the jobs alone, where nothing else competes."""
    per_job, slower, alone_err = [], [], []
    for i, ts in enumerate(times):
        positive = [t for t in ts if t > 0]
        if len(positive) < 2:
            continue
        med = statistics.median(positive)
        per_job.append(statistics.median(abs(t - med) / med for t in positive))
        if in_run is not None and in_run[i] > 0:
            slower.append(in_run[i] / med)
        if modelled is not None:
            alone_err.append(abs(modelled[i] - med) / med)
    if not per_job:
        return {"jobs": 0, "median_abs_dev_pct": None, "p90_abs_dev_pct": None}
    per_job.sort()
    p90 = per_job[min(len(per_job) - 1, int(0.9 * len(per_job)))]
    out: dict[str, Any] = {
        "jobs": len(per_job),
        "repeats": max(len(ts) for ts in times),
        "median_abs_dev_pct": statistics.median(per_job) * 100,
        "p90_abs_dev_pct": p90 * 100,
    }
    if slower:
        out["in_run_over_alone_median"] = statistics.median(slower)
    if alone_err:
        out["model_err_alone_median_pct"] = statistics.median(alone_err) * 100
    return out
