"""Figures from kvsim's tables: each function takes DataFrames and returns a matplotlib Figure.

Expected columns (extra columns are ignored):

- :func:`hit_vs_capacity`: a sweep results table: a capacity column (``cpu_gib`` or
  ``cpu_chunks``), a metric (``combined_hit_ratio``) and ``status``; one line per
  combination of the other configuration columns that vary (policy, admission, ...).
- :func:`ttft_cdf`: a timed-mode requests table with ``ttft_s``; ``by`` splits it into lines.
- :func:`usage_timeline`: a timed-mode steps table: a time column (``time_s``, ``end_s`` or
  ``start_s``) and usage columns: ``gpu_kv_usage`` / ``cpu_cache_usage_perc`` (fractions 0..1,
  as ``kvsim simulate`` writes them), ``gpu_usage`` / ``cpu_usage``, or ``gpu_*`` / ``cpu_*``
  counts.
- :func:`transfers`: a timed-mode transfers table with ``direction``, ``bytes``, ``start_s``
  and ``end_s``.

:func:`save` writes a figure as PNG and SVG atomically. Nothing here reads files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kvsim.errors import InputError
from kvsim.io import atomic_path, figure_format

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from kvsim.replay.mrc import MRC
    from kvsim.results import Result

KINDS = ("hit-vs-capacity", "ttft-cdf", "usage-timeline", "transfers")
CAPACITY_COLUMNS = ("cpu_gib", "cpu_chunks")
#: configuration columns that never split lines in hit_vs_capacity (bookkeeping or resolved).
_NOT_A_SERIES = {"cell", "cell_id", "status", "error", "elapsed_s", "mode", "limit"}


def _need(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(
            f"{what} needs column(s) {', '.join(missing)}; "
            f"the table has {', '.join(map(str, df.columns))}"
        )


def save_as(fig: Figure, path: str | os.PathLike[str], *, close: bool = True) -> str:
    """Write one figure file (format from the extension) atomically; return its path."""
    path = os.fspath(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=figure_format(path), dpi=120, bbox_inches="tight")
    if close:
        plt.close(fig)
    return path


def save(fig: Figure, base: str | os.PathLike[str]) -> list[str]:
    """Write ``base.png`` and ``base.svg`` (each atomically); return the paths."""
    paths = [save_as(fig, f"{os.fspath(base)}.{ext}", close=False) for ext in ("png", "svg")]
    plt.close(fig)
    return paths


def mrc_curve(mrc: MRC, *, title: str | None = None) -> Figure:
    """Hit ratio against CPU capacity (log x) of a :class:`kvsim.replay.mrc.MRC`, with the
    capacity from which a prefix-protocol curve is exact."""
    t = mrc.table
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(t["capacity"], t["hit_ratio"], drawstyle="steps-post")
    if mrc.protocol == "prefix" and mrc.exact_from > 1:
        ax.axvline(
            mrc.exact_from, color="grey", linestyle=":", label=f"exact from {mrc.exact_from}"
        )
        ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("CPU capacity (chunks)")
    ax.set_ylabel("CPU hit ratio" if mrc.protocol == "prefix" else "hit ratio")
    ax.set_ylim(0, max(0.05, float(t["hit_ratio"].max()) * 1.1))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _config_columns(df: pd.DataFrame) -> list[str]:
    """Configuration columns: those before the first metric (``requests``) in a sweep table."""
    cols = list(df.columns)
    end = cols.index("requests") if "requests" in cols else len(cols)
    return [c for c in cols[:end] if c not in _NOT_A_SERIES]


def hit_vs_capacity(
    results: pd.DataFrame,
    *,
    x: str | None = None,
    y: str = "combined_hit_ratio",
    by: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Hit ratio against CPU capacity, one line per policy/admission/... combination."""
    df = results[results["status"] == "ok"] if "status" in results.columns else results
    if x is None:
        x = next((c for c in CAPACITY_COLUMNS if c in df.columns and df[c].notna().any()), None)
        if x is None:
            raise InputError(
                f"hit-vs-capacity needs a capacity column ({' or '.join(CAPACITY_COLUMNS)})"
            )
    _need(df, [x, y], "hit-vs-capacity")
    df = df.assign(
        **{x: pd.to_numeric(df[x], errors="coerce"), y: pd.to_numeric(df[y], errors="coerce")}
    ).dropna(subset=[x, y])
    if df.empty:
        raise InputError("hit-vs-capacity: no successful cells to plot")
    if by is None:
        by = [
            c
            for c in _config_columns(df)
            if c != x and c not in CAPACITY_COLUMNS and df[c].astype(str).nunique() > 1
        ]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = df.groupby(list(by), dropna=False, sort=True) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        g = g.sort_values(x)
        label = ", ".join(f"{c}={v}" for c, v in zip(by, key)) or y
        ax.plot(g[x], g[y], marker="o", label=label)
    ax.set_xscale("log" if df[x].min() > 0 and df[x].max() / df[x].min() >= 20 else "linear")
    unit = {"cpu_gib": "CPU tier size (GiB)", "cpu_chunks": "CPU tier size (chunks)"}
    ax.set_xlabel(unit.get(x, x))
    ax.set_ylabel(
        y.replace("_", " ") + (" (fraction of prompt blocks)" if y.endswith("ratio") else "")
    )
    if y.endswith("ratio"):
        ax.set_ylim(0, max(1e-3, float(df[y].max()) * 1.1))
    ax.set_title(title or f"{y.replace('_', ' ')} vs CPU capacity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", title=None)
    return fig


