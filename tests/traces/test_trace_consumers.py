"""What reads a trace in batches downstream: ``--requests-csv`` rows that read back as the
replay's rows, batches in order, Parquet equal to the CSV; and sweep cells that
share one parse (and one timed baseline per engine configuration) of their trace."""

from __future__ import annotations

import csv
import gzip
import os
from pathlib import Path

import pandas as pd
import pytest
from support import SAMPLE, copy_to, expect_overload, has_files, run_main, trace_cache_folder

import kvsim
from kvsim.cachemode import REQUEST_COLUMNS, CacheReplay
from kvsim.traces import open_trace


def _rows_and_file(
    requests: list, cfg: dict, path: Path, **extra: int
) -> tuple[list, list[list[str]]]:
    """The replay's rows in memory, and the lines of the ``--requests-csv`` file it wrote."""
    from kvsim.api import make_options

    config = make_options(**cfg).resolve(512)
    assert config.as_dict() == kvsim.replay(requests, per_request=False, **cfg).config
    rows: list = []
    CacheReplay(config).run(requests, rows.append)
    kvsim.replay(requests, requests_csv=path, **cfg, **extra)
    with open(path, newline="") as f:
        return rows, list(csv.reader(f))


def _parsed(fields: list[str]) -> tuple:
    """One CSV line back as values: ids and counts ints, the arrival a float, the flag a bool."""
    assert fields[-1] in ("true", "false")
    return (int(fields[0]), float(fields[1]), *map(int, fields[2:-1]), fields[-1] == "true")


@pytest.mark.parametrize(
    "cfg",
    [
        {"cpu_chunks": 60},
        {"cpu_chunks": 3, "gpu_blocks": 40, "store_threshold": 2, "policy": "arc"},
    ],
)
def test_requests_csv_holds_the_replays_rows(tmp_path, cfg):
    path = tmp_path / "rows.csv"
    rows, lines = _rows_and_file(list(open_trace(SAMPLE)), cfg, path)
    assert lines[0] == list(REQUEST_COLUMNS)
    assert [_parsed(line) for line in lines[1:]] == rows and len(rows) == 200
    assert path.read_bytes().startswith(",".join(REQUEST_COLUMNS).encode() + b"\n0,0,")
    assert any(r[-1] for r in rows) == (b",true\n" in path.read_bytes())


def test_requests_csv_from_a_list_trace_matches_too(tmp_path):
    """Requests in memory (ints where floats are expected too) read back as their rows."""
    reqs = [kvsim.Request(0, 0, 1100, 7, (4, 5, 6)), kvsim.Request(1, 2.5, 1100, 7, (4, 5, 6))]
    rows, lines = _rows_and_file(reqs, {"cpu_chunks": 4}, tmp_path / "r.csv", block_tokens=512)
    assert [_parsed(line) for line in lines[1:]] == rows
    assert lines[2][:2] == ["1", "2.5"]


def test_batches_reach_the_sink_in_order(tmp_path):
    config = kvsim.api.make_options(cpu_chunks=60).resolve(512)
    rows: list = []
    batches: list = []
    CacheReplay(config).run(open_trace(SAMPLE), rows.append, batch_sink=batches.append)
    assert [r for b in batches for r in b] == rows and len(rows) == 200


def test_replay_out_writes_parquet_with_the_csv_rows(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_main(["replay", SAMPLE, "--cpu-chunks", "40", "--out", out], capsys)
    assert code == 0, err
    code, _, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", "40", "--requests-csv", tmp_path / "r.csv"], capsys
    )
    assert code == 0, err
    table = pd.read_parquet(out / "requests.parquet")
    from_csv = pd.read_csv(tmp_path / "r.csv")
    assert list(table.columns) == list(REQUEST_COLUMNS) and len(table) == 200
    pd.testing.assert_frame_equal(table, from_csv, check_dtype=False)
    assert (out / "summary.json").exists() and (out / ".kvsim-run.json").exists()
    code, _, err = run_main(
        [
            "replay",
            SAMPLE,
            "--cpu-chunks",
            "40",
            "--out",
            out,
            "--requests-csv",
            tmp_path / "x.csv",
        ],
        capsys,
    )
    assert code == 2 and "--out" in err and err.count("\n") == 1


