"""One-pass LRU curves: exact against repeated replays, bounded error when sampled."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import SAMPLE, SYNTHETIC, run_main

from kvsim.api import mrc, replay
from kvsim.cachemode.mrc import lru_mrc
from kvsim.cachemode.object_protocol import object_replay
from kvsim.core.errors import InputError
from kvsim.core.keys import KeyLayout
from kvsim.options.config import CacheConfig
from kvsim.traces import as_trace


@pytest.fixture(scope="module")
def trace():
    return as_trace(SYNTHETIC, limit=500)


def test_prefix_curve_equals_replays(trace):
    layout = KeyLayout(trace.block_tokens, trace.block_tokens)
    curve = lru_mrc(trace, layout)
    assert curve.exact_from == curve.info["longest_request_chunks"]
    for capacity in (curve.exact_from, 900, 2500, 6000, 20000):
        s = replay(trace, cpu_chunks=capacity, policy="lru", per_request=False).summary
        assert curve.hit_ratio(capacity) == pytest.approx(s["cpu_hit_ratio"], abs=1e-12), capacity


def test_prefix_curve_with_sub_block_chunks(trace):
    layout = KeyLayout(trace.block_tokens, 256)
    curve = lru_mrc(trace, layout)
    for capacity in (2 * curve.exact_from, 9000):
        s = replay(trace, cpu_chunks=capacity, chunk_tokens=256, per_request=False).summary
        assert curve.hit_ratio(capacity) == pytest.approx(s["cpu_hit_ratio"], abs=1e-12)


def test_object_curve_equals_replays(trace):
    layout = KeyLayout(trace.block_tokens, trace.block_tokens)
    curve = lru_mrc(trace, layout, protocol="object")
    for capacity in (1, 7, 150, 1200, 5000):
        s = object_replay(trace, CacheConfig(capacity, trace.block_tokens, trace.block_tokens))
        assert curve.hit_ratio(capacity) == pytest.approx(s["hit_ratio"], abs=1e-12), capacity


def test_shards_error_is_bounded(trace):
    layout = KeyLayout(trace.block_tokens, trace.block_tokens)
    exact = lru_mrc(trace, layout)
    sampled = lru_mrc(trace, layout, sample_rate=0.1, seed=1)
    assert sampled.sampled < 0.2 * exact.accesses
    caps = np.arange(exact.exact_from, 12_000, 250)
    err = max(abs(sampled.hit_ratio(c) - exact.hit_ratio(c)) for c in caps)
    assert err < 0.02


def test_bad_arguments(trace):
    layout = KeyLayout(trace.block_tokens, trace.block_tokens)
    with pytest.raises(InputError):
        lru_mrc(trace, layout, sample_rate=0)
    with pytest.raises(InputError):
        lru_mrc(trace, layout, protocol="nope")


def test_cli_writes_table_and_plot(tmp_path, capsys):
    from kvsim.cli import main

    csv, png = tmp_path / "mrc.csv", tmp_path / "mrc.png"
    with pytest.raises(SystemExit) as exc:
        main(["mrc", SAMPLE, "--csv", str(csv), "--plot", str(png), "--sample-rate", "0.5"])
    assert exc.value.code == 0
    head = csv.read_text().splitlines()
    assert (
        head[0] == "capacity,hit_ratio,miss_ratio,capacity_tokens,policy,exact" and len(head) > 10
    )
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mrc.csv",
        "mrc.png",
    ]  # no temp files left
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["mrc", SAMPLE, "--policy", "arc", "--json"])
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["policy"], out["method"], out["sample_rate"]) == ("arc", "miniature", 0.1)
    with pytest.raises(SystemExit) as exc:
        main(["mrc", SAMPLE, "--policy", "no-such-policy"])
    assert exc.value.code == 2
    assert "no-such-policy" in capsys.readouterr().err


def test_a_grid_of_more_points_than_capacities_is_every_capacity_without_building_it():
    """``--points 1000000000`` built two billion-point grids (7.45 GiB) to keep 4,083 rows."""
    from kvsim.cachemode.mrc import _capacity_grid

    every = np.arange(1, 12)
    for points in (11, 12, 10**9):
        assert np.array_equal(_capacity_grid(10, None, points), every)
    wide = _capacity_grid(10_000, None, 200)
    assert wide[0] == 1 and wide[-1] == 10_001 and 200 <= len(wide) <= 400


def test_mrc_refuses_a_limit_of_no_request(capsys):
    code, out, err = run_main(["mrc", SAMPLE, "--limit", "0"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == "kvsim: error: --limit: Expected `int` >= 1, got 0"


def test_two_outputs_naming_one_file_are_refused_as_such(tmp_path, capsys):
    csv = tmp_path / "x.csv"
    code, out, err = run_main(["mrc", SAMPLE, "--csv", csv, "--plot", csv], capsys)
    assert code == 2 and out == "" and not csv.exists()
    assert err.strip() == f"kvsim: error: --plot and --csv both name {csv}: give each its own file"


@pytest.mark.parametrize(
    ("extra", "phrase"),
    [  # 7 tokens: a 512-token chunk is no whole number of such GPU blocks
        ([], "--gpu-block-tokens 7 sizes the KV of a --model, and without one nothing reads it"),
        (["--tp", "2"], "--tp 2, --gpu-block-tokens 7 size the KV of a --model"),
        (["--model", "llama-3.1-8b"], "must be a multiple of the GPU block size 7"),
        (
            ["--model", "llama-3.1-8b", "--cpu-gib", "16"],
            "must be a multiple of the GPU block size 7",
        ),
    ],
)
def test_a_gpu_block_size_is_refused_with_or_without_a_model(extra, phrase, tmp_path, capsys):
    csv = tmp_path / "c.csv"  # was: accepted, and ignored, without --model
    args = ["mrc", SAMPLE, "--gpu-block-tokens", "7", "--csv", csv, *extra]
    code, out, err = run_main(args, capsys)
    assert code == 2 and out == "" and not csv.exists()
    assert phrase in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_gpu_block_size_is_read_with_a_model_and_its_default_without():
    assert mrc(SAMPLE, gpu_block_tokens=16).ceiling == mrc(SAMPLE).ceiling
    with_model = mrc(SAMPLE, model="llama-3.1-8b", gpu_block_tokens=32, cpu_gib=[1])
    assert with_model.points is not None and len(with_model.points) == 1
    with pytest.raises(InputError, match="--gpu-block-tokens 32 sizes the KV of a --model"):
        mrc(SAMPLE, gpu_block_tokens=32)
