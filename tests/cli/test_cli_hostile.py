"""Issue 27's command-line faults, each a regression test through the real entry point: an
output folder that holds an input (#1), plugin side effects (#8, #14), one-line messages
(#13), SIGHUP (#12), a trailing slash (#15)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import CONVERSATION, LLAMA_CONFIG, ROOT, SAMPLE, TRACES, run_main

AZURE = TRACES / "azure_llm_2023_code.csv"


def one_line(err: str) -> bool:
    return len([line for line in err.splitlines() if line.strip()]) == 1


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# --------------------------------------------------------------------------- 1: out folders

CASES = [
    ("simulate", "requests.csv", ["--limit", "50", "--no-progress"]),  # an Azure CSV trace
    ("simulate", "steps.parquet", ["--limit", "50", "--no-progress", "--format", "mooncake"]),
    ("replay", "requests.csv", ["--cpu-chunks", "10", "--format", "mooncake"]),
    ("replay", "summary.json", ["--cpu-chunks", "10", "--format", "mooncake"]),
    ("replay", "metadata.json", ["--cpu-chunks", "10", "--format", "mooncake"]),
]


@pytest.mark.parametrize(("command", "name", "extra"), CASES)
def test_an_input_inside_the_out_folder_is_never_overwritten(
    tmp_path, capsys, command, name, extra
):
    out = tmp_path / "d"
    out.mkdir()
    shutil.copy(AZURE if command == "simulate" and name.endswith(".csv") else SAMPLE, out / name)
    before = snapshot(out)
    if command == "simulate" and "--format" in extra:
        extra = extra[:-2]  # simulate reads the format from the file's content
    code, _, err = run_main([command, out / name, *extra, "--out", out], capsys)
    assert code == 2, err
    assert one_line(err) and name in err and "input" in err, err
    assert snapshot(out) == before


def test_a_link_in_the_out_folder_to_the_trace_is_never_followed(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    shutil.copy(SAMPLE, trace)
    out = tmp_path / "d"
    out.mkdir()
    (out / "requests.csv").symlink_to(trace)
    before = trace.read_bytes()
    code, _, err = run_main(["replay", trace, "--cpu-chunks", "10", "--out", out], capsys)
    assert code == 2 and "requests.csv" in err, err
    assert trace.read_bytes() == before


def test_a_model_config_inside_the_out_folder_is_kept(tmp_path, capsys):
    out = tmp_path / "d"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    before = snapshot(out)
    args = ["replay", SAMPLE, "--cpu-gib", "1", "--model", out, "--out", out]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "config.json" in err, err
    assert snapshot(out) == before


def test_a_stale_file_the_marker_lists_is_an_input_too(tmp_path, capsys):
    """An earlier run's file that this run would remove (its marker lists it)."""
    out = tmp_path / "d"
    code, _, err = run_main(["replay", SAMPLE, "--cpu-chunks", "10", "--out", out], capsys)
    assert code == 0, err
    marker = json.loads((out / ".kvsim-run.json").read_text())
    (out / "my.jsonl").write_bytes(Path(SAMPLE).read_bytes())
    marker["files"].append("my.jsonl")
    (out / ".kvsim-run.json").write_text(json.dumps(marker))
    code, _, err = run_main(
        ["replay", out / "my.jsonl", "--cpu-chunks", "10", "--out", out], capsys
    )
    assert code == 2 and "my.jsonl" in err, err
    assert (out / "my.jsonl").read_bytes() == Path(SAMPLE).read_bytes()


def test_an_unrelated_file_in_the_out_folder_is_fine(tmp_path, capsys):
    out = tmp_path / "d"
    out.mkdir()
    shutil.copy(SAMPLE, out / "trace.jsonl")
    args = ["replay", out / "trace.jsonl", "--cpu-chunks", "10", "--out", out]
    code, _, err = run_main(args, capsys)
    assert code == 0, err
    assert (out / "trace.jsonl").read_bytes() == Path(SAMPLE).read_bytes()
    assert (out / "requests.csv").exists()


