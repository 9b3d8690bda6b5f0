"""Issue 13's faults, each pinned through the real entry point (``kvsim.cli.main``; a
subprocess where signals, devices or standard streams are involved): no input destroyed,
one line and exit 2 for bad input, nothing half-written."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from support import CONVERSATION, ROOT, SAMPLE, run_main

import kvsim
from kvsim.core.errors import InputError
from kvsim.policies.lru import LRUPolicy
from kvsim.traces import open_trace

run = run_main


def one_line_error(code: int, err: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    copy = tmp_path / "t.jsonl"
    shutil.copy(SAMPLE, copy)
    return copy


# --- 1. an output equal to an input is refused, the input untouched ---


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "{t}", "--cpu-chunks", "50", "--requests-csv", "{t}"],
        ["replay", "{t}", "--cpu-chunks", "50", "--requests-csv", "{link}"],
        ["mrc", "{t}", "--csv", "{t}"],
        ["simulate", "{t}", "--limit", "3", "--no-progress", "--chrome-trace", "{t}"],
        ["mrc", "{t}", "--plot", "{t}"],
        ["bench", "{t}", "--cpu-chunks", "50", "--repeat", "1", "--csv", "{t}"],
        [
            "trace",
            "gen",
            "chat",
            "-n",
            "5",
            "--arrival",
            "replay",
            "--arrival-trace",
            "{t}",
            "-o",
            "{t}",
        ],
    ],
    ids=[
        "replay",
        "replay-through-symlink",
        "mrc-csv",
        "simulate-chrome-trace",
        "mrc-plot",
        "bench",
        "trace-gen",
    ],
)
def test_an_output_that_is_an_input_is_refused(args, trace, tmp_path, capsys):
    link = tmp_path / "link.jsonl"
    link.symlink_to(trace)
    before = digest(trace)
    code, _, err = run([a.format(t=trace, link=link) for a in args], capsys)
    one_line_error(code, err)
    assert "is an input of this run" in err
    assert digest(trace) == before


# --- 2. symlinks are written through, devices written into, never replaced ---


def test_an_output_symlink_stays_a_link_to_the_new_file(trace, tmp_path, capsys):
    target = tmp_path / "rows.csv"
    target.write_text("old\n")
    link = tmp_path / "rows-link.csv"
    link.symlink_to(target)
    code, _, err = run(["replay", trace, "--cpu-chunks", "50", "--requests-csv", link], capsys)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert pd.read_csv(target).shape[0] == 200


def test_a_device_output_is_written_into_not_replaced(trace, capsys):
    code, _, err = run(
        ["replay", trace, "--cpu-chunks", "50", "--requests-csv", "/dev/null"], capsys
    )
    assert code == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_dev_stdout_gets_the_csv(trace):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvsim",
            "replay",
            str(trace),
            "--cpu-chunks",
            "50",
            "--requests-csv",
            "/dev/stdout",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") > 200  # the summary JSON and 201 CSV lines


# --- 16. SIGTERM cleans up like Ctrl-C ---


def _long_replay_with_its_temp_file(folder: Path, poll_s: float) -> subprocess.Popen[str]:
    """A replay writing ``folder/rows.csv``, returned once its temporary file exists.
    16-token chunks (32 keys per trace block) make it last long enough (tens of seconds)
    to be interrupted while that file exists."""
    argv = ["replay", CONVERSATION, "--cpu-chunks", "2000", "--policy", "s3fifo"]
    argv += ["--chunk-tokens", "16", "--no-progress", "--requests-csv", str(folder / "rows.csv")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvsim", *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not list(folder.glob(".rows.csv.*.tmp")) and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(poll_s)
    return proc


def test_sigterm_leaves_no_temp_file(tmp_path):
    proc = _long_replay_with_its_temp_file(tmp_path, 0.02)
    # past the run's first imports (a first read loads Arrow): a signal inside an import
    # can trip CPython's own import locks (gh-87712), which no cleanup of ours can mend
    time.sleep(1.0)
    assert proc.poll() is None, "the replay ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_around_the_csv_helpers_fork_leaves_nothing_behind(tmp_path):
    """The CSV helper is forked just after the temporary file is made: a SIGTERM landing
    a few milliseconds either side of the fork still stops both processes, and neither
    leaves the file (the helper never recreates a file its parent removed). The trace is
    cached first, so that nothing is imported in that window (see above)."""
    list(open_trace(CONVERSATION))  # into this test's trace cache, which the runs share
    delays = [0.0, 0.001, 0.002, 0.003, 0.005, 0.008, 0.013]
    for i, delay in enumerate(delays):
        folder = tmp_path / str(i)
        folder.mkdir()
        proc = _long_replay_with_its_temp_file(folder, 0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, (delay, err)
        time.sleep(0.2)  # a helper that outlived its parent would write by now
        assert list(folder.iterdir()) == [], delay


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_whose_exception_python_dropped_still_commits_nothing(tmp_path):
    """CPython drops an exception raised in a weakref callback (its import locks run
    such callbacks): the SIGTERM handler's exception is lost there, the run goes on, and
    the first file it would commit raises the signal again instead, leaving nothing."""
    import weakref

    from kvsim.core.ending import Terminated, end_on_signal, forget_ending
    from kvsim.core.io import atomic_write

    class Anything:
        pass

    thing = Anything()
    ref = weakref.ref(thing, lambda _: end_on_signal(signal.SIGTERM, None))
    try:
        del thing  # the callback runs and raises; Python prints it and goes on
        assert ref() is None
        target = tmp_path / "rows.csv"
        with pytest.raises(Terminated) as raised, atomic_write(target) as f:
            f.write("a,b\n")
        assert raised.value.signum == signal.SIGTERM
        assert list(tmp_path.iterdir()) == []
    finally:
        forget_ending()
    with atomic_write(tmp_path / "after.csv") as f:  # forgotten: the next run commits
        f.write("x\n")
    assert (tmp_path / "after.csv").read_text() == "x\n"


# --- 15. one line for usage errors and unwritable outputs ---


def test_a_usage_error_is_one_line(capsys):
    code, _, err = run(["replay", SAMPLE, "--no-such-option"], capsys)
    one_line_error(code, err)
    assert "kvsim replay" in err and "--help" in err


def test_an_unwritable_output_names_the_file(trace, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            locked.chmod(0o700)
            blocker = tmp_path / "file"
            blocker.write_text("")
            out = blocker / "rows.csv"  # a file where a folder should be: fails even as root
        else:
            out = locked / "rows.csv"
        code, _, err = run(["replay", trace, "--cpu-chunks", "50", "--requests-csv", out], capsys)
    finally:
        locked.chmod(0o700)
    one_line_error(code, err)
    assert "rows.csv" in err or str(out.parent) in err


def test_a_failed_simulate_leaves_no_out_folder_behind(tmp_path, capsys):
    """simulate makes --out first (--chrome-trace may go inside it); when the run then
    fails, the folders it made are removed again, and a folder that was there stays."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": "x"}\n'
    )
    args = ["simulate", bad, "--cpu-gib", "1", "--model", "llama-3.1-8b", "--out"]
    code, _, err = run_main([*args, tmp_path / "new" / "run"], capsys)
    one_line_error(code, err)
    assert "bad.jsonl:2" in err
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    code, _, err = run_main([*args, tmp_path / "kept" / "run"], capsys)
    one_line_error(code, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "kept"]
    assert not any((tmp_path / "kept").iterdir())


