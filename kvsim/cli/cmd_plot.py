"""``kvsim plot``: figures (PNG, PDF or SVG) from sweep, MRC or timed-mode result tables."""

from __future__ import annotations

import os
from typing import Any

import click
import pandas as pd

from kvsim.cli.common import FiniteFloatRange, check_output_path
from kvsim.core.errors import InputError
from kvsim.core.io import read_json
from kvsim.report.result import check_run_folder

KINDS = (
    "hit-vs-capacity",
    "metric-vs-capacity",
    "tiers-vs-capacity",
    "mrc",
    "ttft-cdf",
    "usage-timeline",
    "transfers",
)
#: figure size presets (kvsim.plots.PRESETS; named here so the CLI loads matplotlib only to draw)
STYLES = ("one-column", "two-column")
#: which file of a results folder each kind reads
FOLDER_FILES = {
    "hit-vs-capacity": "results",
    "metric-vs-capacity": "results",
    "tiers-vs-capacity": "results",
    "mrc": "mrc",
    "ttft-cdf": "requests",
    "usage-timeline": "steps",
    "transfers": "transfers",
}
#: the kinds each kind-specific option acts on (given for another kind, it is an error)
OPTION_KINDS = {
    "x": ("hit-vs-capacity", "metric-vs-capacity", "tiers-vs-capacity", "mrc"),
    "y": ("hit-vs-capacity", "metric-vs-capacity", "tiers-vs-capacity", "mrc"),
    "log_y": ("metric-vs-capacity",),
    "by": ("hit-vs-capacity", "ttft-cdf"),
    "ceiling": ("hit-vs-capacity", "tiers-vs-capacity", "mrc"),
    "baseline": ("hit-vs-capacity", "tiers-vs-capacity", "mrc"),
    "belady": ("hit-vs-capacity", "mrc"),
    "cpu_chunks": ("usage-timeline",),
    "max_points": ("usage-timeline",),
}


def _read_file(path: str) -> pd.DataFrame:
    try:
        if path.endswith(".parquet"):
            return pd.read_parquet(path)
        if path.endswith((".csv", ".csv.gz")):
            return pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read table: {e}", source=path) from None
    raise InputError("expected a .parquet or .csv file, or a results folder", source=path)


def _sibling(folder: str, stem: str) -> str | None:
    """``folder/stem.parquet`` or ``.csv``, whichever exists first."""
    for ext in ("parquet", "csv"):
        candidate = os.path.join(folder, f"{stem}.{ext}")
        if os.path.exists(candidate):
            return candidate
    return None


def read_table(path: str, kind: str) -> pd.DataFrame:
    """A Parquet/CSV file, or the kind's table in a folder (sweep --out or simulate --out)."""
    if os.path.isdir(path):
        check_run_folder(path)
        stem = FOLDER_FILES[kind]
        found = _sibling(path, stem)
        if found is None:
            hint = ""
            if stem == "steps":
                hint = " (kvsim simulate writes it with --out DIR --save-steps)"
            raise InputError(
                f"no {stem}.parquet or {stem}.csv for --kind {kind}{hint}", source=path
            )
        return _read_file(found)
    if not os.path.exists(path):
        raise InputError("results file not found", source=path)
    return _read_file(path)


def folder_kind(folder: str) -> str:
    """The figure a results folder is for (a sweep's or an MRC's; a run folder has several)."""
    if _sibling(folder, "results"):
        return "hit-vs-capacity"
    if _sibling(folder, "mrc"):
        return "mrc"
    raise InputError(
        "a run folder holds several tables; give --kind (ttft-cdf, usage-timeline or transfers)",
        source=folder,
    )


def table_kind(df: pd.DataFrame, source: str) -> str:
    """The figure a table is for, from its columns (else ask for --kind)."""
    cols = {str(c) for c in df.columns}
    if {"capacity", "hit_ratio"} <= cols:
        return "mrc"
    if cols & {"cpu_gib", "cpu_chunks"} and any(c.endswith("hit_ratio") for c in cols):
        return "tiers-vs-capacity" if "tiers" in cols else "hit-vs-capacity"
    if "ttft_s" in cols:
        return "ttft-cdf"
    if {"direction", "bytes", "start_s", "end_s"} <= cols:
        return "transfers"
    if any(c.startswith(("gpu_", "cpu_")) for c in cols) and cols & {"time_s", "end_s", "start_s"}:
        return "usage-timeline"
    raise InputError(
        f"cannot tell which figure this table is for; give --kind ({', '.join(KINDS)})",
        source=source,
    )


