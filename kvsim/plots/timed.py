"""Figures of a timed run (``kvsim simulate``): TTFT CDFs, cache usage over time, transfers.

:func:`usage_timeline` draws *occupancy* (resident chunks / capacity) for the CPU tier.
vLLM's ``cpu_cache_usage_perc`` gauge is something else, the fraction pinned by in-flight
transfers (a tier can be full while the gauge reads 0.05), so it gets its own axis and
label. Step series longer than ``max_points`` are resampled into equal time bins (mean
line, min-max band), the same way every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kvsim.core.errors import InputError
from kvsim.plots.capacity import MAX_LINES, need_columns
from kvsim.plots.style import (
    REFERENCES,
    Preset,
    finish,
    legend,
    panels,
    series_style,
    styled,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# --------------------------------------------------------------------------- TTFT

#: the quantiles marked on every CDF line
MARKS = (0.5, 0.99)


def _ecdf(ttft_s: pd.Series) -> np.ndarray:
    v = ttft_s.to_numpy(dtype=float)
    return np.sort(v[np.isfinite(v) & (v > 0)]) * 1000.0


def _cdf_line(ax: Axes, v: np.ndarray, label: str, style: dict[str, object]) -> None:
    frac = np.arange(1, len(v) + 1) / len(v)
    (line,) = ax.plot(v, frac, drawstyle="steps-post", label=label, **style)  # type: ignore[arg-type]
    for q in MARKS:
        at = float(np.quantile(v, q, method="inverted_cdf"))  # where the step reaches q
        ax.plot(
            [at],
            [q],
            marker="|",
            markersize=9,
            markeredgewidth=1.4,
            color=line.get_color(),
            linestyle="none",
            gid=f"p{round(q * 100)}",
            label="_nolegend_",
        )


def ttft_cdf(
    requests: pd.DataFrame,
    *,
    baseline: pd.DataFrame | None = None,
    by: str | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """Empirical CDF of time to first token on a log axis, one line per value of ``by``,
    with p50 and p99 marked on every line; ``baseline`` (the requests table of the run
    without offloading, ``baseline_requests``) is drawn as the reference."""
    need_columns(requests, ["ttft_s"] + ([by] if by else []), "ttft-cdf")
    if baseline is not None:
        need_columns(baseline, ["ttft_s"], "ttft-cdf baseline")
    groups = list(requests.groupby(by, sort=True)) if by else [("offloading", requests)]
    lines = [
        (f"{by}={key}" if by else ("offloading" if baseline is not None else "all"), g)
        for key, g in groups
    ]
    return _cdfs(lines, baseline, (title, "TTFT distribution (CDF)"), ax, preset)


def sweep_ttft_cdf(
    results: pd.DataFrame,
    requests: pd.DataFrame,
    *,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """A sweep's TTFT CDFs, one line per successful cell, each named by the parameters that
    vary across the cells (``LRU, 64 GiB``: :func:`kvsim.report.labels.cell_label`).

    Args:
        results: the sweep's results table (``cell_id`` and the configuration columns).
        requests: the cells' requests tables as one, with ``cell_id``
            (:func:`kvsim.sweeps.cell_tables.read_requests`).
    """
    from kvsim.report.labels import cell_label
    from kvsim.sweeps.cell_tables import CELL_ID, check_timed, varying_columns

    check_timed(results)
    need_columns(requests, ["ttft_s", CELL_ID], "ttft-cdf")
    need_columns(results, [CELL_ID], "ttft-cdf")
    ok = results[results["status"] == "ok"] if "status" in results.columns else results
    if len(ok) > MAX_LINES:
        raise InputError(
            f"ttft-cdf: the sweep has {len(ok)} cells, more lines than can be told apart "
            f"({MAX_LINES}); load the tables with kvsim.sweeps.read_requests and pick cells"
        )
    varying = varying_columns(ok)
    by_cell = dict(list(requests.groupby(CELL_ID, sort=False)))
    lines = [
        (cell_label({c: row[c] for c in varying}) or str(row[CELL_ID]), by_cell[row[CELL_ID]])
        for _, row in ok.iterrows()
        if row[CELL_ID] in by_cell
    ]
    return _cdfs(lines, None, (title, "TTFT distribution (CDF) per sweep cell"), ax, preset)


def _cdfs(
    lines: list[tuple[str, pd.DataFrame]],
    baseline: pd.DataFrame | None,
    title: tuple[str | None, str],
    ax: Axes | None,
    preset: str | Preset | None,
) -> Figure:
    """One CDF line per ``(label, requests)``, and the baseline's as the reference;
    ``title`` is ``(given, default)`` (given ``""``: none)."""
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        drawn = []
        for i, (name, g) in enumerate(lines):
            v = _ecdf(g["ttft_s"])
            if len(v):
                _cdf_line(a, v, name, series_style(i, points=len(v)))
                drawn.append(v)
        if baseline is not None:
            v = _ecdf(baseline["ttft_s"])
            if len(v):
                style: dict[str, object] = {"color": "black", "linestyle": "-."}
                _cdf_line(a, v, REFERENCES["baseline"]["label"], style)
                drawn.append(v)
        if not drawn:
            raise InputError("ttft-cdf: no request has a positive ttft_s")
        for q in MARKS:
            a.axhline(q, color="0.6", linewidth=0.5, linestyle=":", gid=f"p{round(q * 100)}-guide")
            a.annotate(
                f"p{round(q * 100)}",
                (0.0, q),
                xycoords=("axes fraction", "data"),
                xytext=(2, 1),
                textcoords="offset points",
                va="bottom",
                fontsize=p.small_pt,
                color="0.35",
            )
        a.set_xscale("log")
        a.set_xlabel("time to first token (ms)")
        a.set_ylabel("fraction of requests")
        a.set_ylim(0, 1.02)
        if title[0] != "":
            a.set_title(title[0] or title[1])
        legend([a], p, own=ax is None)
        return finish([a], p)


# --------------------------------------------------------------------------- usage over time

TIME_COLUMNS = ("time_s", "end_s", "start_s")
#: vLLM's CPU gauges: the fraction pinned by in-flight transfers, not occupancy
GAUGE = "cpu_cache_usage_perc"
#: fractions of each tier, preferred first
GPU_FRACTIONS = ("gpu_kv_usage", "gpu_usage")
CPU_FRACTIONS = ("cpu_occupancy", "cpu_usage")
RESIDENT = "cpu_resident_chunks"
#: default cap on the points of one drawn series
MAX_POINTS = 1000


def resample(t: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, ...]:
    """``(t, mean, low, high)`` of a series: itself (low = high = mean) when it has at most
    ``max_points`` points, else per equal time bin (empty bins left out), so a long run
    draws ``max_points`` points at most and keeps its peaks in the band."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(t) <= max_points:
        return t, y, y, y
    lo_t, hi_t = float(t.min()), float(t.max())
    edges = np.linspace(lo_t, hi_t if hi_t > lo_t else lo_t + 1.0, max_points + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max_points - 1)
    count = np.bincount(idx, minlength=max_points)
    mean = np.bincount(idx, weights=y, minlength=max_points)
    high = np.full(max_points, -np.inf)
    low = np.full(max_points, np.inf)
    np.maximum.at(high, idx, y)
    np.minimum.at(low, idx, y)
    keep = count > 0
    return edges[:-1][keep], mean[keep] / count[keep], low[keep], high[keep]


