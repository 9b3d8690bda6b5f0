"""The validation report: a simulated and a real run of one trace, compared.

Built by :func:`real.validate.run_validation` from what the two runs recorded; nothing here
runs anything. ``summary()`` is what ``kvsim validate`` prints (and the GPU check keeps),
``as_dict()`` the whole report with one row per request and per real job (its measured,
modelled and simulated seconds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from kvsim.engine.transfer_model import TransferModelParams
from kvsim.specs.models import ModelSpec
from real.validation_spec import ValidationSpec

MIN_JOBS = 30  # fewer jobs of a kind than this: its median error says little


@dataclass
class ValidationReport:
    """Simulated vs real run of one trace: compared hits, job times, TTFT, GB/s, integrity."""

    spec: ValidationSpec
    device: str
    pinned: bool
    link: dict[str, Any]
    hits: dict[str, Any]
    transfers: dict[str, Any]
    ttft: dict[str, Any]
    bandwidth: dict[str, Any]
    integrity: dict[str, int]
    runs: dict[str, Any]
    noise: dict[str, Any] = field(default_factory=dict)
    lockstep: dict[str, Any] = field(default_factory=dict)  # real.lockstep's comparison
    tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def as_dict(self, per_item: bool = True) -> dict[str, Any]:
        """The whole report as JSON-ready values; ``per_item`` adds one row per request
        (hits and TTFT of both runs) and per real transfer job (measured vs modelled)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("tables", "spec")}
        d["spec"] = {
            k: (v.name if isinstance(v, ModelSpec) else v)
            for k, v in asdict(self.spec).items()
            if k != "model"
        }
        d["spec"]["model"] = (
            self.spec.model.name if isinstance(self.spec.model, ModelSpec) else self.spec.model
        )
        d["transfers"].pop("simulated_s_by_job", None)  # in the per-job rows instead
        if per_item and self.tables:
            cols = ["request", "gpu_hit_tokens", "cpu_hit_tokens", "ttft_s"]
            sim = self.tables["simulated_requests"][cols]
            real = self.tables["real_requests"][cols]
            both = sim.merge(real, on="request", suffixes=("_sim", "_real"))
            d["requests"] = both.to_dict(orient="records")
            jobs = self.tables["real_jobs"]
            simulated = self.transfers.get("simulated_s_by_job", {})
            d["jobs"] = [
                {
                    "job": int(r.job_id),
                    "direction": r.direction,
                    "bytes": int(r.nbytes),
                    "copies": int(r.copies),
                    "success": bool(r.success),
                    "measured_s": float(r.duration_s),
                    "modelled_s": link_time(self.link, r.direction, int(r.nbytes), int(r.copies)),
                    "simulated_s": simulated.get(int(r.job_id)),
                }
                for r in jobs.itertuples(index=False)
            ]
        return _clean(d)

    def summary(self) -> dict[str, Any]:
        """The compact comparison (what the CLI prints)."""
        t, bw = self.transfers, self.bandwidth
        out = {
            "device": self.device,
            "pinned": self.pinned,
            "link": self.link.get("link"),
            "requests": self.hits["requests"],
            "hit_decisions_identical": self.hits["all_identical"],
            "hit_decisions_same": self.hits["identical"],
            "first_difference": _first_diff(self.hits["first_difference"]),
            "first_batching_difference": self.hits.get("first_batching_difference"),
            "jobs_measured": t["all"]["n"],
            "store_jobs": t["store"]["n"],
            "load_jobs": t["load"]["n"],
            "job_err_median_pct": t["all"]["median_abs_pct_err"],
            "job_noise_median_pct": self.noise.get("median_abs_dev_pct"),
            "noise_jobs": self.noise.get("jobs"),
            "job_err_alone_median_pct": self.noise.get("model_err_alone_median_pct"),
            "jobs_in_run_over_alone": self.noise.get("in_run_over_alone_median"),
            "job_err_p90_pct": t["all"]["p90_abs_pct_err"],
            "store_err_median_pct": t["store"]["median_abs_pct_err"],
            "load_err_median_pct": t["load"]["median_abs_pct_err"],
            "jobs_matched_to_sim": t["matched_to_simulated_run"]["n"],
            "matched_err_median_pct": t["matched_to_simulated_run"]["median_abs_pct_err"],
            "ttft_err_median_pct": self.ttft["median_abs_pct_err"],
            "ttft_err_p90_pct": self.ttft["p90_abs_pct_err"],
            "ttft_predicted_median_s": self.ttft.get("predicted_median_s"),
            "ttft_measured_median_s": self.ttft.get("measured_median_s"),
            "store_gbps": bw["store_d2h"]["achieved_gbps"],
            "store_link_peak_gbps": bw["store_d2h"]["link_peak_gbps"],
            "load_gbps": bw["load_h2d"]["achieved_gbps"],
            "load_link_peak_gbps": bw["load_h2d"]["link_peak_gbps"],
            "failed_jobs": self.runs["real"]["failed_jobs"],
            "integrity_checked_blocks": self.integrity["checked_blocks"],
            "integrity_mismatched_blocks": self.integrity["mismatched_blocks"],
            "integrity_mismatched_bytes": self.integrity["mismatched_bytes"],
            **lockstep_summary(self.lockstep),
            "real_wall_s": self.runs["real"]["wall_s"],
            "caveats": caveats(t, self.noise),
        }
        return _clean(out)


