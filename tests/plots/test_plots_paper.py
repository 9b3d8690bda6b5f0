"""Figures fit for a paper: lines split only by parameters, colour = policy, line style =
admission, markers, reference lines; occupancy (not vLLM's pinned gauge) over time;
TTFT CDFs against the baseline; every function draws into ``ax=``; PNG/PDF/SVG; presets
whose text stays >= 7 pt at column width. Checked on the artists, not on pixels."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Text
from support import SAMPLE, labelled_lines, run_main

from kvsim import plots
from kvsim.cli.cmd_plot import KINDS, STYLES
from kvsim.core.errors import InputError
from kvsim.report.result import RUN_MARKER

POLICIES = ("arc", "lru", "s3fifo")
CAPACITIES = (100, 400, 1600, 6400)


def _wide_table() -> pd.DataFrame:
    """A sweep-like table with no ``requests`` column and 30 metric columns, each varying per
    row: what drew one legend entry per row before."""
    rng = np.random.default_rng(1)
    rows = []
    for policy in POLICIES:
        for threshold in (0, 2):
            for cap in CAPACITIES:
                row = {
                    "policy": policy,
                    "store_threshold": threshold,
                    "admission": "threshold" if threshold else "always",
                    "cpu_chunks": cap,
                    "trace": "traces/t.jsonl",
                    "combined_hit_ratio": 0.05 * np.log10(cap) - 0.01 * threshold,
                    "tier": f"fused-{policy}",
                }
                row.update({f"metric_{i}": rng.random() for i in range(30)})
                row["bytes_loaded"] = int(rng.integers(1, 10**9))
                rows.append(row)
    return pd.DataFrame(rows)


def _tiers_table() -> pd.DataFrame:
    """A ``kvsim sweep --tier-set`` table: CPU GiB x tier sets, the hit ratio rising with both."""
    sets = ("none", "fs:capacity=1TiB", "fs:capacity=2TiB")
    return pd.DataFrame(
        [
            {"cpu_gib": gib, "tiers": t, "combined_hit_ratio": 0.05 * i + 0.01 * np.log2(gib)}
            for i, t in enumerate(sets)
            for gib in (16, 64, 256)
        ]
    )


def _legend_texts(fig):
    legends = list(fig.legends) + [a.get_legend() for a in fig.axes if a.get_legend()]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


# --------------------------------------------------------------------------- capacity curves


def test_lines_split_by_parameters_never_metrics():
    df = _wide_table()
    assert plots.series_columns(df, "cpu_chunks") == ["policy", "admission"]
    fig = plots.hit_vs_capacity(df)
    groups = df.groupby(["policy", "admission"]).ngroups
    assert groups == 6 and len(_legend_texts(fig)) == groups
    assert sorted(_legend_texts(fig)) == sorted(
        f"{p}, {a}" for p in POLICIES for a in ("always", "threshold")
    )
    assert fig.legends[0].get_title().get_text() == "policy, admission"


def test_colour_and_marker_follow_policy_line_style_follows_admission():
    fig = plots.hit_vs_capacity(_wide_table())
    lines = {tuple(line.get_label().split(", ")): line for line in labelled_lines(fig.axes[0])}
    assert len(lines) == 6
    for policy in POLICIES:
        a, t = lines[(policy, "always")], lines[(policy, "threshold")]
        assert to_hex(a.get_color()) == to_hex(t.get_color())
        assert a.get_marker() == t.get_marker() and a.get_marker() not in ("None", "", None)
        assert a.get_linestyle() == "-" and t.get_linestyle() == "--"
        assert len(a.get_xdata()) == len(CAPACITIES)
    colours = {to_hex(lines[(p, "always")].get_color()) for p in POLICIES}
    markers = {lines[(p, "always")].get_marker() for p in POLICIES}
    assert len(colours) == len(markers) == len(POLICIES)  # greyscale: markers tell them apart


def test_redundant_parameter_is_left_out_but_a_refining_one_is_kept():
    df = _wide_table()
    assert "store_threshold" not in plots.series_columns(df, "cpu_chunks")
    more = df.copy()
    more.loc[(more["store_threshold"] == 2) & (more["cpu_chunks"] > 400), "store_threshold"] = 3
    assert plots.series_columns(more, "cpu_chunks") == ["policy", "admission", "store_threshold"]


def test_reference_lines_and_belady_rows():
    df = _wide_table()
    belady = df[df["policy"] == "lru"].assign(policy="belady", combined_hit_ratio=0.3)
    fig = plots.hit_vs_capacity(pd.concat([df, belady]), ceiling=0.42, baseline=0.02)
    ax = fig.axes[0]
    by_gid = {}
    for line in ax.get_lines():
        by_gid.setdefault(line.get_gid(), []).append(line)
    assert [float(v) for v in by_gid["ceiling"][0].get_ydata()] == [0.42, 0.42]
    assert "ceiling" in by_gid["ceiling"][0].get_label()
    assert [float(v) for v in by_gid["baseline"][0].get_ydata()] == [0.02, 0.02]
    assert "baseline" in by_gid["baseline"][0].get_label()
    assert len(by_gid["belady"]) == 2  # one per admission rule, black, its own marker
    for line in by_gid["belady"]:
        assert to_hex(line.get_color()) == "#000000" and "Belady" in line.get_label()
    assert ax.get_ylim()[1] > 0.42  # the ceiling is inside the axes
    assert len(_legend_texts(fig)) == 6 + 2 + 2


def test_belady_table_drawn_on_an_mrc_in_its_units():
    curve = pd.DataFrame({"capacity": [1, 10, 100, 1000], "hit_ratio": [0.0, 0.1, 0.2, 0.3]})
    sweep = _wide_table()
    sweep.loc[sweep["policy"] == "lru", "policy"] = "belady"  # other policies' rows are left out
    fig = plots.mrc(curve, belady=sweep, ceiling=0.35)
    belady = [line for line in fig.axes[0].get_lines() if line.get_gid() == "belady"]
    assert len(belady) == 2  # the table's two admission rules
    assert list(belady[0].get_xdata()) == list(CAPACITIES)  # cpu_chunks read as chunks
    with pytest.raises(InputError, match="Belady"):
        plots.mrc(curve.assign(cpu_gib=curve["capacity"] / 16.0), belady=sweep)


def test_mrc_table_is_one_line_in_gib_when_the_table_has_gib():
    caps = np.unique(np.geomspace(1, 150_000, 366).astype(int))
    curve = pd.DataFrame(
        {"capacity": caps, "hit_ratio": np.linspace(0, 0.38, len(caps)), "miss_ratio": 0.5}
    )
    fig = plots.mrc(curve, exact_from=64)
    ax = fig.axes[0]
    assert len(labelled_lines(ax)) == 2 and ax.get_xscale() == "log"  # the curve and "exact from"
    assert "chunks" in ax.get_xlabel()
    gib = curve.assign(cpu_gib=curve["capacity"] * 0.0625)  # 64 MiB chunks
    fig = plots.mrc(gib, exact_from=64, ceiling=0.4)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "CPU tier size (GiB)"
    (curve_line,) = [line for line in ax.get_lines() if line.get_label() == "LRU"]
    assert curve_line.get_xdata()[-1] == pytest.approx(caps[-1] * 0.0625)
    assert curve_line.get_drawstyle() == "steps-post"
    (marks,) = [line for line in ax.get_lines() if line.get_gid() == "exact:lru"]
    assert 0 < len(marks.get_xdata()) <= 2 * plots.style.DENSE_POINTS  # markers thinned
    (exact,) = [line for line in ax.get_lines() if line.get_gid() == "exact_from"]
    assert exact.get_xdata()[0] == pytest.approx(64 * 0.0625)
    assert ax.get_ylim()[1] == pytest.approx(0.4 * 1.1)  # the ceiling, not the marker's 0..1
    assert "chunks" in plots.mrc(gib, x="chunks").axes[0].get_xlabel()


def test_too_many_explicit_lines_is_an_input_error():
    df = _wide_table()
    df = pd.concat([df, df.assign(metric_0=df["metric_0"] + 1)])  # 48 distinct values
    with pytest.raises(InputError, match="48 lines"):
        plots.hit_vs_capacity(df, by=["metric_0"])


# --------------------------------------------------------------------------- usage over time


def _steps(n: int = 400) -> pd.DataFrame:
    t = np.linspace(0.0, 100.0, n)
    resident = np.minimum(np.arange(n) * 10, 1024)
    return pd.DataFrame(
        {
            "step": np.arange(n),
            "end_s": t,
            "gpu_kv_usage": np.linspace(0, 1, n),
            "cpu_cache_usage_perc": np.where(np.arange(n) % 7 == 0, 0.05, 0.0),
            "cpu_resident_chunks": resident,
        }
    )


def test_usage_timeline_plots_occupancy_and_keeps_the_gauge_apart():
    steps = _steps()
    fig = plots.usage_timeline(steps, cpu_chunks=1024)
    _, cpu_ax, gauge_ax = fig.axes
    (occupancy,) = [line for line in cpu_ax.get_lines() if line.get_gid() == "cpu_occupancy"]
    assert np.allclose(occupancy.get_ydata(), steps["cpu_resident_chunks"] / 1024)
    assert occupancy.get_ydata()[-1] == 1.0  # the tier is full ...
    (gauge,) = gauge_ax.get_lines()
    assert gauge.get_gid() == "cpu_cache_usage_perc"
    assert float(np.max(gauge.get_ydata())) == pytest.approx(0.05)  # ... while the gauge is low
    assert gauge_ax is not cpu_ax and gauge_ax.get_ylim()[1] < 0.1
    assert "pinned" in gauge.get_label() and "occupancy" in occupancy.get_label()
    assert cpu_ax.get_ylabel() == "CPU used (fraction)" and "gauge" in gauge_ax.get_ylabel()
    texts = _legend_texts(fig)
    assert len(texts) == 3 and any("cpu_cache_usage_perc" in t for t in texts)


def test_usage_timeline_without_capacity_draws_chunks_not_a_fraction():
    fig = plots.usage_timeline(_steps())
    cpu_ax = fig.axes[1]
    assert cpu_ax.get_ylabel() == "CPU (chunks)"
    assert max(cpu_ax.get_lines()[0].get_ydata()) == 1024


def test_resampling_caps_points_keeps_peaks_and_is_deterministic():
    n = 50_000
    steps = _steps(n)
    steps.loc[12_345, "cpu_cache_usage_perc"] = 0.9  # one short spike
    fig = plots.usage_timeline(steps, cpu_chunks=1024, max_points=500)
    for ax in fig.axes:
        for line in ax.get_lines():
            assert len(line.get_xdata()) <= 500
    t, mean, low, high = plots.resample(steps["end_s"], steps["cpu_cache_usage_perc"], 500)
    assert len(t) <= 500 and high.max() == 0.9 and mean.max() < 0.9
    assert np.all(low <= mean) and np.all(mean <= high)
    again = plots.resample(steps["end_s"], steps["cpu_cache_usage_perc"], 500)
    assert all(np.array_equal(a, b) for a, b in zip((t, mean, low, high), again))
    short = plots.resample(np.arange(10.0), np.arange(10.0), 500)
    assert np.array_equal(short[1], np.arange(10.0))  # short series are drawn as they are
    bands = [c for c in fig.axes[1].collections]
    assert bands  # the min-max band of each resampled series


# --------------------------------------------------------------------------- TTFT


def _requests(scale: float, n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request": range(n), "ttft_s": rng.lognormal(np.log(scale), 1.0, n)})


def test_ttft_cdf_baseline_log_x_and_quantile_marks():
    req, base = _requests(0.1), _requests(0.3, seed=1)
    fig = plots.ttft_cdf(req, baseline=base)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [line.get_label() for line in labelled_lines(ax)]
    assert labels == ["offloading", "no offloading (baseline)"]
    for q, gid in ((0.5, "p50"), (0.99, "p99")):
        marks = [line for line in ax.get_lines() if line.get_gid() == gid]
        assert len(marks) == 2  # one per line
        want = sorted(
            np.quantile(df["ttft_s"] * 1000, q, method="inverted_cdf") for df in (req, base)
        )
        assert sorted(float(m.get_xdata()[0]) for m in marks) == pytest.approx(want)
        assert all(float(m.get_ydata()[0]) == q for m in marks)
    assert {"p50", "p99"} <= {t.get_text() for t in ax.texts}


# --------------------------------------------------------------------------- ax= and presets


@functools.cache
def _stats():
    """Read-only, so shared by every test that draws it."""
    from kvsim.traces.stats import trace_stats

    return trace_stats(SAMPLE, limit=40)


def _transfers() -> pd.DataFrame:
    start = np.arange(0, 5, 0.25)
    return pd.DataFrame(
        {
            "direction": ["load", "store"] * 10,
            "bytes": np.full(20, 64 * 2**20),
            "start_s": start,
            "end_s": start + 0.01,
        }
    )


_MRC = pd.DataFrame({"capacity": [1, 10, 100, 1000], "hit_ratio": [0.0, 0.1, 0.2, 0.3]})


#: (name, call, panels): every public figure function
def _instances() -> pd.DataFrame:
    return pd.DataFrame(
        {"instance": [0, 1, 2], "load_share": [0.3, 0.3, 0.4], "hit_share": [0.2, 0.5, 0.3]}
    )


def _sweep_cells() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A timed sweep's results (two cells) and its cells' requests tables as one."""
    results = pd.DataFrame(
        {"cell_id": ["a", "b"], "status": "ok", "mode": "timed", "policy": ["lru", "arc"]}
    )
    requests = pd.concat(
        [_requests(0.1).assign(cell_id="a"), _requests(0.2, seed=2).assign(cell_id="b")]
    )
    return results, requests


