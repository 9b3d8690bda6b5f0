"""A measurements file's experiments run and compared: the rows, the error summary (median
and mean APE per metric over the experiments' whole runs), ``accuracy.csv`` and
``metadata.json``."""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from kvsim.accuracy.measurements import read_measurements
from kvsim.accuracy.parallel import run_experiments
from kvsim.accuracy.run import METRICS, ExperimentResult, Row
from kvsim.core.io import atomic_write
from kvsim.core.processes import check_workers
from kvsim.options.offload import option_name
from kvsim.options.schema import Schema, check_fields

if TYPE_CHECKING:
    from kvsim.engine.phase_compute import PhaseProfile

__all__ = ["CSV_COLUMNS", "AccuracyReport", "accuracy"]

CSV_COLUMNS = ("experiment", "stage", "metric", "predicted", "measured", "ape_pct")


class _RunSettings(Schema, frozen=True):
    """:func:`accuracy`'s run settings as ``kvsim accuracy`` takes them (its options'
    ranges): checked once, before any experiment, so that a bad one is one line and not a
    failure of every experiment (a cap of 0 s: 'sends no request') or no effect (NaN)."""

    max_stage_s: Annotated[float, Meta(ge=1)] | None = None
    warmup_s: Annotated[float, Meta(ge=0)] = 0.0
    seed: Annotated[int, Meta(ge=0)] = 0

    def __post_init__(self) -> None:
        check_fields(self, names=option_name)  # a numpy number counts as the one it holds


@dataclass(frozen=True)
class AccuracyReport:
    """Every experiment's result and what the run was made of."""

    file: str
    results: tuple[ExperimentResult, ...]
    config: dict[str, Any]

    @property
    def rows(self) -> list[Row]:
        return [row for r in self.results for row in r.rows]

    @property
    def failures(self) -> list[ExperimentResult]:
        return [r for r in self.results if r.error is not None]

    def whole_run_rows(self) -> list[Row]:
        """Each experiment's whole-run rows: its ``all`` rows, or a one-stage load's stage 0
        rows where the file measured only that stage (the same requests: its whole run)."""
        out: list[Row] = []
        for r in self.results:
            stages = {row.stage for row in r.rows}
            measured_all = any(row.stage == "all" and row.measured is not None for row in r.rows)
            whole = "0" if stages == {"0", "all"} and not measured_all else "all"
            out.extend(row for row in r.rows if row.stage == whole)
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        """``{metric: {median, mean, n}}`` of the APE over the experiments' whole runs
        (:meth:`whole_run_rows`)."""
        out: dict[str, dict[str, float]] = {}
        whole = self.whole_run_rows()
        for metric in METRICS:
            apes = [
                a for row in whole if row.metric == metric for a in [row.ape_pct] if a is not None
            ]
            if apes:
                out[metric] = {
                    "median": statistics.median(apes),
                    "mean": statistics.fmean(apes),
                    "n": float(len(apes)),
                }
        return out

    def write(self, folder: str, command: str | None = None) -> None:
        """``accuracy.csv`` (one row per predicted metric) and ``metadata.json``."""
        from kvsim.report.result import write_metadata

        os.makedirs(folder, exist_ok=True)
        with atomic_write(os.path.join(folder, "accuracy.csv"), newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            for row in self.rows:
                ape = row.ape_pct
                w.writerow(
                    (
                        row.experiment,
                        row.stage,
                        row.metric,
                        "" if row.predicted is None else _num(row.predicted),
                        "" if row.measured is None else _num(row.measured),
                        "" if ape is None else _num(ape),
                    )
                )
        config = {
            **self.config,
            "experiments": [
                {
                    "id": r.experiment,
                    "error": r.error,
                    "requests": r.requests,
                    "seconds": round(r.seconds, 3),
                    "warnings": list(r.warnings),
                }
                for r in self.results
            ],
            "summary": self.summary(),
        }
        write_metadata(folder, [], config, command)

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "rows": [
                {
                    "experiment": r.experiment,
                    "stage": r.stage,
                    "metric": r.metric,
                    "predicted": r.predicted,
                    "measured": r.measured,
                    "ape_pct": r.ape_pct,
                }
                for r in self.rows
            ],
            "summary": self.summary(),
            "failures": {r.experiment: r.error for r in self.failures},
            "warnings": {r.experiment: list(r.warnings) for r in self.results if r.warnings},
        }


