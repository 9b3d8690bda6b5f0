"""Simulation vs hardware: the comparison tables of a validation run, as plain values.

Inputs are per-request rows (``request``, ``gpu_hit``, ``cpu_hit``, ``ttft``) of the two
runs, the real backend's :class:`~real.transfer.JobRecord` list, the transfer jobs the
simulated run completed (``(direction, keys, duration)``) and the link model. Nothing here
runs anything; every number is computed from what the runs recorded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from kvsim.engine.transfer_protocol import STORE

if TYPE_CHECKING:
    from kvsim.engine.transfer_model import TransferModelParams
    from real.transfer import JobRecord

Row = Mapping[str, Any]  # one request of a run: request, gpu_hit, cpu_hit, ttft
SimJob = tuple[str, object, int, float]  # (direction, request, chunks, duration)
RealJob = tuple["JobRecord", object, int]  # (record, request, chunks)


def abs_pct_errors(
    predicted: Sequence[float], measured: Sequence[float]
) -> npt.NDArray[np.float64]:
    """``|predicted - measured| / measured`` for pairs with a positive measurement."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    ok = m > 0
    return np.abs(p[ok] - m[ok]) / m[ok]


def error_stats(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, Any]:
    err = abs_pct_errors(predicted, measured)
    if err.size == 0:
        return {"n": 0, "median_abs_pct_err": None, "p90_abs_pct_err": None}
    return {
        "n": int(err.size),
        "median_abs_pct_err": float(np.median(err) * 100),
        "p90_abs_pct_err": float(np.percentile(err, 90) * 100),
        "predicted_mean_s": float(np.mean(predicted)),
        "measured_mean_s": float(np.mean(measured)),
    }


def hit_decisions(sim_rows: Sequence[Row], real_rows: Sequence[Row]) -> dict[str, Any]:
    """Identical per-request (gpu_hit, cpu_hit)? And where they first differ."""
    sim = {r["request"]: (r["gpu_hit"], r["cpu_hit"]) for r in sim_rows}
    real = {r["request"]: (r["gpu_hit"], r["cpu_hit"]) for r in real_rows}
    order = [r["request"] for r in sim_rows]
    first = None
    same = 0
    for rid in order:
        if sim.get(rid) == real.get(rid):
            same += 1
        elif first is None:
            first = {"request": rid, "simulated": sim.get(rid), "real": real.get(rid)}
    missing = sorted(set(real) ^ set(sim), key=str)
    return {
        "requests": len(order),
        "identical": same,
        "all_identical": same == len(order) and not missing,
        "first_difference": first,
        "requests_in_one_run_only": len(missing),
    }


def first_batching_difference(sim: pd.DataFrame, real: pd.DataFrame) -> object | None:
    """The first request (in the simulated run's order) first scheduled in a step with
    other requests in one run than in the other, or None when every request shared its
    first step with the same requests in both runs. A request's step-mates are the
    requests with the same ``first_scheduled_s`` (a step's start time). Decisions that
    differ from this request on follow from the wall clock's batching, not from a policy;
    decisions that differ before it do not."""
    mates = [_step_mates(df) for df in (sim, real)]
    for rid in sim["request"]:
        if mates[0].get(rid) != mates[1].get(rid):
            return rid
    return None


def _step_mates(df: pd.DataFrame) -> dict[object, frozenset[object]]:
    groups: dict[float, set[object]] = defaultdict(set)
    for rid, t in zip(df["request"], df["first_scheduled_s"]):
        groups[float(t)].add(rid)
    return {
        rid: frozenset(groups[float(t)])
        for rid, t in zip(df["request"], df["first_scheduled_s"])
        if t == t  # a request never scheduled (NaN) has no step-mates
    }


def transfer_durations(
    records: Sequence[JobRecord],
    link: TransferModelParams,
    sim_jobs: Sequence[SimJob] = (),
    real_jobs: Sequence[RealJob] = (),
) -> dict[str, Any]:
    """Measured job durations vs (a) the link model for that exact job (its bytes and
    copy calls), alone on the link, and (b) the duration the simulated run gave the
    matching job: same kind (store/load), same request, same chunk count, in order.

    ``sim_jobs``: ``(direction, request, chunks, duration)``; ``real_jobs``:
    ``(JobRecord, request, chunks)``.
    """
    ok = [r for r in records if r.success]
    out: dict[str, Any] = {}
    for label, want in (("store", (STORE,)), ("load", ("load", "expedited")), ("all", None)):
        recs = [r for r in ok if want is None or r.direction in want]
        pred = [
            (link.d2h if r.direction == STORE else link.h2d).job_time(r.nbytes, r.copies)
            for r in recs
        ]
        out[label] = error_stats(pred, [r.duration for r in recs])
    matched = match_simulated(sim_jobs, real_jobs)
    by_id = {r.job_id: r for r in ok}
    pairs = [(sim, by_id[jid].duration) for jid, sim in matched.items() if jid in by_id]
    out["matched_to_simulated_run"] = error_stats([p for p, _ in pairs], [m for _, m in pairs])
    out["simulated_s_by_job"] = matched
    return out


def match_simulated(sim_jobs: Sequence[SimJob], real_jobs: Sequence[RealJob]) -> dict[int, float]:
    """Real job id -> the duration the simulated run gave its matching job: same kind
    (store/load), same request, same chunk count, taken in order; successful jobs only."""
    sim_by: dict[tuple[str, object, int], list[float]] = defaultdict(list)
    for direction, request, chunks, dur in sim_jobs:
        sim_by[(_kind(direction), request, chunks)].append(dur)
    out: dict[int, float] = {}
    for rec, request, chunks in real_jobs:
        lst = sim_by.get((_kind(rec.direction), request, chunks))
        if rec.success and lst:
            out[rec.job_id] = lst.pop(0)
    return out


def _kind(direction: str) -> str:
    return "store" if direction == STORE else "load"


def ttft(sim_rows: Sequence[Row], real_rows: Sequence[Row]) -> dict[str, Any]:
    real = {r["request"]: r["ttft"] for r in real_rows}
    pred, meas = [], []
    for r in sim_rows:
        m = real.get(r["request"])
        if r["ttft"] is not None and m is not None:
            pred.append(r["ttft"])
            meas.append(m)
    stats = error_stats(pred, meas)
    if meas:
        stats["predicted_median_s"] = float(np.median(pred))
        stats["measured_median_s"] = float(np.median(meas))
    return stats


def bandwidth(records: Sequence[JobRecord], link: TransferModelParams) -> dict[str, Any]:
    """Achieved GB/s per direction (bytes over busy time) vs the link's peak."""
    out: dict[str, Any] = {}
    for label, want, dp in (
        ("store_d2h", (STORE,), link.d2h),
        ("load_h2d", ("load", "expedited"), link.h2d),
    ):
        recs = [r for r in records if r.success and r.direction in want]
        busy = _union_length([(r.start_time, r.end_time) for r in recs])
        nbytes = sum(r.nbytes for r in recs)
        peak = dp.peak_gbps
        gbps = nbytes / busy / 1e9 if busy > 0 else None
        out[label] = {
            "bytes": nbytes,
            "busy_s": busy,
            "achieved_gbps": gbps,
            "link_peak_gbps": peak,
            "fraction_of_peak": gbps / peak if gbps is not None else None,
        }
    return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