FIGURES = [
    ("hit_vs_capacity", lambda **k: plots.hit_vs_capacity(_wide_table(), **k), 1),
    (
        "metric_vs_capacity",
        lambda **k: plots.metric_vs_capacity(_wide_table(), "combined_hit_ratio", **k),
        1,
    ),
    ("mrc", lambda **k: plots.mrc(_MRC, ceiling=0.4, **k), 1),
    ("tiers_vs_capacity", lambda **k: plots.tiers_vs_capacity(_tiers_table(), **k), 1),
    ("ttft_cdf", lambda **k: plots.ttft_cdf(_requests(0.1), baseline=_requests(0.2), **k), 1),
    ("sweep_ttft_cdf", lambda **k: plots.sweep_ttft_cdf(*_sweep_cells(), **k), 1),
    ("usage_timeline", lambda **k: plots.usage_timeline(_steps(), cpu_chunks=1024, **k), 2),
    ("transfers", lambda **k: plots.transfers(_transfers(), **k), 2),
    ("transfer_bandwidth", lambda **k: plots.transfer_bandwidth(_transfers(), **k), 1),
    ("transfer_durations", lambda **k: plots.transfer_durations(_transfers(), **k), 1),
    ("token_lengths", lambda **k: plots.token_lengths(_stats(), **k), 2),
    ("reuse_cdfs", lambda **k: plots.reuse_cdfs(_stats(), **k), 2),
    ("block_popularity", lambda **k: plots.block_popularity(_stats(), **k), 1),
    ("arrival_rate", lambda **k: plots.arrival_rate(_stats(), **k), 1),
    ("fleet_balance", lambda **k: plots.fleet_balance(_instances(), **k), 1),
]


