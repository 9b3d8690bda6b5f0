"""Figures of a trace's statistics (:func:`kvsim.traces.stats.trace_stats`), one function per
figure so each can draw into a caller's axes; :func:`trace_figures` makes them all."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvsim.plots.style import COLOURS, Preset, finish, panels, styled

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from kvsim.report.result import Result


def _name(stats: Result) -> str:
    return os.path.basename(str(stats.summary.get("trace", "trace")))


def _suptitle(ax: object, fig: Figure, text: str) -> None:
    if ax is None:  # only a figure of our own gets a figure title
        fig.suptitle(text)


def token_lengths(
    stats: Result, *, ax: Sequence[Axes] | None = None, preset: str | Preset | None = None
) -> Figure:
    """Histograms of prompt and output lengths (two panels)."""
    req = stats.requests
    with styled(preset) as p:
        axes = panels(ax, p, 2, rows=1)
        for i, (a, col, label) in enumerate(
            zip(axes, ("prompt_tokens", "output_tokens"), ("prompt", "output"))
        ):
            v = req[col].to_numpy()
            a.hist(v, bins=50, color=COLOURS[i], label=label)
            a.set_xlabel(f"{label} length (tokens)")
            a.set_ylabel("requests")
            a.set_title(f"{label} tokens (mean {v.mean():,.0f})" if len(v) else label)
        fig = finish(axes, p)
        _suptitle(ax, fig, f"{_name(stats)}: request sizes")
        return fig


def reuse_cdfs(
    stats: Result, *, ax: Sequence[Axes] | None = None, preset: str | Preset | None = None
) -> Figure:
    """CDFs of reuse distance (distinct blocks in between) and reuse time (two panels)."""
    reuses = stats.reuses
    with styled(preset) as p:
        axes = panels(ax, p, 2, rows=1)
        for a, col, label in (
            (axes[0], "distance", "reuse distance (distinct blocks)"),
            (axes[1], "time_s", "reuse time (s)"),
        ):
            v = np.sort(reuses[col].to_numpy(dtype=float))
            if len(v):
                a.plot(v, np.arange(1, len(v) + 1) / len(v), drawstyle="steps-post")
                if v.max() > 0:
                    a.set_xscale("symlog" if v.min() <= 0 else "log")
            a.set_xlabel(label)
            a.set_ylabel("fraction of reuses")
            a.set_ylim(0, 1.02)
        fig = finish(axes, p)
        _suptitle(ax, fig, f"{_name(stats)}: reuse CDFs ({len(reuses):,} reuses)")
        return fig


def block_popularity(
    stats: Result, *, ax: Axes | None = None, preset: str | Preset | None = None
) -> Figure:
    """Accesses per block against the block's popularity rank, log-log."""
    counts = stats.popularity["accesses"].to_numpy()
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        if len(counts):
            a.loglog(np.arange(1, len(counts) + 1), counts, marker=".", linestyle="none")
        a.set_xlabel("block rank")
        a.set_ylabel("accesses")
        a.set_title(f"{_name(stats)}: block popularity")
        return finish([a], p)


def arrival_rate(
    stats: Result, *, ax: Axes | None = None, preset: str | Preset | None = None
) -> Figure:
    """Requests per second over the trace, in the statistics' bins. The last bin ends at the
    last arrival, so it is partial; it is left out (a partial bin would read as a drop in
    the rate) unless it is the only one."""
    arr = stats.arrivals
    width = float(stats.summary.get("arrival_bin_s", 1.0))
    if len(arr) > 1 and "width_s" in arr.columns and float(arr["width_s"].iloc[-1]) < width:
        arr = arr.iloc[:-1]
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        a.plot(arr["start_s"], arr["rate_rps"], drawstyle="steps-post")
        a.set_xlabel("time since trace start (s)")
        a.set_ylabel(f"arrivals (req/s, {width:g} s bins)")
        a.set_title(f"{_name(stats)}: arrivals over time")
        return finish([a], p)


def trace_figures(stats: Result, *, preset: str | Preset | None = None) -> dict[str, Figure]:
    """Every figure of a :func:`kvsim.traces.stats.trace_stats` result, by file stem."""
    return {
        "token_lengths": token_lengths(stats, preset=preset),
        "reuse_cdfs": reuse_cdfs(stats, preset=preset),
        "block_popularity": block_popularity(stats, preset=preset),
        "arrival_rate": arrival_rate(stats, preset=preset),
    }