def _kind_of(
    results: str, kind: str | None, y: str | None = None
) -> tuple[str, pd.DataFrame | None]:
    """The figure to draw (given, or told by the table or folder) and the table when it had
    to be read to tell. A hit-vs-capacity ``y`` that is no ratio (a latency, a rate) is a
    metric-vs-capacity figure, with that metric's labels, axis and baseline."""
    if kind == "hit-vs-capacity" and y is not None and not y.endswith(("ratio", "share")):
        return "metric-vs-capacity", None
    if kind is not None:
        return kind, None
    if not os.path.isdir(results):
        df = read_table(results, "mrc")
        return table_kind(df, results), df
    kind = folder_kind(results)
    if kind == "hit-vs-capacity":  # a --tier-set sweep has a figure of its own
        df = read_table(results, kind)
        return table_kind(df, results), df
    return kind, None


def _folder_of(path: str) -> str:
    return path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))


def baseline_requests(path: str) -> pd.DataFrame | None:
    """The offload-free twin's requests (``simulate --baseline``) beside RESULTS, if any:
    in the folder, or next to a ``requests`` file."""
    if not os.path.isdir(path) and not os.path.basename(path).startswith("requests."):
        return None
    found = _sibling(_folder_of(path), "baseline_requests")
    return _read_file(found) if found else None


def run_capacity(path: str) -> int | None:
    """The CPU tier's capacity in chunks from the run's ``summary.json`` beside RESULTS."""
    summary = os.path.join(_folder_of(path), "summary.json")
    if os.path.basename(path).startswith("baseline_") or not os.path.exists(summary):
        return None
    data = read_json(summary)
    value = data.get("cpu_chunks") if isinstance(data, dict) else None
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def _check_options(kind: str, given: dict[str, Any]) -> None:
    for name, value in given.items():
        if value is not None and kind not in OPTION_KINDS[name]:
            option = "--" + name.replace("_", "-")
            raise InputError(
                f"{option} applies to {' and '.join(OPTION_KINDS[name])}, not --kind {kind}"
                + (
                    "; ttft-cdf draws the run's baseline_requests itself"
                    if name == "baseline"
                    else ""
                )
            )