def test_result_save_refuses_to_overwrite_its_trace(tmp_path):
    import kvsim
    from kvsim.core.errors import InputError

    shutil.copy(SAMPLE, tmp_path / "requests.csv")
    result = kvsim.replay(str(tmp_path / "requests.csv"), fmt="mooncake", cpu_chunks=10)
    with pytest.raises(InputError, match=r"requests\.csv"):
        result.save(tmp_path)
    assert (tmp_path / "requests.csv").read_bytes() == Path(SAMPLE).read_bytes()


# --------------------------------------------------------------------------- 8, 14: plugins

PLUGINS = """
import sys

from kvsim.policies.lru import LRUPolicy


class UnknownKey(LRUPolicy):
    def evict(self, n, protected):
        victims = super().evict(n, protected)
        return None if victims is None else [(123456789, victims[0][1])] + victims[1:]


class KeyTwice(LRUPolicy):
    def evict(self, n, protected):
        victims = super().evict(n, protected)
        if victims is None or n < 2:
            return victims
        return [victims[0], victims[0]] + victims[2:]


class Exits(LRUPolicy):
    def evict(self, n, protected):
        raise SystemExit(0)


class ExitsLater(LRUPolicy):
    def touch(self, keys, ctx=None):
        sys.exit(0)


class RaisesInAHook(LRUPolicy):
    def touch(self, keys, ctx=None):
        raise RuntimeError("boom")


class Prints(LRUPolicy):
    def evict(self, n, protected):
        print("evicting", n)
        return super().evict(n, protected)
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "hostile_plugins.py").write_text(PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    ("cls", "phrase"),
    [
        ("UnknownKey", "returned key 123456789 which is not in the cache"),
        ("KeyTwice", "twice"),
        ("Exits", "failed in evict: SystemExit: 0"),
    ],
)
def test_a_plugin_evict_that_breaks_the_protocol_is_one_line(plugins, capsys, cls, phrase):
    args = ["replay", SAMPLE, "--cpu-chunks", "20", "--policy", f"hostile_plugins:{cls}"]
    code, out, err = run_main(args, capsys)
    assert code == 2, (out, err)
    assert one_line(err) and f"hostile_plugins:{cls}" in err and phrase in err, err
    assert "Traceback" not in err


def test_a_plugin_exit_anywhere_is_an_error_not_a_silent_success(plugins, capsys):
    args = ["replay", SAMPLE, "--cpu-chunks", "20", "--policy", "hostile_plugins:ExitsLater"]
    code, _, err = run_main([*args, "--no-fused"], capsys)
    assert code == 2 and one_line(err) and "exit(0)" in err, err


@pytest.mark.parametrize("command", ["replay", "mrc"])
def test_a_plugin_raising_in_any_hook_is_one_line_naming_it(plugins, capsys, command):
    """Not only evict: any call into the plugin that raises (a traceback before)."""
    args = [command, SAMPLE, "--policy", "hostile_plugins:RaisesInAHook"]
    args += ["--cpu-chunks", "20", "--no-fused"] if command == "replay" else []
    code, _, err = run_main(args, capsys)
    assert code == 2 and one_line(err), err
    assert "hostile_plugins.py:" in err and "in touch" in err and "RuntimeError: boom" in err


def test_a_closed_pipe_ends_quietly(tmp_path):
    """``kvsim policies | head -1``: the reader is gone before kvsim writes; it ends as a
    writer killed by SIGPIPE would, saying nothing (it blamed a plugin before)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvsim", "policies"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has even imported kvsim
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGPIPE
    assert err == b""


