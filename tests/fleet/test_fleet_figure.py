"""The fleet figure: load and hit share per instance, and --out writes it."""

from __future__ import annotations

import pandas as pd
import pytest
from support import SAMPLE, run_main

import kvsim
from kvsim.plots import fleet_balance


def test_fleet_balance_draws_both_shares_per_instance() -> None:
    result = kvsim.replay(SAMPLE, cpu_chunks=40, limit=60, instances=3, router="random")
    fig = fleet_balance(result)
    bars = fig.axes[0].patches
    assert len(bars) == 6
    heights = sorted(round(b.get_height(), 9) for b in bars)
    table = result.tables["instances"]
    expected = sorted(round(v, 9) for v in [*table["load_share"], *table["hit_share"]])
    assert heights == expected
    with pytest.raises(kvsim.InputError, match="hit_share"):
        fleet_balance(pd.DataFrame({"instance": [0], "load_share": [1.0]}))


def test_the_legend_sits_above_the_bars_not_on_them() -> None:
    table = pd.DataFrame(
        {"instance": range(8), "load_share": [0.125] * 7 + [0.2], "hit_share": [0.125] * 8}
    )
    fig = fleet_balance(table)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.y0 >= ax.get_window_extent(renderer).y1 - 1  # was inside, over the bars


def test_replay_out_writes_the_fleet_figure(tmp_path, capsys) -> None:
    code, _, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", "40", "--limit", "40", "--instances", "2",
         "--out", tmp_path],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    names = {p.name for p in tmp_path.iterdir()}
    assert {"fleet_balance.png", "fleet_balance.svg", "instances.csv", "requests.csv"} <= names
