"""One look for every kvsim figure: size presets, series styles, reference lines, saving.

A preset is a figure width that matches a paper's column (one-column ~3.3 in, two-column
~7 in) and font sizes chosen *at that width*: a figure saved at the preset's size and placed
at column width keeps every text at least :data:`MIN_FONT_PT`. Figures therefore use a
constrained layout and are saved without ``bbox_inches="tight"`` (which would change the
width, and so the printed font size).

Series are told apart by colour *and* marker (and line style for a second dimension), so a
figure still reads when printed in greyscale. Reference lines (Belady, the ceiling, the
baseline) are black or grey in their own line styles and never take a series colour.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
import matplotlib.pyplot as plt

from kvsim.core.io import FIGURE_FORMATS, atomic_path, figure_format

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend

#: no text in a placed figure is smaller than this (a common venue minimum)
MIN_FONT_PT = 7.0
#: raster resolution of PNG files (vector formats ignore it)
SAVE_DPI = 300


@dataclass(frozen=True)
class Preset:
    """Figure size and text sizes for one placement width."""

    name: str
    width_in: float
    panel_height_in: float  # one row of panels; figures with n rows are n times as tall
    font_pt: float  # axis labels, titles
    small_pt: float  # tick labels, legends, annotations
    line_width: float
    marker_size: float


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("one-column", 3.3, 2.3, 8.0, 7.0, 1.1, 3.5),
        Preset("two-column", 7.0, 2.9, 9.0, 8.0, 1.4, 4.5),
    )
}
DEFAULT_PRESET = "two-column"

#: Okabe-Ito colours (colour-blind safe), black left out: it marks reference lines
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
LINESTYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
#: reference lines: label and style, one entry each
REFERENCES: dict[str, dict[str, Any]] = {
    "belady": {"label": "Belady (offline optimum)", "color": "black", "marker": "x"},
    "ceiling": {"label": "infinite cache (ceiling)", "color": "0.3", "linestyle": ":"},
    "baseline": {"label": "no offloading (baseline)", "color": "0.3", "linestyle": "-."},
}
#: a line with more points than this gets markers at intervals, not on every point
DENSE_POINTS = 25


def preset_of(preset: str | Preset | None) -> Preset:
    """A preset by name (``None``: the default); unknown names are a ``ValueError``."""
    if isinstance(preset, Preset):
        return preset
    name = preset or DEFAULT_PRESET
    if name not in PRESETS:
        raise ValueError(f"unknown figure preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def _rc(p: Preset) -> Any:  # matplotlib types the keys as a Literal of every rc name
    return {
        "font.size": p.font_pt,
        "axes.titlesize": p.font_pt,
        "axes.labelsize": p.font_pt,
        "figure.titlesize": p.font_pt,
        "xtick.labelsize": p.small_pt,
        "ytick.labelsize": p.small_pt,
        "legend.fontsize": p.small_pt,
        "legend.title_fontsize": p.small_pt,
        "lines.linewidth": p.line_width,
        "lines.markersize": p.marker_size,
        "axes.linewidth": 0.6,
        "grid.linewidth": 0.4,
        "grid.alpha": 0.35,
        "legend.frameon": True,  # a light box: legends may sit over lines
        "legend.framealpha": 0.85,
        "legend.edgecolor": "none",
        "axes.spines.top": False,
        "axes.spines.right": False,
    }


@contextlib.contextmanager
def styled(preset: str | Preset | None) -> Iterator[Preset]:
    """Draw inside this: text made here gets the preset's sizes."""
    p = preset_of(preset)
    with mpl.rc_context(_rc(p)):
        yield p


def new_figure(p: Preset, rows: int = 1, cols: int = 1, *, sharex: bool = False) -> list[Axes]:
    """A figure of the preset's width with ``rows x cols`` panels (row-major axes list)."""
    _, axes = plt.subplots(
        rows,
        cols,
        figsize=(p.width_in, p.panel_height_in * rows),
        sharex=sharex,
        squeeze=False,
        layout="constrained",
    )
    return list(axes.flat)


