"""trace_stats against values computed by hand on tiny traces, and against replay."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from support import SAMPLE

import kvsim
from kvsim.cli import cli
from kvsim.traces import Request, Trace
from kvsim.traces.stats import trace_stats


def _tiny() -> Trace:
    # 4-token blocks. Access order: 1 2 | 1 2 | 1 4 5 | 1 2  (R1's 3rd id is a partial block)
    reqs = [
        Request(0, 0.0, 8, 10, (1, 2)),
        Request(1, 1.0, 10, 20, (1, 2, 3)),
        Request(2, 3.0, 12, 30, (1, 4, 5)),
        Request(3, 6.0, 8, 40, (1, 2)),
    ]
    return Trace.from_requests(reqs, 4)


def test_hand_computed_summary():
    s = trace_stats(_tiny(), bin_s=2).summary
    assert s["requests"] == 4
    assert s["blocks"] == 9  # 2 + 2 + 3 + 2 complete blocks
    assert s["unique_blocks"] == 4
    assert s["infinite_cache_hit_blocks"] == 5  # 0 + 2 + 1 + 2
    assert s["infinite_cache_hit_ratio"] == pytest.approx(5 / 9)
    assert s["reuses"] == 5
    assert s["prompt_tokens"] == 38 and s["output_tokens"] == 100
    assert s["duration_s"] == 6.0 and s["mean_rate_rps"] == pytest.approx(0.5)
    # block 1 has 3 reuses out of 5; the top 1% and 10% of 4 blocks is that one block
    assert s["reuse_share_top1pct"] == pytest.approx(0.6)
    assert s["reuse_share_top10pct"] == pytest.approx(0.6)
    assert s["peak_rate_rps"] == pytest.approx(1.0)


def test_hand_computed_reuse_distances_and_times():
    st = trace_stats(_tiny(), bin_s=2)
    r = st.reuses
    assert r["block"].tolist() == [1, 2, 1, 1, 2]
    assert r["distance"].tolist() == [1, 1, 1, 2, 3]
    assert r["time_s"].tolist() == pytest.approx([1.0, 1.0, 2.0, 3.0, 5.0])
    assert st.requests["hit_blocks"].tolist() == [0, 2, 1, 2]
    assert st.popularity[["block", "accesses"]].values.tolist() == [[1, 4], [2, 3], [4, 1], [5, 1]]
    assert st.arrivals["requests"].tolist() == [2, 1, 0, 1]
    assert st.arrivals["rate_rps"].tolist() == pytest.approx([1.0, 0.5, 0.0, 0.5])
    assert st.arrivals["width_s"].tolist() == pytest.approx([2.0, 2.0, 2.0, 0.0])  # ends at 6 s


def test_a_trace_out_of_time_order_is_read_in_file_order_and_said():
    backwards = Trace.from_requests(
        [Request(0, 10.0, 8, 5, (1, 2)), Request(1, 0.0, 8, 5, (1, 2))], 4
    )
    with pytest.warns(kvsim.InputWarning, match="1 request.s. arrive earlier .* negative"):
        st = trace_stats(backwards)
    assert st.reuses["time_s"].tolist() == [-10.0, -10.0]  # the file's order, as replay's


@pytest.mark.parametrize("option", [{"tp": 2}, {"kv_cache_dtype": "fp8"}, {"gpu_block_tokens": 32}])
def test_model_sizing_options_without_a_model_are_refused(option):
    with pytest.raises(kvsim.InputError, match="sizes the KV of a --model, and without one"):
        trace_stats(_tiny(), **option)


def test_arrival_rate_figure_leaves_out_the_partial_last_bin():
    from kvsim import plots

    st = trace_stats(_tiny(), bin_s=2)
    (line,) = plots.arrival_rate(st).axes[0].get_lines()
    assert list(line.get_ydata()) == pytest.approx([1.0, 0.5, 0.0])  # no drop to a partial bin
    d = st.distributions.set_index("quantity")
    assert d.at["reuse_distance", "p50"] == 1.0 and d.at["reuse_distance", "max"] == 3.0
    assert d.at["prompt_tokens", "mean"] == pytest.approx(9.5)


def test_no_reuse_trace():
    t = Trace.from_requests([Request(0, 0.0, 8, 1, (1, 2)), Request(1, 0.0, 4, 1, (3,))], 4)
    s = trace_stats(t).summary
    assert s["reuses"] == 0 and s["infinite_cache_hit_ratio"] == 0.0
    assert math.isnan(s["reuse_distance_p50"]) and math.isnan(s["mean_rate_rps"])


def test_infinite_cache_ratio_is_replay_at_unbounded_capacity():
    s = trace_stats(SAMPLE).summary
    r = kvsim.replay(SAMPLE, cpu_chunks=10**7, per_request=False).summary
    assert s["blocks"] == r["prompt_blocks"]
    assert s["infinite_cache_hit_ratio"] == pytest.approx(r["combined_hit_ratio"])
    assert s["requests"] == 200


def test_limit_and_infinite_ratio_is_the_ceiling():
    """A small CPU tier hits less; an unbounded one reaches exactly the infinite-cache ratio."""
    st = trace_stats(SAMPLE, limit=120)
    assert st.summary["requests"] == 120
    assert (st.reuses["distance"] >= 0).all()
    ratios = [
        kvsim.replay(SAMPLE, limit=120, cpu_chunks=c, per_request=False).summary[
            "combined_hit_ratio"
        ]
        for c in (10, 10**7)
    ]
    assert ratios[0] <= ratios[1] == pytest.approx(st.summary["infinite_cache_hit_ratio"])


def test_cli_json_and_plots(tmp_path):
    res = CliRunner().invoke(
        cli, ["trace", "stats", SAMPLE, "--limit", "50", "--json", "--plot", str(tmp_path / "figs")]
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["summary"]["requests"] == 50
    assert {d["quantity"] for d in payload["distributions"]} >= {"prompt_tokens", "reuse_time"}
    files = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert "reuse_cdfs.png" in files and "arrival_rate.svg" in files and len(files) == 9
    figures = [f for f in files if f != "metadata.json"]  # what made them: see test_bench_metrics
    assert all((tmp_path / "figs" / f).stat().st_size > 1000 for f in figures)


def test_cli_table():
    res = CliRunner().invoke(cli, ["trace", "stats", SAMPLE, "--limit", "20"])
    assert res.exit_code == 0
    assert "infinite_cache_hit_ratio" in res.output and "reuse_distance" in res.output
