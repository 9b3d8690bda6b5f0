"""Every metric per load stage: a benchmark client reports each stage (the requests sent
in it) on its own, and a published measurement is per stage, so a timed run is too.

The table has one row per stage and one, ``all``, for the whole run, each with
``vllm bench serve``'s fields (:func:`kvsim.report.serve_metrics.bench_fields`) over that
stage's requests; its duration runs from the stage's first send to its last finish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvsim.engine.recorder import Recorder
from kvsim.report.serve_metrics import BenchSettings, bench_fields, inter_token_latencies

__all__ = ["STAGE_PERCENTILES", "stage_table"]

#: percentiles every stage row has (a measurement gives p50, p90, p99), besides the run's
STAGE_PERCENTILES = (50.0, 90.0, 99.0)


def _stage_row(
    label: int | str,
    requests: pd.DataFrame,
    rec: Recorder,
    where: np.ndarray,
    bench: BenchSettings,
) -> dict[str, Any]:
    sub = requests[where]
    done = sub[~sub["rejected"]]
    first = float(sub["arrival_s"].min()) if len(sub) else 0.0
    end = float(done["finish_s"].max()) if len(done) else first
    chosen = [r for r, keep in zip(rec.requests, where) if keep]
    gaps = [np.frombuffer(r.token_gaps, dtype=np.float32) for r in chosen if r.token_gaps]
    times = rec.token_times(chosen)
    fields = bench_fields(sub, inter_token_latencies(gaps), times, max(end - first, 1e-12), bench)
    return {
        "stage": label,
        "requests": len(sub),
        "start_s": first,
        "end_s": end,
        **fields,
        "prompt_len_mean": float(done["prompt_tokens"].mean()) if len(done) else float("nan"),
        "output_len_mean": float(done["output_tokens"].mean()) if len(done) else float("nan"),
        "gpu_hit_tokens": int(done["gpu_hit_tokens"].sum()),
        "cpu_hit_tokens": int(done["cpu_hit_tokens"].sum()),
        "computed_prompt_tokens": int(done["computed_prompt_tokens"].sum()),
        "preemptions": int(done["preemptions"].sum()),
    }


def stage_table(
    requests: pd.DataFrame, rec: Recorder, stages: Sequence[int], bench: BenchSettings
) -> pd.DataFrame:
    """One row per stage, then ``all``.

    Args:
        requests: the run's requests table (the recorder's order).
        rec: the run's recorder (the token times).
        stages: each request's stage, in the table's order.
        bench: what to report; the stage rows add p50, p90 and p99 to its percentiles.
    """
    wanted = tuple(sorted({*bench.metric_percentiles, *STAGE_PERCENTILES}))
    bench = dataclasses.replace(bench, metric_percentiles=wanted)
    stage = np.asarray(stages, dtype=np.int64)
    rows = [_stage_row(int(s), requests, rec, stage == s, bench) for s in np.unique(stage)]
    rows.append(_stage_row("all", requests, rec, np.ones(len(stage), dtype=bool), bench))
    return pd.DataFrame(rows)
