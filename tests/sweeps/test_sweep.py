"""Sweeps: grid expansion, equivalence across executors, failures, resume after interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from click.testing import CliRunner
from support import ROOT, SAMPLE, expect_overload

import kvsim
from kvsim.cli import cli
from kvsim.core.errors import InputError
from kvsim.policies.lru import LRUPolicy
from kvsim.sweeps import SweepSpec, cell_id, read_journal, run_cell, sweep

SPEC = {
    "traces": [SAMPLE],
    "limit": 120,
    "options": {"model": "llama-3.1-8b"},
    "grid": {"policy": ["lru", "arc"], "cpu_chunks": [40, 400], "store_threshold": [0, 2]},
}


def _metrics(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["elapsed_s"]).reset_index(drop=True)


def test_cells_in_order_with_stable_ids():
    cells = SweepSpec.from_mapping(SPEC).cells()
    assert len(cells) == 8
    assert cells[0] == {
        "trace": SAMPLE,
        "mode": "cache",
        "limit": 120,
        "model": "llama-3.1-8b",
        "policy": "lru",
        "cpu_chunks": 40,
        "store_threshold": 0,
    }
    assert [c["store_threshold"] for c in cells[:2]] == [0, 2]  # last axis fastest
    assert cell_id(cells[0]) == cell_id(dict(reversed(list(cells[0].items()))))
    assert len({cell_id(c) for c in cells}) == 8


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"traces": []}, r"^sweep spec: traces: Expected `array` of length >= 1, got \[\]$"),
        ({"traces": [SAMPLE], "gird": {}}, "gird: unknown key \\(did you mean 'grid'\\?\\)"),
        ({"traces": [SAMPLE], "mode": "fast"}, "mode: .*, got 'fast'"),
        (
            {"traces": [SAMPLE], "options": {"policy": "lru"}, "grid": {"policy": ["arc"]}},
            "both fixed and swept",
        ),
        # a row's own columns are no options
        ({"traces": [SAMPLE], "grid": {"status": [1]}}, "grid.status: unknown key"),
        ({"traces": [SAMPLE], "options": {"trace": "x"}}, "options.trace: unknown key"),
    ],
)
def test_bad_specs(bad, match):
    with pytest.raises(InputError, match=match):
        SweepSpec.from_mapping(bad)


def test_row_is_the_single_run():
    cell = SweepSpec.from_mapping(SPEC).cells()[5]
    row = run_cell(cell)
    direct = kvsim.replay(
        SAMPLE,
        limit=120,
        per_request=False,
        model="llama-3.1-8b",
        policy="arc",
        cpu_chunks=40,
        store_threshold=2,
    ).summary
    assert row["status"] == "ok" and row["error"] is None
    for k in ("combined_hit_ratio", "chunks_stored", "chunks_evicted", "bytes_loaded", "admission"):
        assert row[k] == direct[k]


def test_serial_and_process_pool_agree_with_single_runs(tmp_path):
    serial = sweep(SPEC, executor="serial")
    pool = sweep(SPEC, executor="local", workers=2, out=tmp_path / "pool")
    pd.testing.assert_frame_equal(_metrics(serial), _metrics(pool))
    assert (serial["status"] == "ok").all() and serial["cell"].tolist() == list(range(8))
    singles = pd.DataFrame(
        [{"cell": i, **run_cell(c)} for i, c in enumerate(SweepSpec.from_mapping(SPEC).cells())]
    )
    pd.testing.assert_frame_equal(_metrics(serial), _metrics(singles[serial.columns]))
    # the files hold the same table
    on_disk = pd.read_parquet(tmp_path / "pool" / "results.parquet")
    pd.testing.assert_frame_equal(_metrics(on_disk), _metrics(pool), check_dtype=False)
    assert len(pd.read_csv(tmp_path / "pool" / "results.csv")) == 8
    # capacity helps, the threshold keeps fewer chunks
    lru = serial[(serial.policy == "lru") & (serial.store_threshold == 0)]
    assert lru.combined_hit_ratio.is_monotonic_increasing
    assert (
        serial[serial.store_threshold == 2].chunks_stored.values
        < serial[serial.store_threshold == 0].chunks_stored.values
    ).all()


def test_ray_agrees_with_local():
    pytest.importorskip("ray")
    spec = {**SPEC, "grid": {"policy": ["lru", "arc"], "cpu_chunks": [40, 400]}}
    local = sweep(spec, executor="serial")
    on_ray = sweep(spec, executor="ray", workers=2)
    pd.testing.assert_frame_equal(_metrics(local), _metrics(on_ray))


def test_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
    # a chunk of 700 tokens fits no 512-token hash block: known only when the cell runs
    spec = {
        "traces": [SAMPLE],
        "limit": 50,
        "grid": {"chunk_tokens": [512, 700, 1024], "cpu_chunks": [100]},
    }
    df = sweep(spec, executor="local", workers=2, out=tmp_path)
    assert len(df) == 3
    status = dict(zip(df.chunk_tokens, df.status))
    assert status == {512: "ok", 700: "error", 1024: "ok"}
    error = df.set_index("chunk_tokens")["error"][700]
    assert "700" in error and "[" not in error  # bad input names itself, not kvsim's source
    assert pd.read_parquet(tmp_path / "results.parquet")["status"].tolist() == df["status"].tolist()
    res = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--trace",
            SAMPLE,
            "--limit",
            "20",
            "--chunk-tokens",
            "512,700",
            "--cpu-chunks",
            "10",
            "--out",
            str(tmp_path / "cli"),
            "--executor",
            "serial",
        ],
    )
    assert res.exit_code == 1
    assert "1 ok, 1 failed" in res.output


def test_interrupted_sweep_resumes_without_rerunning(tmp_path):
    clean = sweep(SPEC, executor="serial")

    def stop_after_three(row, done, total):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(SPEC, executor="serial", out=tmp_path, on_row=stop_after_three)
    journal = (tmp_path / "JOURNAL").with_name("journal.jsonl").read_text().splitlines()
    assert len(journal) == 3
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == 3  # nothing finished is lost
    # a kill in the middle of a write leaves a torn line; it is dropped, not fatal
    with open(tmp_path / "journal.jsonl", "a") as f:
        f.write('{"cell": 7, "cell_id": "tor')
    ran = []
    resumed = sweep(
        SPEC, executor="serial", out=tmp_path, on_row=lambda r, d, t: ran.append(r["cell"])
    )
    assert sorted(ran) == [3, 4, 5, 6, 7]
    pd.testing.assert_frame_equal(_metrics(resumed), _metrics(clean))
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert lines[:3] == journal and len(lines) == 8
    assert all(json.loads(line) for line in lines)
    # a finished sweep re-run does nothing
    ran.clear()
    sweep(SPEC, executor="serial", out=tmp_path, on_row=lambda r, d, t: ran.append(r))
    assert ran == []


def _sweep_past_two_cells(cmd: list[str], out, pipe: int) -> subprocess.Popen[str]:
    """The sweep ``cmd`` started, once it has journaled two cells in ``out`` (or ended, or
    a minute passed)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=pipe, stderr=pipe, text=True)
    journal = out / "journal.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_text().count("\n") >= 2:
            break
        time.sleep(0.02)
    return proc


