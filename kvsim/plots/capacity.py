"""Hit ratio against CPU capacity: sweep tables (:func:`hit_vs_capacity`) and one-pass
miss-ratio curves (:func:`mrc`), drawn by one routine.

Lines split only on *parameter* columns, the keywords a run takes (``policy``,
``admission``, ``store_threshold``, ``trace``, ...: read from the API's signatures, so they
stay in step), never on metrics (hit ratios, bytes, counts): a table with 30 metric columns
still gets one line per configuration. Among the parameters that vary, one that splits no
line further (``admission`` resolved from ``store_threshold``, say) is left out.

Colour and marker follow the policy (and any other varying parameter), line style the
admission rule (``admission``, ``store_threshold``), so a figure reads in greyscale. Rows
of the ``belady`` policy are drawn as the reference they are, in black.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvsim.core.errors import InputError
from kvsim.plots.style import (
    DENSE_POINTS,
    REFERENCES,
    Preset,
    finish,
    legend,
    panels,
    reference_hline,
    series_style,
    styled,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from kvsim.cachemode.mrc import MRC

#: capacity columns, preferred first: GiB (a model is known), then chunks (``capacity`` is
#: the chunk count of a ``kvsim mrc`` table)
CAPACITY_COLUMNS = ("cpu_gib", "cpu_chunks", "capacity")
CHUNK_COLUMNS = ("cpu_chunks", "capacity")
#: the hit ratio to draw when none is named: a sweep's, then an MRC's
#: (a timed sweep has shares of prompt tokens: ``combined_hit_share``)
RATIO_COLUMNS = ("combined_hit_ratio", "hit_ratio", "cpu_hit_ratio", "combined_hit_share")
#: parameters that set the line style (the admission rule); the others set colour + marker
ADMISSION_COLUMNS = ("admission", "store_threshold")
#: parameters that vary per cell but never describe a configuration worth a line
_NOT_A_SERIES = {"cpu_bytes", "progress", "per_request", "requests_csv", "points"}
#: more lines than this cannot be told apart in one figure
MAX_LINES = 24
X_LABELS = {"cpu_gib": "CPU tier size (GiB)", "cpu_chunks": "CPU tier size (chunks)"}
X_LABELS["capacity"] = X_LABELS["cpu_chunks"]


@functools.cache
def parameter_names() -> frozenset[str]:
    """Columns that are run parameters: every keyword of ``kvsim.replay``,
    ``kvsim.simulate`` and ``kvsim.mrc`` (and the offload options), plus a sweep's
    ``trace``, ``mode`` and ``limit``."""
    from kvsim.api import mrc
    from kvsim.sweeps import option_names

    mrc_keywords = {
        p.name
        for p in inspect.signature(mrc).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    names = option_names("cache") | option_names("timed") | mrc_keywords
    return frozenset((names | {"trace", "mode", "limit"}) - set(CAPACITY_COLUMNS) - _NOT_A_SERIES)


def need_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """One line naming the figure (``what``) and the missing columns, if any are missing;
    or saying which table to pass, when ``df`` is not a table (a Result, an MRC)."""
    if not isinstance(df, pd.DataFrame):
        tables = getattr(df, "tables", None)
        if isinstance(tables, dict):
            hint = f": one of this result's tables, as result.NAME ({', '.join(tables)})"
        elif isinstance(getattr(df, "table", None), pd.DataFrame):
            hint = ": this object's .table"
        else:
            hint = ""
        raise InputError(
            f"{what} takes a table (a pandas DataFrame){hint}, got a {type(df).__name__}"
        )
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(
            f"{what} needs column(s) {', '.join(missing)}; "
            f"the table has {', '.join(map(str, df.columns))}"
        )


def series_columns(df: pd.DataFrame, x: str) -> list[str]:
    """The parameter columns that split ``df`` into lines: those that vary, policy first,
    then admission, then table order, each kept only when it splits a line further."""
    from kvsim.sweeps.cell_tables import varying_columns

    params = parameter_names()
    return varying_columns(df, [str(c) for c in df.columns if c in params and c != x])


def pick_column(
    df: pd.DataFrame, wanted: str | None, options: Sequence[str], what: str, noun: str
) -> str:
    """The column a figure plots: ``wanted`` (which must exist), else the first of ``options``
    holding a number; one line naming the figure (``what``) when there is none."""
    if wanted is not None:
        need_columns(df, [wanted], what)
        return wanted
    for c in options:
        if c in df.columns and pd.to_numeric(df[c], errors="coerce").notna().any():
            return c
    raise InputError(f"{what} needs a {noun} column ({' or '.join(options)})")


def series_value(v: Any) -> str:
    """A series' value as a legend shows it (a file's name, not its whole path)."""
    text = str(v)
    return os.path.basename(text) if os.sep in text else text


def numeric_rows(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``df`` with ``columns`` as numbers, rows where any is not a finite number dropped (a
    failed sweep cell leaves them empty; an infinite value has no place on an axis)."""
    as_numbers = {
        c: pd.to_numeric(df[c], errors="coerce").replace([np.inf, -np.inf], np.nan) for c in columns
    }
    return df.assign(**as_numbers).dropna(subset=list(columns))


