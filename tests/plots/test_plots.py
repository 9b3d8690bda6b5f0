"""Every figure kind is drawn from small DataFrames into non-empty PNG and SVG files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from support import SAMPLE, expect_overload

from kvsim import plots
from kvsim.cli import cli
from kvsim.core.errors import InputError
from kvsim.traces.stats import trace_stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_files(paths):
    assert [p.rsplit(".", 1)[1] for p in paths] == ["png", "svg"]
    with open(paths[0], "rb") as f:
        assert f.read(8) == PNG_MAGIC
    with open(paths[1]) as f:
        svg = f.read()
    assert "<svg" in svg and len(svg) > 2000


def _sweep_table() -> pd.DataFrame:
    rows = []
    for i, (policy, cap) in enumerate((p, c) for p in ("lru", "arc") for c in (10, 100, 1000)):
        rows.append(
            {
                "cell": i,
                "cell_id": f"id{i}",
                "status": "ok",
                "error": None,
                "elapsed_s": 0.1,
                "trace": "t.jsonl",
                "mode": "cache",
                "limit": None,
                "model": "m",
                "policy": policy,
                "cpu_chunks": cap,
                "requests": 10,
                "combined_hit_ratio": 0.1 * np.log10(cap) + (0.05 if policy == "arc" else 0),
            }
        )
    rows.append(
        {
            **rows[0],
            "cell": 6,
            "cell_id": "id6",
            "status": "error",
            "error": "boom",
            "policy": "bad",
            "combined_hit_ratio": None,
        }
    )
    return pd.DataFrame(rows)


def _requests() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {"request": range(200), "ttft_s": rng.exponential(0.2, 200), "policy": ["lru", "arc"] * 100}
    )


def _steps() -> pd.DataFrame:
    t = np.linspace(0, 10, 50)
    return pd.DataFrame(
        {
            "time_s": t,
            "gpu_usage": np.clip(t / 10, 0, 1),
            "cpu_usage": np.clip(t / 20, 0, 1),
            "running": 3,
        }
    )


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


def test_hit_vs_capacity_lines_per_policy(tmp_path):
    fig = plots.hit_vs_capacity(_sweep_table())
    ax = fig.axes[0]
    labels = sorted(line.get_label() for line in ax.get_lines())
    assert labels == ["arc", "lru"]  # failed cell left out, constant columns ignored
    assert fig.legends[0].get_title().get_text() == "policy"  # the values' column
    assert ax.get_xscale() == "log" and "chunks" in ax.get_xlabel() and ax.get_title()
    _check_files(plots.save(fig, tmp_path / "hit"))


@pytest.mark.parametrize(
    "make, draw",
    [
        (_requests, lambda df: plots.ttft_cdf(df, by="policy")),
        (_requests, plots.ttft_cdf),
        (_steps, plots.usage_timeline),
        (_transfers, plots.transfers),
    ],
)
def test_timed_kinds(tmp_path, make, draw):
    fig = draw(make())
    assert fig.axes[-1].get_xlabel() and all(ax.get_ylabel() for ax in fig.axes)
    _check_files(plots.save(fig, tmp_path / "fig"))


def test_usage_timeline_with_count_columns():
    steps = pd.DataFrame(
        {"time_s": [0.0, 1.0, 2.0], "gpu_used_blocks": [1, 5, 3], "cpu_used_chunks": [0, 2, 4]}
    )
    fig = plots.usage_timeline(steps)
    assert len(fig.axes) == 2 and "GPU" in fig.axes[0].get_ylabel()


def test_transfer_bandwidth_conserves_bytes():
    fig = plots.transfers(_transfers(), bins=10)
    top = fig.axes[0]
    width = 4.76 / 10
    for line in top.get_lines():
        gbps = np.asarray(line.get_ydata())
        assert (gbps * width * 1e9).sum() == pytest.approx(10 * 64 * 2**20, rel=1e-6)


def test_missing_columns_are_input_errors():
    with pytest.raises(InputError, match="ttft_s"):
        plots.ttft_cdf(pd.DataFrame({"x": [1]}))
    with pytest.raises(InputError, match="direction"):
        plots.transfers(pd.DataFrame({"bytes": [1]}))
    with pytest.raises(InputError, match="capacity column"):
        plots.hit_vs_capacity(pd.DataFrame({"combined_hit_ratio": [0.1]}))


def test_trace_figures(tmp_path):
    st = trace_stats(SAMPLE, limit=60)
    paths = plots.save_all(plots.trace_figures(st), tmp_path)
    assert len(paths) == 8 and all((tmp_path / p).stat().st_size > 1000 for p in paths)


def test_cli_reads_files_and_folders(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _requests().to_parquet(run / "requests.parquet")
    _steps().to_parquet(run / "steps.parquet")
    _transfers().to_csv(run / "transfers.csv", index=False)
    _sweep_table().to_csv(tmp_path / "results.csv", index=False)
    runner = CliRunner()
    for args in (
        ["plot", str(run), "--kind", "ttft-cdf", "--by", "policy"],
        ["plot", str(run), "--kind", "usage-timeline"],
        ["plot", str(run), "--kind", "transfers", "--out", str(tmp_path / "tx")],
        ["plot", str(tmp_path / "results.csv"), "--kind", "hit-vs-capacity"],
    ):
        res = runner.invoke(cli, args)
        assert res.exit_code == 0, res.output
        for path in res.output.split():
            _check_files([path, path[:-3] + "svg"]) if path.endswith("png") else None
    assert (run / "ttft-cdf.png").exists() and (tmp_path / "tx.svg").exists()
    assert (tmp_path / "hit-vs-capacity.png").exists()
    res = runner.invoke(cli, ["plot", str(run), "--kind", "hit-vs-capacity"])
    assert res.exit_code != 0 and "results.parquet" in str(res.exception or res.output)


@expect_overload
def test_real_timed_tables():
    """The tables kvsim.simulate returns plot as they are."""
    simulate = pytest.importorskip("kvsim.api").simulate
    r = simulate(SAMPLE, limit=30, cpu_chunks=100)
    for fig in (
        plots.ttft_cdf(r.requests),
        plots.usage_timeline(r.steps),
        plots.transfers(r.transfers),
    ):
        assert fig.axes and fig.axes[-1].get_xlabel()
        plots.plt.close(fig)


def test_a_result_or_an_mrc_where_a_table_belongs_is_named():
    """``plots.ttft_cdf(run)`` reached ``.columns`` on the Result (an AttributeError deep
    inside); now one line says which table to pass. An empty steps table (record_steps
    off) is said so, not drawn as blank axes."""
    import kvsim

    run = kvsim.simulate(SAMPLE, cpu_gib=8, limit=5)
    for draw in (plots.ttft_cdf, plots.usage_timeline, plots.transfers, plots.mrc):
        with pytest.raises(InputError, match=r"takes a table .* as result\.NAME \(requests"):
            draw(run)
    with pytest.raises(InputError, match=r"this object's \.table, got a MRC"):
        plots.hit_vs_capacity(kvsim.mrc(SAMPLE, limit=20))
    with pytest.raises(InputError, match="fleet-balance: takes a fleet's result"):
        plots.fleet_balance(run)
    quiet = kvsim.simulate(SAMPLE, cpu_gib=8, limit=5, record_steps=False)
    with pytest.raises(InputError, match="steps table is empty"):
        plots.usage_timeline(quiet.steps)
