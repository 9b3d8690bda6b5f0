"""Issue 28 item 3, last part: ``kvsim plot SWEEP_DIR --kind ttft-cdf`` draws one CDF line
per cell of a timed sweep run with ``--keep-requests``, each named by what varies across the
cells, and says what to do when the sweep kept no tables."""

from __future__ import annotations

import pandas as pd
import pytest
from support import SAMPLE, expect_overload, run_main

import kvsim
from kvsim import plots
from kvsim.core.errors import InputError
from kvsim.report.labels import cell_label
from kvsim.sweeps import read_requests

pytestmark = expect_overload


def _sweep(folder, keep: bool = True, mode: str = "timed") -> pd.DataFrame:
    spec = {
        "mode": mode,
        "traces": [SAMPLE],
        "limit": 12,
        "keep_requests": keep,
        "options": {"cpu_chunks": 64} if mode == "cache" else {},
        "grid": {"policy": ["lru", "arc"]} if mode == "cache" else {"cpu_chunks": [4, 400]},
    }
    return kvsim.sweep(spec, out=folder, executor="serial")


@pytest.fixture(scope="module")
def timed_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timed")
    _sweep(folder)
    return folder


def _lines(ax):
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def test_one_line_per_cell_named_by_what_varies(timed_sweep):
    results = pd.read_parquet(timed_sweep / "results.parquet")
    fig = plots.sweep_ttft_cdf(results, read_requests(timed_sweep, results))
    ax = fig.axes[0]
    assert [ln.get_label() for ln in _lines(ax)] == ["4 chunks", "400 chunks"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["4 chunks", "400 chunks"]
    assert ax.get_title() == "TTFT distribution (CDF) per sweep cell"
    assert ax.get_xlabel() == "time to first token (ms)" and ax.get_xscale() == "log"
    # each line is its cell's own requests: 12 steps up to 1
    for line in _lines(ax):
        assert len(line.get_ydata()) == 12 and line.get_ydata()[-1] == 1.0


def test_the_cli_draws_it_from_the_sweep_folder(timed_sweep, tmp_path, capsys):
    code, out, err = run_main(
        [
            "plot",
            timed_sweep,
            "--kind",
            "ttft-cdf",
            "--style",
            "one-column",
            "--out",
            tmp_path / "f",
        ],
        capsys,
    )
    assert code == 0, err
    assert out.split() == [str(tmp_path / "f.png"), str(tmp_path / "f.svg")]
    assert "4 chunks" in (tmp_path / "f.svg").read_text()
    code, _, err = run_main(["plot", timed_sweep, "--kind", "ttft-cdf", "--by", "policy"], capsys)
    assert code == 2 and "one line per cell" in err


def test_a_sweep_without_the_option_is_one_line_saying_to_rerun_with_it(tmp_path, capsys):
    _sweep(tmp_path, keep=False)
    code, _, err = run_main(["plot", tmp_path, "--kind", "ttft-cdf"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "rerun the sweep with --keep-requests" in err and str(tmp_path) in err


def test_a_cache_sweep_has_no_times_to_draw(tmp_path, capsys):
    _sweep(tmp_path, mode="cache")
    code, _, err = run_main(["plot", tmp_path, "--kind", "ttft-cdf"], capsys)
    assert code == 2 and "needs a timed sweep" in err
    with pytest.raises(InputError, match="needs a timed sweep"):
        results = pd.read_parquet(tmp_path / "results.parquet")
        plots.sweep_ttft_cdf(results, read_requests(tmp_path, results))


def test_a_cells_label_reads_each_parameter_with_its_unit():
    label = cell_label({"cpu_gib": 64.0, "store_threshold": 2, "policy": "lru"})
    assert label == "LRU, 64 GiB, store_threshold=2"
    assert cell_label({"cpu_chunks": 1600, "trace": "traces/a/b.jsonl"}) == "1,600 chunks, b.jsonl"