def test_a_plugin_print_never_reaches_json_stdout(plugins, capsys):
    args = ["replay", SAMPLE, "--cpu-chunks", "20", "--policy", "hostile_plugins:Prints", "--json"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    assert json.loads(out)["requests"] > 0
    assert "evicting" in err


# --------------------------------------------------------------------------- 12: SIGHUP


def test_sighup_leaves_no_temp_file(tmp_path):
    """A closed terminal or a dropped ssh connection: cleaned up as SIGTERM is."""
    argv = ["replay", CONVERSATION, "--cpu-chunks", "2000", "--policy", "s3fifo"]
    argv += ["--chunk-tokens", "16", "--no-progress", "--requests-csv", str(tmp_path / "r.csv")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvsim", *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not list(tmp_path.glob(".r.csv.*.tmp")) and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.02)
    time.sleep(1.0)  # past the run's first imports (see test_cli_reliability)
    assert proc.poll() is None, "the replay ended before it could be hung up"
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert "hung up" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- 13: one line


def test_a_file_size_limit_on_requests_csv_is_one_line(tmp_path):
    out = tmp_path / "rows.csv"
    command = f"ulimit -f 20; {sys.executable} -m kvsim replay {CONVERSATION} --cpu-chunks 10"
    done = subprocess.run(
        ["bash", "-c", f"{command} --requests-csv {out} --no-progress > /dev/null"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr) and str(out) in done.stderr, done.stderr
    assert "File too large" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_hitting_a_file_size_limit_names_the_file(tmp_path):
    out = tmp_path / "o"
    command = f"ulimit -f 1; {sys.executable} -m kvsim sweep --trace {SAMPLE}"
    command += f" --cpu-chunks 10,20,30,40,50,60,70,80 --out {out} --executor serial"
    done = subprocess.run(
        ["bash", "-c", command + " --no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr) and str(out) in done.stderr, done.stderr


def test_a_newline_in_a_path_stays_on_one_line(tmp_path, capsys):
    code, _, err = run_main(["replay", tmp_path / "a\nb.jsonl", "--cpu-chunks", "10"], capsys)
    assert code == 2 and one_line(err) and "a\\nb.jsonl" in err, err


# --------------------------------------------------------------------------- 15: a slash


def test_a_trailing_slash_on_an_output_file_is_refused(tmp_path, capsys):
    target = tmp_path / "x.csv"
    args = ["replay", SAMPLE, "--cpu-chunks", "10", "--requests-csv", f"{target}/"]
    code, _, err = run_main(args, capsys)
    assert code == 2 and one_line(err) and "x.csv/" in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_link_to_a_missing_folder_is_refused_as_the_folder_is(tmp_path, capsys):
    """The output is written through the link; a target whose folder is missing was made
    (and left behind when the run then failed), where a direct path is refused."""
    link = tmp_path / "out.csv"
    link.symlink_to(tmp_path / "missing" / "x.csv")
    args = ["replay", SAMPLE, "--cpu-chunks", "10", "--requests-csv", str(link)]
    code, _, err = run_main(args, capsys)
    assert code == 2 and one_line(err) and "missing does not exist" in err, err
    assert not (tmp_path / "missing").exists()


def test_a_bad_line_on_standard_input_is_named_as_stdin(tmp_path):
    """``-`` is read through a temporary copy, gone when the error is read: the line is
    named ``<stdin>:N``, not by that copy's path."""
    lines = Path(SAMPLE).read_text().splitlines()[:3]
    bad = '{"timestamp": 1, "input_length": "x", "output_length": 2, "hash_ids": [1]}'
    proc = subprocess.run(
        [sys.executable, "-m", "kvsim", "replay", "-", "--cpu-chunks", "100"],
        input="\n".join([*lines, bad]) + "\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "<stdin>:4: field 'input_length'" in proc.stderr and "kvsim-trace-" not in proc.stderr


# --------------------------------------------------------------------------- a preset name


@pytest.mark.parametrize(
    "option,value,said",
    [
        ("--gpu", "h2000", "--gpu: unknown GPU 'h2000' (did you mean 'h200'?); known: "),
        ("--model", "lama-3.2-1b", "--model: unknown model 'lama-3.2-1b' (did you mean "),
    ],
)
def test_an_unknown_preset_names_its_option_and_the_closest_name(capsys, option, value, said):
    """``--gpu`` was not named (``unknown GPU 'h2000'``), and neither name had a hint."""
    args = ["simulate", SAMPLE, "--model", "llama-3.2-1b", "--cpu-chunks", "10", option, value]
    code, out, err = run_main(args, capsys)
    assert code == 2 and one_line(err) and said in err and out == "", err
