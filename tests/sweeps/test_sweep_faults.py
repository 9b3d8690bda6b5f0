"""Issue 13's sweep faults, each through the real entry point: a dead worker costs only its
own cell, resume keys on the trace's content, the spec is checked whole before any cell
runs, a corrupt journal line is a warning, workers die with the driver, one sweep per folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from support import ROOT, SAMPLE
from support import run_main as support_run_main

from kvsim.core.errors import InputError
from kvsim.sweeps import CRASH_LIMIT, SweepSpec, option_names, read_journal, sweep
from kvsim.sweeps import journal as journal_module
from kvsim.sweeps.inputs import trace_fingerprint

PLUGIN = '''
"""Policies that misbehave the way a cell's process can: killed, killed once, blocked."""
import os
import signal
import time

from kvsim.policies.lru import LRUPolicy

HERE = os.path.dirname(os.path.abspath(__file__))


class AlwaysDies(LRUPolicy):
    """Killed (as by the OOM killer) whenever a process builds it."""

    def __init__(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)


class DiesOnce(LRUPolicy):
    """Killed the first time any process builds it; an ordinary LRU after that."""

    def __init__(self, *args, **kwargs):
        try:
            os.close(os.open(os.path.join(HERE, "died-once"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            super().__init__(*args, **kwargs)
            return
        os.kill(os.getpid(), signal.SIGKILL)


class Sleeper(LRUPolicy):
    """Records its process id and blocks, as a long cell does."""

    def __init__(self, *args, **kwargs):
        open(os.path.join(HERE, "pids", str(os.getpid())), "w").close()
        time.sleep(120)
'''


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """A folder holding the ``sweep_plugin`` module, for PYTHONPATH."""
    folder = tmp_path / "plugin"
    (folder / "pids").mkdir(parents=True)
    (folder / "sweep_plugin.py").write_text(PLUGIN)
    return folder


def kvsim(*args: str, path: Path | None = None, timeout: float = 60):
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "kvsim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def write_spec(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def journal_lines(folder: Path) -> list[str]:
    return (folder / "journal.jsonl").read_text().splitlines()


# --------------------------------------------------------------------------- 3: dead workers


def test_a_dead_worker_costs_only_its_own_cell(tmp_path, plugin):
    """One cell always SIGKILLs its worker, another once: the first is blamed after
    CRASH_LIMIT deaths, the second re-runs fine, no other cell is touched, and neither a
    plain resume nor --retry-failed leaves a healthy cell unfinished."""
    spec = write_spec(
        tmp_path / "spec.yaml",
        f"""
        traces: [{SAMPLE}]
        limit: 20
        grid:
          policy: [lru, arc, fifo, "sweep_plugin:AlwaysDies", "sweep_plugin:DiesOnce", sieve]
          cpu_chunks: [10, 40]
        """,
    )
    out = tmp_path / "out"
    args = [spec, "--out", str(out), "--workers", "2", "--no-progress"]
    first = kvsim("sweep", *args, path=plugin)
    assert first.returncode == 1, first.stderr
    assert "Traceback" not in first.stderr
    table = pd.read_csv(out / "results.csv")
    dies = table.policy == "sweep_plugin:AlwaysDies"
    assert (table[~dies].status == "ok").all(), table[~dies].error.tolist()
    assert (table[dies].status == "error").all()
    for error in table[dies].error:
        assert f"died (killed by SIGKILL), {CRASH_LIMIT} times" in error
    assert len(journal_lines(out)) == 12  # a cell that was not run is not journaled
    assert (plugin / "died-once").exists()  # the cell that died once did run again

    again = kvsim("sweep", *args, path=plugin)  # a plain resume runs nothing new
    assert again.returncode == 1 and len(journal_lines(out)) == 12

    retried = kvsim("sweep", *args, "--retry-failed", path=plugin)
    assert retried.returncode == 1, retried.stderr
    assert "10 ok, 2 failed" in retried.stdout
    assert len(journal_lines(out)) == 14  # only the two failing cells ran again


def test_rows_of_cells_that_never_ran_are_run_on_resume(tmp_path):
    """Journals from before the fix hold 'worker failed: BrokenProcessPool' rows for cells
    that were only pending; a plain resume runs them."""
    spec = {"traces": [SAMPLE], "limit": 20, "grid": {"cpu_chunks": [10, 20, 40]}}
    sweep(spec, executor="serial", out=tmp_path)
    rows = [json.loads(line) for line in journal_lines(tmp_path)]
    for row in rows[1:]:
        row.pop("run_key", None)
        row.update(
            status="error",
            error="worker failed: BrokenProcessPool: A process in the process pool was "
            "terminated abruptly while the future was running or pending.",
        )
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ran: list[int] = []
    df = sweep(spec, executor="serial", out=tmp_path, on_row=lambda r, d, t: ran.append(r["cell"]))
    assert ran == [1, 2]
    assert (df.status == "ok").all()


# --------------------------------------------------------------------------- 9: trace content


def test_resume_reruns_a_regenerated_trace_and_a_new_kvsim(tmp_path, monkeypatch):
    lines = Path(SAMPLE).read_text().splitlines(keepends=True)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(lines[:80]))
    spec = {"traces": [str(trace)], "grid": {"cpu_chunks": [20]}}
    out = tmp_path / "out"
    before = sweep(spec, executor="serial", out=out)

    def resume() -> tuple[pd.DataFrame, list[int]]:
        ran: list[int] = []
        df = sweep(spec, executor="serial", out=out, on_row=lambda r, d, t: ran.append(r["cell"]))
        return df, ran

    assert resume()[1] == []  # same content: nothing to do
    trace.write_text("".join(lines[80:]))  # regenerated at the same path
    after, ran = resume()
    assert ran == [0]
    fresh = sweep(spec, executor="serial")
    assert after.requests.tolist() == fresh.requests.tolist() != before.requests.tolist()
    assert after.combined_hit_ratio.tolist() == fresh.combined_hit_ratio.tolist()
    monkeypatch.setattr(journal_module, "kvsim_version", lambda: "99.0")
    assert resume()[1] == [0]  # another kvsim may give another answer


def test_fingerprint_sees_a_change_in_the_middle_with_size_and_mtime_kept(tmp_path):
    """Issue 27 #2: the whole content is hashed, so an edit in the middle of a file over
    2 MiB, its size and modification time put back (``cp -p``, ``rsync -t``), changes the
    fingerprint (it used to hash the first and last MiB only)."""
    trace = tmp_path / "t.bin"
    trace.write_bytes(b"a" * (3 << 20))
    first = trace_fingerprint(str(trace))
    stat = trace.stat()
    with open(trace, "r+b") as f:
        f.seek(3 << 19)
        f.write(b"b")
    os.utime(trace, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert trace.stat().st_size == stat.st_size
    assert trace_fingerprint(str(trace)) != first
    assert trace_fingerprint(str(tmp_path / "nope")) == "missing"


# --------------------------------------------------------------------------- 12, 4: the spec


@pytest.fixture
def run_main(capsys, tmp_path):
    """``kvsim ARGS`` through the entry point in this process: (exit code, stderr lines)."""

    def run(*args: str) -> tuple[int, list[str]]:
        code, _, err = support_run_main(list(args), capsys)
        assert "Traceback" not in err
        return code, err.strip().splitlines()

    return run


BASE = f"traces: [{SAMPLE}]\nlimit: 20\n"


@pytest.mark.parametrize(
    "body, needle",
    [
        ("grid: {polcy: [lru], cpu_chunks: [10]}", "grid.polcy: unknown key"),
        ("grid: {polcy: [lru], cpu_chunks: [10]}", "did you mean 'policy'"),
        ("grid: {cpu_chunks: [-5]}", "grid.cpu_chunks[0]: Expected `int` >= 1, got -5"),
        ("grid: {cpu_chunks: [abc]}", "grid.cpu_chunks[0]: Expected `int"),
        ("grid: {cpu_chunks: [abc]}", "got 'abc'"),
        (
            "grid: {cpu_chunks: ['1e3']}",
            "got '1e3' (a number as text: write it unquoted, such as 1000)",
        ),
        (
            "grid: {cpu_chunks: [10], store_threshold: [-1]}",
            "grid.store_threshold[0]: Expected `int` >= 0",
        ),
        ("grid: {cpu_chunks: [10], policy: [{lru: 1}]}", "grid.policy[0]: Expected `str`"),
        (
            "grid: {cpu_chunks: [10], gpu: [h100]}",
            "grid.gpu: an option of timed mode, not of this cache",
        ),
        ("grid: {cpu_chunks: []}", "grid.cpu_chunks: Expected `array` of length >= 1, got []"),
        ("grid: [1, 2]", "grid: Expected `object`"),
        ("options: [model, x]\ngrid: {cpu_chunks: [10]}", "options: Expected `object`"),
        ("options: {cpu_gib: '64'}", "options.cpu_gib: Expected `float"),
        ("options: {cpu_gib: abc}", "options.cpu_gib"),
        ("options: {cpu_gib: .nan}", "options.cpu_gib: must be finite, got nan"),
        ("options: {cpu_gib: .inf}", "options.cpu_gib: must be finite, got inf"),
        ("grid: {cpu_gib: [4], cpu_chunks: [10]}", "only one CPU tier size"),
        ("grid: {policy: [lru, arc]}", "no CPU tier size"),
        ("mode: [cache]\ngrid: {cpu_chunks: [10]}", "mode: "),
        ("name: [a]\ngrid: {cpu_chunks: [10]}", "name: Expected `int | str`"),
        ("polcy: lru\ngrid: {cpu_chunks: [10]}", "polcy: unknown key, got 'lru'"),
        ("gird: {cpu_chunks: [10]}", "gird: unknown key (did you mean 'grid'?)"),
    ],
)
def test_a_bad_spec_is_one_error_before_any_cell(tmp_path, run_main, body, needle):
    spec = write_spec(tmp_path / "spec.yaml", BASE + body)
    out = tmp_path / "out"
    code, err = run_main("sweep", spec, "--out", str(out), "--executor", "serial")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"kvsim: error: {spec}: ") and needle in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "body, needle",
    [
        ("limit: -5", "limit: Expected `int` >= 1, got -5"),
        ("limit: abc", "limit: Expected `int | null`"),
        ("limit: '1e3'", "write it unquoted, such as 1000"),
        ("limit: [1]", "limit: Expected `int | null`"),
        ("traces: 5", "traces: Expected `str | object | array`"),
        ("traces: [[a.jsonl]]", "traces[0]: Expected `str | object`"),
        ("traces: [{kind: chat, n_requests: abc}]", "traces[0].n_requests: Expected `int`"),
        ("traces: [{kind: chat, n_requests: 0}]", "traces[0].n_requests: Expected `int` >= 1"),
        ("traces: [{n_requests: 10}]", ("traces[0]", "kind", "missing")),
        ("traces: [{kind: chta}]", "traces[0]: unknown workload kind 'chta'"),
        ("traces: [{kind: chat, rte: 2}]", "traces[0]: unknown knob(s) for chat: rte"),
    ],
)
def test_bad_limit_and_traces(tmp_path, run_main, body, needle):
    text = f"traces: [{SAMPLE}]\n" if not body.startswith("traces") else ""
    spec = write_spec(tmp_path / "spec.yaml", text + body + "\ngrid: {cpu_chunks: [10]}\n")
    code, err = run_main("sweep", spec, "--out", str(tmp_path / "out"))
    needles = (needle,) if isinstance(needle, str) else needle
    assert code == 2 and len(err) == 1 and all(n in err[0] for n in needles), err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--cpu-gib", "abc"], "--cpu-gib: Expected `float"),
        (["--cpu-gib", "nan"], "--cpu-gib: Expected `float"),  # YAML's NaN is .nan
        (["--cpu-gib", ".inf"], "--cpu-gib: must be finite, got inf"),
        (["--cpu-gib", "4,-1"], "--cpu-gib: Expected `float` > 0.0, got -1"),
        (["--cpu-chunks", "-5"], "--cpu-chunks: Expected `int` >= 1, got -5"),
        (["--cpu-chunks", "'1e3'"], "got '1e3' (a number as text: write it unquoted, such as"),
        (["--cpu-chunks", "10", "--store-threshold", "x"], "--store-threshold: Expected `int`"),
        (["--cpu-chunks", "10", "--policy", "{a: b}"], "--policy: Expected `str`"),
        (["--cpu-chunks", ","], "--cpu-chunks: give at least one value"),
        (["--policy", "lru"], "no CPU tier size"),
    ],
)
def test_bad_grid_options(tmp_path, run_main, args, needle):
    out = tmp_path / "out"
    code, err = run_main("sweep", "--trace", SAMPLE, *args, "--out", str(out))
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_a_bad_value_is_refused_in_a_fresh_process_and_through_the_api(tmp_path):
    """``--cpu-gib abc`` once built a 'abc' * 2**30 string per cell; now nothing runs."""
    out = tmp_path / "out"
    res = kvsim("sweep", "--trace", SAMPLE, "--cpu-gib", "abc", "--out", str(out))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--cpu-gib" in res.stderr and not out.exists()
    for bad in ("64", float("nan"), float("inf"), True, [4]):
        with pytest.raises(InputError, match=r"options\.cpu_gib"):
            sweep({"traces": [SAMPLE], "options": {"cpu_gib": bad}}, out=out)
    with pytest.raises(InputError, match="workers must be an integer"):
        sweep({"traces": [SAMPLE], "grid": {"cpu_chunks": [10]}}, workers="2")  # type: ignore[arg-type]
    assert not out.exists()


def test_good_specs_still_pass():
    """The checks know every keyword of both modes (a timed spec with engine knobs)."""
    spec = SweepSpec.from_mapping(
        {
            "traces": [SAMPLE, {"kind": "chat", "n_requests": 10, "seed": 1}],
            "mode": "timed",
            "limit": 5,
            "options": {"gpu": "h200", "gpu_memory_utilization": 0.9, "baseline": True},
            "grid": {"cpu_gib": [0.5, 4], "max_num_seqs": [8], "vllm_config": [{}]},
        }
    )
    assert len(spec.cells()) == 4
    assert option_names("cache") >= {"policy", "cpu_chunks", "fused", "protocol"}


# --------------------------------------------------------------------------- 5: the journal


def test_corrupt_journal_lines_are_skipped_with_a_warning(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", BASE + "grid: {cpu_chunks: [10, 20, 40, 80]}\n")
    out = tmp_path / "out"
    args = [spec, "--out", str(out), "--executor", "serial", "--no-progress"]
    assert kvsim("sweep", *args).returncode == 0
    lines = journal_lines(out)
    row = json.loads(lines[2])
    row.pop("cell_id")
    lines[1] = '{"cell": 1, "cell_id": "ab'  # a corrupt line in the middle
    lines[2] = json.dumps(row)  # a row without a cell_id
    lines.append("[1, 2]")  # JSON, not a row
    lines.append("\x00 garbage")  # not JSON at all
    (out / "journal.jsonl").write_text("\n".join(lines) + "\n")
    res = kvsim("sweep", *args)
    assert res.returncode == 0, res.stderr
    # the journal's lines (the cells' own warnings, named by their cell, aside)
    warnings = [ln for ln in res.stderr.strip().splitlines() if "warning: cell " not in ln]
    assert len(warnings) == 4 and "Traceback" not in res.stderr
    for number, line in zip((2, 3, 5, 6), warnings):
        assert line.startswith("kvsim: warning: ") and f"journal.jsonl:{number}: skipped" in line
    assert len(read_journal(out, on_warning=lambda m: None)) == 4  # the two cells ran again
    assert (pd.read_csv(out / "results.csv").status == "ok").all()
    with pytest.warns(RuntimeWarning, match="skipped a line"):
        read_journal(out)


# --------------------------------------------------------------------------- 13: orphans


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for whoever adopted it to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_driver_ends_its_workers(tmp_path, plugin):
    spec = write_spec(
        tmp_path / "spec.yaml",
        BASE + 'grid: {policy: ["sweep_plugin:Sleeper"], cpu_chunks: [10, 20]}\n',
    )
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    cmd = [sys.executable, "-m", "kvsim", "sweep", spec, "--out", str(tmp_path / "out")]
    driver = subprocess.Popen(
        [*cmd, "--workers", "2"], cwd=ROOT, env=env, stderr=subprocess.DEVNULL
    )
    pids: list[int] = []
    try:
        assert _wait_for(lambda: len(os.listdir(plugin / "pids")) == 2, 30), "no workers"
        pids = [int(p) for p in os.listdir(plugin / "pids")]
        driver.kill()
        driver.wait()
        assert _wait_for(lambda: all(_gone(p) for p in pids), 5), "orphaned workers"
    finally:
        driver.kill()
        _kill_all(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_portable_watchdog_alone_ends_an_orphan(tmp_path):
    """Without Linux's parent-death signal, the worker's watchdog thread sees the new parent."""
    ready = tmp_path / "ready"
    child = (
        "import sys, time; from kvsim.core.processes import exit_with_parent; "
        "sys.platform = 'other'; "
        f"exit_with_parent(None); open({str(ready)!r}, 'w').close(); time.sleep(60)"
    )
    parent = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print(p.pid, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    pid = 0
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert _wait_for(ready.exists, 20), "the child did not start"
        proc.kill()
        proc.wait()
        assert _wait_for(lambda: _gone(pid), 3), "the orphan kept running"
    finally:
        proc.kill()
        _kill_all([pid] if pid else [])


# --------------------------------------------------------------------------- 18: one per folder


def test_a_second_sweep_into_a_busy_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    spec = {"traces": [SAMPLE], "limit": 20, "grid": {"cpu_chunks": [10, 20]}}
    cli_args = ["sweep", "--trace", SAMPLE, "--limit", "20", "--cpu-chunks", "10,20"]
    second: list[subprocess.CompletedProcess[str]] = []

    def start_another(row, done, total):
        if done == 1:
            second.append(kvsim(*cli_args, "--out", str(out), "--executor", "serial"))

    sweep(spec, executor="serial", out=out, on_row=start_another)
    res = second[0]
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"another sweep (pid {os.getpid()}) is writing to this folder" in lines[0]
    assert len(journal_lines(out)) == 2  # the refused sweep wrote nothing
    done = kvsim(*cli_args, "--out", str(out), "--executor", "serial")  # free again
    assert done.returncode == 0, done.stderr