def ttft_cdf(requests: pd.DataFrame, *, by: str | None = None, title: str | None = None) -> Figure:
    """Empirical CDF of time to first token, one line per value of ``by``."""
    _need(requests, ["ttft_s"] + ([by] if by else []), "ttft-cdf")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = requests.groupby(by, sort=True) if by else [("all requests", requests)]
    for key, g in groups:
        v = np.sort(g["ttft_s"].dropna().to_numpy(dtype=float)) * 1000.0
        if len(v) == 0:
            continue
        ax.step(
            v,
            np.arange(1, len(v) + 1) / len(v),
            where="post",
            label=f"{by}={key}" if by else str(key),
        )
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(title or "TTFT distribution (CDF)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


#: preferred usage columns, in order: kvsim simulate's steps table, then generic names.
USAGE_COLUMNS = ("gpu_kv_usage", "cpu_cache_usage_perc", "gpu_usage", "cpu_usage")
TIME_COLUMNS = ("time_s", "end_s", "start_s")


def _usage_columns(steps: pd.DataFrame) -> list[str]:
    cols = [c for c in USAGE_COLUMNS if c in steps.columns]
    if cols:
        return cols
    return [
        c
        for c in steps.columns
        if str(c).startswith(("gpu_", "cpu_")) and pd.api.types.is_numeric_dtype(steps[c])
    ]


def usage_timeline(
    steps: pd.DataFrame,
    *,
    columns: Sequence[str] | None = None,
    time: str | None = None,
    title: str | None = None,
) -> Figure:
    """GPU and CPU cache occupancy over (simulated) time; one panel per tier.

    ``time`` defaults to the first of ``time_s``, ``end_s``, ``start_s``; ``columns`` to
    ``gpu_kv_usage`` and ``cpu_cache_usage_perc`` (fractions, as in ``kvsim simulate``),
    else ``gpu_usage`` / ``cpu_usage``, else every numeric ``gpu_*`` / ``cpu_*`` column.
    """
    time = time or next((c for c in TIME_COLUMNS if c in steps.columns), TIME_COLUMNS[0])
    cols = list(columns) if columns else _usage_columns(steps)
    _need(steps, [time], "usage-timeline")
    if not cols:
        raise InputError(
            "usage-timeline needs gpu_kv_usage/cpu_cache_usage_perc, gpu_usage/cpu_usage "
            "or gpu_*/cpu_* columns"
        )
    _need(steps, cols, "usage-timeline")
    tiers = [t for t in ("gpu", "cpu") if any(c.startswith(t) for c in cols)] or ["usage"]
    fig, axes = plt.subplots(
        len(tiers), 1, figsize=(8, 2.6 * len(tiers) + 0.6), sharex=True, squeeze=False
    )
    for ax, tier in zip(axes[:, 0], tiers):
        mine = [c for c in cols if c.startswith(tier)] if tier != "usage" else cols
        for c in mine:
            ax.step(steps[time], steps[c], where="post", label=c)
        fraction = all(
            ("usage" in c or c.endswith("fraction")) and steps[c].max() <= 1.0 for c in mine
        )
        ax.set_ylabel(f"{tier.upper()} {'(fraction used)' if fraction else '(blocks / chunks)'}")
        if fraction:
            ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle(title or "KV cache usage over time")
    return fig


def transfers(table: pd.DataFrame, *, bins: int = 60, title: str | None = None) -> Figure:
    """Transfer bandwidth over time per direction (top) and duration against size (bottom)."""
    _need(table, ["direction", "bytes", "start_s", "end_s"], "transfers")
    if table.empty:
        raise InputError("transfers: the table is empty")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5))
    t0, t1 = float(table["start_s"].min()), float(table["end_s"].max())
    edges = np.linspace(t0, t1 if t1 > t0 else t0 + 1e-3, bins + 1)
    width = edges[1] - edges[0]
    for direction, g in table.groupby("direction", sort=True):
        # spread each transfer's bytes over its interval, then sum per time bin
        s, e, b = (g[c].to_numpy(dtype=float) for c in ("start_s", "end_s", "bytes"))
        per_bin = np.zeros(bins)
        for lo, hi, nbytes in zip(s, e, b):
            span = max(hi - lo, 1e-12)
            overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
            per_bin += (
                nbytes * overlap / span
                if hi > lo
                else nbytes * ((edges[:-1] <= lo) & (lo < edges[1:]))
            )
        top.step(edges[:-1], per_bin / width / 1e9, where="post", label=str(direction))
        bottom.scatter(b / 2**20, (e - s) * 1000.0, s=8, alpha=0.6, label=str(direction))
    top.set_xlabel("time (s)")
    top.set_ylabel("bandwidth (GB/s)")
    top.set_title("transfer bandwidth over time")
    top.grid(True, alpha=0.3)
    top.legend(fontsize="small")
    bottom.set_xlabel("transfer size (MiB)")
    bottom.set_ylabel("duration (ms)")
    bottom.set_title("transfer duration vs size")
    bottom.grid(True, alpha=0.3)
    bottom.legend(fontsize="small")
    fig.suptitle(title or "KV transfers between GPU and CPU")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- trace stats