def _series(
    ax: Axes,
    t: np.ndarray,
    y: np.ndarray,
    label: str,
    style: dict[str, object],
    max_points: int,
    gid: str,
) -> None:
    rt, mean, low, high = resample(t, y, max_points)
    (line,) = ax.plot(rt, mean, drawstyle="steps-post", label=label, gid=gid, **style)  # type: ignore[arg-type]
    if len(rt) < len(t):  # the band shows what the bin means smooth away
        ax.fill_between(rt, low, high, step="post", color=line.get_color(), alpha=0.2, lw=0)


#: vLLM's three CPU gauges (pinned, pending writes, pending reads): never occupancy
GAUGES = (GAUGE, "cpu_cache_write_usage_perc", "cpu_cache_read_usage_perc")

_LABELS = {
    "gpu_kv_usage": "GPU KV blocks in use",
    "gpu_usage": "GPU KV in use",
    "cpu_occupancy": "CPU tier occupancy (resident / capacity)",
    "cpu_usage": "CPU tier occupancy",
    RESIDENT: "CPU tier resident chunks",
}


def _tiers(
    steps: pd.DataFrame, cpu_chunks: int | None
) -> list[tuple[str, dict[str, pd.Series], bool]]:
    """``(tier, {name: values}, is_fraction)`` per tier to draw: a fraction column when the
    table has one (CPU: resident / capacity when the capacity is known), else counts."""
    cols = steps.columns
    gpu = next(({c: steps[c]} for c in GPU_FRACTIONS if c in cols), None)
    cpu = next(({c: steps[c]} for c in CPU_FRACTIONS if c in cols), None)
    cpu_fraction = cpu is not None
    if cpu is None and RESIDENT in cols:
        cpu_fraction = bool(cpu_chunks)
        cpu = (
            {"cpu_occupancy": steps[RESIDENT] / float(cpu_chunks)}
            if cpu_chunks
            else {RESIDENT: steps[RESIDENT]}
        )
    if gpu is None and cpu is None:  # a table of counts: every numeric gpu_* / cpu_* column
        numeric = [c for c in cols if pd.api.types.is_numeric_dtype(steps[c]) and c not in GAUGES]
        gpu = {c: steps[c] for c in numeric if str(c).startswith("gpu_")}
        cpu = {c: steps[c] for c in numeric if str(c).startswith("cpu_")}
    out = [("GPU", gpu or {}, gpu is not None and any(c in GPU_FRACTIONS for c in gpu))]
    out.append(("CPU", cpu or {}, cpu_fraction))
    return [t for t in out if t[1]]