def test_every_public_figure_function_is_covered():
    public = {n for n in plots.__all__ if callable(getattr(plots, n))}
    helpers = {"parameter_names", "series_columns", "resample", "save", "save_as", "save_all"}
    wrappers = {"Preset", "out_paths", "mrc_curve", "mrc_title", "trace_figures"}
    assert public - helpers - wrappers - {"plt"} == {name for name, _, _ in FIGURES}


@pytest.mark.parametrize("name, draw, n", FIGURES, ids=[f[0] for f in FIGURES])
def test_every_function_draws_into_the_given_axes(name, draw, n):
    fig, axes = plt.subplots(1, n, figsize=(8, 3))
    given = list(np.atleast_1d(axes))
    out = draw(ax=given[0] if n == 1 else given)
    assert out is fig and len([a for a in fig.axes if a not in given]) <= 1  # a twin at most
    for a in given:
        assert a.lines or a.collections or a.patches, f"{name} left an axes empty"
    assert not fig.legends  # a caller's figure keeps its own layout; legends stay in the axes


def test_usage_timeline_overlays_on_one_axes():
    _, ax = plt.subplots()
    plots.usage_timeline(_steps(), cpu_chunks=1024, ax=ax)
    assert {line.get_gid() for line in ax.get_lines()} >= {"gpu_kv_usage", "cpu_occupancy"}
    assert ax.get_ylabel() == "cache used (fraction)"
    with pytest.raises(ValueError, match="2 panels"):
        plots.transfers(_transfers(), ax=ax)  # type: ignore[arg-type]


