"""Benchmark workloads through ``kvsim.simulate`` and the command line: the stages table,
the traces ``kvsim trace gen shared-prefix / random`` write, and the one-line refusals."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner
from support import run_main

from kvsim.api import simulate
from kvsim.cli import cli
from kvsim.core.errors import InputError

SP = (
    "{type: shared_prefix, num_groups: 2, num_prompts_per_group: 4, system_prompt_len: 64,"
    " question_len: 40, output_len: 8}"
)
SP_DICT = {
    "type": "shared_prefix",
    "num_groups": 2,
    "num_prompts_per_group": 4,
    "system_prompt_len": 64,
    "question_len": 40,
    "output_len": 8,
}


def test_simulate_a_closed_loop_reports_each_stage():
    load = {
        "type": "concurrency",
        "stages": [{"concurrency": 2, "num_requests": 10}, {"concurrency": 5, "duration": 0.5}],
    }
    r = simulate(workload=SP_DICT, load=load, gpu="h100", seed=1)
    req, stages = r.requests, r.tables["stages"]
    assert set(req.stage) == {0, 1} and (req.stage == 0).sum() == 10
    assert list(stages.stage) == [0, 1, "all"]
    assert stages.requests.tolist()[:2] == [10, (req.stage == 1).sum()]
    assert stages.requests.iloc[-1] == len(req) == r.summary["requests"]
    whole = stages.set_index("stage").loc["all"]
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "mean_itl_ms", "completed"):
        assert whole[key] == pytest.approx(r.summary[key])
    # never more than the stage's clients in flight: 2 while stage 0 sends
    for rid, t, stage in zip(req.request, req.arrival_s, req.stage):
        sent = (req.request <= rid) & (req.finish_s > t)  # itself and those before it
        assert sent.sum() <= (2, 5)[stage]
    # the second pass of the 8 prompts hits every complete block (104 tokens: 6 blocks)
    assert (req.sort_values("request").gpu_hit_tokens.iloc[8:10] == 96).all()


def test_simulate_refuses_mixed_arrivals():
    with pytest.raises(InputError, match="not both"):
        simulate("x.jsonl", workload=SP_DICT, load={"type": "constant", "stages": []})
    with pytest.raises(InputError, match="both or neither"):
        simulate(workload=SP_DICT)
    load = {"type": "constant", "stages": [{"rate": 1, "duration": 2}]}
    with pytest.raises(InputError, match="time_scale re-times a trace"):
        simulate(workload=SP_DICT, load=load, time_scale=2.0)


def test_trace_gen_shared_prefix_then_simulate_per_stage(tmp_path):
    out = tmp_path / "sp.jsonl"
    load = "{type: constant, stages: [{rate: 4, duration: 2}, {rate: 10, duration: 1}]}"
    args = ["trace", "gen", "shared-prefix", "--seed", "3", "-o", str(out), "--load", load]
    for knob in ("num_groups=2", "num_prompts_per_group=4", "system_prompt_len=64"):
        args += ["--set", knob]
    args += ["--set", "question_len=40", "--set", "output_len=8"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["block_tokens"] == 16 and head["stage_starts"] == [0, 8]
    assert head["workload"]["num_groups"] == 2 and head["seed"] == 3
    recs = [json.loads(x) for x in lines[1:]]
    assert [x["arrival_s"] for x in recs] == [i / 4 for i in range(8)] + [
        2 + i / 10 for i in range(10)
    ]
    assert all(x["block_hashes"] == recs[i % 8]["block_hashes"] for i, x in enumerate(recs))
    folder = tmp_path / "run"
    res = CliRunner().invoke(cli, ["simulate", str(out), "--gpu", "h100", "--out", str(folder)])
    assert res.exit_code == 0, res.output
    assert "per load stage" in res.output
    table = pd.read_csv(folder / "stages.csv")
    assert table.stage.astype(str).tolist() == ["0", "1", "all"]
    assert table.requests.tolist() == [8, 10, 18]


def test_simulate_cli_workload_file_with_both_blocks(tmp_path):
    spec = tmp_path / "w.yaml"
    spec.write_text(
        f"workload: {SP}\nload: {{type: poisson, stages: [{{rate: 5, duration: 2}}]}}\n"
    )
    res = CliRunner().invoke(cli, ["simulate", "--workload", str(spec), "--gpu", "h100", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["trace"].startswith("shared_prefix(2x4, 64+40->8) poisson")
    assert [row["stage"] for row in out["stages"]] == [0, "all"]
    assert out["stages"][1]["mean_ttft_ms"] == pytest.approx(out["mean_ttft_ms"])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            [
                "trace",
                "gen",
                "random",
                "--load",
                "{type: concurrency, stages: [{concurrency: 2, duration: 1}]}",
            ],
            "no fixed arrival times",
        ),
        (["trace", "gen", "shared-prefix", "--set", "num_groups=1"], "needs --load"),
        (["trace", "gen", "random", "--rate", "3", "--load", "{}"], "--rate does not apply"),
        (
            ["trace", "gen", "random", "-n", "3", "--rate", "3", "--load", "{}"],
            "-n/--requests, --rate do not apply",
        ),
        (
            [
                "trace",
                "gen",
                "random",
                "--load",
                "{type: constant, stages: [{rate: 0, duration: 1}]}",
            ],
            "rate",
        ),
        (
            [
                "trace",
                "gen",
                "random",
                "--load",
                "{type: constant, stages: [{rate: 0.01, duration: 4}]}",
            ],
            "sends no request",  # a trace no command could read: not written
        ),
        (
            [
                "trace",
                "gen",
                "random",
                "--load",
                "{type: constant, stages: [{rate: 1000000, duration: 100000}]}",
            ],
            "more than kvsim plans",  # 10^11 send times: a numpy MemoryError before
        ),
        (["simulate", "--workload", SP], "--workload needs --load"),
        (["simulate", "--workload", "[1, 2", "--load", "{}"], "--workload: bad YAML"),
    ],
)
def test_bad_cli_input_is_one_line(tmp_path, capsys, args, match):
    out = tmp_path / "x.jsonl"
    code, _, err = run_main([*args, "-o", out] if args[0] == "trace" else args, capsys)
    assert code == 2, err
    assert match in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


LOAD = "{type: constant, stages: [{rate: 8, duration: 1}]}"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--workload", "{type: shared_prefix, num_groups: 0}", "--load", LOAD],
            "--workload: num_groups: Expected `int` >= 1, got 0",
        ),
        (
            ["--workload", "{type: sharedprefix}", "--load", LOAD],
            "--workload: type: expected one of shared_prefix, random, got 'sharedprefix' "
            "(did you mean 'shared_prefix'?)",
        ),
        (
            ["--workload", SP, "--load", "{type: constant}"],
            "--load: stages: missing (a required key)",
        ),
        (
            ["--workload", SP, "--load", "{type: constant, stages: [{rate: 0, duration: 1}]}"],
            "--load: stages[0].rate: Expected `float` > 0.0, got 0",
        ),
    ],
)
def test_simulate_workload_errors_name_the_option(capsys, args, line):
    code, _, err = run_main(["simulate", "--gpu", "h100", *args], capsys)
    assert code == 2 and err.strip().splitlines() == [f"kvsim: error: {line}"], err


def test_workload_file_errors_name_the_file_and_block(tmp_path, capsys):
    both = tmp_path / "both.yaml"
    both.write_text(f"workload: {{type: random, input_len: -1}}\nload: {LOAD}\n")
    one = tmp_path / "one.yaml"
    one.write_text("type: random\ninput_len: x\n")
    code, _, err = run_main(["simulate", "--gpu", "h100", "--workload", str(both)], capsys)
    assert code == 2 and f"{both}: workload.input_len: Expected `int` >= 1, got -1" in err
    args = ["simulate", "--gpu", "h100", "--workload", str(one), "--load", LOAD]
    code, _, err = run_main(args, capsys)
    assert code == 2 and f"{one}: input_len: Expected `int`, got 'x'" in err


@pytest.mark.parametrize(
    ("knob", "line"),
    [
        ("num_groups=0", "--set: num_groups: Expected `int` >= 1, got 0"),
        ("foo=1", "--set: foo: unknown key, got 1"),
        ("block_tokens=0", "--set: block_tokens: must be a positive integer, got 0"),
    ],
)
def test_trace_gen_workload_errors_name_set(tmp_path, capsys, knob, line):
    out = tmp_path / "x.jsonl"
    args = ["trace", "gen", "shared-prefix", "--set", knob, "--load", LOAD, "-o", out]
    code, _, err = run_main(args, capsys)
    assert code == 2 and err.strip().splitlines() == [f"kvsim: error: {line}"], err
    assert not out.exists()


def test_an_in_memory_trace_of_a_workload_runs_as_the_workload():
    """The open load's trace (in memory, no file header) gives the same run as the workload;
    it has no stages table (only a workload or a trace file says its stages)."""
    from kvsim.workloads import build_workload

    load = {"type": "poisson", "stages": [{"rate": 20, "duration": 2}]}
    tr = build_workload(SP_DICT, load, seed=4).trace()
    a = simulate(tr, gpu="h100")
    b = simulate(workload=SP_DICT, load=load, gpu="h100", seed=4)
    assert "stages" not in a.tables and "stages" in b.tables
    cols = ["arrival_s", "first_token_s", "finish_s"]
    # a trace's times are counted from its first arrival (timed mode rebases them), a
    # workload's from the client's start: the same run, shifted by the first send
    first = float(b.requests["arrival_s"].iloc[0])
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols] - first)
    assert list(a.requests.gpu_hit_tokens) == list(b.requests.gpu_hit_tokens)


def test_a_bad_stage_header_is_one_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    head = {"kvsim_trace": 1, "block_tokens": 16, "stage_starts": [0, 3, 2]}
    rec = {"arrival_s": 0, "input_tokens": 40, "output_tokens": 2, "block_hashes": [1, 2]}
    trace.write_text(json.dumps(head) + "\n" + json.dumps(rec) + "\n")
    code, _, err = run_main(["simulate", trace, "--gpu", "h100"], capsys)
    assert code == 2 and "stage_starts" in err and ":1:" in err
    assert len(err.strip().splitlines()) == 1
