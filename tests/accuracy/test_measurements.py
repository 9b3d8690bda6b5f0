"""The measurements file reader: the shared files read; a bad file is one line naming the
file and the key, exit 2, nothing written."""

from __future__ import annotations

import os

import pytest
from measurements_small import experiment, write
from support import run_main

from kvsim.accuracy.measurements import VllmArgs, read_measurements
from kvsim.core.errors import InputError
from kvsim.options.registry import schema_named
from kvsim.options.schema import json_schema

SHARED = "/work/shared/measurements"


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="the shared measurements are not here")
def test_the_shared_files_read():
    train = read_measurements(os.path.join(SHARED, "h100_inference_perf_train.yaml"))
    assert len(train.experiments) == 6
    assert sum(len(e.load.stages) for e in train.experiments) == 11
    first = train.experiments[0]
    assert first.vllm.num_gpu_blocks_override == 7463 and first.workload_spec().num_prompts == 100
    fleet = read_measurements(os.path.join(SHARED, "llm-d_qwen3-32b_fleet.yaml"))
    assert fleet.experiments[0].instances == 8 and fleet.experiments[0].router is not None


def test_the_schema_is_registered_and_describes_the_workloads():
    schema = json_schema(schema_named("measurements"))
    experiment_props = schema["$defs"]["Experiment"]["properties"]
    kinds = [s["properties"]["type"] for s in experiment_props["workload"]["anyOf"]]
    assert {k.get("default") for k in kinds} == {"shared_prefix", "random"}
    assert schema["$defs"]["VllmArgs"]["additionalProperties"] is False


def test_the_schema_takes_the_kv_transfer_configs_the_reader_takes(tmp_path):
    """Another connector's config with keys of its own is read (its experiment fails
    alone): the schema refused it, and so a file the reader takes; an OffloadingConnector
    config with a misspelt key it still refuses, and so one naming no connector."""
    import jsonschema
    import yaml

    validator = jsonschema.Draft202012Validator(json_schema(schema_named("measurements")))
    offload = experiment()["vllm"]["kv_transfer_config"]
    lmcache = {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.max_local_cpu_size": 20},
    }
    typo = {**offload, "kv_connector_extra_config": {"cpu_bytes_to_usee": 8}}
    nameless = {k: v for k, v in offload.items() if k != "kv_connector"}
    for config, refused in (
        (offload, None),
        (lmcache, None),
        (typo, "cpu_bytes_to_usee"),
        ({**offload, "kv_connector": None}, "got null"),  # vLLM does not start
        (nameless, "got no kv_connector"),
    ):
        path = write(
            tmp_path / "m.yaml",
            experiment(vllm={**experiment()["vllm"], "kv_transfer_config": config}),
        )
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        assert validator.is_valid(data) is (refused is None), config
        if refused is None:
            read_measurements(path)
        else:
            with pytest.raises(InputError, match=refused):
                read_measurements(path)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"vllm": {"max_num_seqs": 8, "swap_space": 4}}, "swap_space"),
        ({"vllm": {"max_num_seqs": 0}}, "vllm.max_num_seqs"),
        ({"workload": {"type": "sharegpt"}}, "workload.type"),
        ({"workload": {**experiment()["workload"], "num_groups": -1}}, "num_groups"),
        ({"load": {"type": "constant", "stages": [{"concurrency": 4, "duration": 5}]}}, "stages"),
        ({"measured": [{"stage": 5, "ttft_ms": {"mean": 1.0}}]}, "past the load"),
        ({"measured": [{"stage": "al"}]}, "stage"),
        ({"measured": [{"stage": 0, "ttft_ms": {"median": 3}}]}, "median"),
        ({"tp": "two"}, "tp"),
        # below: taken until 2026-12-07 (a fit then failed on the log of a negative ITL)
        (
            {"measured": [{"stage": 0, "ttft_ms": {"mean": 30.0}, "e2e_ms": {"mean": 10.0}}]},
            r"measured\[0\]: e2e_ms.mean 10 is below ttft_ms.mean 30",
        ),
        (
            {"measured": [{"stage": 0, "ttft_ms": {"p50": 50, "p90": 20, "p99": 60}}]},
            r"measured\[0\].ttft_ms: p50 50 is above p90 20",
        ),
        (
            {"vllm": {"kv_transfer_config": {"kv_connector": 5}}},
            "kv_transfer_config.kv_connector: a connector's name, got 5",
        ),
        (
            {"vllm": {"kv_transfer_config": '{"kv_connector": "A", "kv_connector": "B"}'}},
            "kv_transfer_config: kv_connector given twice",
        ),
        (  # a plugin router is loaded as the file is read (it failed when its turn came)
            {"instances": 2, "router": {"name": "nosuchmodule:Router"}},
            r"experiments\[0\].router.name nosuchmodule:Router: cannot load the plugin",
        ),
        (
            {"instances": 2, "router": {"name": "os:system"}},
            r"experiments\[0\].router.name os:system: not a class",
        ),
        ({"instances": 100_000}, r"experiments\[0\].instances: Expected `int` <= 4096"),
        ({"id": "a\nb"}, r"experiments\[0\].id: 'a\\nb' has spaces around it or a line break"),
        ({"id": " x "}, r"experiments\[0\].id: ' x ' has spaces around it"),
    ],
)
def test_a_bad_experiment_is_one_line_naming_the_key(tmp_path, capsys, changes, needle):
    path = write(tmp_path / "m.yaml", experiment(**changes))
    with pytest.raises(InputError, match=needle):
        read_measurements(path)
    out_dir = tmp_path / "out"
    code, out, err = run_main(["accuracy", path, "--out", out_dir], capsys)
    assert code == 2 and out == "" and not out_dir.exists()
    assert len(err.strip().splitlines()) == 1 and path in err and "Traceback" not in err


