"""A measurements file naming a real model kvsim has no spec for (a Hugging Face id that is
not one of the presets'): that experiment fails alone, as another KV connector does, and
the file's others still give their numbers; a name of kvsim's own vocabulary that nothing
matches stays a bad file."""

from __future__ import annotations

import csv
import json

import pytest
from measurements_small import experiment, write
from support import run_main

from kvsim.accuracy.measurements import names_a_hub_model, read_measurements


def test_an_unknown_hub_model_fails_its_experiment_alone(tmp_path, capsys):
    path = write(
        tmp_path / "m.yaml",
        experiment(id="other", model="meta-llama/Llama-3.3-70B-Instruct"),
        experiment(id="known"),
    )
    out = tmp_path / "acc"
    code, stdout, err = run_main(["accuracy", path, "--out", out, "--no-progress"], capsys)
    assert code == 1, err  # after the other ran
    said = [line for line in err.splitlines() if "experiment other:" in line]
    assert len(said) == 1, err
    assert "kvsim has no spec for the Hugging Face model " in said[0]
    assert "'meta-llama/Llama-3.3-70B-Instruct'" in said[0]
    assert "give its path as the model" in said[0]
    with open(out / "accuracy.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["experiment"] for r in rows} == {"known"}
    assert all(r["predicted"] for r in rows if r["metric"] == "ttft_mean")
    meta = json.loads((out / "metadata.json").read_text())
    errors = {e["id"]: e["error"] for e in meta["config"]["experiments"]}
    assert errors["known"] is None and "no spec" in errors["other"]
    assert "known" in stdout


def test_a_misspelt_hub_id_is_said_with_the_closest_id(tmp_path, capsys):
    path = write(tmp_path / "m.yaml", experiment(model="meta-llama/Llama-2-7b-hff"))
    code, _, err = run_main(["accuracy", path, "--no-progress"], capsys)
    assert code == 1
    assert "(did you mean 'meta-llama/Llama-2-7b-hf'?)" in err


@pytest.mark.parametrize(
    ("name", "hub"),
    [
        ("meta-llama/Llama-3.3-70B-Instruct", True),
        ("Qwen/Qwen3-235B-A22B", True),
        ("mistralai/Mixtral-8x7B-v0.1", True),
        ("llama-2-7bb", False),  # a preset's name, misspelt
        ("configs/mine.json", False),  # a spec file that is not there
        ("a/b/c", False),  # a folder path, not org/name
        ("/abs/model", False),
        ("org/", False),
    ],
)
def test_what_reads_as_a_hub_id(tmp_path, name, hub):
    assert names_a_hub_model(name, str(tmp_path)) is hub


def test_a_local_folder_of_that_name_is_not_a_hub_id(tmp_path):
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert not names_a_hub_model("org/model", str(tmp_path))


def test_the_file_is_still_read_whole_before_anything_runs(tmp_path):
    """The hub id is let through; the rest of that experiment is still checked."""
    from kvsim.core.errors import InputError

    path = write(tmp_path / "m.yaml", experiment(model="org/model", gpu="h100x"))
    with pytest.raises(InputError, match=r"experiments\[0\]\.gpu: unknown GPU 'h100x'"):
        read_measurements(path)
