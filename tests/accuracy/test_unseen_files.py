"""``kvsim accuracy`` on measurements files written by others: what such a file may say
(any subset of each latency's mean, p50, p90, p99) is compared, or said not to be, never
dropped without a word."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from measurements_small import EXPERIMENT, experiment, write
from support import run_main

from kvsim.accuracy.run import stage_metrics

#: a one-stage run short enough for a test
SHORT = {"type": "constant", "stages": [{"rate": 4, "duration": 3}]}
FAST = ["--max-stage-s", "3", "--warmup-s", "0", "--no-progress", "--workers", "1"]


def test_stage_metrics_by_hand():
    stages = pd.DataFrame(
        {
            "stage": [0, 1, "all"],
            "completed": [2, 0, 2],
            "duration": [1.6, 0.0, 2.0],
            "total_output_tokens": [22, 0, 22],
            "total_input_tokens": [600, 0, 600],
            "mean_ttft_ms": [15.0, 0.0, 15.0],
            "p50_ttft_ms": [14.0, 0.0, 14.0],
            "p90_ttft_ms": [19.0, 0.0, 19.0],
            "p99_ttft_ms": [19.9, 0.0, 19.9],
            "mean_e2el_ms": [550.0, 0.0, 550.0],
            "p50_e2el_ms": [540.0, 0.0, 540.0],
            "p90_e2el_ms": [590.0, 0.0, 590.0],
            "p99_e2el_ms": [599.0, 0.0, 599.0],
        }
    )
    m = stage_metrics(stages, 11, overhead_s=0.005)
    assert set(m) == {"0", "all"}  # a stage that completed nothing has no metrics
    assert m["0"]["ttft_mean"] == pytest.approx(20.0)  # the client's 5 ms added
    assert m["0"]["ttft_p50"] == pytest.approx(19.0)
    assert m["all"]["e2e_p50"] == pytest.approx(545.0)
    assert m["0"]["e2e_p99"] == pytest.approx(604.0)
    assert m["0"]["itl_mean"] == pytest.approx((555.0 - 20.0) / 10)  # overhead cancels
    assert m["0"]["requests_per_s"] == pytest.approx(2 / 1.605)  # span ends later too
    assert m["all"]["output_tokens_per_s"] == pytest.approx(22 / 2.005)
    assert m["all"]["total_tokens_per_s"] == pytest.approx(622 / 2.005)


@pytest.mark.parametrize("cut", [[], FAST[:4]], ids=["whole", "cut"])
def test_a_measured_p50_is_compared(tmp_path, capsys, cut):
    """A file that gives only medians (``p50``) gets rows for them, in the whole run of a
    cut run (weighted) as of an uncut one, not an experiment with nothing compared."""
    medians = experiment(
        load={"type": "constant", "stages": [{"rate": 4, "duration": 8 if cut else 3}]},
        measured=[{"stage": "all", "ttft_ms": {"p50": 20.0}, "e2e_ms": {"p50": 200.0}}],
    )
    out = tmp_path / "acc"
    path = write(tmp_path / "m.yaml", medians)
    code, _, err = run_main(["accuracy", path, "--out", out, *FAST[4:], *cut], capsys)
    assert code == 0, err
    with open(out / "accuracy.csv", newline="") as f:
        rows = {(r["stage"], r["metric"]): r for r in csv.DictReader(f)}
    for metric, measured in (("ttft_p50", 20.0), ("e2e_p50", 200.0)):
        row = rows[("all", metric)]
        assert float(row["measured"]) == measured
        assert 0 < float(row["predicted"]) < float(rows[("all", metric[:-3] + "p99")]["predicted"])
        assert row["ape_pct"] != ""
    summary = json.loads((out / "metadata.json").read_text())["config"]["summary"]
    assert set(summary) == {"ttft_p50", "e2e_p50"}


def test_a_measured_itl_percentile_is_said_not_compared(tmp_path, capsys):
    """kvsim predicts the mean ITL only: a file's ITL percentiles are a warning naming
    them (stderr, --json's warnings), not dropped without a word."""
    itl = experiment(
        load=SHORT,
        measured=[{"stage": "all", "itl_ms": {"mean": 9.0, "p50": 8.0, "p99": 30.0}}],
    )
    path = write(tmp_path / "m.yaml", itl)
    code, stdout, err = run_main(["accuracy", path, "--json", *FAST], capsys)
    assert code == 0, err
    said = "measured itl_ms.p50 of stage all, itl_ms.p99 of stage all not compared"
    assert said in err
    assert any(said in w for w in json.loads(stdout)["warnings"]["small-llama-2-7b"])
    rows = {r["metric"]: r for r in json.loads(stdout)["rows"] if r["stage"] == "all"}
    assert rows["itl_mean"]["measured"] == 9.0  # the mean is compared


def test_a_stage_index_written_as_text_is_the_index(tmp_path):
    """``stage: "0"`` (a file quoting its stages as it quotes ``"all"``) is stage 0."""
    from kvsim.accuracy.measurements import read_measurements

    quoted = experiment(
        measured=[{"stage": "1", "ttft_ms": {"mean": 20.0}}, {"stage": "all", "requests": 6}]
    )
    read = read_measurements(write(tmp_path / "m.yaml", quoted))
    assert [m.stage for m in read.experiments[0].measured] == [1, "all"]


@pytest.mark.parametrize("stage", ["ALL", "first", "-1", "1.5"])
def test_a_stage_that_is_neither_says_what_a_stage_is(tmp_path, capsys, stage):
    """Not a stage: one line naming the key path and both kinds of stage, exit 2 (the
    schema's own message listed only ``all``)."""
    bad = experiment(measured=[{"stage": 0}, {"stage": stage, "ttft_ms": {"mean": 20.0}}])
    path, out = write(tmp_path / "m.yaml", bad), tmp_path / "acc"
    code, stdout, err = run_main(["accuracy", path, "--out", out], capsys)
    assert code == 2 and not stdout and not out.exists()
    assert err == (
        f"kvsim: error: {path}: experiments[0].measured[1].stage: a load "
        f"stage's index from 0, or all (the whole run), got '{stage}'\n"
    )


def test_a_gpu_block_count_past_the_gpus_memory_fails_its_experiment_alone(tmp_path, capsys):
    """vLLM's log gives the KV cache's size in tokens (7463 blocks: 119,408 tokens): written
    as num_gpu_blocks_override it is 16 times the KV an H100 holds, a run vLLM could not have
    started. It fails alone, saying so, instead of running a KV of 930 GiB (and 1e9 blocks,
    rather than fail, had the process killed for its memory)."""
    tokens = experiment(
        id="tokens", load=SHORT, vllm={**EXPERIMENT["vllm"], "num_gpu_blocks_override": 119408}
    )
    path = write(tmp_path / "m.yaml", tokens, experiment(load=SHORT))
    code, stdout, err = run_main(["accuracy", path, "--json", *FAST], capsys)
    assert code == 1
    failures = json.loads(stdout)["failures"]
    assert set(failures) == {"tokens"}  # the other ran
    assert failures["tokens"].startswith(
        "vllm.num_gpu_blocks_override 119408: 119,408 blocks of 16 tokens are 932.9 GiB of KV "
        "per GPU at tp=1, more than h100's 79.6 GiB less llama-2-7b's weights"
    )
    assert "kvsim: experiment tokens: vllm.num_gpu_blocks_override 119408" in err


def test_a_cpu_tier_too_small_is_named_as_the_file_names_it(tmp_path, capsys):
    """cpu_bytes_to_use written in GiB (8) is 8 bytes: its experiment fails naming
    cpu_bytes_to_use, not ``--cpu-gib``, an option of ``kvsim simulate`` the file never
    wrote."""
    kv = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    kv["kv_connector_extra_config"] = {"cpu_bytes_to_use": 8}
    gib = experiment(load=SHORT, vllm={**EXPERIMENT["vllm"], "kv_transfer_config": kv})
    code, _, err = run_main(["accuracy", write(tmp_path / "m.yaml", gib), *FAST], capsys)
    assert code == 1
    assert (
        "kvsim: experiment small-llama-2-7b: cpu_bytes_to_use: 8 bytes: capacity too small "
        "for one chunk (needs 8388608 bytes per chunk)\n"
    ) in err


def test_a_workload_without_its_type_is_said_missing_and_the_schema_requires_it(tmp_path):
    """The reader needs ``type`` to know the workload's kind: its absence is 'missing', not
    'got None', and the printed schema (which a file's writer checks against) requires it,
    as the reader does, instead of giving it a default the reader does not apply."""
    import jsonschema

    from kvsim.accuracy.measurements import read_measurements
    from kvsim.core.errors import InputError
    from kvsim.options.registry import schema_named
    from kvsim.options.schema import json_schema

    untyped = experiment(workload={"input_len": 100, "output_len": 10})
    path = write(tmp_path / "m.yaml", untyped)
    with pytest.raises(InputError) as exc:
        read_measurements(path)
    assert str(exc.value) == (
        f"{path}: experiments[0].workload.type: missing (a required key: shared_prefix, random)"
    )
    data = {"kvsim_measurements": 1, "experiments": [untyped]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, json_schema(schema_named("measurements")))
    jsonschema.validate(
        {"kvsim_measurements": 1, "experiments": [experiment()]},
        json_schema(schema_named("measurements")),
    )


def test_a_one_stage_load_measured_as_stage_0_counts_in_the_summary(tmp_path, capsys):
    """A one-stage load's stage 0 is its whole run: a file that measured it so (and not
    ``all``) is in the summary, not left out while the table counts it."""
    stage0 = experiment(id="stage0", load=SHORT, measured=[{"stage": 0, "ttft_ms": {"mean": 20.0}}])
    whole = experiment(load=SHORT, measured=[{"stage": "all", "ttft_ms": {"mean": 20.0}}])
    two = experiment(id="two", measured=[{"stage": 0, "ttft_ms": {"mean": 20.0}}])
    path = write(tmp_path / "m.yaml", stage0, whole, two)
    code, stdout, err = run_main(["accuracy", path, "--json", *FAST], capsys)
    assert code == 0, err
    data = json.loads(stdout)
    assert data["summary"]["ttft_mean"]["n"] == 2  # not two's: stage 0 of two is not its run
    ttft = {
        (r["experiment"], r["stage"]): r["ape_pct"]
        for r in data["rows"]
        if r["metric"] == "ttft_mean"
    }
    apes = [ttft[("stage0", "0")], ttft[("small-llama-2-7b", "all")]]
    assert data["summary"]["ttft_mean"]["mean"] == pytest.approx(sum(apes) / 2)


def test_the_table_keeps_ids_whole(tmp_path, capsys):
    """Two ids alike in their first 44 characters (the table's column) are told apart in
    the printed table, as in accuracy.csv."""
    stem = "llm-d-qwen3-32b-sys30k-offload-concurrency-"
    ids = [stem + "045", stem + "090"]
    path = write(tmp_path / "m.yaml", *(experiment(id=i, load=SHORT) for i in ids))
    code, stdout, err = run_main(["accuracy", path, *FAST], capsys)
    assert code == 0, err
    lines = stdout.splitlines()
    for i in ids:
        assert sum(line.startswith(i + " ") for line in lines) == 24  # 12 metrics, 2 stages
    assert lines[0].index(" metric") == lines[1].index(" ttft_mean")  # the columns line up


def test_a_null_vllm_argument_is_vllms_default(tmp_path):
    """vLLM's own defaults of block_size, enable_prefix_caching and enable_chunked_prefill
    are None: a file that writes its engine arguments as vLLM holds them (null), or an
    empty ``vllm:``, reads as those keys left out, as max_num_seqs: null always did."""
    from kvsim.accuracy.measurements import VllmArgs, read_measurements

    keys = ("block_size", "gpu_memory_utilization", "enable_prefix_caching", "dtype")
    nulls = experiment(id="nulls", vllm={**dict.fromkeys(keys), "max_num_seqs": 64})
    empty = experiment(id="empty", vllm=None)
    read = read_measurements(write(tmp_path / "m.yaml", nulls, empty))
    assert read.experiments[0].vllm == VllmArgs(max_num_seqs=64)
    assert read.experiments[1].vllm == VllmArgs()


def test_an_fp8_kv_cache_runs_with_its_bytes(tmp_path, capsys):
    """``kv_cache_dtype: fp8`` (vLLM's --kv-cache-dtype, under its own name) runs with half
    the KV bytes (less decode attention time), where it was an unknown key that refused the
    whole file; a value vLLM does not have is a bad file naming the key, a packed layout
    kvsim does not size fails its experiment alone."""
    long = {**EXPERIMENT["workload"], "system_prompt_len": 1000, "question_len": 2000}
    fp8 = {**EXPERIMENT["vllm"], "kv_cache_dtype": "fp8"}
    packed = {**EXPERIMENT["vllm"], "kv_cache_dtype": "int8_per_token_head"}
    path = write(
        tmp_path / "m.yaml",
        experiment(id="auto", load=SHORT, workload=long),
        experiment(id="fp8", load=SHORT, workload=long, vllm=fp8),
        experiment(id="packed", load=SHORT, vllm=packed),
    )
    code, stdout, err = run_main(["accuracy", path, "--json", *FAST], capsys)
    assert code == 1
    data = json.loads(stdout)
    assert set(data["failures"]) == {"packed"}
    assert "vllm.kv_cache_dtype 'int8_per_token_head' is not modelled" in data["failures"]["packed"]
    itl = {
        r["experiment"]: r["predicted"]
        for r in data["rows"]
        if r["stage"] == "all" and r["metric"] == "itl_mean"
    }
    assert itl["fp8"] < itl["auto"]
    bad = write(tmp_path / "bad.yaml", experiment(vllm={**fp8, "kv_cache_dtype": "fp8e4m3"}))
    code, stdout, err = run_main(["accuracy", bad], capsys)
    assert code == 2 and not stdout
    assert err.startswith(
        f"kvsim: error: {bad}: experiments[0].vllm.kv_cache_dtype: unknown value 'fp8e4m3' "
        "(did you mean 'fp8_e4m3'?); known: auto,"
    )
    assert err.count("\n") == 1


def test_a_random_workload_says_ignore_eos_as_vllm_bench_does(tmp_path, capsys):
    """``vllm bench serve --ignore-eos`` written on a random workload (``ignore_eos: true``)
    runs, where it was an unknown key that refused the whole file; ``false`` (outputs of
    the model's text) fails its experiment alone, as on a shared_prefix workload."""
    random = {"type": "random", "input_len": 300, "output_len": 20, "range_ratio": 0.5}
    path = write(
        tmp_path / "m.yaml",
        experiment(id="eos", load=SHORT, workload={**random, "ignore_eos": True}),
        experiment(id="text", load=SHORT, workload={**random, "ignore_eos": False}),
    )
    code, stdout, _ = run_main(["accuracy", path, "--json", *FAST], capsys)
    assert code == 1
    data = json.loads(stdout)
    assert data["failures"]["text"].startswith("workload: ignore_eos: false is not modelled")
    assert {r["experiment"] for r in data["rows"]} == {"eos"}


def test_a_metric_measured_as_zero_is_said_not_compared(tmp_path, capsys):
    """A measured 0 (a placeholder for a number not published) has no relative error: a
    warning naming it as the file does, where it was left out of the rows' APE and the
    summary without a word."""
    zero = experiment(
        load=SHORT,
        measured=[{"stage": "all", "ttft_ms": {"mean": 0.0, "p90": 30.0}, "requests_per_s": 0}],
    )
    code, stdout, err = run_main(
        ["accuracy", write(tmp_path / "m.yaml", zero), "--json", *FAST], capsys
    )
    assert code == 0, err
    said = "measured ttft_ms.mean of stage all, requests_per_s of stage all is 0, not compared"
    assert said in err
    assert set(json.loads(stdout)["summary"]) == {"ttft_p90"}


@pytest.mark.parametrize(
    ("name", "preset"),
    [("NVIDIA H100 80GB HBM3", "h100"), ("H100-80GB", "h100"), ("NVIDIA A100-SXM4-80GB", "a100")],
)
def test_a_gpu_named_by_its_product_name_is_its_preset(tmp_path, name, preset):
    """The GPU as nvidia-smi or a benchmark's report names it is the preset of that part,
    where it was an unknown GPU that refused the whole file."""
    from kvsim.accuracy.measurements import read_measurements

    read = read_measurements(write(tmp_path / "m.yaml", experiment(gpu=name)))
    assert read.experiments[0].gpu_arg(str(tmp_path)) == preset


@pytest.mark.parametrize("name", ["H100 PCIe", "NVIDIA H100 NVL", "A100-40GB"])
def test_another_part_of_a_presets_family_is_not_the_preset(tmp_path, name):
    """A part whose bandwidth or memory differs from the preset's (PCIe, NVL, 40 GB) is
    not taken for it: one line naming the key, as any unknown GPU."""
    from kvsim.accuracy.measurements import read_measurements
    from kvsim.core.errors import InputError

    with pytest.raises(InputError, match=rf"experiments\[0\]\.gpu: unknown GPU '{name}'"):
        read_measurements(write(tmp_path / "m.yaml", experiment(gpu=name)))


def test_measured_requests_unlike_the_load_are_said(tmp_path, capsys):
    """A load that cannot have sent the requests measured (a duration written in minutes:
    10 for 600 s) is a warning naming both counts, where every metric was compared
    against a run of another length without a word; a Poisson count near its mean is not."""
    minutes = experiment(
        id="minutes",
        load={"type": "constant", "stages": [{"rate": 4, "duration": 10}]},
        measured=[{"stage": 0, "requests": 2400, "ttft_ms": {"mean": 20.0}}],
    )
    poisson = experiment(
        id="poisson",
        load={"type": "poisson", "stages": [{"rate": 4, "duration": 600}]},
        measured=[{"stage": "all", "requests": 2450, "ttft_ms": {"mean": 20.0}}],
    )
    failed = experiment(  # a count of the requests served, the failed ones beside it
        id="failed",
        load={"type": "constant", "stages": [{"rate": 4, "duration": 600}]},
        measured=[{"stage": 0, "requests": 1400, "failed": 1000, "ttft_ms": {"mean": 20.0}}],
    )
    path = write(tmp_path / "m.yaml", minutes, poisson, failed)
    code, stdout, err = run_main(["accuracy", path, "--json", *FAST], capsys)
    assert code == 0, err
    said = json.loads(stdout)["warnings"]
    assert any("stage 0 measured 2400 requests, the load sends 40" in w for w in said["minutes"])
    assert not said.get("poisson") and not said.get("failed")


def test_a_single_gpu_block_is_named_as_the_file_names_it(tmp_path, capsys):
    """``num_gpu_blocks_override: 1`` fails its experiment naming that key, where it said
    ``--gpu-blocks: Expected int >= 2``, an option of kvsim simulate the file never wrote."""
    one = experiment(vllm={**EXPERIMENT["vllm"], "num_gpu_blocks_override": 1})
    code, stdout, _ = run_main(
        ["accuracy", write(tmp_path / "m.yaml", one), "--json", *FAST], capsys
    )
    assert code == 1
    failure = json.loads(stdout)["failures"]["small-llama-2-7b"]
    assert failure.startswith("vllm.num_gpu_blocks_override 1: vLLM keeps one GPU block")


def test_a_step_budget_below_max_num_seqs_fails_its_experiment(tmp_path, capsys):
    """vLLM refuses to start with max_num_batched_tokens below max_num_seqs: the experiment
    fails alone, named as the file names them, where it ran one token a step as though
    vLLM had (tests/vllm/test_vllm_batch_limits.py holds the rule to vLLM's)."""
    below = experiment(id="below", vllm={**EXPERIMENT["vllm"], "max_num_batched_tokens": 64})
    path = write(tmp_path / "m.yaml", below)
    code, stdout, _ = run_main(["accuracy", path, "--json", *FAST], capsys)
    assert code == 1
    assert json.loads(stdout)["failures"]["below"].startswith(
        "vllm.max_num_batched_tokens 64 is below vllm.max_num_seqs 128: vLLM refuses"
    )
