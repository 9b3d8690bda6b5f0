"""``kvsim accuracy`` (kvsim against published GPU measurements) and ``kvsim fit-compute``
(the step-time model fitted to them)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from kvsim.accuracy.crossval import FOLD_BY
from kvsim.accuracy.search import SEARCHES
from kvsim.cli.common import FiniteFloatRange, check_output_folder, check_output_path
from kvsim.core.errors import InputError
from kvsim.core.io import json_text, output_folder

if TYPE_CHECKING:
    from kvsim.engine.phase_compute import PhaseProfile


#: what ``kvsim accuracy --out DIR`` writes there
_ACCURACY_FILES = frozenset({"accuracy.csv", "metadata.json"})


def _receives_folds(name: str) -> bool:
    """The files ``cross-validate --out`` writes: the report's and each fold's profile."""
    return name in _ACCURACY_FILES or (name.startswith("fold-") and name.endswith(".json"))


def _workers(command: Callable[..., None]) -> Callable[..., None]:
    """``--workers``: the processes experiments run on (the results are the same with any
    number; each experiment is a function of its inputs and seed)."""
    return click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        help="Experiments run in parallel (default: CPUs; 1: in this process).",
    )(command)


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:.2f}"


@click.command("accuracy")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    help="Write accuracy.csv and metadata.json here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows and summary as JSON.")
@click.option(
    "--compute-profile",
    type=click.Path(dir_okay=False),
    help="Step-time profile JSON (default: the GPU's shipped one).",
)
@click.option(
    "--max-stage-s",
    type=FiniteFloatRange(min=1),
    help="Cut every load stage to this many seconds (a quick run; rates stay).",
)
@click.option(
    "--warmup-s",
    type=FiniteFloatRange(min=0),
    default=None,
    help="With --max-stage-s: a stage longer than this plus the cap first runs this many "
    "seconds at its rate, unmeasured (its first seconds are a transient that a long "
    "measured stage dilutes)  [default: 30]",
)
@click.option("--experiment", "experiments", multiple=True, help="Run only this id (repeatable).")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Workload and load seed.",
)
@click.option(
    "--async-scheduling/--no-async-scheduling",
    default=True,
    show_default=True,
    help="vLLM 0.33's engine loop; --no-async-scheduling: the synchronous one of older vLLM.",
)
@click.option("--progress/--no-progress", default=None, help="A bar counting experiments.")
@_workers
def accuracy_command(
    file: str,
    out: str | None,
    as_json: bool,
    compute_profile: str | None,
    max_stage_s: float | None,
    warmup_s: float | None,
    experiments: tuple[str, ...],
    seed: int,
    async_scheduling: bool,
    progress: bool | None,
    workers: int | None,
) -> None:
    """Re-create and simulate each experiment of a measurements FILE; print predicted
    against measured per stage with the absolute percentage error, then the median and
    mean error per metric over the whole runs.

    \b
    Example:
      kvsim accuracy ../shared/measurements/h100_inference_perf_train.yaml --out acc/
    """
    from kvsim.accuracy import accuracy
    from kvsim.accuracy.fit import WARMUP_S
    from kvsim.accuracy.measurements import read_measurements
    from kvsim.report.progress import Progress

    if warmup_s is not None and max_stage_s is None:
        raise InputError("--warmup-s leads each stage that --max-stage-s cuts; give --max-stage-s")
    total = len(read_measurements(file).experiments) if not experiments else len(set(experiments))
    show = (sys.stderr.isatty() if progress is None else progress) and not as_json
    check_output_folder(out, "--out", _ACCURACY_FILES.__contains__, [file, compute_profile])
    with output_folder(out), Progress(show, total, "experiments", unit="exp") as bar:
        # the folder is made first: one that cannot be is said before the runs, not after
        report = accuracy(
            file,
            compute_profile=compute_profile,
            max_stage_s=max_stage_s,
            warmup_s=WARMUP_S if warmup_s is None else warmup_s,
            experiments=experiments or None,
            seed=seed,
            async_scheduling=async_scheduling,
            progress=bar.callback,
            workers=workers,
        )
        if out is not None:
            report.write(out, command="kvsim accuracy " + " ".join(sys.argv[2:]))
    for failed in report.failures:
        click.echo(f"kvsim: experiment {failed.experiment}: {failed.error}", err=True)
    if as_json:
        click.echo(json_text(report.as_json()))
    else:
        _print(report)
    if report.failures:
        raise click.exceptions.Exit(1)


def _print(report: object) -> None:
    from kvsim.accuracy.report import AccuracyReport

    assert isinstance(report, AccuracyReport)
    # as wide as the longest id: two ids alike in their first 44 characters stay apart
    wide = max([44, *(len(r.experiment) for r in report.results)])
    click.echo(
        f"{'experiment':<{wide}} {'stage':>5} {'metric':<20} "
        f"{'predicted':>10} {'measured':>10} {'APE %':>7}"
    )
    for row in report.rows:
        click.echo(
            f"{row.experiment:<{wide}} {row.stage:>5} {row.metric:<20} "
            f"{_fmt(row.predicted):>10} {_fmt(row.measured):>10} {_fmt(row.ape_pct):>7}"
        )
    summary = report.summary()
    ok = len(report.results) - len(report.failures)
    click.echo(f"\nAPE over {ok} experiment(s), whole runs (stage all, or a one-stage load's 0):")
    click.echo(f"{'metric':<20} {'median %':>9} {'mean %':>8}")
    for metric, s in summary.items():
        click.echo(f"{metric:<20} {_fmt(s['median']):>9} {_fmt(s['mean']):>8}")


def _start_profile(path: str) -> PhaseProfile:
    """The ``--start`` of fit-compute and cross-validate: a phases profile file (bad JSON or
    another kind is one line naming the file)."""
    from kvsim.core.io import read_json
    from kvsim.engine.phase_compute import PhaseProfile

    return PhaseProfile.from_dict(read_json(path), source=path)


#: the fit's budget options, innermost first (``--help`` lists them last to first)
_FIT_BUDGET: tuple[tuple[str, click.ParamType, float, str], ...] = (
    (
        "--max-evals",
        click.IntRange(min=1),
        150,
        "Simulations of the training experiments at most (cross-validate: per fold).",
    ),
    (
        "--warmup-s",
        FiniteFloatRange(min=0),
        30.0,
        "Seconds each cut stage first runs at its rate, unmeasured (0: none).",
    ),
    (
        "--max-stage-s",
        FiniteFloatRange(min=1),
        20.0,
        "Each fit evaluation's stage length cap, seconds.",
    ),
)


def _fit_budget(command: Callable[..., None]) -> Callable[..., None]:
    """The fit's budget and search, as fit-compute and cross-validate both take them: the
    stage cap of each evaluation and its unmeasured lead-in (the predictions of
    cross-validate run whole), the evaluations, and the search that spends them."""
    for name, kind, default, text in _FIT_BUDGET:
        command = click.option(name, type=kind, default=default, show_default=True, help=text)(
            command
        )
    return click.option(
        "--search",
        "search",
        type=click.Choice(SEARCHES),
        default="coordinate",
        show_default=True,
        help="coordinate: one parameter at a time (the shipped profile's fit); lm: "
        "Levenberg-Marquardt moves them together first (docs/accuracy.md).",
    )(command)


@click.command("fit-compute")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--gpu", required=True, help="The GPU preset the experiments ran on (h100).")
@click.option(
    "--out", "out", required=True, type=click.Path(dir_okay=False), help="Profile JSON to write."
)
@_fit_budget
@click.option(
    "--hold-out",
    "hold_out",
    multiple=True,
    metavar="ID",
    help="Leave this experiment out of the fit (repeatable): a cross-validation's test set.",
)
@click.option(
    "--start",
    type=click.Path(dir_okay=False),
    help="Phases profile JSON the search starts from (default: the GPU's shipped one, "
    "itself fitted on the shared training file).",
)
@_workers
def fit_compute_command(
    file: str,
    gpu: str,
    out: str,
    max_stage_s: float,
    warmup_s: float,
    max_evals: int,
    search: str,
    hold_out: tuple[str, ...],
    start: str | None,
    workers: int | None,
) -> None:
    """Fit the step-time model's few global parameters to the experiments of FILE with
    the simulation in the loop; print the training error and write a profile that
    --compute-profile loads (its provenance inside).

    \b
    Example:
      kvsim fit-compute ../shared/measurements/h100_inference_perf_train.yaml --gpu h100 \\
          --out h100-fitted.json

    \b
    A cross-validation fold (fit without one model, from the unfitted prior):
      kvsim fit-compute train.yaml --gpu h100 --start examples/h100-prior-profile.json \\
          --hold-out EXPERIMENT_ID --out fold.json
      kvsim accuracy train.yaml --experiment EXPERIMENT_ID --compute-profile fold.json
    """
    from kvsim.accuracy.fit import fit_compute
    from kvsim.core.io import atomic_write

    gpu = gpu.strip().lower()
    if not out.endswith(".json"):
        raise InputError(f"--out {out!r}: a profile is a .json file")
    check_output_path(out, "--out", file, start)  # before the fit's minutes, not after
    result = fit_compute(
        file,
        gpu,
        max_stage_s=max_stage_s,
        warmup_s=warmup_s,
        max_evals=max_evals,
        start=None if start is None else _start_profile(start),
        hold_out=hold_out,
        search=search,
        log=lambda line: click.echo(line, err=True),
        workers=workers,
    )
    with atomic_write(out) as f:
        f.write(result.profile.to_json())
    click.echo(f"{result.evaluations} evaluations, loss {result.loss:.4f}")
    click.echo(
        "training error (median / mean APE %, whole runs, stages cut to "
        f"{max_stage_s:g} s after {warmup_s:g} s unmeasured):"
    )
    for metric, s in result.summary.items():
        click.echo(f"  {metric:<20} {_fmt(s['median']):>7} {_fmt(s['mean']):>7}")
    click.echo(f"wrote {out}")


@click.command("cross-validate")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--gpu", required=True, help="The GPU preset the experiments ran on (h100).")
@click.option(
    "--start",
    required=True,
    type=click.Path(dir_okay=False),
    help="Phases profile JSON each fold's search starts from: a prior no measurement "
    "shaped (examples/h100-prior-profile.json), not the shipped fitted one.",
)
@click.option(
    "--out", "out", type=click.Path(file_okay=False), help="Write the folds' results here."
)
@_fit_budget
@click.option(
    "--fold-by",
    type=click.Choice(FOLD_BY),
    default="model",
    show_default=True,
    help="What a fold leaves out: every experiment of one model, or one experiment (a "
    "workload the fit has not seen, on models it has).",
)
@click.option("--progress/--no-progress", default=None, help="A bar counting folds.")
@_workers
def cross_validate_command(
    file: str,
    gpu: str,
    start: str,
    out: str | None,
    max_stage_s: float,
    warmup_s: float,
    max_evals: int,
    search: str,
    fold_by: str,
    progress: bool | None,
    workers: int | None,
) -> None:
    """Leave one model out: for each model of FILE, fit the step-time model on the other
    models' experiments (from --start) and predict this model's at full length; print
    predicted against measured, then the median and mean held-out error. With --fold-by
    experiment, each experiment is a fold of its own.

    \b
    Example:
      kvsim cross-validate ../shared/measurements/h100_inference_perf_train.yaml --gpu h100 \\
          --start examples/h100-prior-profile.json --out cv/

    --out writes accuracy.csv and metadata.json (as kvsim accuracy does) and each fold's
    profile, fold-N.json, N counting the file's models (or experiments) in order.
    """
    from kvsim.accuracy.crossval import cross_validate, folds
    from kvsim.core.io import atomic_write
    from kvsim.report.progress import Progress

    gpu = gpu.strip().lower()
    prior = _start_profile(start)
    show = sys.stderr.isatty() if progress is None else progress
    check_output_folder(out, "--out", _receives_folds, [file, start])
    with (
        output_folder(out),  # made before the folds: one that cannot be is said first
        Progress(show, len(folds(file, fold_by)), "folds", unit="fold") as bar,
    ):
        report, profiles = cross_validate(
            file,
            gpu,
            prior,
            max_stage_s=max_stage_s,
            warmup_s=warmup_s,
            max_evals=max_evals,
            search=search,
            by=fold_by,
            progress=bar.callback,
            workers=workers,
        )
        if out is not None:
            import os

            report.write(out, command="kvsim cross-validate " + " ".join(sys.argv[2:]))
            for i, profile in enumerate(profiles.values()):
                with atomic_write(os.path.join(out, f"fold-{i}.json")) as f:
                    f.write(profile.to_json())
    for failed in report.failures:
        click.echo(f"kvsim: experiment {failed.experiment}: {failed.error}", err=True)
    _print(report)
    if report.failures:
        raise click.exceptions.Exit(1)


COMMANDS = [accuracy_command, fit_compute_command, cross_validate_command]
