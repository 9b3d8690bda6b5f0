"""``kvsim accuracy`` end to end on a shortened experiment, and the metrics it derives from
a run checked by hand (``kvsim fit-compute`` and ``kvsim cross-validate``:
test_fit_compute_cli.py)."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from measurements_small import EXPERIMENT, UNSTARTABLE, experiment, write
from support import run_main

from kvsim.accuracy.run import METRICS, stage_metrics


def test_accuracy_end_to_end(tmp_path, capsys):
    path = write(
        tmp_path / "m.yaml",
        experiment(),
        experiment(id="unchunked", vllm=UNSTARTABLE),
    )
    out = tmp_path / "acc"
    code, stdout, err = run_main(["accuracy", path, "--out", out, "--no-progress"], capsys)
    assert code == 1  # the unchunked experiment could not run: counted, after the other ran
    assert (
        "kvsim: experiment unchunked: vllm.max_num_batched_tokens 2048 is below "
        "vllm.max_model_len 4096 without chunked prefill" in err
    )
    with open(out / "accuracy.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["experiment", "stage", "metric", "predicted", "measured", "ape_pct"]
    assert {r["stage"] for r in rows} == {"0", "1", "all"}
    assert [r["metric"] for r in rows if r["stage"] == "all"] == list(METRICS)
    by = {(r["stage"], r["metric"]): r for r in rows}
    assert by[("1", "ttft_mean")]["measured"] == ""  # stage 1 has no measurement
    ttft = by[("all", "ttft_mean")]
    predicted = float(ttft["predicted"])
    assert 5 < predicted < 200  # milliseconds of a cached 300-token prompt on an H100
    assert float(ttft["ape_pct"]) == pytest.approx(abs(predicted - 22.0) / 22.0 * 100, rel=1e-4)
    # the measured ITL is derived as the file defines it: (210 - 22) / (20 - 1)
    assert float(by[("all", "itl_mean")]["measured"]) == pytest.approx(188 / 19)
    meta = json.loads((out / "metadata.json").read_text())
    assert [e["id"] for e in meta["config"]["experiments"]] == ["small-llama-2-7b", "unchunked"]
    assert meta["config"]["experiments"][1]["error"].endswith("vLLM refuses to start")
    assert "e2e_mean" in stdout and "median" in stdout

    code, stdout, _ = run_main(
        ["accuracy", path, "--json", "--experiment", "small-llama-2-7b"], capsys
    )
    assert code == 0
    data = json.loads(stdout)
    assert data["summary"]["ttft_mean"]["n"] == 1 and not data["failures"]


STATS = ("mean", "p50", "p90", "p99")


def test_a_stage_of_one_request_has_no_throughput_predicted(tmp_path, capsys):
    """A low rate cut short sent one request: its span is that request's E2E, and
    requests_per_s was 1/E2E (here 1/0.555 s), set beside a measured stage's real rate."""
    one = pd.DataFrame(
        {
            "stage": [0, 1],
            "completed": [1, 1],
            "duration": [0.55, 0.55],
            "total_output_tokens": [11, 11],
            "total_input_tokens": [300, 300],
            **{f"{s}_{k}_ms": [5.0, 5.0] for s in STATS for k in ("ttft", "e2el")},
        }
    )
    m = stage_metrics(one, 11, overhead_s=0.005)
    throughputs = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s")
    assert all(m["0"][name] is None for name in throughputs)
    assert m["0"]["ttft_mean"] == pytest.approx(10.0)  # its latencies are predicted
    rare = experiment(
        load={
            "type": "constant",
            "stages": [{"rate": 0.2, "duration": 60}, {"rate": 8, "duration": 5}],
        }
    )
    path = write(tmp_path / "m.yaml", rare)
    args = ["accuracy", path, "--max-stage-s", "5", "--warmup-s", "0", "--no-progress", "--json"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    rows = {(r["stage"], r["metric"]): r["predicted"] for r in json.loads(out)["rows"]}
    assert [rows[("0", name)] for name in throughputs] == [None] * 3
    assert rows[("0", "ttft_mean")] > 0 and rows[("1", "requests_per_s")] > 1


FLEET = dict(
    id="fleet",
    instances=2,
    router={"name": "prefix-aware"},
    workload={
        "type": "shared_prefix",
        "num_groups": 3,
        "num_prompts_per_group": 4,
        "system_prompt_len": 1000,
        "question_len": 200,
        "output_len": 20,
        "ignore_eos": True,
    },
    load={"type": "concurrency", "stages": [{"concurrency": 4, "num_requests": 12}]},
    measured=[{"stage": "all", "ttft_ms": {"mean": 30.0}, "total_tokens_per_s": 5000.0}],
)


def test_accuracy_runs_a_fleet_as_simulate_does(tmp_path, capsys):
    """An experiment with instances and router is the fleet ``kvsim simulate --instances N
    --router NAME`` runs: the same stage metrics, its clients shared by the fleet."""
    import kvsim
    from kvsim.engine.compute_model import default_compute_profile
    from kvsim.specs.hardware import get_gpu

    path = write(tmp_path / "m.yaml", experiment(**FLEET))
    code, stdout, err = run_main(["accuracy", path, "--json", "--no-progress"], capsys)
    assert code == 0, err
    rows = {r["metric"]: r for r in json.loads(stdout)["rows"] if r["stage"] == "all"}
    run = kvsim.simulate(
        workload=FLEET["workload"],
        load=FLEET["load"],
        model="llama-2-7b",
        gpu="h100",
        gpu_block_tokens=16,
        vllm_config=EXPERIMENT["vllm"]["kv_transfer_config"],
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        gpu_kv_blocks=7463,
        gpu_memory_utilization=0.9,
        record_steps=False,
        instances=2,
        router="prefix-aware",
    )
    assert set(run.tables["requests"]["instance"]) == {0, 1}
    overhead = default_compute_profile(get_gpu("h100")).request_overhead_s
    want = stage_metrics(run.tables["stages"], 20, overhead)["all"]
    for metric in ("ttft_mean", "e2e_p90", "total_tokens_per_s", "requests_per_s"):
        assert rows[metric]["predicted"] == pytest.approx(want[metric], rel=1e-12), metric
    assert rows["total_tokens_per_s"]["measured"] == 5000.0


def test_a_bad_router_in_a_measurements_file_is_one_line(tmp_path, capsys):
    bad = experiment(**{**FLEET, "router": {"name": "prefix_aware"}})
    code, _, err = run_main(["accuracy", write(tmp_path / "m.yaml", bad)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "experiments[0].router" in err and "did you mean 'prefix-aware'" in err


@pytest.mark.parametrize(
    ("change", "args", "named"),
    [
        ({"model": "llama-2-7bb"}, [], "experiments[0].model: unknown model 'llama-2-7bb' (did"),
        ({"gpu": "h100x"}, [], "experiments[0].gpu: unknown GPU 'h100x'"),
        ({"gpu": "gpus/mine.json"}, [], "relative to the measurements file"),
        (
            {
                "vllm": {
                    **EXPERIMENT["vllm"],
                    "kv_transfer_config": {
                        "kv_connector": "OffloadingConnector",
                        "kv_connector_extra_config": {
                            "cpu_bytes_to_use": 2**33,
                            "eviction_policy": "fifo2",
                        },
                    },
                }
            },
            [],
            "kv_connector_extra_config.eviction_policy: unknown eviction policy 'fifo2'",
        ),
        (
            {
                "vllm": {
                    **EXPERIMENT["vllm"],
                    "kv_transfer_config": {"kv_connector": "OffloadingConnector"},
                }
            },
            [],
            "kv_connector_extra_config: give the CPU tier's size",
        ),
        (
            {
                "vllm": {
                    **EXPERIMENT["vllm"],
                    "kv_transfer_config": {
                        "kv_connector": "OffloadingConnector",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": 2**33, "block_size": 24},
                    },
                }
            },
            [],
            "block_size: 24 is not a multiple of vllm.block_size 16",
        ),
        ({}, ["--compute-profile", "nope.json"], "nope.json: cannot read"),
        ({}, ["--max-stage-s", "nan"], "not a finite number"),
        ({}, ["--seed", "-1"], "--seed"),
    ],
)
def test_what_no_experiment_could_run_with_is_bad_input(tmp_path, capsys, change, args, named):
    """A name that is neither a preset nor a file beside the measurements file, a profile
    that cannot be read, a NaN cap, a negative seed: one line, exit 2, before any run and
    with no --out (they were each experiment's failure, exit 1, after the runs; the NaN
    cap ran whole stages; the seed failed in numpy with a traceback)."""
    path = write(tmp_path / "m.yaml", experiment(**change))
    out = tmp_path / "acc"
    code, stdout, err = run_main(["accuracy", path, *args, "--out", out], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert stdout == "" and not out.exists()


def test_an_out_that_cannot_be_made_is_said_before_the_runs(tmp_path, capsys, monkeypatch):
    """It was found after the whole run, its results then lost."""
    from kvsim.accuracy import parallel

    ran: list[str] = []
    monkeypatch.setattr(parallel, "run_experiment", lambda exp, *a, **k: ran.append(exp.id))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = write(tmp_path / "m.yaml")
    code, _, err = run_main(["accuracy", path, "--out", blocker / "acc"], capsys)
    assert code == 2 and "a-file/acc" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_main(
        ["fit-compute", path, "--gpu", "h100", "--out", tmp_path / "no" / "p.json"], capsys
    )
    assert code == 2 and "folder" in err and "does not exist" in err, err
    assert ran == []


def test_a_gpu_spec_is_read_beside_the_measurements_file(tmp_path, capsys, monkeypatch):
    """As a model's config.json is: the file names it relative to itself, wherever kvsim
    runs from."""
    from kvsim.specs.hardware import get_gpu

    h100 = get_gpu("h100")
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "mine.json").write_text(
        json.dumps(
            {
                "name": "mine",
                "memory_bytes": h100.memory_bytes,
                "hbm_bytes_per_s": h100.hbm_bytes_per_s,
                "peak_flops": h100.peak_flops,
                "link": h100.link,
            }
        )
    )
    path = write(tmp_path / "m.yaml", experiment(gpu="gpus/mine.json"))
    monkeypatch.chdir(tmp_path / "gpus")  # not where the file is
    code, _, err = run_main(["accuracy", path, "--max-stage-s", "2", "--warmup-s", "0"], capsys)
    assert code == 0, err


def test_a_measured_stage_that_sends_nothing_in_the_run_is_said(tmp_path, capsys):
    quiet = experiment(
        load={
            "type": "constant",
            "stages": [{"rate": 0.2, "duration": 60}, {"rate": 8, "duration": 5}],
        }
    )
    path = write(tmp_path / "m.yaml", quiet)
    code, out, err = run_main(["accuracy", path, "--max-stage-s", "3", "--warmup-s", "0"], capsys)
    assert code == 0, err
    assert "stage 0 sent no request in the run (0.2/s for 3 s), so it is not compared" in err
    stages = {line.split()[1] for line in out.splitlines() if line.startswith("small-")}
    assert "0" not in stages and stages == {"1", "all"}


def test_a_load_that_the_cut_leaves_sending_nothing_names_the_cut(tmp_path, capsys):
    """It was 'the poisson load sends no request in its 2 stage(s) (a stage at rate R for
    D seconds sends R x D requests ...)': true of the cut run only, and no word of the cut."""
    rare = experiment(load={"type": "poisson", "stages": [{"rate": 0.01, "duration": 600}]})
    path = write(tmp_path / "m.yaml", rare)
    code, _, err = run_main(["accuracy", path, "--max-stage-s", "5", "--no-progress"], capsys)
    assert code == 1
    assert (
        "the poisson load sends no request with its stage cut to 5 s by --max-stage-s "
        "(after 30 s unmeasured): give a longer --max-stage-s"
    ) in err


def test_one_output_token_has_no_itl_predicted(tmp_path, capsys):
    """No gap between tokens: the predicted ITL was a NaN, written 'nan' in accuracy.csv."""
    from kvsim.accuracy import accuracy

    one = experiment(workload={**EXPERIMENT["workload"], "output_len": 1})
    path = write(tmp_path / "m.yaml", one)
    args = ["accuracy", path, "--max-stage-s", "2", "--warmup-s", "0", "--no-progress"]
    code, _, err = run_main([*args, "--out", tmp_path / "acc"], capsys)
    assert code == 0, err
    with open(tmp_path / "acc" / "accuracy.csv", newline="") as f:
        itl = [r for r in csv.DictReader(f) if r["metric"] == "itl_mean"]
    assert {r["stage"] for r in itl} == {"0", "1", "all"}
    assert all(r["predicted"] == r["measured"] == r["ape_pct"] == "" for r in itl)
    report = accuracy(path, max_stage_s=2, workers=1)
    assert [r.predicted for r in report.rows if r.metric == "itl_mean"] == [None] * 3
    assert "itl_mean" not in report.summary() and "ttft_mean" in report.summary()


def test_closed_loops_run_and_impossible_settings_fail_with_a_reason(tmp_path):
    from kvsim.accuracy import accuracy

    closed = experiment(
        id="closed",
        load={"type": "concurrency", "stages": [{"concurrency": 4, "num_requests": 12}]},
        measured=[{"stage": "all", "e2e_ms": {"mean": 300.0}}],
    )
    # 300-token prompts, 20-token outputs: vLLM 0.33 would cut them to 10; v0.15.1's server,
    # the measurements', refused every one
    too_long = experiment(id="too-long", vllm={**experiment()["vllm"], "max_model_len": 310})
    past = experiment(id="past", vllm={**experiment()["vllm"], "max_model_len": 8192})
    tp3 = experiment(id="tp3", tp=3)  # Llama-2-7B's 32 heads do not split over 3 GPUs
    report = accuracy(write(tmp_path / "m.yaml", closed, too_long, past, tp3))
    by = {r.experiment: r for r in report.results}
    assert by["closed"].error is None and by["closed"].requests == 12
    assert "every request (" in (by["too-long"].error or "")
    assert "vllm.max_model_len (310)" in (by["too-long"].error or "")
    assert "vllm.max_model_len 8192 exceeds llama-2-7b's max_model_len from its config (4096)" in (
        by["past"].error or ""
    )
    assert (by["tp3"].error or "").startswith("tp 3: llama-2-7b's 32 attention heads")
    assert [f.experiment for f in report.failures] == ["too-long", "past", "tp3"]


def test_what_a_run_refuses_or_never_sends_is_said_not_scored_silently(tmp_path):
    """Found by a hostile pass: every request refused (10 GPU blocks) was an experiment
    with no rows and no error, exit 0; some refused were scored over the rest unsaid; a
    load sending nothing was a numpy IndexError that lost the file's other results; a
    random workload's longest request was over-counted (prefix scaled by the range ratio,
    special tokens twice), refusing experiments vLLM runs; a 32-token block size with the
    connector failed on a 16-token chunk nobody gave."""
    import warnings

    from kvsim.accuracy import accuracy

    vllm = experiment()["vllm"]
    none_fit = experiment(id="none-fit", vllm={**vllm, "num_gpu_blocks_override": 10})
    silent = experiment(
        id="silent", load={"type": "constant", "stages": [{"rate": 0.05, "duration": 10}]}
    )
    rand = {"type": "random", "input_len": 100, "output_len": 10, "range_ratio": 0.5}
    edge = experiment(
        id="edge",
        workload={**rand, "prefix_len": 1000, "special_tokens": 1},
        vllm={**vllm, "max_model_len": 1165},  # 1 + 1000 + ceil(99 x 1.5) + 15, exactly
    )
    # one token shorter: the experiment runs (it was a failure before), its longest
    # requests refused per request, as v0.15.1's server refused them
    shy = experiment(
        id="shy",
        workload={**rand, "prefix_len": 1000, "special_tokens": 1},
        vllm={**vllm, "max_model_len": 1150},
    )
    bs32 = experiment(id="bs32", vllm={**vllm, "block_size": 32, "num_gpu_blocks_override": 3731})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        file = write(tmp_path / "m.yaml", none_fit, silent, edge, shy, bs32)
        report = accuracy(file, max_stage_s=5)
    by = {r.experiment: r for r in report.results}
    assert "every request (" in (by["none-fit"].error or "")
    assert "sends no request" in (by["silent"].error or "")
    assert by["edge"].error is None and by["bs32"].error is None and by["shy"].error is None
    assert not any("refused" in w for w in by["edge"].warnings)
    assert any("requests refused" in w and "(1150)" in w for w in by["shy"].warnings)
    assert [f.experiment for f in report.failures] == ["none-fit", "silent"]
    few = experiment(
        id="few",
        vllm={**vllm, "num_gpu_blocks_override": 18},  # 17 usable: 272 tokens
        workload={**rand, "input_len": 240, "range_ratio": 0.3},  # 168 to 312, + up to 13
    )
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        report = accuracy(write(tmp_path / "few.yaml", few), max_stage_s=5)
    assert not report.failures
    assert any("requests refused (longer than the GPU KV" in str(w.message) for w in said)


@pytest.mark.parametrize(
    ("given", "max_model_len", "chunked", "expected"),
    [
        (2048, 4096, True, 2048),  # chunked: the file's budget, whatever max_model_len
        (None, 4096, True, None),  # chunked: vllm serve's default, the engine's to pick
        (4096, 4096, False, 4096),
        (None, 4096, False, 8192),  # vllm serve's H100 default, already >= max_model_len
        (None, 16384, False, 16384),  # raised to max_model_len (Llama-3.1-8B's 16,384)
        (None, None, False, 8192),  # max_model_len from the model: Llama-2-7B's 4,096
    ],
)
def test_without_chunked_prefill_the_budget_holds_a_whole_prompt(
    tmp_path, given, max_model_len, chunked, expected
):
    """vLLM's ``EngineArgs`` without chunked prefill raises the default step budget to
    max_model_len; a budget given below it makes vLLM refuse to start."""
    from kvsim.accuracy.measurements import read_measurements
    from kvsim.accuracy.run import _max_num_batched_tokens
    from kvsim.specs.context import vllm_max_model_len
    from kvsim.specs.hardware import get_gpu
    from kvsim.specs.models import get_model

    vllm = {"enable_chunked_prefill": chunked, "max_num_batched_tokens": given}
    if max_model_len is not None:
        vllm["max_model_len"] = max_model_len
    vllm = {k: v for k, v in vllm.items() if v is not None}
    exp = read_measurements(write(tmp_path / "m.yaml", experiment(vllm=vllm))).experiments[0]
    # a max_model_len past Llama-2-7B's 4,096 positions: vLLM would not start
    model = get_model("llama-2-7b" if (max_model_len or 0) <= 4096 else "llama-3.1-8b")
    mml = vllm_max_model_len(model, exp.vllm.max_model_len, "vllm.max_model_len")
    budget = _max_num_batched_tokens(exp, mml, get_gpu("h100"))
    assert budget == expected


def test_an_unchunked_experiment_runs_and_waits_for_whole_prompts(tmp_path, capsys):
    """With chunked prefill off the experiment runs (it was refused before), and its
    prompts are never split: four clients send 2,100-token prompts at once, which 4,096-token
    steps take one and a half at a time with chunked prefill and one at a time without, so
    the first tokens come at other times (here sooner on average: each prompt's step is
    shorter). The step-by-step rule is the differential test's against vLLM."""
    vllm = {**EXPERIMENT["vllm"], "max_num_batched_tokens": 4096}
    workload = {**EXPERIMENT["workload"], "question_len": 2000}
    load = {"type": "concurrency", "stages": [{"concurrency": 4, "num_requests": 12}]}
    path = write(
        tmp_path / "m.yaml",
        experiment(id="chunked", vllm=vllm, workload=workload, load=load),
        experiment(
            id="unchunked",
            vllm={**vllm, "enable_chunked_prefill": False},
            workload=workload,
            load=load,
        ),
    )
    code, stdout, err = run_main(["accuracy", path, "--json", "--no-progress"], capsys)
    assert code == 0, err
    rows = json.loads(stdout)["rows"]
    ttft = {r["experiment"]: r["predicted"] for r in rows if r["metric"] == "ttft_mean"}
    assert 0 < ttft["unchunked"] < ttft["chunked"], ttft


def test_a_warning_names_the_experiment_it_comes_from(tmp_path, capsys):
    """In a file of many runs an "overloaded" line must say which run; each once."""
    hot = experiment(  # 1,600-token prompts of their own at 60 a second: past the GPU
        id="hot",
        workload={**EXPERIMENT["workload"], "question_len": 1500, "num_prompts_per_group": 50},
        load={"type": "constant", "stages": [{"rate": 60, "duration": 5}]},
        measured=[{"stage": "all", "e2e_ms": {"mean": 300.0}}],
    )
    path = write(tmp_path / "m.yaml", experiment(), hot)
    code, _, err = run_main(["accuracy", path, "--no-progress", "--out", tmp_path / "a"], capsys)
    assert code == 0
    lines = [line for line in err.splitlines() if "overloaded" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("kvsim: warning: experiment hot: overloaded")
    # and the report keeps them: metadata.json per experiment, --json by experiment
    meta = json.loads((tmp_path / "a" / "metadata.json").read_text())
    said = {e["id"]: e["warnings"] for e in meta["config"]["experiments"]}
    assert said["small-llama-2-7b"] == [] and said["hot"][0].startswith("overloaded")
    code, stdout, _ = run_main(["accuracy", path, "--json"], capsys)
    assert code == 0 and list(json.loads(stdout)["warnings"]) == ["hot"]


@pytest.mark.parametrize(
    ("keywords", "line"),
    [
        ({"max_stage_s": 0}, "--max-stage-s: Expected `float` >= 1.0, got 0"),
        ({"max_stage_s": float("nan")}, "--max-stage-s: must be finite, got nan"),
        ({"max_stage_s": 5, "warmup_s": -1}, "--warmup-s: Expected `float` >= 0.0, got -1"),
        ({"seed": -1}, "--seed: Expected `int` >= 0, got -1"),
        ({"seed": True}, "--seed: Expected `int`, got True"),
        ({"experiments": "small-llama-2-7b"}, "experiments: a list of ids, got 'small"),
    ],
)
def test_the_apis_run_settings_are_checked_before_any_experiment(tmp_path, keywords, line):
    """``accuracy()`` takes what ``kvsim accuracy`` takes: a cap of 0 s failed every
    experiment ('sends no request'), NaN was no cap, a seed of -1 failed each experiment
    alone and a text id ran its letters."""
    from kvsim.accuracy import accuracy
    from kvsim.core.errors import InputError

    path = write(tmp_path / "m.yaml", experiment())
    with pytest.raises(InputError) as caught:
        accuracy(path, workers=1, **keywords)
    assert str(caught.value).startswith(line)


def test_the_apis_run_settings_take_numpy_numbers(tmp_path):
    import numpy as np

    from kvsim.accuracy import accuracy

    path = write(tmp_path / "m.yaml", experiment())
    report = accuracy(path, max_stage_s=np.float64(5), warmup_s=np.int64(0), seed=np.int64(0))
    assert report.rows == accuracy(path, max_stage_s=5, workers=1).rows and report.rows
