"""Secondary tiers against CPU capacity: one line per tier set of a ``tiers`` sweep
(``kvsim sweep --tier-set``), the hit ratio and, when the sweep is timed, the median TTFT.

Colour and marker follow the tier set, in the sweep's order (``none`` first when it was
given first), so the gap between ``none`` and a tier set is what that tier adds at each CPU
size. Any other parameter that varies (policy, say) sets the line style, through the same
grouping as :func:`kvsim.plots.hit_vs_capacity`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from kvsim.core.errors import InputError
from kvsim.plots.capacity import (
    CAPACITY_COLUMNS,
    MAX_LINES,
    RATIO_COLUMNS,
    X_LABELS,
    axes_labels,
    draw_references,
    need_columns,
    numeric_rows,
    pick_column,
    series_columns,
    series_value,
)
from kvsim.plots.style import Preset, finish, legend, panels, series_style, styled

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: the sweep's tier-set column (kvsim.sweeps.TIERS)
TIERS = "tiers"
#: median TTFT columns of a timed run's summary, preferred first
TTFT_COLUMNS = ("median_ttft_ms",)


def _ttft_column(df: pd.DataFrame, ttft: bool | None) -> str | None:
    """The TTFT column to draw: None when not asked for or (by default) not in the table."""
    found = None
    for c in TTFT_COLUMNS:
        if c in df and pd.to_numeric(df[c], errors="coerce").notna().any():
            found = c
            break
    if ttft and found is None:
        raise InputError(f"tiers-vs-capacity: ttft needs a {' or '.join(TTFT_COLUMNS)} column")
    return found if ttft is not False else None


def _draw(ax: Axes, df: pd.DataFrame, x: str, y: str, order: list[str], others: list[str]) -> None:
    """One line per (tier set, other parameters): colour by tier set, style by the rest."""
    keys = [TIERS, *others]
    groups = list(df.groupby(keys, dropna=False, sort=False))
    if len(groups) > MAX_LINES:
        raise InputError(
            f"tiers-vs-capacity: {len(groups)} lines (tier sets x {', '.join(others)}); "
            f"at most {MAX_LINES} can be told apart"
        )
    rest = sorted({tuple(series_value(v) for v in key[1:]) for key, _ in groups})
    groups.sort(key=lambda kg: (order.index(str(kg[0][0])), rest.index(_rest(kg[0]))))
    for key, g in groups:
        g = g.sort_values(x)
        style = series_style(order.index(str(key[0])), rest.index(_rest(key)), points=len(g))
        label = ", ".join(series_value(v) for v in key)
        ax.plot(g[x], g[y], label=label, gid=f"tiers={key[0]}", **style)


def _capacity_ticks(ax: Axes, values: pd.Series) -> None:
    """Ticks at the sweep's capacities, written as numbers (16, 64, 256), not powers of 10."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    sizes = sorted(set(values.tolist()))
    if len(sizes) <= 12:
        ax.set_xticks(sizes)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _rest(key: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(series_value(v) for v in key[1:])


def tiers_vs_capacity(
    results: pd.DataFrame,
    *,
    x: str | None = None,
    y: str | None = None,
    ttft: bool | None = None,
    ceiling: float | None = None,
    baseline: float | None = None,
    title: str | None = None,
    ax: Axes | list[Axes] | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """Hit ratio against CPU capacity, one line per secondary-tier set (the ``tiers``
    column of a ``kvsim sweep --tier-set`` table); a second panel, the median TTFT, when
    the table has it (a timed sweep) and ``ttft`` is not False.

    ``x`` defaults to ``cpu_gib`` (else ``cpu_chunks``), ``y`` to ``combined_hit_ratio``
    (``secondary_tier_hit_ratio`` draws what the secondary tiers alone served);
    ``ceiling`` and ``baseline`` draw reference lines as in :func:`hit_vs_capacity`. With
    ``ax=``: one Axes, or two when the TTFT panel is drawn.
    """
    df = results[results["status"] == "ok"] if "status" in results.columns else results
    need_columns(df, [TIERS], "tiers-vs-capacity (a kvsim sweep --tier-set table)")
    x = pick_column(df, x, CAPACITY_COLUMNS, "tiers-vs-capacity", "capacity")
    y = pick_column(df, y, RATIO_COLUMNS, "tiers-vs-capacity", "hit-ratio")
    df = numeric_rows(df, [x, y]).assign(**{TIERS: lambda d: d[TIERS].astype(str)})
    if df.empty:
        raise InputError("tiers-vs-capacity: no successful cells to plot")
    t = _ttft_column(df, ttft)
    order = list(dict.fromkeys(df[TIERS]))
    others = [c for c in series_columns(df, x) if c != TIERS]
    lo, hi = float(df[x].min()), float(df[x].max())
    log_x = lo > 0 and hi / lo >= 4  # capacities grow by factors
    with styled(preset) as p:
        axes = panels(ax, p, 2 if t else 1, sharex=True)
        _draw(axes[0], df, x, y, order, others)
        draw_references(axes[0], x, y, belady=None, ceiling=ceiling, baseline=baseline)
        axes_labels(axes[0], df, x, y, log_x)
        if t is not None:
            times = numeric_rows(df, [t]).assign(ttft_s=lambda d: d[t] / 1e3)
            _draw(axes[1], times, x, "ttft_s", order, others)
            axes[1].set_xscale("log" if log_x else "linear")
            axes[1].set_xlabel(X_LABELS.get(x, x))
            axes[1].set_ylabel("TTFT p50 (s)")
            low, high = times["ttft_s"].min(), times["ttft_s"].max()
            if low > 0 and high / low >= 20:
                axes[1].set_yscale("log")
            axes[0].set_xlabel("")
        for a in axes:
            _capacity_ticks(a, df[x])
        if title != "":
            axes[0].set_title(title or "secondary tiers behind the CPU tier")
        legend(axes[:1], p, own=ax is None, title=", ".join([TIERS, *others]))
        return finish(axes, p)