def draw_curves(
    ax: Axes,
    df: pd.DataFrame,
    x: str,
    y: str,
    by: Sequence[str],
    *,
    steps: bool = False,
    label: str | None = None,
) -> None:
    """One line per ``by`` group: colour + marker by the non-admission columns, line style by
    the admission columns; ``belady`` rows in the reference style."""
    groups = list(df.groupby(list(by), dropna=False, sort=True)) if by else [((), df)]
    if len(groups) > MAX_LINES:
        raise InputError(
            f"lines split by {', '.join(by)} would be {len(groups)} lines "
            f"(at most {MAX_LINES} can be told apart); split by fewer columns"
        )
    dash_cols = [c for c in by if c in ADMISSION_COLUMNS]
    colour_cols = [c for c in by if c not in ADMISSION_COLUMNS]

    def part(key: tuple[Any, ...], cols: list[str]) -> tuple[str, ...]:
        return tuple(series_value(key[by.index(c)]) for c in cols)

    keys = [k if isinstance(k, tuple) else (k,) for k, _ in groups]
    colour_keys = sorted({part(k, colour_cols) for k in keys if not _is_belady(k, by)})
    dash_keys = sorted({part(k, dash_cols) for k in keys})
    for key, (_, g) in zip(keys, groups):
        g = g.sort_values(x)
        name = ", ".join(series_value(v) for v in key) or label or y
        style = series_style(
            colour_keys.index(part(key, colour_cols)) if not _is_belady(key, by) else 0,
            dash_keys.index(part(key, dash_cols)),
            points=len(g),
        )
        if _is_belady(key, by):
            style.update({k: v for k, v in REFERENCES["belady"].items() if k != "label"})
            style["gid"] = "belady"
            name = ", ".join(
                REFERENCES["belady"]["label"] if c == "policy" else series_value(v)
                for c, v in zip(by, key)
            )
        ax.plot(
            g[x],
            g[y],
            label=name,
            drawstyle="steps-post" if steps else "default",
            **style,
        )


def _is_belady(key: tuple[Any, ...], by: Sequence[str]) -> bool:
    return "policy" in by and str(key[list(by).index("policy")]).lower() == "belady"


def axes_labels(ax: Axes, df: pd.DataFrame, x: str, y: str, log_x: bool | None) -> None:
    """Scales and labels; a ratio axis from 0 to above its highest line, references included."""
    lo, hi = float(df[x].min()), float(df[x].max())
    if log_x is None:
        log_x = lo > 0 and hi / lo >= 20
    ax.set_xscale("log" if log_x else "linear")
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel(y.replace("_", " "))
    if y.endswith("ratio"):
        in_data = [  # lines whose y is data (not an axvline's 0..1 of the axes)
            line
            for line in ax.get_lines()
            if line.get_transform().contains_branch_seperately(ax.transData)[1]
            and np.asarray(line.get_ydata()).size  # legend-only proxies carry no data
        ]
        top = max(float(np.nanmax(np.asarray(line.get_ydata(), float))) for line in in_data)
        ax.set_ylim(0, max(1e-3, top * 1.1))


