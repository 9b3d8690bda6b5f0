"""Issue 28 item 3: a timed sweep's metric against CPU capacity: labels and units from the
metric registry, the baseline as a reference line, y from 0 (or log), colour per policy."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from support import run_main

from kvsim import plots
from kvsim.core.errors import InputError


def _sweep() -> pd.DataFrame:
    rows = []
    for policy, gain in (("lru", 0.8), ("arc", 0.7)):
        for threshold in (0, 2):
            for gib in (16, 64, 256):
                rows.append(
                    {
                        "status": "ok",
                        "policy": policy,
                        "store_threshold": threshold,
                        "cpu_gib": gib,
                        "median_ttft_ms": 900.0 * gain ** (gib / 16) + threshold,
                        "baseline_median_ttft_ms": 1000.0,
                    }
                )
    return pd.DataFrame(rows)


def test_labels_baseline_axis_and_colour_per_policy():
    fig = plots.metric_vs_capacity(_sweep(), "median_ttft_ms")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "median TTFT (ms)" and ax.get_xlabel() == "CPU tier size (GiB)"
    assert ax.get_ylim()[0] == 0 and ax.get_title() == "median TTFT (ms) vs CPU capacity"
    series = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("series:")]
    assert len(series) == 4  # 2 policies x 2 thresholds
    colours = {ln.get_label(): to_hex(ln.get_color()) for ln in series}
    assert colours["LRU, store_threshold=0"] == colours["LRU, store_threshold=2"]
    assert colours["ARC, store_threshold=0"] != colours["LRU, store_threshold=0"]
    (base,) = [ln for ln in ax.get_lines() if ln.get_gid() == "baseline"]
    assert list(base.get_ydata()) == [1000.0, 1000.0]
    assert "no offloading (baseline) 1,000" in [t.get_text() for t in fig.legends[0].get_texts()]
    log = plots.metric_vs_capacity(_sweep(), "median_ttft_ms", log_y=True).axes[0]
    assert log.get_yscale() == "log"
    with pytest.raises(InputError, match="no column 'p99_foo'"):
        plots.metric_vs_capacity(_sweep(), "p99_foo")


def test_cli_hit_vs_capacity_with_a_latency_draws_this_kind(tmp_path, capsys, monkeypatch):
    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, out: figs.append(fig) or [str(out)])
    table = tmp_path / "results.csv"
    _sweep().to_csv(table, index=False)
    code, _, err = run_main(
        [
            "plot",
            table,
            "--kind",
            "hit-vs-capacity",
            "--y",
            "median_ttft_ms",
            "--out",
            tmp_path / "f.png",
        ],
        capsys,
    )
    assert code == 0, err
    assert figs[0].axes[0].get_ylabel() == "median TTFT (ms)"
    code, _, err = run_main(
        ["plot", table, "--kind", "metric-vs-capacity", "--out", tmp_path / "g.png"], capsys
    )
    assert code == 2 and "needs a metric (--y)" in err