# --- 4, 5, 14, 17. values are checked before any arithmetic ---


@pytest.mark.parametrize(
    ("extra", "phrase"),
    [
        (["--cpu-gib", "nan", "--model", "llama-3.1-8b"], "--cpu-gib: must be finite"),
        (["--cpu-gib", "inf", "--model", "llama-3.1-8b"], "--cpu-gib: must be finite"),
        (["--cpu-chunks", "10", "--chunk-tokens", "0"], "--chunk-tokens: Expected `int` >= 1"),
        (["--cpu-chunks", "10", "--vllm-config", '{"cpu_bytes_to_use": NaN}'], "NaN"),
        (["--cpu-chunks", "10", "--vllm-config", "missing.json"], "no such file"),
        (
            ["--vllm-config", '{"cpu_bytes_to_use": 1e9, "eviction_policy": "nope"}'],
            "--vllm-config: eviction_policy: unknown eviction policy 'nope'",
        ),
        (
            ["--vllm-config", '{"kv_connector": "LMCacheConnector", "kv_role": "kv_both"}'],
            "kv_connector: must be one of OffloadingConnector, got 'LMCacheConnector'",
        ),
        (
            ["--cpu-chunks", "10", "--tier", "fs:n_read_threads=-2"],
            "n_read_threads: Expected `int` >= 1, got -2",
        ),
        (["--cpu-chunks", "10", "--tier", "fs:capacity=0"], "at least 1 byte, got 0"),
    ],
)
def test_bad_option_values_are_one_line(extra, phrase, capsys):
    code, _, err = run(["replay", SAMPLE, *extra], capsys)
    one_line_error(code, err)
    assert phrase in err


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"cpu_chunks": 10.5}, "--cpu-chunks: Expected `int | null`, got 10.5"),
        ({"cpu_chunks": "10"}, "--cpu-chunks: Expected `int | null`, got '10'"),
        ({"cpu_chunks": True}, "--cpu-chunks: Expected `int | null`, got True"),
        ({"cpu_gib": "64", "model": "llama-3.1-8b"}, "--cpu-gib: Expected `float | null`, got '6"),
        ({"cpu_gib": "abc"}, "--cpu-gib: Expected `float | null`, got 'abc'"),
        ({"cpu_chunks": 10, "policy": LRUPolicy}, "--policy: Expected `str`, got <class"),
    ],
)
def test_api_misuse_raises_input_errors(kwargs, phrase):
    with pytest.raises(InputError) as info:
        kvsim.replay(SAMPLE, **kwargs)
    assert str(info.value).startswith(phrase)