def _belady_frame(belady: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The Belady rows of a table (all rows when it has no policy column), with the figure's
    x (the same unit: GiB, or chunks under any chunk column name) and y (else a hit ratio)."""
    if "policy" in belady.columns:
        belady = belady[belady["policy"].astype(str).str.lower() == "belady"]
    else:
        belady = belady.assign(policy="belady")
    bx = x if x in belady.columns else None
    if bx is None and x in CHUNK_COLUMNS:
        bx = next((c for c in CHUNK_COLUMNS if c in belady.columns), None)
    by = y if y in belady.columns else next((c for c in RATIO_COLUMNS if c in belady.columns), None)
    if "status" in belady.columns:
        belady = belady[belady["status"] == "ok"]
    if bx is None or by is None or belady.empty:
        raise InputError(f"the Belady table needs belady rows with a {x} column and a hit ratio")
    return numeric_rows(
        belady.drop(columns=[c for c in (x, y) if c not in (bx, by)], errors="ignore"), [bx, by]
    ).rename(columns={bx: x, by: y})


def draw_references(
    ax: Axes,
    x: str,
    y: str,
    *,
    belady: pd.DataFrame | None,
    ceiling: float | None,
    baseline: float | None,
) -> None:
    """Belady's curve(s) (one per admission rule or other configuration of the table), the
    ceiling and the baseline."""
    if belady is not None:
        b = _belady_frame(belady, x, y)
        by = ["policy"] + [c for c in series_columns(b, x) if c != "policy"]
        draw_curves(ax, b, x, y, by)
    if ceiling is not None:
        reference_hline(ax, "ceiling", float(ceiling))
    if baseline is not None:
        reference_hline(ax, "baseline", float(baseline))


def hit_vs_capacity(
    results: pd.DataFrame,
    *,
    x: str | None = None,
    y: str | None = None,
    by: Sequence[str] | None = None,
    ceiling: float | None = None,
    baseline: float | None = None,
    belady: pd.DataFrame | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """Hit ratio against CPU capacity, one line per configuration (policy, admission, ...).

    ``x`` defaults to ``cpu_gib``, else ``cpu_chunks`` (or an MRC's ``capacity``); ``y`` to
    ``combined_hit_ratio`` (else ``hit_ratio``); ``by`` to the parameter columns that vary.
    ``ceiling`` and ``baseline`` (hit ratios) draw horizontal reference lines, ``belady`` (a
    table) the offline optimum; ``belady`` rows of ``results`` are drawn as that reference.
    """
    need_columns(results, [], "hit-vs-capacity")
    df = results[results["status"] == "ok"] if "status" in results.columns else results
    x = pick_column(df, x, CAPACITY_COLUMNS, "hit-vs-capacity", "capacity")
    y = pick_column(df, y, RATIO_COLUMNS, "hit-vs-capacity", "hit-ratio")
    df = numeric_rows(df, [x, y])
    if df.empty:
        raise InputError("hit-vs-capacity: no successful cells to plot")
    need_columns(df, list(by or []), "hit-vs-capacity --by")
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        lines = by if by is not None else series_columns(df, x)
        draw_curves(a, df, x, y, list(lines))
        draw_references(a, x, y, belady=belady, ceiling=ceiling, baseline=baseline)
        axes_labels(a, df, x, y, None)
        if title != "":
            a.set_title(title or f"{y.replace('_', ' ')} vs CPU capacity")
        legend([a], p, own=ax is None, title=", ".join(lines) or None)
        return finish([a], p)


def mrc(
    curve: pd.DataFrame | MRC,
    *,
    x: str | None = None,
    y: str = "hit_ratio",
    ceiling: float | None = None,
    belady: pd.DataFrame | None = None,
    baseline: float | None = None,
    exact_from: int | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """A miss-ratio curve (as hit ratio) against CPU capacity, log x, as steps.

    ``curve`` is a ``kvsim mrc`` table (``capacity`` in chunks, ``hit_ratio``; ``cpu_gib``
    when a model is known) or a :class:`kvsim.cachemode.mrc.MRC`. ``x`` is ``"cpu_gib"``,
    ``"chunks"`` or None (GiB when the table has it). ``exact_from`` (chunks; taken from an
    ``MRC`` of the prefix protocol) marks where the curve becomes exact; ``ceiling``,
    ``baseline`` and ``belady`` are the reference lines of :func:`hit_vs_capacity`.
    """
    ylabel = "hit ratio"
    points: pd.DataFrame | None = None
    if not isinstance(curve, pd.DataFrame) and not hasattr(curve, "protocol"):  # not an MRC
        need_columns(curve, [], "mrc")  # says what to pass instead
    if not isinstance(curve, pd.DataFrame):
        ylabel = "CPU hit ratio" if curve.protocol == "prefix" else ylabel
        if exact_from is None and curve.protocol == "prefix" and curve.exact_from > 1:
            exact_from = curve.exact_from
        points = curve.points
        curve = curve.table
    if x in (None, "cpu_gib") and "cpu_gib" in curve.columns and curve["cpu_gib"].notna().any():
        xcol = "cpu_gib"
    elif x in (None, "chunks", "capacity", "cpu_chunks"):
        xcol = pick_column(curve, None, CHUNK_COLUMNS, "mrc", "capacity")
    else:
        raise InputError(f"mrc: x must be cpu_gib or chunks, and the table must have it; got {x}")
    need_columns(curve, [y], "mrc")  # a sweep's table, a --y it does not have
    df = numeric_rows(curve, [xcol, y])
    df = df[df[xcol] > 0]
    if df.empty:
        raise InputError(f"mrc: no row of the curve has a positive capacity and a finite {y}")
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        _mrc_lines(a, df, xcol, y, points)
        draw_references(a, xcol, y, belady=belady, ceiling=ceiling, baseline=baseline)
        if exact_from is not None and exact_from > 1:
            at = float(exact_from)
            if xcol == "cpu_gib":  # the table's own GiB per chunk
                per_chunk = (
                    df["cpu_gib"] / df[pick_column(df, None, CHUNK_COLUMNS, "mrc", "capacity")]
                ).median()
                at *= float(per_chunk)
            a.axvline(
                at,
                color="0.5",
                linestyle=(0, (1, 2)),
                linewidth=0.8,
                gid="exact_from",
                label=f"exact from {exact_from:,} chunks",
            )
        axes_labels(a, df, xcol, y, True)
        a.set_ylabel(ylabel if y == "hit_ratio" else y.replace("_", " "))
        if title is None:
            title = mrc_title(curve)
        if title:
            a.set_title(title)
        legend([a], p, own=ax is None)
        return finish([a], p)


def mrc_title(table: pd.DataFrame, trace: str | None = None) -> str:
    """A curve's title from its own columns: the policies (upper case, as papers name them)
    and the model, then the trace's file name when given."""
    names = ", ".join(
        str(v).upper() for v in sorted(set(table.get("policy", pd.Series(["lru"])).astype(str)))
    )
    model = table["model"].dropna().astype(str) if "model" in table.columns else pd.Series([])
    parts = [f"{names} hit ratio vs CPU capacity"]
    if len(model):
        parts.append(", ".join(dict.fromkeys(model)))
    if trace:
        parts.append(os.path.basename(trace))
    return ": ".join(parts[:1]) + ("" if len(parts) == 1 else " (" + "; ".join(parts[1:]) + ")")


def _mrc_lines(ax: Axes, df: pd.DataFrame, x: str, y: str, points: pd.DataFrame | None) -> None:
    """One step line per policy; exact points filled, estimated ones (sampled, or below
    ``exact_from``) hollow; the asked ``--cpu-gib`` sizes as large diamonds."""
    groups = list(df.groupby("policy", sort=True)) if "policy" in df.columns else [("lru", df)]
    if len(groups) > MAX_LINES:
        raise InputError(f"mrc: {len(groups)} policies in one table (at most {MAX_LINES})")
    exact_col = "exact" if "exact" in df.columns else None
    hollow_seen = filled_seen = False
    for i, (name, g) in enumerate(groups):
        g = g.sort_values(x)
        style = series_style(i)
        colour = style["color"]
        ax.plot(
            g[x],
            g[y],
            color=colour,
            linestyle=style["linestyle"],
            drawstyle="steps-post",
            label=str(name).upper(),
            gid=f"mrc:{name}",
        )
        exact = g[exact_col].astype(str).str.lower().isin(("true", "1")) if exact_col else None
        shown = g if len(g) <= DENSE_POINTS else g.iloc[:: max(1, len(g) // DENSE_POINTS)]
        ex = exact.loc[shown.index] if exact is not None else pd.Series(True, index=shown.index)
        if ex.any():
            filled_seen = True
            ax.plot(
                shown[x][ex],
                shown[y][ex],
                linestyle="none",
                marker=style["marker"],
                color=colour,
                gid=f"exact:{name}",
            )
        if (~ex).any():
            hollow_seen = True
            ax.plot(
                shown[x][~ex],
                shown[y][~ex],
                linestyle="none",
                marker=style["marker"],
                color=colour,
                markerfacecolor="none",
                gid=f"estimate:{name}",
            )
    if filled_seen and hollow_seen:  # say what the two kinds of marker mean, once
        ax.plot([], [], linestyle="none", marker="o", color="0.4", label="exact (a full replay)")
        ax.plot(
            [],
            [],
            linestyle="none",
            marker="o",
            color="0.4",
            markerfacecolor="none",
            label="estimate (sampled)",
        )
    elif hollow_seen:
        ax.plot(
            [],
            [],
            linestyle="none",
            marker="o",
            color="0.4",
            markerfacecolor="none",
            label="every point an estimate (sampled)",
        )
    if points is not None and len(points):
        px = "cpu_gib" if x == "cpu_gib" and "cpu_gib" in points.columns else "capacity"
        ax.plot(
            points[px],
            points["hit_ratio"],
            linestyle="none",
            marker="D",
            markersize=7,
            color="black",
            markerfacecolor="none",
            gid="asked_sizes",
            label="at the asked --cpu-gib sizes",
        )


def mrc_curve(
    curve: MRC,
    *,
    title: str | None = None,
    ax: Axes | None = None,
    preset: str | Preset | None = None,
) -> Figure:
    """:func:`mrc` of an :class:`~kvsim.cachemode.mrc.MRC` (kept for existing callers)."""
    return mrc(curve, title=title, ax=ax, preset=preset)