def _text_sizes(fig) -> list[tuple[str, float]]:
    fig.canvas.draw()
    return [
        (t.get_text(), t.get_fontsize())
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip()
    ]


@pytest.mark.parametrize("preset", sorted(plots.PRESETS))
@pytest.mark.parametrize("name, draw, n", FIGURES, ids=[f[0] for f in FIGURES])
def test_presets_keep_width_and_fonts_of_at_least_7pt(preset, name, draw, n):
    fig = draw(preset=preset)
    width = plots.PRESETS[preset].width_in
    assert fig.get_size_inches()[0] == pytest.approx(width)
    sizes = _text_sizes(fig)
    assert sizes and min(s for _, s in sizes) >= plots.MIN_FONT_PT, sizes


def test_preset_widths_and_cli_names():
    assert plots.PRESETS["one-column"].width_in == pytest.approx(3.3, abs=0.2)
    assert plots.PRESETS["two-column"].width_in == pytest.approx(7.0, abs=0.3)
    assert set(STYLES) == set(plots.PRESETS)


# --------------------------------------------------------------------------- files


def _pdf_width_pt(data: bytes) -> float:
    box = re.search(rb"/MediaBox \[ *([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+) *\]", data)
    assert box
    return float(box.group(3)) - float(box.group(1))


