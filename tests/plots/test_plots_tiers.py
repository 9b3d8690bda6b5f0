"""The secondary-tier figure (``plots.tiers_vs_capacity``, ``kvsim plot --kind
tiers-vs-capacity``): one line per tier set, coloured by it, the hit ratio and, for a timed
sweep, median TTFT. Checked on the artists."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from support import labelled_lines, run_main

from kvsim import plots
from kvsim.core.errors import InputError

SETS = ("none", "fs:capacity=256GiB", "fs:capacity=1TiB", "fs:capacity=2TiB")
GIB = (16, 64, 256)


def _table(ttft: bool = False, policies: tuple[str, ...] = ("lru",)) -> pd.DataFrame:
    """A sweep results table as ``kvsim sweep --tier-set`` writes it (one failed cell)."""
    rows = []
    for policy in policies:
        for i, tiers in enumerate(SETS):
            for gib in reversed(GIB):  # the table's order is not the x order
                hit = 0.04 * np.log2(gib) / 8 + 0.08 * i + (0.01 if policy == "arc" else 0)
                row = {
                    "status": "ok",
                    "trace": "t.jsonl",
                    "mode": "timed" if ttft else "cache",
                    "model": "llama-3.1-8b",
                    "policy": policy,
                    "cpu_gib": gib,
                    "tiers": tiers,
                    "combined_hit_ratio": hit,
                    "secondary_tier_hit_ratio": 0.08 * i,
                }
                if ttft:
                    row["median_ttft_ms"] = 900.0 * (1 - hit)
                rows.append(row)
    rows.append({**rows[0], "status": "error", "tiers": "obj", "combined_hit_ratio": None})
    return pd.DataFrame(rows)


def test_one_line_per_tier_set_in_the_sweeps_order_with_its_own_colour():
    df = _table()
    fig = plots.tiers_vs_capacity(df)
    (ax,) = fig.axes
    lines = labelled_lines(ax)
    assert [line.get_label() for line in lines] == list(SETS)  # the failed cell is left out
    assert len({to_hex(line.get_color()) for line in lines}) == len(SETS)
    assert len({line.get_marker() for line in lines}) == len(SETS)
    for line, tiers in zip(lines, SETS):  # each line is its rows, in capacity order
        rows = df[(df.tiers == tiers) & (df.status == "ok")].sort_values("cpu_gib")
        assert list(line.get_xdata()) == list(rows.cpu_gib)
        assert list(line.get_ydata()) == pytest.approx(list(rows.combined_hit_ratio))
    assert ax.get_xscale() == "log" and "GiB" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "64", "256"]
    assert fig.legends[0].get_title().get_text() == "tiers"


def test_a_timed_sweep_adds_a_ttft_panel_in_the_same_colours():
    fig = plots.tiers_vs_capacity(_table(ttft=True))
    hit, ttft = fig.axes
    assert ttft.get_ylabel() == "TTFT p50 (s)" and "GiB" in ttft.get_xlabel()
    colours = [[to_hex(line.get_color()) for line in labelled_lines(a)] for a in (hit, ttft)]
    assert colours[0] == colours[1] and len(set(colours[0])) == len(SETS)
    none = labelled_lines(ttft)[0]
    expected = _table(ttft=True).query("tiers == 'none' and status == 'ok'").sort_values("cpu_gib")
    assert list(none.get_ydata()) == pytest.approx(list(expected.median_ttft_ms / 1e3))
    assert len(plots.tiers_vs_capacity(_table(ttft=True), ttft=False).axes) == 1
    with pytest.raises(InputError, match="median_ttft_ms"):
        plots.tiers_vs_capacity(_table(), ttft=True)


def test_another_varying_parameter_sets_the_line_style_not_the_colour():
    fig = plots.tiers_vs_capacity(_table(policies=("arc", "lru")))
    lines = labelled_lines(fig.axes[0])
    assert len(lines) == 2 * len(SETS)
    by_label = {line.get_label(): line for line in lines}
    arc, lru = by_label["none, arc"], by_label["none, lru"]
    assert to_hex(arc.get_color()) == to_hex(lru.get_color())
    assert arc.get_linestyle() != lru.get_linestyle()
    assert to_hex(by_label["fs:capacity=1TiB, arc"].get_color()) != to_hex(arc.get_color())


def test_draws_into_the_callers_axes_and_needs_a_tiers_column():
    fig, (a, b) = plt.subplots(1, 2)
    assert plots.tiers_vs_capacity(_table(ttft=True), ax=[a, b]) is fig
    assert len(labelled_lines(a)) == len(labelled_lines(b)) == len(SETS) and not fig.legends
    with pytest.raises(ValueError, match="2 panels"):
        plots.tiers_vs_capacity(_table(ttft=True), ax=a)
    with pytest.raises(InputError, match="tiers"):
        plots.tiers_vs_capacity(_table().drop(columns="tiers"))


def _sweep_folder(tmp_path, df):
    folder = tmp_path / "sweep"
    folder.mkdir()
    df.to_csv(folder / "results.csv", index=False)
    return folder


def test_cli_picks_the_tier_figure_for_a_tier_sweep(tmp_path, capsys, monkeypatch):
    figs = []

    def keep(fig, out):
        figs.append(fig)
        return [plots.save_as(fig, path, close=False) for path in plots.out_paths(out)]

    monkeypatch.setattr(plots, "save", keep)
    folder = _sweep_folder(tmp_path, _table(ttft=True))
    code, stdout, err = run_main(["plot", folder], capsys)
    assert code == 0, err
    assert stdout.split() == [str(folder / f"tiers-vs-capacity.{e}") for e in ("png", "svg")]
    assert len(figs[0].axes) == 2 and len(labelled_lines(figs[0].axes[0])) == len(SETS)
    code, _, err = run_main(
        [
            "plot",
            folder / "results.csv",
            "--y",
            "secondary_tier_hit_ratio",
            "--out",
            tmp_path / "f.png",
        ],
        capsys,
    )
    assert code == 0, err
    assert list(labelled_lines(figs[1].axes[0])[0].get_ydata()) == [0.0] * len(GIB)  # none: no tier
    code, _, err = run_main(["plot", folder, "--kind", "tiers-vs-capacity", "--by", "x"], capsys)
    assert code == 2 and "--by applies to" in err and len(err.strip().splitlines()) == 1