def trace_figures(stats: Result) -> dict[str, Figure]:
    """Figures of a :func:`kvsim.traces.stats.trace_stats` result, by file stem."""
    req, reuses, pop, arr = stats.requests, stats.reuses, stats.popularity, stats.arrivals
    name = os.path.basename(str(stats.summary.get("trace", "trace")))
    figs: dict[str, Figure] = {}

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, col, label in (
        (axes[0], "input_tokens", "prompt"),
        (axes[1], "output_tokens", "output"),
    ):
        v = req[col].to_numpy()
        ax.hist(v, bins=50, color="tab:blue" if label == "prompt" else "tab:orange")
        ax.set_xlabel(f"{label} length (tokens)")
        ax.set_ylabel("requests")
        ax.set_title(f"{label} tokens (mean {v.mean():,.0f})" if len(v) else label)
    fig.suptitle(f"{name}: request sizes")
    fig.tight_layout()
    figs["token_lengths"] = fig

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, col, label in (
        (axes[0], "distance", "reuse distance (distinct blocks)"),
        (axes[1], "time_s", "reuse time (s)"),
    ):
        v = np.sort(reuses[col].to_numpy(dtype=float))
        if len(v):
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post")
            if v.max() > 0 and v[v > 0].size:
                ax.set_xscale("symlog" if v.min() <= 0 else "log")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of reuses")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{name}: reuse CDFs ({len(reuses):,} reuses)")
    fig.tight_layout()
    figs["reuse_cdfs"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    counts = pop["accesses"].to_numpy()
    if len(counts):
        ax.loglog(np.arange(1, len(counts) + 1), counts, marker=".", linestyle="none")
    ax.set_xlabel("block rank")
    ax.set_ylabel("accesses")
    ax.set_title(f"{name}: block popularity")
    ax.grid(True, alpha=0.3, which="both")
    figs["block_popularity"] = fig

    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = float(stats.summary.get("arrival_bin_s", 1.0))
    ax.step(arr["start_s"], arr["rate_rps"], where="post")
    ax.set_xlabel("time since trace start (s)")
    ax.set_ylabel(f"arrival rate (req/s, {width:g} s bins)")
    ax.set_title(f"{name}: arrivals over time")
    ax.grid(True, alpha=0.3)
    figs["arrival_rate"] = fig
    return figs


def save_all(figs: dict[str, Figure], folder: str | os.PathLike[str]) -> list[str]:
    """Save every figure as ``folder/<stem>.png`` and ``.svg``."""
    os.makedirs(folder, exist_ok=True)
    out: list[str] = []
    for stem, fig in figs.items():
        out += save(fig, os.path.join(folder, stem))
    return out
