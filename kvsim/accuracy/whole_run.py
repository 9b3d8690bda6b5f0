"""The ``all`` row of a cut run (``kvsim accuracy --max-stage-s``): the whole run as the
measurement saw it, each stage's requests weighted by the time they stand for.

A real stage of ten minutes is its first seconds (a cold prefix cache, requests in flight
building up at a new rate) and then its steady state; its ``all`` statistics hold each at
its share of the stage. A cut run has a warm-up of ``w`` seconds and a measured part of
``m`` (:func:`kvsim.accuracy.run.shortened`): unweighted, the warm-up is the larger part
of ``all`` (a closed loop's jump to many more clients put ``all``'s mean TTFT above every
stage's); without it, ``all`` loses the cold requests a real p99 holds (the first pass is
2% of a 600-s stage). So a warm-up request stands for itself (its ``w`` seconds are the
stage's first ``w``), and a measured request for ``(D - w) / m`` of the stage's
(``D``: the stage's real length; a closed loop of N requests cut to n: ``N / n``).
Throughputs are the weighted requests and tokens over the stages' weighted nominal
lengths plus the last stage's drain.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvsim.accuracy.measurements import Experiment

__all__ = ["stage_weights", "weighted_whole_run"]


def stage_weights(exp: Experiment, run: Experiment, measured: list[int | None]) -> list[float]:
    """For each stage of ``run`` (``exp`` cut), how much of ``exp``'s time one of its
    requests stands for: 1 for a warm-up and an uncut stage."""
    weights: list[float] = []
    for j, (cut, index) in enumerate(zip(run.load.stages, measured, strict=True)):
        if index is None:
            weights.append(1.0)
            continue
        real = exp.load.stages[index]
        if real.num_requests is not None and cut.num_requests:
            weights.append(real.num_requests / cut.num_requests)
        elif real.duration is not None and cut.duration:
            warm = run.load.stages[j - 1].duration if j and measured[j - 1] is None else 0.0
            weights.append((real.duration - (warm or 0.0)) / cut.duration)
        else:
            weights.append(1.0)
    return weights


def _percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of ``values`` each counted ``weights`` times (linear between
    the midpoints of their weights' steps)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    mid = (np.cumsum(w) - w / 2.0) / w.sum()
    return float(np.interp(q / 100.0, mid, v))


def weighted_whole_run(
    stages: pd.DataFrame, requests: pd.DataFrame, run: Experiment, weights: list[float]
) -> pd.DataFrame:
    """``stages`` with its ``all`` row over every stage's requests, weighted (``weights``,
    by :func:`stage_weights`); as it is when every weight is 1 (an uncut run)."""
    if all(w == 1.0 for w in weights):
        return stages
    done = requests[~requests["rejected"]]
    per_request = np.asarray([weights[int(s)] for s in done["stage"]], dtype=np.float64)
    rows = {str(r["stage"]): r for r in stages.to_dict("records")}
    span = drain = 0.0
    for j, stage in enumerate(run.load.stages):
        row = rows.get(str(j))  # None: the stage sent no request (a low rate cut short)
        if stage.duration is not None:  # its time stands even without a request; its
            # drain overlaps the next stage but the last's
            nominal = stage.duration
            drain = 0.0 if row is None else max(0.0, float(row["duration"]) - nominal)
        elif row is not None:
            nominal, drain = float(row["duration"]), 0.0
        else:
            continue
        span += weights[j] * nominal
    span += drain

    def weighted(column: str) -> float:
        return sum(
            weights[int(r["stage"])] * float(r[column]) for key, r in rows.items() if key != "all"
        )

    row_all: dict[str, Any] = {
        "stage": "all",
        "completed": float(per_request.sum()),
        "duration": span,
        "total_input_tokens": weighted("total_input_tokens"),
        "total_output_tokens": weighted("total_output_tokens"),
    }
    for name, column in (("ttft", "ttft_s"), ("e2el", "e2e_s")):
        ms = done[column].to_numpy(dtype=np.float64) * 1000.0
        ok = len(ms) > 0
        row_all[f"mean_{name}_ms"] = float(np.average(ms, weights=per_request)) if ok else 0.0
        for q in (50, 90, 99):
            row_all[f"p{q}_{name}_ms"] = _percentile(ms, per_request, q) if ok else 0.0
    return pd.concat([stages[stages["stage"].astype(str) != "all"], pd.DataFrame([row_all])])
