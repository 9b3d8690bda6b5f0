"""Faults a probe of every command found (2026-12-07), each a regression test through the
real entry point: a command group called bare prints its help as it reads; an output name
the run writes that is taken by a folder, an output folder that cannot be made and a
Chrome trace named as a run file are refused before the run, leaving nothing; sizes past
any machine are one line naming the option (a CPU tier past any float of bytes is the
ceiling, as one past any trace is); a run spanning ages is summarised."""

from __future__ import annotations

import json

import pytest
from support import ROOT, SAMPLE, run_main

PRIOR = ROOT / "examples" / "h100-prior-profile.json"


def one_line(err: str) -> bool:
    return len([line for line in err.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("args", [[], ["trace"]])
def test_a_bare_group_prints_its_help_as_it_reads(capsys, args):
    code, out, err = run_main(args, capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: kvsim") and "\nCommands:\n" in err and "\\n" not in err


@pytest.mark.parametrize(
    "args, option",
    [
        (["replay", SAMPLE, "--cpu-chunks", "9", "--gpu-blocks", "99999999999999"], "--gpu-blocks"),
        (
            ["simulate", SAMPLE, "--cpu-chunks", "9", "--gpu-blocks", "99999999999999"],
            "--gpu-blocks",
        ),
        (
            ["bench", SAMPLE, "--timed", "--no-vllm", "--limit", "5", "--gpu-blocks", "1"],
            "--gpu-blocks",
        ),
        (["replay", SAMPLE, "--cpu-chunks", "9", "--instances", "100000"], "--instances"),
    ],
)
def test_a_size_past_any_machine_is_one_line_naming_its_option(capsys, args, option):
    """These were a MemoryError traceback (or the wrong option's name)."""
    code, _, err = run_main(args, capsys)
    assert code == 2 and one_line(err) and option in err and "Traceback" not in err


def test_a_cpu_tier_past_any_float_of_bytes_is_the_ceiling(capsys):
    """1e300 GiB was an OverflowError traceback (its bytes are no float); as 1e19 GiB, a
    size past any trace is the ceiling (tests/options/test_capacity_units.py)."""
    args = ["replay", SAMPLE, "--model", "llama-3.1-8b", "--cpu-gib"]
    code, huge, err = run_main([*args, "1e300"], capsys)
    assert code == 0, err
    code, big, err = run_main([*args, "1e19"], capsys)
    assert code == 0, err
    hit = [line for line in huge.splitlines() if line.startswith("cpu_hit_ratio")]
    assert hit and hit == [line for line in big.splitlines() if line.startswith("cpu_hit_ratio")]
    assert "(~10^309 B)" in huge


@pytest.mark.parametrize(
    "command, taken",
    [
        (["simulate", SAMPLE, "--cpu-chunks", "40", "--limit", "10"], "summary.json"),
        (["replay", SAMPLE, "--cpu-chunks", "40", "--limit", "10"], "requests.parquet"),
        (
            ["sweep", "--trace", SAMPLE, "--cpu-chunks", "10", "--executor", "serial"],
            "results.parquet",
        ),
    ],
)
def test_an_output_name_taken_by_a_folder_is_refused_before_the_run(
    tmp_path, capsys, command, taken
):
    """The run used to go, write its other files, then fail on the folder."""
    out = tmp_path / "out"
    (out / taken).mkdir(parents=True)
    code, _, err = run_main([*command, "--out", out], capsys)
    assert code == 2 and one_line(err) and taken in err and "--out" in err
    assert [p.name for p in out.iterdir()] == [taken]


def test_a_sweeps_own_cells_folder_is_not_refused(tmp_path, capsys):
    args = ["sweep", "--trace", SAMPLE, "--cpu-chunks", "10", "--executor", "serial"]
    code, _, err = run_main([*args, "--out", tmp_path / "s"], capsys)
    assert code == 0, err
    (tmp_path / "s" / "cells").mkdir(exist_ok=True)
    code, _, err = run_main([*args, "--out", tmp_path / "s"], capsys)
    assert code == 0, err


def test_replay_refuses_an_out_folder_it_cannot_make_before_the_run(tmp_path, capsys):
    """It used to replay the whole trace, print nothing and then fail."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", "40", "--out", blocker / "run"], capsys
    )
    assert code == 2 and one_line(err) and str(blocker) in err and out == ""
    code, _, err = run_main(["replay", SAMPLE, "--cpu-chunks", "40", "--out", ""], capsys)
    assert code == 2 and one_line(err) and "--out" in err


def test_cross_validate_refuses_its_out_folder_before_the_folds(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_main(  # any FILE will do: the folder is checked first
        ["cross-validate", SAMPLE, "--gpu", "h100", "--start", PRIOR, "--out", blocker / "cv"],
        capsys,
    )
    assert code == 2 and one_line(err) and str(blocker) in err


def test_a_chrome_trace_named_as_a_run_file_is_refused(tmp_path, capsys):
    """It overwrote the run's summary.json, and the run's marker said the run was whole."""
    out = tmp_path / "run"
    args = ["simulate", SAMPLE, "--cpu-chunks", "40", "--limit", "10", "--out", out]
    code, _, err = run_main([*args, "--chrome-trace", out / "summary.json"], capsys)
    assert code == 2 and one_line(err) and "--chrome-trace" in err
    assert not out.exists()  # the folder it made is gone again
    code, _, err = run_main([*args, "--chrome-trace", out / "trace.json"], capsys)
    assert code == 0, err
    assert (out / "trace.json").exists() and (out / "summary.json").exists()


def test_a_run_spanning_ages_is_summarised(capsys):
    """Arrivals 10^12 times further apart: the busiest second was counted in an array of
    one slot per simulated second (a MemoryError traceback, or the machine out of memory);
    ``peak_rates``' tests hold the sparse count against vLLM's loops."""
    args = ["simulate", SAMPLE, "--cpu-chunks", "40", "--limit", "20", "--json"]
    code, out, err = run_main([*args, "--time-scale", "1e12"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert 1 <= summary["max_concurrent_requests"] <= 20
    assert summary["max_output_tokens_per_s"] > 0


@pytest.mark.parametrize(
    "table, args",
    [
        ("capacity,combined_hit_ratio\n1,0.1\n2,0.2\n", []),  # a sweep's table, no hit_ratio
        ("capacity,hit_ratio\n1,0.1\n2,0.2\n", ["--y", "nosuch"]),
        ("capacity,hit_ratio\n1,nan\n2,inf\n", []),  # no finite point to draw
    ],
)
def test_an_mrc_figure_of_a_table_it_cannot_draw_is_one_line(tmp_path, capsys, table, args):
    """These were a KeyError traceback and matplotlib's 'Axis limits cannot be NaN or Inf'."""
    csv = tmp_path / "t.csv"
    csv.write_text(table)
    png = tmp_path / "f.png"
    code, _, err = run_main(["plot", csv, "--kind", "mrc", *args, "--out", png], capsys)
    assert code == 2 and one_line(err) and "mrc" in err and "Traceback" not in err
    assert not png.exists()


def test_refused_requests_are_said_with_the_limits(capsys):
    """A --max-model-len shorter than every prompt refused every request in silence: exit 0
    and latencies of 0.00 that read as a result."""
    args = ["simulate", SAMPLE, "--cpu-chunks", "40", "--limit", "20", "--json"]
    code, out, err = run_main([*args, "--max-model-len", "1"], capsys)
    assert code == 0, err
    assert json.loads(out)["failed"] == 20
    assert "20 of 20 requests refused" in err and "max_model_len 1," in err and one_line(err)
    code, out, err = run_main(args, capsys)
    assert code == 0 and json.loads(out)["failed"] == 0 and "refused" not in err


@pytest.mark.parametrize(
    "args, said",
    [  # each said 'unknown model/GPU' with the presets, or 'expected a mapping'
        (["replay", SAMPLE, "--cpu-gib", "4", "--model", "/no/such/config.json"], "no such file"),
        (["simulate", SAMPLE, "--cpu-gib", "4", "--gpu", "/no/such/gpu.json"], "no such file"),
        (
            [
                "simulate",
                "--workload",
                "/no/such/w.yaml",
                "--load",
                "{type: concurrency, stages: [{concurrency: 2, num_requests: 8}]}",
            ],
            "--workload: /no/such/w.yaml: no such file",
        ),
        (["trace", "gen", "chat", "-n", "5", "-o", ""], "an empty path"),
        (["replay", SAMPLE, "--cpu-chunks", "9", "--requests-csv", ""], "--requests-csv: an empty"),
    ],
)
def test_a_missing_file_or_an_empty_path_is_said_so(capsys, args, said):
    code, out, err = run_main(args, capsys)
    assert code == 2 and out == "" and one_line(err) and said in err


def test_an_error_in_compiled_code_is_not_blamed_on_a_plugin(tmp_path):
    """A frame whose source is no file here (Cython's ``pyarrow/error.pxi``) is no user's
    plugin: a sweep's int64 overflow in Arrow said 'a plugin failed'. A plugin's file is."""
    from kvsim.cli import _plugin_frame

    def raised(filename: str) -> BaseException:
        try:
            exec(compile("raise OverflowError('too large')", filename, "exec"), {})
        except OverflowError as exc:
            assert exc.__traceback__ is not None
            return exc.with_traceback(exc.__traceback__.tb_next)  # the compiled frame alone
        raise AssertionError("nothing raised")

    assert _plugin_frame(raised("pyarrow/error.pxi")) is None
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text("raise OverflowError('too large')\n")
    assert _plugin_frame(raised(str(plugin))) == "my_plugin.py:1 in <module>"