def test_api_misuse_outside_replay_is_named():
    with pytest.raises(InputError, match=r"options are given by name \(replay\(trace"):
        kvsim.replay(SAMPLE, 64)  # type: ignore[misc]
    for points in (-5, 0, 1, 2.5):
        with pytest.raises(InputError, match=f"--points must be a whole number >= 2, got {points}"):
            kvsim.mrc(SAMPLE, points=points)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="on_row must be a function"):
        kvsim.sweep("never-read.yaml", on_row=5)  # type: ignore[arg-type]
    curve = kvsim.mrc(SAMPLE)
    assert curve.reach(0.5).equals(curve.reach([0.5]))
    assert repr(curve).startswith("<MRC lru, prefix protocol, sample rate 1: ")
    assert f"{len(curve.table):,} rows" in repr(curve) and "DataFrame" not in repr(curve)


def test_api_rejects_what_is_not_a_trace():
    with pytest.raises(InputError, match="got int"):
        kvsim.replay(42, cpu_chunks=10)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="holds Requests"):
        kvsim.replay([1, 2], cpu_chunks=10)  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("row", "phrase"),
    [
        ({"prompt_tokens": -512, "block_hashes": [1]}, "non-negative integer"),
        ({"prompt_tokens": 5120, "block_hashes": [1]}, "needs 10"),
        ({"prompt_tokens": 1024, "block_hashes": [1.7, 2]}, "element 0 is 1.7"),
    ],
)
def test_dataframe_traces_are_checked_like_files(row, phrase):
    frame = pd.DataFrame([{"arrival_s": 0.0, "output_tokens": 1, **row}])
    with pytest.raises(InputError, match=f"requests DataFrame row:0: .*{phrase}"):
        kvsim.replay(frame, cpu_chunks=10)


