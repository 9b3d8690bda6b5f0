"""Issue 28 items 1 and 4: a sampled miss-ratio curve names its policy and model, draws one
line per policy with estimated points hollow and the asked sizes marked; a figure drawn
into a caller's axes gets kvsim's style and is saved without clipping."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from support import SAMPLE

from kvsim import plots
from kvsim.api import mrc as api_mrc


def _labels(fig) -> list[str]:
    return [
        t.get_text()
        for lg in [*fig.legends, *(a.get_legend() for a in fig.axes)]
        if lg
        for t in lg.get_texts()
    ]


def test_sampled_curve_is_one_line_named_by_its_policy_and_model():
    curve = api_mrc(
        SAMPLE, policy="arc", sample_rate=0.5, points=12, model="llama-3.1-8b", cpu_gib=[1.0]
    )
    fig = plots.mrc(curve)
    ax = fig.axes[0]
    assert ax.get_title().startswith("ARC hit ratio") and "llama-3.1-8b" in ax.get_title()
    curves = [line for line in ax.get_lines() if (line.get_gid() or "").startswith("mrc:")]
    assert [line.get_label() for line in curves] == ["ARC"]  # not one line per sample rate
    assert [line for line in ax.get_lines() if line.get_gid() == "asked_sizes"]
    labels = _labels(fig)
    assert "ARC" in labels and "at the asked --cpu-gib sizes" in labels
    assert not any(lab.replace(".", "").isdigit() for lab in labels)  # no raw sample rates
    assert set(curve.table["policy"]) == {"arc"} and curve.table["exact"].dtype == bool


def test_a_table_of_two_policies_draws_two_lines_and_says_exact_from_estimate():
    caps = np.array([1, 10, 100, 1000])
    rows = [
        pd.DataFrame(
            {
                "capacity": caps,
                "hit_ratio": [0.0, 0.1, 0.2, 0.3],
                "policy": "lru",
                "exact": True,
                "sample_rate": 1.0,
            }
        ),
        pd.DataFrame(
            {
                "capacity": caps,
                "hit_ratio": [0.0, 0.12, 0.22, 0.3],
                "policy": "arc",
                "exact": [True, False, False, False],
                "sample_rate": [1.0, 0.3, 0.3, 0.1],
            }
        ),
    ]
    fig = plots.mrc(pd.concat(rows))
    ax = fig.axes[0]
    (hollow,) = [line for line in ax.get_lines() if line.get_gid() == "estimate:arc"]
    assert hollow.get_markerfacecolor() == "none" and len(hollow.get_xdata()) == 3
    curves = [
        line.get_label() for line in ax.get_lines() if (line.get_gid() or "").startswith("mrc:")
    ]
    assert curves == ["ARC", "LRU"]
    assert ax.get_title() == "ARC, LRU hit ratio vs CPU capacity"
    labels = _labels(fig)
    assert "exact (a full replay)" in labels and "estimate (sampled)" in labels
    assert len(labels) == 4


def test_callers_axes_get_the_style_and_the_file_keeps_every_label(tmp_path):
    fig, (left, right) = plt.subplots(1, 2, figsize=(2.0, 1.2))  # no layout engine: crowded
    curve = pd.DataFrame({"capacity": [1, 10, 100], "hit_ratio": [0.0, 0.1, 0.2]})
    out = plots.mrc(curve, ax=left, preset="one-column")
    assert out is fig
    p = plots.PRESETS["one-column"]
    assert not left.spines["top"].get_visible() and not left.spines["right"].get_visible()
    assert left.xaxis.label.get_size() == pytest.approx(p.font_pt)
    assert right.spines["top"].get_visible()  # axes kvsim did not draw into are left alone
    path = plots.save_as(fig, tmp_path / "f.png", close=False)
    tight = fig.get_tightbbox(fig.canvas.get_renderer())
    width, height = Image.open(path).size
    # the saved image holds the tight box (labels that overflow the figure are not cut)
    assert width >= tight.width * plots.style.SAVE_DPI - 2
    assert height >= tight.height * plots.style.SAVE_DPI - 2
    assert (width, height) != (round(2.0 * plots.style.SAVE_DPI), round(1.2 * plots.style.SAVE_DPI))
    plt.close(fig)
