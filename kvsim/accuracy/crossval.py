"""Leave one model out (``kvsim cross-validate``): the step-time fit's error on a model it
has not seen, which is what a fitted clock promises and training error cannot show.

Each distinct ``model`` of the file is one fold: :func:`kvsim.accuracy.fit.fit_compute`
fits on the other models' experiments from ``start`` (a profile no measurement shaped:
starting from the shipped profile would leak the held-out runs into the fit), and
:func:`kvsim.accuracy.report.accuracy` predicts the fold's experiments at full length with
that profile. The report holds every experiment once, each predicted by the fold that left
its model out.
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

__all__ = ["cross_validate", "folds_by_model"]


def folds_by_model(file: str) -> dict[str, list[str]]:
    """``{model: [experiment ids]}`` in file order: the folds of a leave-one-model-out
    validation (a model's runs are held out together, so none of them trains its own
    prediction)."""
    folds: dict[str, list[str]] = {}
    for e in read_measurements(file).experiments:
        folds.setdefault(e.model, []).append(e.id)
    return folds


def cross_validate(
    file: str,
    gpu: str,
    start: PhaseProfile,
    *,
    max_stage_s: float = 20.0,
    warmup_s: float = WARMUP_S,
    max_evals: int = 150,
    search: str = "coordinate",
    progress: Callable[[int], None] | None = None,
) -> tuple[AccuracyReport, dict[str, PhaseProfile]]:
    """Fit without each model in turn and predict that model's experiments.

    Args:
        file: a measurements file with at least two models.
        gpu: the GPU preset every experiment ran on.
        start: where each fold's search starts (a prior, not a fitted profile).
        max_stage_s: each fit evaluation's stage length cap (the predictions run whole).
        warmup_s: the unmeasured lead-in of each cut stage in the fit's evaluations.
        max_evals: simulations of the training experiments per fold at most.
        search: the fit's search (:data:`kvsim.accuracy.search.SEARCHES`).
        progress: called with 1 as each fold finishes.

    Returns:
        The report of every experiment, each predicted by the fold that held its model
        out, and each fold's fitted profile by model.
    """
    folds = folds_by_model(file)
    if len(folds) < 2:
        only = ", ".join(folds) or "none"
        raise InputError(f"{file}: one model ({only}); leaving it out leaves nothing to fit on")
    results: list[ExperimentResult] = []
    profiles: dict[str, PhaseProfile] = {}
    for model, ids in folds.items():
        fit = fit_compute(
            file,
            gpu,
            max_stage_s=max_stage_s,
            warmup_s=warmup_s,
            max_evals=max_evals,
            search=search,
            start=start,
            hold_out=ids,
        )
        profiles[model] = fit.profile
        results.extend(accuracy(file, compute_profile=fit.profile, experiments=ids).results)
        if progress:
            progress(1)
    config = {
        "file": file,
        "validation": "leave one model out",
        "gpu": gpu,
        "folds": folds,
        "started_from": {k: v for k, v in start.to_dict().items() if k not in ("sources",)},
        "max_stage_s": max_stage_s,
        "warmup_s": warmup_s,
        "max_evals": max_evals,
        "search": search,
    }
    return AccuracyReport(file, tuple(results), config), profiles