def _num(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.6g}"


def accuracy(
    file: str,
    *,
    compute_profile: str | os.PathLike[str] | PhaseProfile | None = None,
    max_stage_s: float | None = None,
    experiments: Sequence[str] | None = None,
    seed: int = 0,
    async_scheduling: bool = True,
    progress: Callable[[int], None] | None = None,
    warmup_s: float = 0.0,
    workers: int | None = None,
) -> AccuracyReport:
    """Run every experiment of measurements ``file`` (or those named in ``experiments``)
    and compare with what it measured.

    Args:
        file: a kvsim measurements file (format 1).
        compute_profile: a profile path (text or ``os.PathLike``) or object (default: the
            GPU's shipped one).
        max_stage_s: cut every load stage to this many seconds (a quick run; rates stay).
        experiments: ids to run (default all; an unknown id is an error).
        seed: the workloads' and loads' seed.
        async_scheduling: vLLM 0.33's engine loop (default); False: the synchronous one.
        progress: called with 1 as each experiment finishes.
        warmup_s: with ``max_stage_s``, each cut stage first runs this many seconds at its
            rate unmeasured (:func:`kvsim.accuracy.run.shortened`).
        workers: processes running the experiments (default: one per CPU; 1: this one).
            The report is the same with any number.
    """
    from kvsim.core.errors import InputError, did_you_mean

    n_workers = check_workers(workers)
    _RunSettings(max_stage_s=max_stage_s, warmup_s=warmup_s, seed=seed)
    if isinstance(experiments, str):  # its letters would be the ids
        raise InputError(f"experiments: a list of ids, got {experiments!r}")
    parsed = read_measurements(file)
    chosen = list(parsed.experiments)
    if experiments:
        ids = {e.id for e in chosen}
        for name in experiments:
            if name not in ids:
                raise InputError(f"--experiment {name!r}: not in {file}{did_you_mean(name, ids)}")
        chosen = [e for e in chosen if e.id in set(experiments)]
    base = os.path.dirname(os.path.abspath(file))
    if isinstance(compute_profile, os.PathLike):  # a pathlib.Path: the path as text
        compute_profile = os.fspath(compute_profile)
    if isinstance(compute_profile, str):
        _check_profile(compute_profile, {e.gpu_arg(base) for e in chosen})
    settings = {
        "compute_profile": compute_profile,
        "max_stage_s": max_stage_s,
        "seed": seed,
        "async_scheduling": async_scheduling,
        "warmup_s": warmup_s,
    }
    results = run_experiments(chosen, base, settings, n_workers, progress)
    profile_name = (
        compute_profile
        if isinstance(compute_profile, str) or compute_profile is None
        else f"phases profile for {compute_profile.gpu}"
    )
    config = {
        "file": os.path.abspath(file),
        "compute_profile": profile_name or "the GPU's shipped default",
        "max_stage_s": max_stage_s,
        "warmup_s": warmup_s if max_stage_s is not None else None,
        "seed": seed,
        "async_scheduling": async_scheduling,
    }
    return AccuracyReport(os.fspath(file), tuple(results), config)


def _check_profile(path: str | os.PathLike[str], gpus: set[str]) -> None:
    """Read ``--compute-profile`` once for each GPU the experiments name, before any runs:
    a missing or bad file is bad input (one line, exit 2), not one failure per experiment."""
    from kvsim.engine.compute_model import ComputeParams, load_compute_profile
    from kvsim.specs.hardware import get_gpu

    for gpu in sorted(gpus):
        load_compute_profile(path, ComputeParams.for_gpu(get_gpu(gpu)))
