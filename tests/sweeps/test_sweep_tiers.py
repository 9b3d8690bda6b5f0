"""Sweeps over secondary-tier sets (``kvsim sweep --tier-set``, ``grid: {tiers: [...]}``):
one row per tier set and CPU size, each with its tiers' hit shares, checked against plain
replays on a slice of the bundled conversation trace."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest
from support import SAMPLE, expect_overload, run_main

import kvsim
import kvsim.api
from kvsim.core.errors import InputError
from kvsim.sweeps import SweepSpec, run_cell, sweep, tier_set, tier_set_label

TRACE = kvsim.bundled_trace()
LIMIT = 600


def _spec(tiers: list[object], **grid: object) -> dict[str, object]:
    return {
        "traces": [TRACE],
        "limit": LIMIT,
        "options": {"model": "llama-3.1-8b"},
        "grid": {"cpu_gib": [1], **grid, "tiers": tiers},
    }


def test_cli_one_row_per_cpu_size_and_tier_set_with_each_tiers_share(tmp_path, capsys):
    out = tmp_path / "sweep"
    code, stdout, err = run_main(
        [
            *("sweep", "--trace", TRACE, "--limit", LIMIT, "--model", "llama-3.1-8b"),
            *("--cpu-gib", "1,4", "--executor", "serial", "--out", out, "--no-progress"),
            *("--tier-set", "none", "--tier-set", "fs:capacity=128GiB"),
            *("--tier-set", "fs:capacity=4GiB+example"),
        ],
        capsys,
    )
    assert code == 0, err
    assert "6 cells (6 ok, 0 failed)" in stdout
    df = pd.read_csv(out / "results.csv")
    assert sorted(zip(df.cpu_gib, df.tiers)) == sorted(
        (g, t) for g in (1, 4) for t in ("none", "fs:capacity=128GiB", "fs:capacity=4GiB+example")
    )
    # every row splits its CPU hits between the CPU tier and the secondary tiers
    assert (df.cpu_tier_hit_ratio + df.secondary_tier_hit_ratio).to_numpy() == pytest.approx(
        df.cpu_hit_ratio.to_numpy()
    )
    none = df[df.tiers == "none"]
    assert (none.secondary_tier_hit_ratio == 0).all() and none.tier1_fs_hit_ratio.isna().all()
    two = df[df.tiers == "fs:capacity=4GiB+example"]
    assert (two.tier1_fs_hit_ratio + two.tier2_example_hit_ratio).to_numpy() == pytest.approx(
        two.secondary_tier_hit_ratio.to_numpy()
    )
    fs = df[df.tiers == "fs:capacity=128GiB"]
    assert (fs.tier1_fs_hit_ratio > 0).all()  # the slice reuses beyond 4 GiB


@pytest.mark.parametrize(
    "text, message",
    [
        ("fs:capcity=1TiB", "unknown key 'capcity' (did you mean 'capacity'?)"),
        ("nvme", "type: must be one of fs, obj, example, got 'nvme'"),
        ("", "empty tier set"),
        ("fs+none", "'none' is a tier set of its own"),
        ("fs:capacity=2XB", "unknown unit 'XB'"),
        ("p2p", "peer vLLM instances"),
    ],
)
def test_cli_bad_tier_set_is_one_line_exit_2_naming_the_option(tmp_path, capsys, text, message):
    out = tmp_path / "sweep"
    code, _, err = run_main(
        [
            *("sweep", "--trace", SAMPLE, "--cpu-gib", "1", "--tier-set", "none"),
            *("--tier-set", text, "--out", out),
        ],
        capsys,
    )
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "--tier-set" in err and message in err, err
    assert not out.exists()  # refused before anything ran


def test_none_row_is_the_plain_replay():
    df = sweep(_spec(["none", "fs"]), executor="serial")
    row = df[df.tiers == "none"].iloc[0]
    plain = kvsim.replay(TRACE, limit=LIMIT, model="llama-3.1-8b", cpu_gib=1, per_request=False)
    for key, value in plain.summary.items():
        if key != "trace":
            assert row[key] == value, key
    assert row.cpu_tier_hit_ratio == plain.summary["cpu_hit_ratio"]
    tiered = df[df.tiers == "fs"].iloc[0]
    assert tiered.combined_hit_ratio > row.combined_hit_ratio  # the tier is used at all


def test_tier_row_is_the_tiered_replay():
    df = sweep(_spec(["fs:capacity=8GiB+example"]), executor="serial")
    direct = kvsim.replay(
        TRACE,
        limit=LIMIT,
        model="llama-3.1-8b",
        cpu_gib=1,
        per_request=False,
        secondary_tiers=[{"type": "fs", "kvsim_capacity": "8GiB"}, {"type": "example"}],
    ).summary
    row = df.iloc[0]
    for key in ("combined_hit_ratio", "cpu_tier_hit_ratio", "tier1_fs_hit_ratio"):
        assert row[key] == direct[key], key
    assert row.tier2_example_hit_ratio == direct["tier2_example_hit_ratio"]


def test_a_larger_fs_tier_never_lowers_the_hit_share():
    sizes = ["2GiB", "8GiB", "32GiB", "128GiB"]
    tiers = ["none", *(f"fs:capacity={s}" for s in sizes), "fs"]  # fs alone: unbounded
    df = sweep(_spec(tiers), executor="local", workers=2).set_index("tiers").loc[tiers]
    assert (df.status == "ok").all(), df.error.tolist()
    combined = df.combined_hit_ratio.to_numpy()
    secondary = df.secondary_tier_hit_ratio.to_numpy()
    assert all(a <= b for a, b in itertools.pairwise(combined)), combined
    assert all(a <= b for a, b in itertools.pairwise(secondary)), secondary
    assert combined[-1] > combined[0]  # not flat: the tier adds hits on this slice


def test_spec_takes_text_objects_and_lists_as_one_cell_each():
    spec = SweepSpec.from_mapping(
        _spec(
            [
                "none",
                " fs: capacity=1TiB ",
                [{"type": "fs", "kvsim_capacity": "2TiB"}, "obj"],
                {"type": "fs", "backpressure": {"backpressure_cls": "EMABackpressureDetector"}},
            ]
        )
    )
    values = spec.grid["tiers"]
    assert values[:3] == ["none", "fs:capacity=1TiB", "fs:capacity=2TiB+obj"]
    assert values[3] == [  # no shorthand for a backpressure object: kept as vLLM wrote it
        {"type": "fs", "backpressure": {"backpressure_cls": "EMABackpressureDetector"}}
    ]
    assert tier_set_label(values[3]).startswith("fs:backpressure={")
    assert tier_set("fs:capacity=1.5e+12+obj") == [
        {"type": "fs", "kvsim_capacity": "1.5e+12"},  # a '+' inside a number stays
        {"type": "obj"},
    ]
    with pytest.raises(InputError, match="duplicate cells"):
        sweep(_spec(["fs:capacity=1TiB", [{"type": "fs", "kvsim_capacity": "1TiB"}]]))


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"options": {"cpu_gib": 1, "secondary_tiers": [{"type": "fs"}]}},
            "options.secondary_tiers: a sweep takes secondary tiers as 'tiers'",
        ),
        ({"options": {"cpu_gib": 1}, "grid": {"tiers": ["none", "fs:x=1"]}}, "grid.tiers[1]"),
        ({"options": {"cpu_gib": 1, "tiers": 3}}, "options.tiers: a tier set is text"),
    ],
)
def test_bad_tiers_in_a_spec_name_their_place(spec, message):
    with pytest.raises(InputError) as info:
        SweepSpec.from_mapping({"traces": [SAMPLE], **spec})
    assert message in str(info.value)


def test_timed_cells_pass_the_tier_set_to_simulate(monkeypatch):
    """A timed sweep hands ``simulate`` the same ``secondary_tiers`` a cache sweep hands
    ``replay``; ``none`` hands it nothing (or clears a ``vllm_config``'s tiers)."""
    calls: list[dict[str, object]] = []

    def fake(trace, **kwargs):
        calls.append(kwargs)
        shares = {
            f"tier{i + 1}_{t['type']}_hit_share": 0.25
            for i, t in enumerate(kwargs.get("secondary_tiers") or [])
        }
        tokens = {"total_input_tokens": 1000, "gpu_hit_tokens": 100, "cpu_hit_tokens": 400}
        summary = {"median_ttft_ms": 1.0, **tokens, **shares}
        return kvsim.Result(summary=summary, tables={}, config={})

    monkeypatch.setattr(kvsim.api, "simulate", fake)
    base = {"trace": SAMPLE, "mode": "timed", "limit": 5, "cpu_gib": 16}
    rows = [
        run_cell({**base, "tiers": "fs:capacity=1TiB+obj"}),
        run_cell({**base, "tiers": "none"}),
        run_cell({**base, "tiers": "none", "vllm_config": {"cpu_bytes_to_use": 1}}),
    ]
    assert [r["status"] for r in rows] == ["ok"] * 3, [r["error"] for r in rows]
    assert calls[0]["secondary_tiers"] == [
        {"type": "fs", "kvsim_capacity": "1TiB"},
        {"type": "obj"},
    ]
    assert "secondary_tiers" not in calls[1] and calls[2]["secondary_tiers"] == []
    assert [r["tiers"] for r in rows] == ["fs:capacity=1TiB+obj", "none", "none"]
    assert rows[0]["secondary_tier_hit_share"] == 0.5  # the timed run's tier shares, summed
    assert rows[1]["secondary_tier_hit_share"] == 0.0
    assert [r["combined_hit_share"] for r in rows] == [0.5] * 3  # (100 + 400) / 1000


@expect_overload
def test_a_real_timed_tier_sweep_draws_its_figure(tmp_path):
    """End to end, no fake: a timed sweep over two tier sets runs simulate with the tiers,
    and its table draws the tiers-vs-capacity figure with a TTFT panel."""
    from kvsim.plots import tiers_vs_capacity

    table = kvsim.sweep(
        {
            "mode": "timed",
            "traces": [SAMPLE],
            "limit": 40,
            "options": {"model": "llama-3.1-8b", "gpu": "h200"},
            "grid": {"cpu_chunks": [4, 16], "tiers": ["none", "fs:capacity=1TiB"]},
        },
        out=tmp_path / "sweep",
        executor="serial",
        progress=False,
    )
    assert list(table["status"]) == ["ok"] * 4, list(table["error"])
    with_fs = table[table["tiers"] != "none"]
    assert (with_fs["tier1_fs_cascaded_chunks"] > 0).all()
    assert (table[table["tiers"] == "none"]["secondary_tier_hit_share"] == 0).all()
    figure = tiers_vs_capacity(table)
    assert len(figure.axes) == 2  # hit share and median TTFT


def test_the_docs_timed_tier_spec_is_valid():
    """examples/sweep_tiers_timed.yaml (the tier answer in docs/secondary-tiers.md) checks as
    a spec: 15 cells, the five tier sets as the page's table names them."""
    from support import ROOT

    spec = SweepSpec.load(ROOT / "examples" / "sweep_tiers_timed.yaml")
    cells = spec.cells()
    assert len(cells) == 15 and {c["mode"] for c in cells} == {"timed"}
    assert len({c["tiers"] for c in cells}) == 5 and "none" in {c["tiers"] for c in cells}
