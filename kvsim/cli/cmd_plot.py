"""``kvsim plot``: figures (PNG + SVG) from sweep or timed-mode result tables."""

from __future__ import annotations

import os

import click
import pandas as pd

from kvsim.errors import InputError
from kvsim.plots import KINDS
from kvsim.results import check_run_folder

#: which file of a results folder each kind reads
FOLDER_FILES = {
    "hit-vs-capacity": "results",
    "ttft-cdf": "requests",
    "usage-timeline": "steps",
    "transfers": "transfers",
}


def read_table(path: str, kind: str) -> pd.DataFrame:
    """A Parquet/CSV file, or the kind's table in a folder (sweep --out or simulate --out)."""
    if os.path.isdir(path):
        check_run_folder(path)
        stem = FOLDER_FILES[kind]
        for ext in ("parquet", "csv"):
            candidate = os.path.join(path, f"{stem}.{ext}")
            if os.path.exists(candidate):
                return read_table(candidate, kind)
        raise InputError(f"no {stem}.parquet or {stem}.csv for --kind {kind}", source=path)
    if not os.path.exists(path):
        raise InputError("results file not found", source=path)
    try:
        if path.endswith(".parquet"):
            return pd.read_parquet(path)
        if path.endswith((".csv", ".csv.gz")):
            return pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read table: {e}", source=path) from None
    raise InputError("expected a .parquet or .csv file, or a results folder", source=path)


@click.command("plot")
@click.argument("results", type=click.Path())
@click.option("--kind", required=True, type=click.Choice(KINDS), help="Which figure.")
@click.option(
    "--out",
    "out",
    type=click.Path(),
    default=None,
    help="Output path without extension (default: RESULTS folder / KIND).",
)
@click.option(
    "--x", default=None, help="hit-vs-capacity: capacity column (default cpu_gib or cpu_chunks)."
)
@click.option(
    "--y", default="combined_hit_ratio", show_default=True, help="hit-vs-capacity: metric column."
)
@click.option(
    "--by", default=None, help="Column(s) that split lines, comma-separated (default: what varies)."
)
@click.option("--title", default=None, help="Figure title.")
def plot_command(
    results: str,
    kind: str,
    out: str | None,
    x: str | None,
    y: str,
    by: str | None,
    title: str | None,
) -> None:
    """Draw a KIND figure from RESULTS (a Parquet/CSV table or a results folder).

    \b
    hit-vs-capacity  sweep results (kvsim sweep --out DIR)
    ttft-cdf         timed requests table (ttft_s)
    usage-timeline   timed steps table (time_s, gpu_*/cpu_* usage)
    transfers        timed transfers table (direction, bytes, start_s, end_s)
    """
    import matplotlib

    matplotlib.use("Agg")  # the CLI only writes files
    from kvsim import plots

    df = read_table(results, kind)
    by_cols = [c.strip() for c in by.split(",") if c.strip()] if by else None
    if kind == "hit-vs-capacity":
        fig = plots.hit_vs_capacity(df, x=x, y=y, by=by_cols, title=title)
    elif kind == "ttft-cdf":
        fig = plots.ttft_cdf(df, by=by_cols[0] if by_cols else None, title=title)
    elif kind == "usage-timeline":
        fig = plots.usage_timeline(df, title=title)
    else:
        fig = plots.transfers(df, title=title)
    if out is None:
        folder = results if os.path.isdir(results) else os.path.dirname(results)
        out = os.path.join(folder, kind)
    for path in plots.save(fig, out):
        click.echo(path)


COMMANDS = [plot_command]
