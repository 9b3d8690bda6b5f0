"""What a timed run with secondary tiers reports: per tier, per request, per tier job.

* :func:`tier_job_table`: every promotion and cascade (tier, request, chunks, bytes,
  submitted, ended), for the Chrome trace and the promotion-time percentiles;
* :func:`add_request_columns`: per request, the tokens its hit took from a secondary tier
  and which tier (``hit_tier``), the time from its first promotion's submission to its
  last one's end (``promotion_wait_s``), and load versus recompute: ``load_s`` is what
  loading took (the tier's existence check, ``promotion_wait_s`` with its queueing on the
  device, and the request's CPU -> GPU copies; not the scheduling waits around them, which
  a recompute meets too), ``recompute_s`` the time the same tokens take alone on the GPU
  (:func:`kvsim.engine.load_rule.prefill_seconds`), ``load_lost`` whether loading was
  the slower; rows without a tier hit have NaN and False;
* :func:`tier_summary`: per tier (``tier1_fs_...``, vLLM's label ``1:fs``) its device,
  hit tokens and share, promoted chunks, promotion time p50 / p99, cascaded and dropped
  chunks, bytes read and written; then the requests whose loading lost and the load rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvsim.engine.tier_driver import TIER_JOB_COLUMNS, TierDriver
from kvsim.engine.transfer_protocol import STORE

#: the load rule as the summary names it
RULE_NAMES = {None: "off (vLLM)", "pays-off": "pays-off (beyond vLLM)"}


def add_tier_outputs(
    driver: TierDriver, tables: dict[str, pd.DataFrame], summary: dict[str, Any], chunk_tokens: int
) -> None:
    """Add the tiers' columns to ``tables["requests"]``, their ``tier_jobs`` table and their
    part of ``summary``, in place."""
    tables["requests"] = add_request_columns(
        driver, tables["requests"], tables["transfers"], chunk_tokens
    )
    tables["tier_jobs"] = tier_job_table(driver)
    steps = tables.get("steps")
    if steps is not None and len(steps):  # each tier's gauges beside the engine's, per step
        gauges = driver.step_gauges()
        assert gauges.pop("step") == steps["step"].tolist()
        tables["steps"] = steps.assign(**gauges)
    summary.update(
        tier_summary(
            driver, tables["requests"], tables["tier_jobs"], summary.get("total_input_tokens", 0)
        )
    )


def tier_job_table(driver: TierDriver) -> pd.DataFrame:
    return pd.DataFrame.from_records(driver.jobs, columns=list(TIER_JOB_COLUMNS))


def add_request_columns(
    driver: TierDriver, requests: pd.DataFrame, transfers: pd.DataFrame, chunk_tokens: int
) -> pd.DataFrame:
    """``requests`` with the tier columns (a copy); ``transfers``: the run's CPU <-> GPU
    jobs (their loads are the copy part of ``load_s``)."""
    n = len(requests)
    tier_tokens = np.zeros(n, dtype=np.int64)
    hit_tier = np.full(n, "", dtype=object)
    wait = np.full(n, np.nan)
    recompute = np.full(n, np.nan)
    copy = np.full(n, 0.0)
    labels = driver.labels
    loads = transfers[transfers["direction"] != STORE]
    copy_by_request = loads["duration_s"].groupby(loads["request"]).sum()
    costs = driver.costs
    cpu_hit = requests["cpu_hit_tokens"].to_numpy()
    gpu_hit = requests["gpu_hit_tokens"].to_numpy()
    for i, rid in enumerate(requests["request"].to_numpy()):
        record = driver.promotions.get(rid)
        if record is None or not any(record.chunks.values()):
            continue
        promoted = sum(record.chunks.values()) * chunk_tokens
        tokens = min(int(cpu_hit[i]), promoted)
        if tokens <= 0:
            continue
        tier_tokens[i] = tokens
        tier = max(record.chunks, key=lambda t: (record.chunks[t], -t))
        hit_tier[i] = labels[tier]
        wait[i] = record.last_end - record.first_submit
        copy[i] = float(copy_by_request.get(rid, 0.0)) + driver.check_latency_s(tier)
        if costs is not None:
            recompute[i] = costs.recompute_s(int(cpu_hit[i]), int(gpu_hit[i]))
    out = requests.copy()
    out["tier_hit_tokens"] = tier_tokens
    out["hit_tier"] = hit_tier
    out["promotion_wait_s"] = wait
    load = np.where(tier_tokens > 0, wait + copy, np.nan)
    out["load_s"] = load
    out["recompute_s"] = recompute
    with np.errstate(invalid="ignore"):
        out["load_lost"] = (tier_tokens > 0) & (load > recompute)
    return out


def tier_summary(
    driver: TierDriver, requests: pd.DataFrame, jobs: pd.DataFrame, total_prompt_tokens: int
) -> dict[str, Any]:
    """The tiers' part of the timed summary."""
    manager = driver.manager
    assert manager is not None
    out: dict[str, Any] = {}
    done = requests[~requests["rejected"]]
    for index, tier in enumerate(manager.tiers):
        name = f"tier{index + 1}_{tier.tier_type}"
        c = tier.counters
        mine = jobs[(jobs["tier"] == index + 1) & (jobs["kind"] == "promotion")]
        durations = mine["duration_s"].to_numpy()
        hit = int(done.loc[done["hit_tier"] == tier.label, "tier_hit_tokens"].sum())
        skipped = len(driver.rule.skipped[index]) if driver.rule is not None else 0
        out.update(
            {
                f"{name}_device": driver.specs[index].name,
                f"{name}_hit_tokens": hit,
                f"{name}_hit_share": hit / total_prompt_tokens if total_prompt_tokens else 0.0,
                f"{name}_promoted_chunks": c.promoted_chunks,
                f"{name}_promotion_jobs": len(mine),
                f"{name}_promotion_p50_ms": _pct(durations, 50),
                f"{name}_promotion_p99_ms": _pct(durations, 99),
                f"{name}_cascaded_chunks": c.cascaded_chunks,
                f"{name}_dropped_chunks": c.dropped_chunks,
                f"{name}_promotion_failures": c.promotion_failures,
                f"{name}_cascade_failures": c.cascade_failures,
                f"{name}_read_bytes": c.promoted_chunks * driver.chunk_bytes,
                f"{name}_written_bytes": c.cascaded_chunks * driver.chunk_bytes,
                f"{name}_resident_chunks": len(tier.store),
                f"{name}_load_rule_skipped_chunks": skipped,
            }
        )
    tiered = done[done["tier_hit_tokens"] > 0]
    lost = int(tiered["load_lost"].sum())
    out["tier_hit_requests"] = len(tiered)
    out["tier_loads_lost"] = lost
    out["tier_loads_lost_share"] = lost / len(tiered) if len(tiered) else 0.0
    out["promotion_wait_total_s"] = float(tiered["promotion_wait_s"].sum())
    rules = {tier.spec.load_rule for tier in manager.tiers}
    out["tier_load_rule"] = ", ".join(sorted(RULE_NAMES.get(r, str(r)) for r in rules))
    return out


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q) * 1e3) if len(values) else 0.0  # none: 0, as vLLM