def usage_timeline(
    steps: pd.DataFrame,
    *,
    cpu_chunks: int | None = None,
    time: str | None = None,
    max_points: int = MAX_POINTS,
    title: str | None = None,
    ax: Axes | Sequence[Axes] | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """GPU and CPU cache occupancy over (simulated) time: a GPU panel and a CPU panel, or
    both on one ``ax``.

    The CPU line is occupancy, ``cpu_resident_chunks / cpu_chunks`` (the tier's capacity,
    ``summary["cpu_chunks"]``; without it the resident count is drawn in chunks). vLLM's
    ``cpu_cache_usage_perc`` (the fraction pinned by in-flight transfers) is drawn on its own
    right-hand axis. ``time`` defaults to ``time_s``, ``end_s`` or ``start_s``. Tables of
    ``gpu_*`` / ``cpu_*`` counts are drawn as counts. Series longer than ``max_points``
    are resampled (:func:`resample`).
    """
    need_columns(steps, [], "usage-timeline")
    if steps.empty:
        raise InputError("usage-timeline: the steps table is empty (a run with record_steps off?)")
    time = time or next((c for c in TIME_COLUMNS if c in steps.columns), TIME_COLUMNS[0])
    need_columns(steps, [time], "usage-timeline")
    if cpu_chunks is not None and cpu_chunks <= 0:
        raise InputError(f"usage-timeline: cpu_chunks must be positive, got {cpu_chunks}")
    if max_points < 2:
        raise InputError(f"usage-timeline: max_points must be at least 2, got {max_points}")
    steps = steps.sort_values(time, kind="stable")
    tiers = _tiers(steps, cpu_chunks)
    if not tiers:
        raise InputError(
            "usage-timeline needs gpu_kv_usage, cpu_resident_chunks, gpu_usage/cpu_usage "
            "or gpu_*/cpu_* columns"
        )
    t = steps[time].to_numpy(dtype=float)
    with styled(preset) as p:
        axes = panels(ax, p, len(tiers), sharex=True, overlay=True)
        overlay = len(set(map(id, axes))) < len(axes)
        index = 0
        for a, (tier, series, fraction) in zip(axes, tiers):
            for name, values in series.items():
                style = series_style(index, index)
                style.pop("marker")
                label = _LABELS.get(str(name), str(name))
                _series(a, t, values.to_numpy(dtype=float), label, style, max_points, str(name))
                index += 1
            unit = "chunks" if tier == "CPU" else "blocks"
            who = "cache" if overlay else tier
            a.set_ylabel(f"{who} used (fraction)" if fraction else f"{who} ({unit})")
            if fraction:
                a.set_ylim(0, 1.05)
        main = axes[-1]
        drawn = list(axes)
        if GAUGE in steps.columns:
            gauge = main.twinx()
            values = steps[GAUGE].to_numpy(dtype=float)
            label = "pinned by transfers (vLLM cpu_cache_usage_perc)"
            _series(gauge, t, values, label, {"color": "0.35", "linestyle": ":"}, max_points, GAUGE)
            gauge.set_ylim(0, max(float(np.nanmax(values, initial=0.0)) * 1.15, 0.01))
            gauge.set_ylabel("pinned fraction (gauge)")
            gauge.set_xlabel("time (s)")  # not drawn (twinx hides its x axis); named all the same
            gauge.spines["right"].set_visible(True)
            drawn.append(gauge)
        main.set_xlabel("time (s)")
        legend(drawn, p, own=ax is None)
        if title != "":
            axes[0].set_title(title or "KV cache usage over time")
        fig = finish(drawn, p)
        if len(drawn) > len(axes):
            drawn[-1].grid(False)  # the twin's grid would cross the occupancy one
        return fig


# --------------------------------------------------------------------------- transfers


def _check_transfers(table: pd.DataFrame) -> None:
    need_columns(table, ["direction", "bytes", "start_s", "end_s"], "transfers")
    if table.empty:
        raise InputError("transfers: the table is empty")


def transfer_bandwidth(
    table: pd.DataFrame,
    *,
    bins: int = 60,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """Transfer bandwidth over time per direction: each job's bytes spread over its
    interval, summed per time bin."""
    _check_transfers(table)
    t0, t1 = float(table["start_s"].min()), float(table["end_s"].max())
    edges = np.linspace(t0, t1 if t1 > t0 else t0 + 1e-3, bins + 1)
    width = edges[1] - edges[0]
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        for i, (direction, g) in enumerate(table.groupby("direction", sort=True)):
            s, e, b = (g[c].to_numpy(dtype=float) for c in ("start_s", "end_s", "bytes"))
            per_bin = np.zeros(bins)
            for lo, hi, nbytes in zip(s, e, b):
                overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
                per_bin += (
                    nbytes * overlap / (hi - lo)
                    if hi > lo
                    else nbytes * ((edges[:-1] <= lo) & (lo < edges[1:]))
                )
            style = series_style(i, i, points=bins)
            a.plot(
                edges[:-1],
                per_bin / width / 1e9,
                drawstyle="steps-post",
                label=str(direction),
                **style,
            )
        a.set_xlabel("time (s)")
        a.set_ylabel("bandwidth (GB/s)")
        if title != "":
            a.set_title(title or "transfer bandwidth over time")
        legend([a], p, own=ax is None)
        return finish([a], p)


def transfer_durations(
    table: pd.DataFrame,
    *,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """Duration of each transfer job against its size, per direction."""
    _check_transfers(table)
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        for i, (direction, g) in enumerate(table.groupby("direction", sort=True)):
            style = series_style(i)
            a.scatter(
                g["bytes"].to_numpy(dtype=float) / 2**20,
                (g["end_s"] - g["start_s"]).to_numpy(dtype=float) * 1000.0,
                s=p.marker_size**2,
                alpha=0.6,
                color=style["color"],
                marker=style["marker"],
                label=str(direction),
            )
        a.set_xlabel("transfer size (MiB)")
        a.set_ylabel("duration (ms)")
        if title != "":
            a.set_title(title or "transfer duration vs size")
        legend([a], p, own=ax is None)
        return finish([a], p)


def transfers(
    table: pd.DataFrame,
    *,
    bins: int = 60,
    title: str | None = None,
    ax: Sequence[Axes] | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """:func:`transfer_bandwidth` (top) and :func:`transfer_durations` (bottom); ``ax`` is a
    pair of axes, or None for a new figure."""
    _check_transfers(table)
    with styled(preset) as p:
        top, bottom = panels(ax, p, 2)
        transfer_bandwidth(table, bins=bins, ax=top, preset=p)
        transfer_durations(table, ax=bottom, preset=p)
        if ax is None and title != "":
            top.figure.suptitle(title or "KV transfers between GPU and CPU")
        return finish([top, bottom], p)