def test_bad_files_are_one_line(tmp_path, capsys):
    cases = {
        "version.yaml": "kvsim_measurements: 2\nexperiments: []\n",
        "yaml.yaml": "kvsim_measurements: 1\nexperiments: [\n",
        "list.yaml": "- 1\n",
        "empty.yaml": "kvsim_measurements: 1\nexperiments: []\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        code, out, err = run_main(["accuracy", path], capsys)
        assert code == 2 and out == "", name
        assert len(err.strip().splitlines()) == 1 and name in err, (name, err)
    twice = write(tmp_path / "twice.yaml", experiment(), experiment())
    code, _, err = run_main(["accuracy", twice], capsys)
    assert code == 2 and "used twice" in err
    code, _, err = run_main(["accuracy", tmp_path / "missing.yaml"], capsys)
    assert code == 2 and "not found" in err


def test_whole_floats_are_read_as_the_ints_they_are(tmp_path):
    """A count written ``2.0`` (a JSON tool's or a spreadsheet's) is the int; ``2.5`` is
    still refused where an int is expected."""
    load = {"type": "concurrency", "stages": [{"concurrency": 4.0, "num_requests": 12.0}]}
    measured = [{"stage": 0.0, "requests": 12.0, "ttft_ms": {"mean": 20}}]
    vllm = {**experiment()["vllm"], "max_num_seqs": 128.0, "num_gpu_blocks_override": 7463.0}
    path = write(tmp_path / "m.yaml", experiment(tp=1.0, load=load, measured=measured, vllm=vllm))
    exp = read_measurements(path).experiments[0]
    assert exp.tp == 1 and exp.load.stages[0].concurrency == 4
    assert exp.measured[0].stage == 0 and exp.vllm.num_gpu_blocks_override == 7463
    with pytest.raises(InputError, match=r"experiments\[0\]\.tp"):
        read_measurements(write(tmp_path / "bad.yaml", experiment(tp=1.5)))


def test_kv_transfer_config_may_be_the_command_lines_json_text(tmp_path, capsys):
    """``kv_transfer_config`` copied as ``vllm serve --kv-transfer-config '{...}'`` takes it
    (a string) reads as the object; text that is not a JSON object is one line, exit 2."""
    import json

    kv = experiment()["vllm"]["kv_transfer_config"]
    vllm = {**experiment()["vllm"], "kv_transfer_config": json.dumps(kv)}
    exp = read_measurements(write(tmp_path / "m.yaml", experiment(vllm=vllm))).experiments[0]
    connector = exp.vllm.connector()
    assert connector is not None
    extra = connector.kv_connector_extra_config
    assert extra.cpu_bytes_to_use == kv["kv_connector_extra_config"]["cpu_bytes_to_use"]
    assert VllmArgs(kv_transfer_config=json.dumps(kv)).connector() == connector  # built in code
    for text in ('{"kv_connector": "OffloadingConnector",}', "[1]"):
        path = write(tmp_path / "bad.yaml", experiment(vllm={**vllm, "kv_transfer_config": text}))
        code, out, err = run_main(["accuracy", path], capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "experiments[0].vllm.kv_transfer_config: not a JSON object" in err
        assert f"got {text!r}" in err  # the value, as every bad value is said


def test_the_schema_says_kv_transfer_config_may_be_the_command_lines_json_text(tmp_path):
    """``kvsim schema measurements`` shows the text the reader takes: a string, described
    as ``vllm serve --kv-transfer-config``'s JSON; a file holding one validates."""
    import json

    import jsonschema
    import yaml

    schema = json_schema(schema_named("measurements"))
    field = schema["$defs"]["VllmArgs"]["properties"]["kv_transfer_config"]
    (text,) = [s for s in field["anyOf"] if s.get("type") == "string"]
    assert "vllm serve --kv-transfer-config" in text["description"]
    assert text["contentMediaType"] == "application/json"
    kv = json.dumps(experiment()["vllm"]["kv_transfer_config"])
    path = write(
        tmp_path / "m.yaml", experiment(vllm={**experiment()["vllm"], "kv_transfer_config": kv})
    )
    with open(path, encoding="utf-8") as f:
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(f))


def test_ignore_eos_false_fails_its_experiment_alone(tmp_path, capsys):
    """A run with ``ignore_eos: false`` cannot be re-created (its lengths were the model's
    text), but it is a valid experiment: it fails alone (exit 1) after the others ran,
    naming its own key; its block is still checked as the file is read (exit 2)."""
    wl = {**experiment()["workload"], "ignore_eos": False}
    path = write(tmp_path / "m.yaml", experiment(), experiment(id="eos", workload=wl))
    code, out, err = run_main(["accuracy", path, "--max-stage-s", "2", "--warmup-s", "0"], capsys)
    assert code == 1 and "small-llama-2-7b" in out
    assert err.strip() == (
        "kvsim: experiment eos: workload: ignore_eos: false is not modelled (the output "
        "length would depend on the model's text); use ignore_eos: true, as the benchmark "
        "runs do"
    )
    bad = write(tmp_path / "bad.yaml", experiment(workload={**wl, "num_groups": 0}))
    code, _, err = run_main(["accuracy", bad], capsys)
    assert code == 2 and "experiments[0].workload.num_groups" in err


@pytest.mark.parametrize("dtype", ["float", "float32"])
def test_a_32_bit_dtype_fails_its_experiment_alone(tmp_path, dtype):
    """vLLM serves ``--dtype float32``, so the file is valid; kvsim does not model 32-bit
    weights, so that experiment fails with the reason and the others run."""
    from kvsim.accuracy import accuracy

    fp32 = experiment(id="fp32", vllm={**experiment()["vllm"], "dtype": dtype})
    report = accuracy(write(tmp_path / "m.yaml", experiment(), fp32), max_stage_s=2)
    by = {r.experiment: r for r in report.results}
    assert by["small-llama-2-7b"].error is None
    assert by["fp32"].error == (
        f"vllm.dtype {dtype} is not modelled (kvsim's step time is for 16-bit weights and "
        "activations, or the model's own quantization)"
    )


def test_a_model_named_by_its_hugging_face_id_runs_as_its_preset(tmp_path):
    """``model: meta-llama/Llama-2-7b-hf`` (as the server was given it) is the preset; a
    folder of that name beside the file would be read instead."""
    path = write(tmp_path / "m.yaml", experiment(model="meta-llama/Llama-2-7b-hf"))
    exp = read_measurements(path).experiments[0]
    assert exp.model_arg(str(tmp_path)) == "llama-2-7b"
    (tmp_path / "meta-llama" / "Llama-2-7b-hf").mkdir(parents=True)
    with pytest.raises(InputError, match=r"config\.json"):
        exp.model_arg(str(tmp_path))  # the folder is read: it has no config.json


def test_another_kv_connector_fails_its_experiment_alone(tmp_path, capsys):
    """``kv_connector: LMCacheConnectorV1`` (with its own extra keys) is a valid vLLM
    config kvsim does not re-create: that experiment fails with the reason (exit 1) after
    the others ran; an OffloadingConnector config is still checked as the file is read."""
    lmcache = {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.max_local_cpu_size": 20},
    }
    other = experiment(id="lmcache", vllm={**experiment()["vllm"], "kv_transfer_config": lmcache})
    path = write(tmp_path / "m.yaml", experiment(), other)
    code, out, err = run_main(["accuracy", path, "--max-stage-s", "2", "--warmup-s", "0"], capsys)
    assert code == 1 and "small-llama-2-7b" in out
    assert err.strip() == (
        "kvsim: experiment lmcache: vllm.kv_transfer_config.kv_connector: "
        "'LMCacheConnectorV1' is not modelled (kvsim models vLLM's OffloadingConnector)"
    )
    offload = experiment()["vllm"]["kv_transfer_config"]
    typo = {**offload, "kv_connector_extra_config": {"cpu_bytes_to_usee": 8}}
    bad = write(
        tmp_path / "bad.yaml", experiment(vllm={**experiment()["vllm"], "kv_transfer_config": typo})
    )
    code, _, err = run_main(["accuracy", bad], capsys)
    assert code == 2
    assert "experiments[0].vllm.kv_transfer_config.kv_connector_extra_config" in err
    assert "did you mean 'cpu_bytes_to_use'" in err


def test_a_kv_transfer_config_naming_no_connector_is_refused_not_run(tmp_path, capsys):
    """``kv_connector: null`` beside a CPU tier's size: vLLM 0.33 does not start with it
    (tests/vllm/test_vllm_kv_transfer_config.py), so kvsim neither runs it with offloading,
    as it did, nor without: one line naming the key, exit 2, before anything runs."""
    offload = experiment()["vllm"]["kv_transfer_config"]
    vllm = {**experiment()["vllm"], "kv_transfer_config": {**offload, "kv_connector": None}}
    path = write(tmp_path / "m.yaml", experiment(), experiment(id="nameless", vllm=vllm))
    code, out, err = run_main(["accuracy", path, "--max-stage-s", "2", "--warmup-s", "0"], capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "experiments[1].vllm.kv_transfer_config.kv_connector: vLLM 0.33 does not start" in err
    assert err.strip().endswith("got null") and str(path) in err