def test_requests_csv_ending_in_gz_is_gzipped(tmp_path, capsys):
    """``--requests-csv rows.csv.gz`` is gzipped, as a trace named so is: the plain file's
    bytes."""
    for name in ("r.csv", "r.csv.gz"):
        args = ["replay", SAMPLE, "--cpu-chunks", "40", "--requests-csv", tmp_path / name]
        code, _, err = run_main(args, capsys)
        assert code == 0, err
    packed = (tmp_path / "r.csv.gz").read_bytes()
    assert packed[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed) == (tmp_path / "r.csv").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.csv.gz"]


# --------------------------------------------------------------------------- sweeps


def test_sweep_cells_share_one_parse_of_their_trace(tmp_path, parses, monkeypatch):
    from kvsim.sweeps import sweep
    from kvsim.traces import synthetic

    path = copy_to(SAMPLE, tmp_path)
    generated: list[int] = []
    real = synthetic.WorkloadSpec.requests

    def counted(self):  # type: ignore[no-untyped-def]
        generated.append(1)
        return real(self)

    monkeypatch.setattr(synthetic.WorkloadSpec, "requests", counted)
    spec = {
        "traces": [path, {"kind": "chat", "n_requests": 60, "seed": 3}],
        "grid": {"policy": ["lru", "arc"], "cpu_chunks": [20, 80]},
    }
    df = sweep(spec, executor="serial")
    assert (df["status"] == "ok").all() and len(df) == 8
    assert parses == [path] and len(generated) == 1


def test_sweep_workers_follow_the_cache_options(tmp_path, capsys):
    path = copy_to(SAMPLE, tmp_path)
    args = ["sweep", "--trace", path, "--cpu-chunks", "10,20", "--executor", "local"]
    args += ["--workers", "2", "--no-progress"]
    code, _, err = run_main([*args, "--out", tmp_path / "a", "--no-cache"], capsys)
    assert code == 0, err
    assert not has_files(trace_cache_folder())
    where = tmp_path / "tc"
    code, _, err = run_main([*args, "--out", tmp_path / "b", "--trace-cache", where], capsys)
    assert code == 0, err
    assert len(list(where.glob("*.columns"))) == 1 and not has_files(trace_cache_folder())


def _timed_spec(trace: str) -> dict:
    return {
        "mode": "timed",
        "traces": [trace],
        "limit": 16,
        "options": {"baseline": True, "time_scale": 20.0, "record_steps": False},
        "grid": {"max_num_seqs": [8, 16], "policy": ["lru", "arc"], "cpu_chunks": [20, 80]},
    }


@expect_overload
def test_sweep_runs_a_timed_baseline_once_per_engine_configuration(tmp_path, monkeypatch):
    from kvsim.engine import setup as engine_module  # where simulate builds its engines
    from kvsim.sweeps import SweepSpec, run_cell, sweep

    path = copy_to(SAMPLE, tmp_path)
    runs: list[bool] = []
    real = engine_module.Engine

    class Counted(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            runs.append(kwargs.get("offload", True))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(engine_module, "Engine", Counted)
    spec = _timed_spec(path)
    df = sweep(spec, executor="serial")
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert len(df) == 8 and runs.count(False) == 2  # one per max_num_seqs, not one per cell
    assert runs.count(True) == 8
    # each row is what the cell alone gives (its own baseline)
    runs.clear()
    cells = SweepSpec.from_mapping(spec).cells()
    alone = pd.DataFrame([{"cell": i, **run_cell(c)} for i, c in enumerate(cells)])
    assert runs.count(False) == 8
    assert sum(c.startswith("baseline_") for c in df.columns) > 10
    pd.testing.assert_frame_equal(
        df.drop(columns=["elapsed_s"]), alone[df.columns].drop(columns=["elapsed_s"])
    )


@expect_overload
def test_timed_sweep_with_shared_baselines_agrees_across_executors(tmp_path):
    from kvsim.sweeps import sweep

    spec = _timed_spec(copy_to(SAMPLE, tmp_path))
    spec["grid"] = {"max_num_seqs": [8], "policy": ["lru", "arc"], "cpu_chunks": [20, 80]}
    serial = sweep(spec, executor="serial").drop(columns=["elapsed_s"])
    pool = sweep(spec, executor="local", workers=2).drop(columns=["elapsed_s"])
    pd.testing.assert_frame_equal(serial, pool)
    assert "KVSIM_SWEEP_BASELINES" not in os.environ