@pytest.mark.parametrize("bin_s", ["nan", "0", "1e-7"])
def test_trace_stats_bins_are_bounded(bin_s, capsys):
    code, _, err = run(["trace", "stats", SAMPLE, "--bin-s", bin_s], capsys)
    one_line_error(code, err)
    assert "--bin-s" in err


@pytest.mark.parametrize("knob", ["turns=abc", "weights=[1,2]", "turns=-3", "rate=.inf"])
def test_trace_gen_knobs_are_one_line(knob, tmp_path, capsys):
    code, _, err = run(
        ["trace", "gen", "chat", "-n", "5", "--set", knob, "-o", tmp_path / "g.jsonl"], capsys
    )
    one_line_error(code, err)
    assert not list(tmp_path.iterdir())


# --- 10, 19. generated traces read back as written ---


def test_trace_gen_gz_is_gzip_and_reads_back(tmp_path, capsys):
    out = tmp_path / "g.jsonl.gz"
    code, _, err = run(["trace", "gen", "chat", "-n", "20", "-o", out], capsys)
    assert code == 0, err
    with gzip.open(out, "rt") as f:
        assert f.readline().startswith("{")
    assert len(list(open_trace(out))) == 20


def test_trace_gen_with_another_block_size_records_it(tmp_path, capsys):
    out = tmp_path / "g16.jsonl"
    code, stdout, err = run(
        ["trace", "gen", "chat", "-n", "20", "--set", "block_tokens=16", "-o", out], capsys
    )
    assert code == 0, err
    assert "16-token blocks" in stdout
    trace = open_trace(out)
    assert trace.block_tokens == 16 and len(list(trace)) == 20


# --- 20. a policy named twice is timed once ---


def test_bench_lists_each_policy_once(capsys):
    code, out, err = run(
        ["bench", SAMPLE, "--policies", "lru,lru,arc", "--cpu-chunks", "50", "--repeat", "1"],
        capsys,
    )
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["kvsim"]]
    assert [r[1] for r in rows] == ["lru", "arc"]


# --- 8. standard input, FIFOs and process substitution are read once ---


def _replay_cpu_hits(command: str) -> str:
    proc = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return next(line for line in proc.stdout.splitlines() if line.startswith("cpu_hit_blocks"))


@pytest.mark.parametrize(
    "command",
    [
        "cat {t} | {kvsim} replay - --cpu-chunks 100",
        "{kvsim} replay <(cat {t}) --cpu-chunks 100",
        "rm -f {fifo}; mkfifo {fifo}; (cat {t} > {fifo} &); {kvsim} replay {fifo} --cpu-chunks 100",
    ],
    ids=["stdin", "process-substitution", "fifo"],
)
def test_streams_give_the_same_answer_as_the_file(command, tmp_path):
    kvsim_cmd = f"{sys.executable} -m kvsim"
    want = _replay_cpu_hits(f"{kvsim_cmd} replay {SAMPLE} --cpu-chunks 100")
    got = _replay_cpu_hits(command.format(t=SAMPLE, kvsim=kvsim_cmd, fifo=tmp_path / "fifo"))
    assert got == want


# --- 5. a faulty policy plugin is one line naming the class and the call ---

PLUGIN = """
from kvsim.policies.lru import LRUPolicy


class RaisesInInit(LRUPolicy):
    def __init__(self, capacity):
        raise RuntimeError("boom in init")


class RaisesInEvict(LRUPolicy):
    def evict(self, n, protected):
        raise ZeroDivisionError("boom in evict")


class ReturnsAnInt(LRUPolicy):
    def evict(self, n, protected):
        return 42
"""