def test_png_pdf_svg_written_at_the_preset_width(tmp_path):
    from PIL import Image

    fig = plots.mrc(_MRC, preset="one-column")
    paths = [plots.save_as(fig, tmp_path / f"m.{ext}", close=False) for ext in ("png", "pdf")]
    paths.append(plots.save_as(fig, tmp_path / "m.svg"))
    png, pdf, svg = (Path(p).read_bytes() for p in paths)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and pdf[:5] == b"%PDF-" and b"<svg" in svg
    assert Image.open(paths[0]).size[0] == round(3.3 * 300)
    assert _pdf_width_pt(pdf) == pytest.approx(3.3 * 72, abs=0.5)
    assert b'width="237.6pt"' in svg
    assert b"/Type3" not in pdf  # TrueType fonts, as venues ask
    fresh = [
        plots.save_as(plots.mrc(_MRC, preset="one-column"), tmp_path / f"{i}.svg") for i in (1, 2)
    ]
    assert Path(fresh[0]).read_bytes() == Path(fresh[1]).read_bytes()  # the same figure, same bytes


def test_bad_extension_is_an_input_error(tmp_path):
    fig = plots.mrc(_MRC)
    with pytest.raises(InputError, match=r"\.jpg"):
        plots.save_as(fig, tmp_path / "m.jpg")
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- CLI


def _run_folder(tmp_path, steps=True):
    """A ``simulate --out``-style folder: requests (+ baseline), steps, summary, marker."""
    run = tmp_path / "run"
    run.mkdir()
    _requests(0.1).to_parquet(run / "requests.parquet")
    _requests(0.3, seed=2).to_csv(run / "baseline_requests.csv", index=False)
    if steps:
        _steps().to_parquet(run / "steps.parquet")
    (run / "summary.json").write_text(json.dumps({"cpu_chunks": 1024}))
    (run / RUN_MARKER).write_text(json.dumps({"complete": True}))
    return run


@pytest.fixture
def captured(monkeypatch):
    """The figures ``kvsim plot`` saves, kept open for the test to look at."""
    figs = []

    def keep(fig, out):
        figs.append(fig)
        return [plots.save_as(fig, path, close=False) for path in plots.out_paths(out)]

    monkeypatch.setattr(plots, "save", keep)
    return figs


