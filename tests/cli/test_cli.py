"""The ``kvsim`` command line: replay output, and bad input -> one stderr line, exit code 2."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from support import ROOT, TRACES

from kvsim.cli import cli

TRACE = os.path.join(ROOT, "traces", "samples", "mooncake_small.jsonl")
REQUIRED = [
    "request",
    "prompt_blocks",
    "gpu_hit_blocks",
    "cpu_hit_blocks",
    "stored_blocks",
    "evicted_blocks",
]
GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'


def run_kvsim(*args):
    return subprocess.run(
        [sys.executable, "-m", "kvsim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_replay_summary_fields():
    res = CliRunner().invoke(cli, ["replay", TRACE, "--cpu-chunks", "50", "--policy", "arc"])
    assert res.exit_code == 0, res.output
    for field in (
        "requests",
        "prompt_blocks",
        "gpu_hit_ratio",
        "cpu_hit_ratio",
        "combined_hit_ratio",
        "chunks_stored",
        "chunks_evicted",
        "allocation_failures",
    ):
        assert field in res.output
    assert "200" in res.output


def test_replay_json_parses():
    res = CliRunner().invoke(cli, ["replay", TRACE, "--cpu-chunks", "50", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["requests"] == 200 and summary["cpu_chunks"] == 50
    assert 0 <= summary["cpu_hit_ratio"] <= 1


def test_no_fused_runs_the_protocol_with_the_same_results(tmp_path):
    out = {}
    for flag in ("--fused", "--no-fused"):
        csv_path = tmp_path / f"{flag}.csv"
        res = CliRunner().invoke(
            cli,
            [
                "replay",
                TRACE,
                "--cpu-chunks",
                "300",
                "--json",
                flag,
                "--requests-csv",
                str(csv_path),
            ],
        )
        assert res.exit_code == 0, res.output
        out[flag] = json.loads(res.output), csv_path.read_text()
    (fused, fused_rows), (protocol, protocol_rows) = out["--fused"], out["--no-fused"]
    assert (fused.pop("tier"), protocol.pop("tier")) == ("fused-lru", "protocol")
    assert fused == protocol and fused_rows == protocol_rows
    assert fused["chunks_evicted"] > 0 and fused["cpu_hit_blocks"] > 0


def test_requests_csv_has_one_row_per_request(tmp_path):
    out = tmp_path / "rows.csv"
    res = CliRunner().invoke(
        cli, ["replay", TRACE, "--cpu-chunks", "50", "--requests-csv", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 200 and set(REQUIRED) <= set(rows[0])
    assert [int(r["request"]) for r in rows] == list(range(200))
    summary = json.loads(res.output)
    assert sum(int(r["cpu_hit_blocks"]) for r in rows) == summary["cpu_hit_blocks"]
    assert sum(int(r["prompt_blocks"]) for r in rows) == summary["prompt_blocks"]


def test_success_exit_code_via_subprocess():
    proc = run_kvsim("replay", TRACE, "--cpu-chunks", "20", "--limit", "10", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"] == 10


def _trace(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("".join(lines))
    return str(path)


BAD_TRACES = {
    "malformed": ([GOOD, '{"timestamp": 1, "input_length": 600 "hash_ids": [1]}\n'], 2),
    "missing_field": ([GOOD, '{"timestamp": 1, "output_length": 1, "hash_ids": [1]}\n'], 2),
    "negative_length": (
        ['{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []}\n'],
        1,
    ),
    "hash_ids_inconsistent": (
        [
            GOOD,
            GOOD,
            '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1,2,3,4,5]}\n',
        ],
        3,
    ),
    "mid_trace": (
        [GOOD] * 150
        + ['{"timestamp": 9, "input_length": "x", "output_length": 1, "hash_ids": [1]}\n'],
        151,
    ),
}


def assert_clean_failure(proc, needle, csv_path):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and lines[0].startswith("kvsim: error:")
    assert needle in lines[0]
    folder = os.path.dirname(csv_path)
    assert not os.path.exists(csv_path)
    assert not [f for f in os.listdir(folder) if f.endswith(".tmp")]  # no temp file left


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_bad_trace_line(tmp_path, case):
    lines, bad_line = BAD_TRACES[case]
    path = _trace(tmp_path, f"{case}.jsonl", lines)
    out = str(tmp_path / "rows.csv")
    proc = run_kvsim("replay", path, "--cpu-chunks", "4", "--requests-csv", out)
    assert_clean_failure(proc, f"{case}.jsonl:{bad_line}:", out)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--cpu-chunks", "4", "--policy", "nope"], "--policy"),
        (["--cpu-gib", "0.001"], "--cpu-gib"),  # smaller than one 64 MiB chunk
        (["--cpu-gib", "8", "--model", "llama-3.1-8b", "--tp", "3"], "--tp 3"),  # 32 heads
        (["--cpu-chunks", "0"], "--cpu-chunks"),
        (["--vllm-config", "{bad"], "--vllm-config"),
        (["--vllm-config", '{"cpu_bytes_to_use": 1, "foo": 2}'], "--vllm-config"),
        (["--vllm-config", '{"block_size": 32, "blocks_per_chunk": 2}'], "--vllm-config"),
    ],
)
def test_bad_options(tmp_path, args, needle):
    out = str(tmp_path / "rows.csv")
    proc = run_kvsim("replay", TRACE, *args, "--requests-csv", out)
    assert_clean_failure(proc, needle, out)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--gpu-blocks", "0"], "--gpu-blocks 0: a timed run needs its GPU KV"),  # was: default
        (["--gpu-blocks", "1"], "--gpu-blocks: Expected `int` >= 2"),  # was --gpu-kv-blocks
    ],
)
def test_simulate_names_its_gpu_blocks_option(capsys, args, said):
    from support import run_main

    code, out, err = run_main(["simulate", TRACE, "--limit", "3", *args], capsys)
    assert code == 2 and out == "" and said in err, err


def test_bad_vllm_config_file_names_the_file(tmp_path):
    cfg = tmp_path / "kv.json"
    cfg.write_text('{"kv_connector_extra_config": {"cpu_bytes_to_use": ')
    out = str(tmp_path / "rows.csv")
    proc = run_kvsim("replay", TRACE, "--vllm-config", str(cfg), "--requests-csv", out)
    assert_clean_failure(proc, "kv.json", out)


def test_existing_csv_is_not_clobbered_by_a_failed_run(tmp_path):
    out = tmp_path / "rows.csv"
    out.write_text("keep me\n")
    path = _trace(tmp_path, "bad.jsonl", BAD_TRACES["mid_trace"][0])
    proc = run_kvsim("replay", path, "--cpu-chunks", "4", "--requests-csv", str(out))
    assert proc.returncode == 2 and out.read_text() == "keep me\n"


def test_a_trace_without_reuse_information_is_called_out():
    import subprocess
    import sys

    for command in ("replay", "simulate"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvsim",
                command,
                str(TRACES / "azure_llm_2023_code.csv"),
                "--cpu-chunks",
                "100",
                "--limit",
                "5",
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        assert "no prefix-reuse information" in proc.stderr


@pytest.mark.parametrize("flag", ["--save-steps", "--save-detailed"])
def test_simulate_save_flags_without_out_are_one_line(flag):
    """Both flags write into --out: without it, one line naming the flag, exit 2, no run."""
    proc = run_kvsim("simulate", TRACE, "--limit", "5", "--no-progress", flag)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"kvsim: error: {flag} writes into --out; give --out DIR"


def test_models_lists_each_preset_with_its_weights_as_stored():
    """Which TP a GPU needs is the weights over TP: the list says what they weigh."""
    from kvsim.specs.models import MODELS

    res = CliRunner().invoke(cli, ["models"])
    assert res.exit_code == 0
    lines = {line.split()[0]: line for line in res.output.splitlines()}
    assert set(lines) == set(MODELS)
    assert (
        lines["deepseek-v3"].endswith("672.9 GB fp8") and "(37.0B active)" in lines["deepseek-v3"]
    )
    assert lines["gpt-oss-120b"].endswith("GB mxfp4 experts")
    assert (
        lines["llama-3.1-8b"].endswith("16.1 GB 16-bit") and "active" not in lines["llama-3.1-8b"]
    )


@pytest.mark.parametrize(
    "command",
    [
        ["replay"],
        ["simulate"],
        ["mrc"],
        ["sweep"],
        ["trace", "stats"],
        ["validate"],
        ["calibrate-compute"],
    ],
)
def test_every_model_option_says_it_takes_a_hugging_face_id(command):
    """Each --model takes a preset's Hugging Face id (get_model): each help says so
    (validate's and calibrate-compute's named a preset or config.json only)."""
    res = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200)
    assert res.exit_code == 0
    assert "Hugging Face id" in " ".join(res.output.split())