@pytest.mark.parametrize(
    ("spec", "phrase"),
    [
        ("plugin_faults:RaisesInInit", "failed in __init__(20): RuntimeError: boom in init"),
        ("plugin_faults:RaisesInEvict", "failed in evict: ZeroDivisionError: boom in evict"),
        ("plugin_faults:ReturnsAnInt", "must return None or a list of"),
        ("plugin_import_fault:X", "importing module 'plugin_import_fault' failed"),
    ],
)
def test_faulty_policy_plugins_are_one_line(spec, phrase, tmp_path, monkeypatch, capsys):
    (tmp_path / "plugin_faults.py").write_text(PLUGIN)
    (tmp_path / "plugin_import_fault.py").write_text("raise RuntimeError('import boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(["replay", SAMPLE, "--cpu-chunks", "20", "--policy", spec], capsys)
    one_line_error(code, err)
    assert phrase in err


def test_bench_vllm_without_vllm_is_one_line(monkeypatch, capsys):
    bench = importlib.import_module("kvsim.cachemode.bench")  # kvsim.replay is also a function
    monkeypatch.setattr(bench, "vllm_available", lambda: False)
    code, _, err = run(["bench", SAMPLE, "--cpu-chunks", "50", "--repeat", "1", "--vllm"], capsys)
    one_line_error(code, err)
    assert "not importable" in err


def test_vllm_block_size_errors_name_the_key(capsys):
    code, _, err = run(
        ["replay", SAMPLE, "--cpu-chunks", "10", "--vllm-config", '{"block_size": -16}'], capsys
    )
    one_line_error(code, err)
    assert "--vllm-config: block_size: Expected `int` >= 1, got -16" in err


def test_mrc_sampling_that_keeps_nothing_is_an_error(capsys):
    code, _, err = run(["mrc", SAMPLE, "--sample-rate", "1e-9"], capsys)
    one_line_error(code, err)
    assert "kept none" in err


@pytest.mark.parametrize(
    ("extra", "phrase"),
    [(["--poisson-rate", "inf"], "--poisson-rate"), (["--time-scale", "nan"], "--time-scale")],
)
def test_simulate_timing_options_must_be_finite(extra, phrase, capsys):
    code, _, err = run(["simulate", SAMPLE, "--limit", "3", "--no-progress", *extra], capsys)
    one_line_error(code, err)
    assert phrase in err


def test_calibrate_refuses_one_file_for_profile_and_report(tmp_path, capsys):
    same = tmp_path / "p.json"
    code, _, err = run(["calibrate", "--out", same, "--report", same], capsys)
    one_line_error(code, err)
    assert f"--report and --out both name {same}: give each its own file" in err
    assert not same.exists()


# --- 6. simulate --out is one set: complete, or refused by readers ---


def test_simulate_out_replaces_an_earlier_set_and_marks_it_complete(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["simulate", SAMPLE, "--limit", "5", "--no-progress", "--out", out]
    code, _, err = run([*base, "--cpu-chunks", "20", "--baseline"], capsys)
    assert code == 0, err
    assert (out / "baseline_requests.csv").exists()
    code, _, err = run([*base, "--cpu-chunks", "20"], capsys)
    assert code == 0, err
    marker = json.loads((out / ".kvsim-run.json").read_text())
    assert sorted(marker["files"]) == sorted(p.name for p in out.iterdir() if p.name[0] != ".")
    assert not (out / "baseline_requests.csv").exists()  # the earlier run's extra table
    code, _, err = run(["plot", out, "--kind", "ttft-cdf", "--out", tmp_path / "f"], capsys)
    assert code == 0, err


def test_a_run_folder_without_its_marker_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run(
        ["simulate", SAMPLE, "--limit", "5", "--no-progress", "--cpu-chunks", "20", "--out", out],
        capsys,
    )
    assert code == 0, err
    (out / ".kvsim-run.json").unlink()  # as a run killed mid-write leaves it
    code, _, err = run(["plot", out, "--kind", "ttft-cdf"], capsys)
    one_line_error(code, err)
    assert "incomplete run folder" in err


# --- 7. out-of-order arrivals are sorted, with a warning ---


def test_out_of_order_arrivals_are_sorted_with_a_warning(tmp_path, capsys):
    lines = [
        '{"timestamp": 5000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
        '{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [3, 4]}',
        '{"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [5, 6]}',
    ]
    trace = tmp_path / "late.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    code, out, err = run(["simulate", trace, "--no-progress", "--json"], capsys)
    assert code == 0, err
    assert err.count("kvsim: warning:") == 1 and "2 request(s)" in err
    summary = json.loads(out)
    assert summary["p99_ttft_ms"] < 100  # measured from each request's own arrival


def test_an_error_on_a_trace_without_reuse_is_still_one_line(capsys):
    """The note that an Azure trace has no prefix reuse comes after a run, never before its
    error."""
    azure = str(ROOT / "traces" / "azure_llm_2023_code.csv")
    code, _, err = run(["replay", azure, "--cpu-chunks", "0"], capsys)
    one_line_error(code, err)
    code, _, err = run(["replay", azure, "--cpu-chunks", "10", "--limit", "5"], capsys)
    assert code == 0 and "no prefix-reuse information" in err


@pytest.mark.parametrize(
    ("extra", "phrase"),
    [
        # two blocks: vLLM's null block and one 16-token block, which no request fits in
        (["--gpu-kv-blocks", "2", "--cpu-chunks", "10"], "no request of the trace fits"),
        (["--cpu-gib", "4", "--cpu-chunks", "50"], "only one CPU tier size"),
    ],
)
def test_validate_refuses_runs_that_would_compare_nothing(extra, phrase, capsys):
    pytest.importorskip("torch", reason="kvsim validate checks for torch first")
    code, _, err = run(["validate", SAMPLE, "--limit", "5", *extra], capsys)
    one_line_error(code, err)
    assert phrase in err


def test_json_errors_do_not_stutter(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(Path(SAMPLE).read_text().splitlines()[0] + '\n{"timestamp": "unterminated\n')
    code, _, err = run(["replay", trace, "--cpu-chunks", "5"], capsys)
    one_line_error(code, err)
    assert "t.jsonl:2: malformed JSON (" in err and ", column " in err
    assert "at at" not in err


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["simulate", SAMPLE, "--limit", "3", "--no-progress", "--cpu-gib", "nan"], "finite"),
        (["mrc", SAMPLE, "--plot", "curve.xyz"], "cannot write a .xyz figure"),
        (["sweep", "--trace", SAMPLE, "--cpu-gib", "abc", "--out", "{tmp}/s"], "--cpu-gib"),
        (["sweep", SAMPLE, "--out", "{tmp}/s"], "bad YAML"),
    ],
    ids=["simulate-cpu-gib-nan", "mrc-plot-format", "sweep-cpu-gib-text", "sweep-bad-yaml"],
)
def test_more_former_tracebacks_are_one_line(args, phrase, tmp_path, capsys):
    code, _, err = run([str(a).format(tmp=tmp_path) for a in args], capsys)
    one_line_error(code, err)
    assert phrase in err


def test_main_gives_the_callers_handlers_back(capsys):
    """Run in-process (a test, a notebook), ``main`` must not leave its SIGTERM handler or
    its warning printer behind."""
    import warnings

    term, show = signal.getsignal(signal.SIGTERM), warnings.showwarning
    code, _, _ = run(["replay", SAMPLE, "--cpu-chunks", "5", "--limit", "3"], capsys)
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) is term and warnings.showwarning is show


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's always-full device")
def test_a_full_device_as_output_is_named(capsys):
    code, _, err = run(["trace", "gen", "chat", "-n", "3", "-o", "/dev/full"], capsys)
    one_line_error(code, err)
    assert "kvsim: error: /dev/full: cannot write (No space left on device)" in err