def test_killed_cli_sweep_resumes(tmp_path):
    """SIGKILL the CLI mid-sweep; the re-run finishes the rest and matches a clean run."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "traces: [traces/mooncake_fast25_conversation_trace.jsonl]\nlimit: 800\n"
        "grid: {policy: [lru, arc], cpu_chunks: [100, 200, 400, 800, 1600, 3200]}\n"
    )
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "kvsim",
        "sweep",
        str(spec),
        "--out",
        str(out),
        "--executor",
        "serial",
        "--no-progress",
    ]
    proc = _sweep_past_two_cells(cmd, out, subprocess.DEVNULL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = read_journal(out)
    assert 2 <= len(before) < 12, "the sweep should have been killed part-way"
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    final = pd.read_parquet(out / "results.parquet")
    assert len(final) == 12 and (final.status == "ok").all()
    for cid, row in before.items():  # rows written before the kill are kept as they were
        assert final.set_index("cell_id").at[cid, "elapsed_s"] == row["elapsed_s"]
    clean = sweep(spec, executor="serial")
    pd.testing.assert_frame_equal(_metrics(final), _metrics(clean), check_dtype=False)


def test_interrupted_cli_sweep_says_what_it_kept_in_one_line(tmp_path):
    """Ctrl-C (SIGINT) mid-sweep: exit 130 and one line naming the cells kept, the results
    file and how to resume (was a bare 'kvsim: aborted')."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "traces: [traces/mooncake_fast25_conversation_trace.jsonl]\nlimit: 800\n"
        "grid: {policy: [lru, arc], cpu_chunks: [100, 200, 400, 800, 1600, 3200]}\n"
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kvsim", "sweep", str(spec), "--out", str(out)]
    cmd += ["--executor", "serial", "--no-progress"]
    proc = _sweep_past_two_cells(cmd, out, subprocess.PIPE)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    kept = len(read_journal(out))
    assert proc.returncode == 130 and 2 <= kept < 12, err
    assert err.splitlines() == [
        f"kvsim: interrupted after {kept} of 12 cells; they are in "
        f"{out / 'results.parquet'} and the journal: the same command resumes"
    ]
    # the results are written from the rows on the way out: all but (in a microsecond's
    # window between journaling a row and keeping it) the last one journaled
    assert len(pd.read_parquet(out / "results.parquet")) in (kept - 1, kept)