def test_cli_mrc_csv_one_line_and_style(tmp_path, capsys, captured):
    mrc = tmp_path / "mrc.csv"
    caps = np.unique(np.geomspace(1, 150_000, 366).astype(int))
    pd.DataFrame(
        {"capacity": caps, "hit_ratio": np.linspace(0, 0.38, len(caps)), "miss_ratio": 0.1}
    ).to_csv(mrc, index=False)
    out = tmp_path / "fig.pdf"
    code, stdout, _ = run_main(
        ["plot", mrc, "--out", out, "--style", "one-column", "--ceiling", "0.4"], capsys
    )
    assert code == 0 and stdout.split() == [str(out)] and out.read_bytes()[:5] == b"%PDF-"
    (fig,) = captured
    assert fig.get_size_inches()[0] == pytest.approx(3.3)
    assert len(_legend_texts(fig)) == 2  # the curve and the ceiling, not 366 rows


def test_cli_wide_table_legend_counts_groups(tmp_path, capsys, captured):
    table = tmp_path / "results.csv"
    _wide_table().to_csv(table, index=False)
    code, _, err = run_main(["plot", table, "--out", tmp_path / "f.svg"], capsys)
    assert code == 0, err
    assert len(_legend_texts(captured[0])) == 6


def test_cli_ttft_cdf_overlays_the_folders_baseline(tmp_path, capsys, captured):
    run = _run_folder(tmp_path)
    code, stdout, err = run_main(["plot", run, "--kind", "ttft-cdf"], capsys)
    assert code == 0, err
    assert stdout.split() == [str(run / "ttft-cdf.png"), str(run / "ttft-cdf.svg")]
    labels = [line.get_label() for line in labelled_lines(captured[0].axes[0])]
    assert labels == ["offloading", "no offloading (baseline)"]
    # the requests file alone finds its sibling too
    code, _, _ = run_main(["plot", run / "requests.parquet", "--out", tmp_path / "t.png"], capsys)
    assert code == 0 and len(labelled_lines(captured[1].axes[0])) == 2


def test_cli_usage_timeline_reads_the_capacity_from_the_summary(tmp_path, capsys, captured):
    run = _run_folder(tmp_path)
    code, _, err = run_main(["plot", run, "--kind", "usage-timeline", "--max-points", "50"], capsys)
    assert code == 0, err
    cpu = captured[0].axes[1]
    (occ,) = [line for line in cpu.get_lines() if line.get_gid() == "cpu_occupancy"]
    assert max(occ.get_ydata()) == 1.0 and len(occ.get_xdata()) <= 50
    code, _, _ = run_main(
        ["plot", run, "--kind", "usage-timeline", "--cpu-chunks", "2048", "--out", tmp_path / "u"],
        capsys,
    )
    (occ,) = [line for line in captured[1].axes[1].get_lines() if line.get_gid() == "cpu_occupancy"]
    assert code == 0 and max(occ.get_ydata()) == 0.5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kind", "ttft-cdf", "--out", "{tmp}/f.jpg"], "cannot write a .jpg figure"),
        (["--kind", "ttft-cdf", "--baseline", "0.3"], "--baseline applies to"),
        (["--kind", "ttft-cdf", "--max-points", "9"], "--max-points applies to"),
        (["--kind", "usage-timeline", "--ceiling", "0.3"], "--ceiling applies to"),
        ([], "give --kind"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    run = _run_folder(tmp_path)
    argv = ["plot", run, *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    code, _, err = run_main(argv, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("f.*"))


def test_cli_kinds_cover_every_table():
    assert set(KINDS) == {
        "hit-vs-capacity",
        "metric-vs-capacity",
        "tiers-vs-capacity",
        "mrc",
        "ttft-cdf",
        "usage-timeline",
        "transfers",
    }


def test_kvsim_mrc_plot_uses_the_shared_style(tmp_path, capsys):
    out = tmp_path / "mrc.pdf"
    code, _, err = run_main(["mrc", SAMPLE, "--limit", "30", "--plot", out], capsys)
    assert code == 0, err
    assert _pdf_width_pt(out.read_bytes()) == pytest.approx(
        plots.PRESETS[plots.DEFAULT_PRESET].width_in * 72, abs=0.5
    )
    code, _, err = run_main(["mrc", SAMPLE, "--limit", "30", "--plot", tmp_path / "m.gif"], capsys)
    assert code == 2 and "--plot" in err and ".gif" in err
