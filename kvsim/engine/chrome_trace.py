"""A Chrome / Perfetto trace of a timed run: engine steps and transfer jobs as "X" events.

Open the file in https://ui.perfetto.dev or chrome://tracing. Times are microseconds.
Tracks: pid 1 "engine" (tid 1 steps, tid 2 flush/sync stalls), pid 2 "PCIe" (one tid per
queue: store, load, expedited), and with secondary tiers pid 2 + i for tier i ("tier 1:fs",
tid 1 promotions, tid 2 cascades; a job spans its submission to its end, queueing on the
device included).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from kvsim.core.io import atomic_write
from kvsim.engine.transfer_protocol import DIRECTIONS

_US = 1e6


def chrome_trace_events(
    steps: pd.DataFrame, transfers: pd.DataFrame, tier_jobs: pd.DataFrame | None = None
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "engine"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "steps"}},
        {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "stalls"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "PCIe"}},
    ]
    for i, d in enumerate(DIRECTIONS):
        events.append(
            {"ph": "M", "pid": 2, "tid": i + 1, "name": "thread_name", "args": {"name": d}}
        )
    for row in steps.itertuples(index=False):
        fwd_start = row.end_s - row.forward_s
        if row.stall_s > 0:
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": 2,
                    "name": "stall",
                    "ts": row.start_s * _US,
                    "dur": row.stall_s * _US,
                    "args": {"step": int(row.step)},
                }
            )
        if row.num_seqs:
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": 1,
                    "name": f"step {int(row.step)}",
                    "ts": fwd_start * _US,
                    "dur": row.forward_s * _US,
                    "args": {
                        "seqs": int(row.num_seqs),
                        "prefill_tokens": int(row.prefill_tokens),
                        "decode_tokens": int(row.decode_tokens),
                    },
                }
            )
    tid = {d: i + 1 for i, d in enumerate(DIRECTIONS)}
    for row in transfers.itertuples(index=False):
        events.append(
            {
                "ph": "X",
                "pid": 2,
                "tid": tid[row.direction],
                "name": f"{row.direction} r{row.request}",
                "ts": row.start_s * _US,
                "dur": row.duration_s * _US,
                "args": {
                    "job": int(row.job),
                    "chunks": int(row.chunks),
                    "bytes": int(row.bytes),
                    "submit_s": row.submit_s,
                },
            }
        )
    if tier_jobs is not None:
        events.extend(_tier_events(tier_jobs))
    return events


def _tier_events(jobs: pd.DataFrame) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for tier, label in sorted(set(zip(jobs["tier"], jobs["label"]))):
        pid = 2 + int(tier)
        events.append(
            {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"tier {label}"}}
        )
        for tid, name in ((1, "promotions"), (2, "cascades")):
            events.append(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
            )
    for row in jobs.itertuples(index=False):
        events.append(
            {
                "ph": "X",
                "pid": 2 + int(row.tier),
                "tid": 1 if row.kind == "promotion" else 2,
                "name": f"{row.kind} r{row.request}",
                "ts": row.submit_s * _US,
                "dur": row.duration_s * _US,
                "args": {
                    "job": int(row.job),
                    "chunks": int(row.chunks),
                    "bytes": int(row.bytes),
                    "success": bool(row.success),
                },
            }
        )
    return events


def write_chrome_trace(
    path: str | os.PathLike[str],
    steps: pd.DataFrame,
    transfers: pd.DataFrame,
    tier_jobs: pd.DataFrame | None = None,
) -> None:
    with atomic_write(path) as f:
        json.dump(
            {
                "traceEvents": chrome_trace_events(steps, transfers, tier_jobs),
                "displayTimeUnit": "ms",
            },
            f,
        )