def lockstep_summary(lock: Mapping[str, Any]) -> dict[str, Any]:
    """The lockstep run's verdicts (none when it did not run): decisions and jobs must be
    the simulation's whatever the machine's load, and no loaded byte may differ."""
    if not lock:
        return {}
    return {
        "lockstep_hit_decisions_identical": lock["hit_decisions_identical"],
        "lockstep_first_difference": _first_diff(lock["first_difference"]),
        "lockstep_jobs_identical": lock["jobs_identical"],
        "lockstep_checked_blocks": lock["integrity"]["checked_blocks"],
        "lockstep_mismatched_bytes": lock["integrity"]["mismatched_bytes"],
    }


def link_time(link: dict[str, Any], direction: str, nbytes: int, copies: int) -> float:
    """The link model's time for one job alone (``link``: a profile as a dict)."""
    params = TransferModelParams.from_dict(link)
    return (params.d2h if direction == "store" else params.h2d).job_time(nbytes, copies)


def caveats(transfers: Mapping[str, Any], noise: Mapping[str, Any]) -> list[str]:
    """What the job-time errors cannot show, in words: too few jobs of a kind for a median,
    or an error no larger than the measurement's own noise."""
    out = []
    for kind in ("store", "load"):
        n = transfers[kind]["n"]
        if n < MIN_JOBS:
            out.append(f"only {n} {kind} jobs (< {MIN_JOBS}): their median error says little")
    err, floor = transfers["all"]["median_abs_pct_err"], noise.get("median_abs_dev_pct")
    if err is not None and floor is not None and err <= 2 * floor:
        out.append(
            f"job-time error {err:.1f}% is within twice the noise of one measurement "
            f"({floor:.1f}%): the model cannot be judged finer than that here"
        )
    return out


def _first_diff(d: Mapping[str, Any] | None) -> str | None:
    if d is None:
        return None
    return f"request {d['request']}: sim (gpu, cpu) hit tokens {d['simulated']} vs real {d['real']}"


def _clean(x: Any) -> Any:
    """JSON-ready: str keys, lists for tuples, None for NaN, Python scalars for numpy ones."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return _clean(x.item())
    return x


def request_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A run's request table as the rows :mod:`real.compare` reads."""
    return [
        {
            "request": r.request,
            "gpu_hit": int(r.gpu_hit_tokens),
            "cpu_hit": int(r.cpu_hit_tokens),
            "ttft": None if r.rejected or math.isnan(r.ttft_s) else float(r.ttft_s),
        }
        for r in df.itertuples(index=False)
    ]
