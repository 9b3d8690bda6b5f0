"""Any metric of a sweep against CPU capacity: a timed sweep's TTFT, TPOT or throughput.

Labels and units come from :mod:`kvsim.report.labels` (the CLI's own), colour from the
policy (one colour per policy, whatever else varies; other varying parameters set the line
style), the offload-free baseline (``baseline_<metric>``, which a ``baseline: true`` sweep
writes) is a reference line, and the y axis starts at 0 unless it is logarithmic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from kvsim.core.errors import InputError
from kvsim.plots.capacity import (
    CAPACITY_COLUMNS,
    X_LABELS,
    numeric_rows,
    pick_column,
    series_columns,
)
from kvsim.plots.style import (
    COLOURS,
    LINESTYLES,
    MARKERS,
    REFERENCES,
    finish,
    legend,
    panels,
    styled,
)
from kvsim.report.labels import cell_label, label_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from kvsim.plots.style import Preset

BASELINE_PREFIX = "baseline_"


def metric_vs_capacity(
    results: pd.DataFrame,
    y: str,
    *,
    x: str | None = None,
    log_y: bool = False,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """``y`` (any numeric column: ``median_ttft_ms``, ``output_throughput``, ...) against CPU
    capacity, one line per configuration, coloured by policy.

    Args:
        results: a sweep's results table (rows with ``status`` other than ``ok`` are left out).
        y: the metric; its label and unit are the CLI's (``median TTFT (ms)``).
        x: the capacity column (default ``cpu_gib``, else ``cpu_chunks``).
        log_y: a logarithmic y axis (else linear from 0).

    Returns:
        the figure (the caller's when ``ax`` is given).
    """
    df = results[results["status"] == "ok"] if "status" in results.columns else results
    if not y:
        raise InputError("metric-vs-capacity needs a metric (--y), e.g. median_ttft_ms")
    if y not in df.columns:
        raise InputError(f"metric-vs-capacity: no column {y!r} in the table")
    x = pick_column(df, x, CAPACITY_COLUMNS, "metric-vs-capacity", "capacity")
    df = numeric_rows(df, [x, y])
    if df.empty:
        raise InputError(f"metric-vs-capacity: no successful cells with {x} and {y}")
    by = series_columns(df, x)
    policies = sorted(df["policy"].astype(str).unique()) if "policy" in df.columns else [""]
    others = [c for c in by if c != "policy"]
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        groups = df.groupby(by, sort=True, dropna=False) if by else [((), df)]
        dashes: list[tuple[str, ...]] = []
        for key, g in groups:
            key = key if isinstance(key, tuple) else (key,)
            values = dict(zip(by, key))
            policy = str(values.get("policy", ""))
            rest = tuple(str(values[c]) for c in others)
            if rest not in dashes:
                dashes.append(rest)
            i = policies.index(policy) if policy in policies else 0
            g = g.sort_values(x)
            name = cell_label({c: values[c] for c in by})
            a.plot(
                g[x],
                g[y],
                color=COLOURS[i % len(COLOURS)],
                marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[dashes.index(rest) % len(LINESTYLES)],
                label=name or label_of(y),
                gid=f"series:{name}",
            )
        _baseline(a, df, y)
        a.set_xlabel(X_LABELS.get(x, x.replace("_", " ")))
        a.set_ylabel(label_of(y))
        if log_y:
            a.set_yscale("log")
        else:
            a.set_ylim(bottom=0)
        if title != "":
            a.set_title(title or f"{label_of(y)} vs CPU capacity")
        legend([a], p, own=ax is None)
        return finish([a], p)


def _baseline(ax: Axes, df: pd.DataFrame, y: str) -> None:
    """The run without offloading as a reference: one line when every cell's baseline is the
    same, else its range as a band (the engine configuration varies)."""
    column = BASELINE_PREFIX + y
    if column not in df.columns:
        return
    values = pd.to_numeric(df[column], errors="coerce").dropna()
    if values.empty:
        return
    style = dict(REFERENCES["baseline"])
    text = style.pop("label")
    lo, hi = float(values.min()), float(values.max())
    if lo == hi:
        ax.axhline(lo, linewidth=1.0, label=f"{text} {lo:,.4g}", gid="baseline", **style)
    else:
        ax.axhspan(lo, hi, color="0.85", label=f"{text}: {lo:,.4g} to {hi:,.4g}", gid="baseline")
