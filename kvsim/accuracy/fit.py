"""Fit the per-phase step-time model's few global parameters to a measurements file, with
the simulation in the loop (``kvsim fit-compute``).

What is fitted (``FITTED``): how well the GPU streams weights (``weight_bandwidth_``) and
KV (``decode_attention_efficiency``), the fixed cost of a step (``step_overhead_s``), of
each request in it (``seq_overhead_s``) and of each request in each layer's attention
(``attention_seq_layer_s``), the client's path outside the engine
(``request_overhead_s``), the fixed cost of an all-reduce per GPU beyond the first
(``allreduce_latency_s``) and the fused-MoE kernels' weight streaming
(``moe_efficiency``). One value each for every model, parallelism and load: no per-model
coefficient, so a fit on some models predicts others. The peaks stay the datasheet's, the
all-reduce bandwidth the published microbenchmarks'; the GEMM and prefill-attention
efficiencies stay the shipped assumptions (prefix-cached shared-prefix loads compute almost
no prefill, so these measurements do not pin them).

The loss is the mean over experiments and load stages of ``|log(predicted / measured)|``
of mean TTFT, mean E2E and mean ITL (a relative error, symmetric, that no one metric's
scale dominates). The search (:mod:`kvsim.accuracy.search`, ``search``) is coordinate
descent (the shipped profile's fit) or Levenberg-Marquardt followed by it; it stops after
``max_evals`` simulations of the file or when the steps are small. Each evaluation
simulates the stages cut to ``max_stage_s`` (the loads are steady: the rates stay) to
keep the loop affordable, each after ``warmup_s`` unmeasured seconds at its rate. A
stage whose prediction is not a positive number counts as 1,000 times off.

``hold_out`` leaves experiments out of the fit, and ``start`` sets where the search begins:
together they make a cross-validation fold (fit on some models from a profile no
measurement shaped, predict the others; docs/accuracy.md).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvsim.accuracy.report import accuracy
from kvsim.accuracy.search import search as run_search
from kvsim.core.errors import InputError
from kvsim.core.processes import check_workers
from kvsim.engine.phase_compute import PhaseProfile, shipped_profile

__all__ = ["FITTED", "FitResult", "fit_compute"]

#: parameter -> (lower bound, upper bound, first step, step kind: "mul" or "add")
FITTED: dict[str, tuple[float, float, float, str]] = {
    "weight_bandwidth_efficiency": (0.3, 1.0, 1.1, "mul"),
    "decode_attention_efficiency": (0.2, 1.0, 1.1, "mul"),
    "step_overhead_s": (0.0, 0.02, 0.0005, "add"),
    "seq_overhead_s": (0.0, 0.0005, 0.00001, "add"),
    "request_overhead_s": (0.0, 0.05, 0.004, "add"),
    "allreduce_latency_s": (0.0, 0.0001, 0.000005, "add"),
    "moe_efficiency": (0.2, 1.0, 1.1, "mul"),
    "attention_seq_layer_s": (0.0, 0.000002, 0.0000002, "add"),
}
LOSS_METRICS = ("ttft_mean", "e2e_mean", "itl_mean")
#: seconds each cut stage runs unmeasured before its measured ``max_stage_s``: a stage's
#: first seconds are a transient (the first pass of a shared-prefix workload computes every
#: prompt whole; the requests in flight build up at a new rate) that a ten-minute
#: measured stage dilutes and a 20-s cut would be mostly made of (docs/accuracy.md)
WARMUP_S = 30.0


@dataclass(frozen=True)
class FitResult:
    """The fitted profile, its loss, and the training error of the final evaluation."""

    profile: PhaseProfile
    loss: float
    evaluations: int
    summary: dict[str, dict[str, float]]


#: the error a stage's metric counts with when its prediction is not a positive number (no
#: request finished in a cut stage): as bad as a prediction 1,000 times off, so that a
#: trial cannot lower the loss by losing a stage
_NO_PREDICTION = math.log(1000.0)


def _log_errors(report: Any, file: str) -> np.ndarray:
    """``log(predicted / measured)`` of each load stage's mean TTFT, E2E and ITL, in the
    report's order (the same rows for every profile: the search differences them); an
    experiment of ``file`` that cannot run is an error naming both."""
    if report.failures:
        failed = report.failures[0]
        raise InputError(f"experiment {failed.experiment}: {failed.error}", source=file)
    measured = [r for r in report.rows if r.metric in LOSS_METRICS and r.measured]
    by_stage = {r.experiment for r in measured if r.stage != "all"}
    errors = [  # each experiment's stages; its whole run where it measured only that
        math.log(row.predicted / row.measured)
        if row.predicted is not None and row.predicted > 0 and math.isfinite(row.predicted)
        else _NO_PREDICTION
        for row in measured
        if (row.stage != "all") == (row.experiment in by_stage)
    ]
    if not errors:
        raise InputError(
            "no experiment measures mean TTFT, E2E or ITL: nothing to fit", source=file
        )
    return np.array(errors)


def fit_compute(
    file: str,
    gpu: str,
    *,
    max_stage_s: float = 20.0,
    warmup_s: float = WARMUP_S,
    max_evals: int = 150,
    search: str = "coordinate",
    start: PhaseProfile | None = None,
    hold_out: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
    workers: int | None = None,
) -> FitResult:
    """Fit ``FITTED`` on the experiments of ``file`` run on ``gpu`` (they must all name it).

    Args:
        file: a measurements file (the training set).
        gpu: the GPU preset the profile is for (its datasheet peaks are kept).
        max_stage_s: each evaluation's stage length cap, seconds.
        warmup_s: the unmeasured seconds each cut stage runs first, at its rate (its
            steady state is what a long stage measured).
        max_evals: simulations of the whole file at most.
        search: ``coordinate`` (one parameter at a time; the shipped profile's fit) or
            ``lm`` (Levenberg-Marquardt first; :mod:`kvsim.accuracy.search`).
        start: where the search starts (default: the profile shipped for ``gpu``). A
            cross-validation starts from a profile no measurement shaped (the shipped one
            was fitted on every experiment, the held-out ones too).
        hold_out: experiment ids left out of the fit (a cross-validation's test set);
            an unknown id, or holding out every experiment, is an error.
        log: called with a line per improvement.
        workers: processes each evaluation's experiments run on (default: one per CPU;
            the fit is the same with any number).

    Returns:
        The fitted profile (sources and provenance say what was fitted, on which
        experiments, from which start), its loss and the final evaluation's error.
    """
    from kvsim.accuracy.measurements import read_measurements
    from kvsim.core.errors import did_you_mean

    n_workers = check_workers(workers)
    parsed = read_measurements(file)
    ids = [e.id for e in parsed.experiments]
    for name in hold_out:
        if name not in ids:
            raise InputError(f"--hold-out {name!r}: not in {file}{did_you_mean(name, set(ids))}")
    held = set(hold_out)
    kept = [i for i in ids if i not in held]
    if not kept:
        raise InputError(f"--hold-out leaves no experiment of {file} to fit on")
    base_dir = os.path.dirname(os.path.abspath(file))
    others = sorted(  # a preset named by its product name ("NVIDIA H100 80GB HBM3") is it
        {
            e.gpu
            for e in parsed.experiments
            if e.id not in held and e.gpu_arg(base_dir).strip().lower() != gpu
        }
    )
    if others:
        raise InputError(f"{file}: experiments on {', '.join(others)}, not --gpu {gpu}")
    base = start or shipped_profile(gpu)
    if base is None:
        raise InputError(f"--gpu {gpu}: no shipped profile to start from")
    evals = 0

    def evaluate(p: PhaseProfile) -> tuple[float, np.ndarray, Any]:
        nonlocal evals
        evals += 1
        with warnings.catch_warnings():  # a trial's overload is the loss's to judge
            warnings.simplefilter("ignore")
            report = accuracy(
                file,
                compute_profile=p,
                max_stage_s=max_stage_s,
                warmup_s=warmup_s,
                experiments=kept,
                workers=n_workers,
            )
        errors = _log_errors(report, file)
        return float(np.mean(np.abs(errors))), errors, report

    best, best_loss, best_report = run_search(base, FITTED, evaluate, max_evals, log, search)
    with open(file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    summary = best_report.summary()
    provenance = {
        "fitted_on": os.path.basename(file),
        "sha256": digest,
        "experiments": kept,
        "held_out": list(hold_out),
        "started_from": {k: getattr(base, k) for k in FITTED},
        "fitted": list(FITTED),
        "max_stage_s": max_stage_s,
        "warmup_s": warmup_s,
        "evaluations": evals,
        "search": search,
        "loss_mean_abs_log_error": best_loss,
        "training_error_median_ape_pct": {k: v["median"] for k, v in summary.items()},
        "note": "training error: measured on the experiments the parameters were fitted to",
    }
    label = f"fitted by kvsim fit-compute on {os.path.basename(file)} (sha256 {digest[:12]})"
    sources = {**best.sources, **dict.fromkeys(FITTED, label)}
    fitted = replace(best, sources=sources, provenance=provenance)
    return FitResult(fitted, best_loss, evals, summary)