def test_generated_trace_cells_and_cli_grid(tmp_path):
    spec = {
        "traces": [{"kind": "chat", "n_requests": 150, "seed": 2}],
        "grid": {"cpu_chunks": [20, 2000]},
    }
    df = sweep(spec, executor="serial")
    assert df.trace.iloc[0] == "gen:chat(n=150,seed=2)"
    assert df.requests.tolist() == [150, 150]
    assert df.combined_hit_ratio.iloc[0] < df.combined_hit_ratio.iloc[1]
    res = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--trace",
            SAMPLE,
            "--limit",
            "30",
            "--policy",
            "lru,arc",
            "--cpu-chunks",
            "10,100",
            "--out",
            str(tmp_path),
            "--executor",
            "serial",
        ],
    )
    assert res.exit_code == 0, res.output
    table = pd.read_csv(tmp_path / "results.csv")
    assert sorted(zip(table.policy, table.cpu_chunks)) == [
        ("arc", 10),
        ("arc", 100),
        ("lru", 10),
        ("lru", 100),
    ]


@expect_overload
def test_timed_cells_run_or_fail_cleanly():
    df = sweep(
        {"traces": [SAMPLE], "mode": "timed", "limit": 20, "grid": {"cpu_chunks": [100]}},
        executor="serial",
    )
    row = df.iloc[0]
    try:
        import kvsim.api  # noqa: F401
    except ImportError:
        assert row.status == "error" and "timed mode is not available" in row.error
    else:
        assert row.status == "ok", row.error
        assert row.requests == 20


class CrashPolicy(LRUPolicy):
    """A policy whose construction kills its process: a worker dying mid-sweep."""

    def __init__(self, capacity: int):
        os._exit(3)


def test_dead_worker_is_recorded_not_fatal(tmp_path):
    spec = {
        "traces": [SAMPLE],
        "limit": 20,
        "grid": {"policy": [f"{__name__}:CrashPolicy"], "cpu_chunks": [10]},
    }
    df = sweep(spec, executor="local", workers=1, out=tmp_path)
    assert df.status.tolist() == ["error"] and "worker failed" in df.error.iloc[0]
    assert len(read_journal(tmp_path)) == 1