@click.command("plot")
@click.argument("results", type=click.Path())
@click.option(
    "--kind", type=click.Choice(KINDS), default=None, help="Which figure (default: from the table)."
)
@click.option(
    "--out",
    "out",
    type=click.Path(),
    default=None,
    help="Output file (.png, .pdf or .svg); without an extension BASE.png and BASE.svg "
    "(default: RESULTS folder / KIND).",
)
@click.option(
    "--style",
    type=click.Choice(STYLES),
    default="two-column",
    show_default=True,
    help="Figure width and fonts for a paper column (one-column ~3.3 in, two-column ~7 in).",
)
@click.option("--title", default=None, help="Figure title ('' for none).")
@click.option("--x", default=None, help="hit-vs-capacity: capacity column; mrc: cpu_gib or chunks.")
@click.option(
    "--y",
    default=None,
    help="hit-vs-capacity, mrc: hit-ratio column; metric-vs-capacity: any metric "
    "(median_ttft_ms, output_throughput, ...; a hit-vs-capacity --y that is not a ratio "
    "draws this kind).",
)
@click.option(
    "--log-y/--linear-y",
    "log_y",
    default=None,
    help="metric-vs-capacity: a logarithmic y axis (default: linear from 0).",
)
@click.option(
    "--by",
    default=None,
    help="hit-vs-capacity, ttft-cdf: column(s) that split lines, comma-separated "
    "(default: the parameters that vary).",
)
@click.option(
    "--ceiling",
    type=FiniteFloatRange(0, 1),
    default=None,
    help="hit-vs-capacity, mrc: draw the infinite-cache hit ratio (kvsim trace stats).",
)
@click.option(
    "--baseline",
    type=FiniteFloatRange(0, 1),
    default=None,
    help="hit-vs-capacity, mrc: draw the hit ratio without offloading.",
)
@click.option(
    "--belady",
    type=click.Path(),
    default=None,
    help="hit-vs-capacity, mrc: a table (or sweep folder) with policy=belady rows to draw.",
)
@click.option(
    "--cpu-chunks",
    type=click.IntRange(min=1),
    default=None,
    help="usage-timeline: CPU tier capacity (default: the run's summary.json).",
)
@click.option(
    "--max-points",
    type=click.IntRange(min=2),
    default=None,
    help="usage-timeline: resample longer series to this many time bins [default: 1000].",
)
def plot_command(
    results: str,
    kind: str | None,
    out: str | None,
    style: str,
    title: str | None,
    x: str | None,
    y: str | None,
    by: str | None,
    ceiling: float | None,
    baseline: float | None,
    belady: str | None,
    cpu_chunks: int | None,
    max_points: int | None,
    log_y: bool | None,
) -> None:
    """Draw a KIND figure from RESULTS (a Parquet/CSV table or a results folder).

    \b
    hit-vs-capacity  sweep results (kvsim sweep --out DIR)
    metric-vs-capacity  a sweep's --y metric (a timed sweep's median_ttft_ms, ...) vs
                     CPU size, coloured by policy, with its baseline_ column if any
    tiers-vs-capacity  a --tier-set sweep: one line per tier set, hit ratio (and
                     median TTFT when timed) vs CPU size; the default for such a sweep
    mrc              kvsim mrc --csv table (capacity, hit_ratio)
    ttft-cdf         timed requests table (ttft_s), with the run's baseline if any;
                     a timed sweep's folder: one line per cell (kvsim sweep --keep-requests)
    usage-timeline   timed steps table (simulate --out DIR --save-steps): CPU
                     occupancy, GPU usage, vLLM's pinned gauge
    transfers        timed transfers table (direction, bytes, start_s, end_s)
    """
    kind, df = _kind_of(results, kind, y)
    by_cols = [c.strip() for c in by.split(",") if c.strip()] if by else None
    _check_options(
        kind,
        {
            "x": x,
            "y": y,
            "by": by_cols,
            "ceiling": ceiling,
            "baseline": baseline,
            "belady": belady,
            "cpu_chunks": cpu_chunks,
            "max_points": max_points,
            "log_y": log_y,
        },
    )
    if out is None:
        out = os.path.join(_folder_of(results), kind)
    else:
        check_output_path(out, "--out", results, belady)
    import matplotlib

    matplotlib.use("Agg")  # the CLI only writes files
    from kvsim import plots

    plots.out_paths(out)  # a bad extension fails before anything is drawn
    if df is None and not (kind == "ttft-cdf" and _is_sweep(results)):
        df = read_table(results, kind)
    belady_df = read_table(belady, "hit-vs-capacity") if belady else None
    common: dict[str, Any] = {"title": title, "preset": style}
    refs: dict[str, Any] = {"ceiling": ceiling, "baseline": baseline, "belady": belady_df}
    if kind == "hit-vs-capacity":
        fig = plots.hit_vs_capacity(df, x=x, y=y, by=by_cols, **refs, **common)
    elif kind == "metric-vs-capacity":
        fig = plots.metric_vs_capacity(df, y or "", x=x, log_y=bool(log_y), **common)
    elif kind == "tiers-vs-capacity":
        fig = plots.tiers_vs_capacity(df, x=x, y=y, ceiling=ceiling, baseline=baseline, **common)
    elif kind == "mrc":
        fig = plots.mrc(df, x=x, y=y or "hit_ratio", **refs, **common)
    elif kind == "ttft-cdf":
        fig = _ttft_cdf(results, df, by_cols, common)
    elif kind == "usage-timeline":
        if max_points is not None:
            common["max_points"] = max_points
        fig = plots.usage_timeline(df, cpu_chunks=cpu_chunks or run_capacity(results), **common)
    else:
        fig = plots.transfers(df, **common)
    for path in plots.save(fig, out):
        click.echo(path)


def _is_sweep(path: str) -> bool:
    """Whether ``path`` is a sweep's output folder (its requests are per cell)."""
    return os.path.isdir(path) and _sibling(path, "results") is not None


def _ttft_cdf(
    path: str, df: pd.DataFrame | None, by: list[str] | None, common: dict[str, Any]
) -> Any:
    """A run's TTFT CDF (with its baseline's), or a sweep folder's, one line per cell from
    the tables ``--keep-requests`` kept."""
    from kvsim import plots

    if not _is_sweep(path):
        if by and len(by) > 1:
            raise InputError("--by: ttft-cdf splits lines by one column")
        assert df is not None
        return plots.ttft_cdf(
            df, baseline=baseline_requests(path), by=by[0] if by else None, **common
        )
    from kvsim.sweeps.cell_tables import check_timed, read_requests, read_results

    if by:
        raise InputError("--by: a sweep's ttft-cdf draws one line per cell, named by what varies")
    results = read_results(path)
    check_timed(results, path)
    return plots.sweep_ttft_cdf(results, read_requests(path, results), **common)


COMMANDS = [plot_command]
