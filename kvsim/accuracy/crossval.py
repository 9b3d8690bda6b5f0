"""Leave one model (or one experiment) out (``kvsim cross-validate``): the step-time fit's
error on a model or a workload it has not seen, which is what a fitted clock promises and
training error cannot show.

Each distinct ``model`` of the file is one fold (``by="experiment"``: each experiment):
:func:`kvsim.accuracy.fit.fit_compute` fits on the other folds' experiments from ``start``
(a profile no measurement shaped: starting from the shipped profile would leak the held-out
runs into the fit), and :func:`kvsim.accuracy.report.accuracy` predicts the fold's
experiments at full length with that profile. The report holds every experiment once, each
predicted by the fold that left it out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvsim.accuracy.fit import WARMUP_S, fit_compute
from kvsim.accuracy.measurements import read_measurements
from kvsim.accuracy.report import AccuracyReport, accuracy
from kvsim.core.errors import InputError

if TYPE_CHECKING:
    from kvsim.accuracy.run import ExperimentResult
    from kvsim.engine.phase_compute import PhaseProfile

__all__ = ["FOLD_BY", "cross_validate", "folds"]

#: what a fold holds out: every experiment of one model, or one experiment (a workload the
#: fit has not seen, on models it has)
FOLD_BY = ("model", "experiment")


def folds(file: str, by: str = "model") -> dict[str, list[str]]:
    """``{model: [experiment ids]}`` in file order: the folds of a leave-one-model-out
    validation (a model's runs are held out together, so none of them trains its own
    prediction); ``by="experiment"``: ``{id: [id]}``, one fold per experiment."""
    if by not in FOLD_BY:
        raise ValueError(f"by must be one of {FOLD_BY}, got {by!r}")
    result: dict[str, list[str]] = {}
    for e in read_measurements(file).experiments:
        result.setdefault(e.model if by == "model" else e.id, []).append(e.id)
    return result


def cross_validate(
    file: str,
    gpu: str,
    start: PhaseProfile,
    *,
    max_stage_s: float = 20.0,
    warmup_s: float = WARMUP_S,
    max_evals: int = 150,
    search: str = "coordinate",
    by: str = "model",
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> tuple[AccuracyReport, dict[str, PhaseProfile]]:
    """Fit without each model (or experiment) in turn and predict what was left out.

    Args:
        file: a measurements file with at least two models.
        gpu: the GPU preset every experiment ran on.
        start: where each fold's search starts (a prior, not a fitted profile).
        max_stage_s: each fit evaluation's stage length cap (the predictions run whole).
        warmup_s: the unmeasured lead-in of each cut stage in the fit's evaluations.
        max_evals: simulations of the training experiments per fold at most.
        search: the fit's search (:data:`kvsim.accuracy.search.SEARCHES`).
        by: what a fold holds out (:data:`FOLD_BY`): a model's experiments, or one
            experiment.
        progress: called with 1 as each fold finishes.
        workers: processes the experiments of each evaluation and prediction run on
            (default: one per CPU; the results are the same with any number).

    Returns:
        The report of every experiment, each predicted by the fold that held it out, and
        each fold's fitted profile by the fold's model (or experiment id).
    """
    held = folds(file, by)
    if len(held) < 2:
        only = ", ".join(held) or "none"
        raise InputError(f"{file}: one {by} ({only}); leaving it out leaves nothing to fit on")
    results: list[ExperimentResult] = []
    profiles: dict[str, PhaseProfile] = {}
    for key, ids in held.items():
        fit = fit_compute(
            file,
            gpu,
            max_stage_s=max_stage_s,
            warmup_s=warmup_s,
            max_evals=max_evals,
            search=search,
            start=start,
            hold_out=ids,
            workers=workers,
        )
        profiles[key] = fit.profile
        report = accuracy(file, compute_profile=fit.profile, experiments=ids, workers=workers)
        results.extend(report.results)
        if progress:
            progress(1)
    config = {
        "file": file,
        "validation": f"leave one {by} out",
        "gpu": gpu,
        "folds": held,
        "started_from": {k: v for k, v in start.to_dict().items() if k not in ("sources",)},
        "max_stage_s": max_stage_s,
        "warmup_s": warmup_s,
        "max_evals": max_evals,
        "search": search,
    }
    return AccuracyReport(file, tuple(results), config), profiles