def panels(
    ax: Axes | Sequence[Axes] | None,
    p: Preset,
    n: int,
    *,
    rows: int | None = None,
    sharex: bool = False,
    overlay: bool = False,
) -> list[Axes]:
    """The ``n`` axes a figure draws into: new ones (``ax=None``), the caller's sequence of
    ``n``, or, where ``overlay`` makes sense, one caller's Axes for every panel."""
    if ax is None:
        r = n if rows is None else rows
        return new_figure(p, r, n // r, sharex=sharex)
    if isinstance(ax, Sequence):
        if len(ax) != n:
            raise ValueError(f"this figure draws {n} panel(s); got {len(ax)} axes")
        given = list(ax)
    elif n == 1 or overlay:
        given = [ax] * n
    else:
        raise ValueError(f"this figure draws {n} panels; pass a sequence of {n} axes")
    for a in dict.fromkeys(given):
        style_axes(a, p)
    return given


def style_axes(ax: Axes, p: Preset) -> None:
    """Give axes made outside :func:`styled` (a caller's) the preset's look: what the rc
    settings would have set had the axes been made inside it (spines, label sizes)."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for spine in ax.spines.values():
        spine.set_linewidth(0.6)
    ax.xaxis.label.set_fontsize(p.font_pt)
    ax.yaxis.label.set_fontsize(p.font_pt)
    ax.title.set_fontsize(p.font_pt)


def finish(axes: Sequence[Axes], p: Preset) -> Figure:
    """Common last touches: grid, tick label sizes fixed on the axes (ticks are made again at
    draw time, outside the preset's style), legends at the preset's size."""
    for a in dict.fromkeys(axes):  # one pass per distinct axes
        a.tick_params(labelsize=p.small_pt)
        a.grid(True)
    fig = axes[0].get_figure(root=True)
    if fig is None:
        raise ValueError("the axes belong to no figure")
    return fig


def legend(
    axes: Sequence[Axes], p: Preset, *, own: bool, title: str | None = None
) -> Legend | None:
    """One legend for every line of ``axes`` (twins included), at the preset's small size.

    In a figure of our own (``own``) it goes below the panels, outside the data, in as many
    columns as fit the preset's width; in a caller's axes it goes where it covers least."""
    handles: list[Any] = []
    labels: list[str] = []
    for a in dict.fromkeys(axes):
        h, lab = a.get_legend_handles_labels()
        handles += h
        labels += lab
    if not handles:
        return None
    if not own:
        return axes[0].legend(handles, labels, title=title, loc="best", handlelength=2.2)
    widest = max(len(t) for t in labels) * 0.55 * p.small_pt / 72 + 0.5  # inches per entry
    ncol = max(1, min(len(handles), int(p.width_in * 0.95 // widest)))
    fig = axes[0].get_figure(root=True)
    assert fig is not None  # axes of our own figure
    rows = -(-len(handles) // ncol) + (title is not None)
    fig.set_figheight(fig.get_figheight() + rows * p.small_pt * 1.5 / 72 + 0.08)  # width kept
    return fig.legend(
        handles, labels, title=title, loc="outside lower center", ncol=ncol, handlelength=2.2
    )


def series_style(index: int, dash: int = 0, *, points: int = 1) -> dict[str, Any]:
    """Line style of series ``index`` (colour and marker) in line-style slot ``dash``."""
    style: dict[str, Any] = {
        "color": COLOURS[index % len(COLOURS)],
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINESTYLES[dash % len(LINESTYLES)],
    }
    if points > DENSE_POINTS:
        style["markevery"] = 0.1  # evenly spaced on screen, log axes included
    return style


def reference_hline(ax: Axes, kind: str, value: float, label: str | None = None) -> None:
    """A horizontal reference line (``ceiling`` or ``baseline``) with its label."""
    style = dict(REFERENCES[kind])
    text = style.pop("label")
    ax.axhline(value, linewidth=1.0, label=label or f"{text} {value:.3g}", gid=kind, **style)


# --------------------------------------------------------------------------- saving

_SAVE_RC: Any = {
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "none",
    "svg.hashsalt": "kvsim",
}
#: no dates or versions in the files: the same figure gives the same bytes
_METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    "svg": {"Creator": None, "Date": None},
}


def save_as(
    fig: Figure, path: str | os.PathLike[str], *, close: bool = True, option: str = "--out"
) -> str:
    """Write one figure file atomically, its format (png, pdf or svg) from the extension; any
    other extension is an :class:`~kvsim.core.errors.InputError` naming ``option``.

    A figure kvsim laid out (constrained layout, the preset's width) is saved at its size; a
    caller's figure without a layout engine is saved with a tight box, so labels that
    overflow its edges are not cut."""
    path = os.fspath(path)
    fmt = figure_format(path, option)
    tight = "tight" if fig.get_layout_engine() is None else None
    with mpl.rc_context(_SAVE_RC), atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=SAVE_DPI, metadata=_METADATA[fmt], bbox_inches=tight)
    if close:
        plt.close(fig)
    return path


def out_paths(out: str | os.PathLike[str], option: str = "--out") -> list[str]:
    """The files an output name stands for: itself when it has an extension (checked),
    ``out.png`` and ``out.svg`` when it has none."""
    out = os.fspath(out)
    if os.path.splitext(os.path.basename(out))[1]:
        figure_format(out, option)
        return [out]
    return [f"{out}.{ext}" for ext in ("png", "svg")]


def save(fig: Figure, out: str | os.PathLike[str], *, option: str = "--out") -> list[str]:
    """Write ``out`` (format from its extension), or ``out.png`` and ``out.svg`` when it has
    none; each file atomically. Returns the paths."""
    paths = [save_as(fig, path, close=False, option=option) for path in out_paths(out, option)]
    plt.close(fig)
    return paths


def save_all(figs: dict[str, Figure], folder: str | os.PathLike[str]) -> list[str]:
    """Save every figure as ``folder/<stem>.png`` and ``.svg``."""
    os.makedirs(folder, exist_ok=True)
    out: list[str] = []
    for stem, fig in figs.items():
        out += save(fig, os.path.join(folder, stem))
    return out


__all__ = [
    "FIGURE_FORMATS",
    "MIN_FONT_PT",
    "PRESETS",
    "Preset",
    "save",
    "save_all",
    "save_as",
]
