"""``kvsim fit-compute`` writing a profile ``--compute-profile`` loads (held-out
experiments, a start, the Levenberg-Marquardt search) and ``kvsim cross-validate``'s folds,
on shortened experiments."""

from __future__ import annotations

import csv
import json

from measurements_small import EXPERIMENT, UNSTARTABLE, experiment, write
from support import run_main

from kvsim.engine.phase_compute import PhaseProfile


def test_fit_compute_fits_on_a_whole_run_where_only_that_is_measured(tmp_path, capsys):
    """A one-stage experiment measured as ``stage: all`` (llm-d's fleet file) was 'no stage
    measures mean TTFT, E2E or ITL: nothing to fit'."""
    whole = experiment(
        load={"type": "constant", "stages": [{"rate": 4, "duration": 5}]},
        measured=[{"stage": "all", "ttft_ms": {"mean": 22.0}, "e2e_ms": {"mean": 210.0}}],
    )
    args = ["fit-compute", write(tmp_path / "m.yaml", whole), "--gpu", "h100"]
    args += ["--out", tmp_path / "p.json", "--max-evals", "1", "--max-stage-s", "3"]
    code, stdout, err = run_main(args, capsys)
    assert code == 0 and "training error" in stdout, err


def test_fit_compute_names_the_file_of_an_experiment_it_cannot_run(tmp_path, capsys):
    short = experiment(vllm={**EXPERIMENT["vllm"], "max_model_len": 16})
    path = write(tmp_path / "m.yaml", short)
    args = ["fit-compute", path, "--gpu", "h100", "--out", tmp_path / "p.json"]
    code, _, err = run_main([*args, "--max-evals", "1", "--max-stage-s", "2"], capsys)
    assert code == 2
    assert err.startswith(f"kvsim: error: {path}: experiment ") and "max_model_len (16)" in err
    assert not (tmp_path / "p.json").exists()


def test_fit_compute_writes_a_profile_with_provenance(tmp_path, capsys):
    path = write(tmp_path / "m.yaml")
    profile = tmp_path / "p.json"
    code, stdout, _ = run_main(
        [
            "fit-compute",
            path,
            "--gpu",
            "h100",
            "--out",
            profile,
            "--max-evals",
            "2",
            "--max-stage-s",
            "3",
        ],
        capsys,
    )
    assert code == 0 and "training error" in stdout
    data = json.loads(profile.read_text())
    loaded = PhaseProfile.from_dict(data, source=str(profile))
    assert loaded.provenance is not None
    assert loaded.provenance["experiments"] == ["small-llama-2-7b"]
    assert "training" in loaded.provenance["note"]
    code, _, _ = run_main(
        ["accuracy", path, "--compute-profile", profile, "--max-stage-s", "3", "--no-progress"],
        capsys,
    )
    assert code == 0


def test_fit_compute_holds_out_experiments_and_starts_where_told(tmp_path, capsys):
    """A cross-validation fold: the held-out experiment is never simulated (it could not
    run: were it evaluated, the fit would fail), and the search starts from --start."""
    path = write(
        tmp_path / "m.yaml",
        experiment(),
        experiment(id="held", vllm=UNSTARTABLE),
    )
    start = tmp_path / "start.json"
    start.write_text(json.dumps({"kind": "phases", "gpu": "h100", "step_overhead_s": 0.002}))
    profile = tmp_path / "p.json"
    argv = ["fit-compute", path, "--gpu", "h100", "--out", profile, "--max-evals", "1"]
    code, _, _ = run_main(
        [*argv, "--max-stage-s", "3", "--hold-out", "held", "--start", start], capsys
    )
    assert code == 0
    loaded = PhaseProfile.from_dict(json.loads(profile.read_text()), source=str(profile))
    assert loaded.provenance is not None
    assert loaded.provenance["experiments"] == ["small-llama-2-7b"]
    assert loaded.provenance["held_out"] == ["held"]
    assert loaded.provenance["started_from"]["step_overhead_s"] == 0.002
    assert loaded.step_overhead_s == 0.002  # one evaluation: the start itself
    code, _, err = run_main([*argv, "--hold-out", "helt"], capsys)
    assert code == 2 and "--hold-out 'helt': not in" in err and "did you mean 'held'" in err
    assert len(err.strip().splitlines()) == 1
    both = ["--hold-out", "held", "--hold-out", "small-llama-2-7b"]
    code, _, err = run_main([*argv, *both], capsys)
    assert code == 2 and "leaves no experiment" in err
    assert not profile.with_suffix(".tmp").exists()


def test_cross_validate_predicts_each_model_from_a_fit_without_it(tmp_path, capsys):
    """Two models, two folds: each experiment is predicted once, by the profile fitted on
    the other model only, from --start; a file of one model is one line, exit 2."""
    path = write(
        tmp_path / "m.yaml",
        experiment(),
        experiment(
            id="small-llama-3.1-8b", model="llama-3.1-8b", vllm={"num_gpu_blocks_override": None}
        ),
    )
    start = tmp_path / "start.json"
    start.write_text(json.dumps({"kind": "phases", "gpu": "h100", "step_overhead_s": 0.002}))
    out = tmp_path / "cv"
    argv = ["cross-validate", path, "--gpu", "h100", "--start", start, "--max-evals", "1"]
    code, stdout, _ = run_main([*argv, "--max-stage-s", "3", "--out", out, "--no-progress"], capsys)
    assert code == 0 and "APE over 2 experiment(s)" in stdout
    with open(out / "accuracy.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["experiment"] for r in rows} == {"small-llama-2-7b", "small-llama-3.1-8b"}
    folds = [json.loads((out / f"fold-{i}.json").read_text())["provenance"] for i in (0, 1)]
    assert [f["held_out"] for f in folds] == [["small-llama-2-7b"], ["small-llama-3.1-8b"]]
    assert [f["experiments"] for f in folds] == [["small-llama-3.1-8b"], ["small-llama-2-7b"]]
    assert all(f["started_from"]["step_overhead_s"] == 0.002 for f in folds)
    meta = json.loads((out / "metadata.json").read_text())["config"]
    assert meta["folds"] == {
        "llama-2-7b": ["small-llama-2-7b"],
        "llama-3.1-8b": ["small-llama-3.1-8b"],
    }
    one = write(tmp_path / "one.yaml", experiment())
    code, _, err = run_main(["cross-validate", one, "--gpu", "h100", "--start", start], capsys)
    assert code == 2 and "one model (llama-2-7b)" in err and len(err.strip().splitlines()) == 1


def test_cross_validate_by_experiment_leaves_out_one_workload_of_a_model(tmp_path, capsys):
    """--fold-by experiment: one fold per experiment, so a model's other run trains the
    prediction of its held-out one (a new workload on a model the fit has seen); a file of
    one experiment is one line, exit 2."""
    path = write(
        tmp_path / "m.yaml",
        experiment(),
        experiment(id="small-llama-2-7b-b"),
        experiment(
            id="small-llama-3.1-8b", model="llama-3.1-8b", vllm={"num_gpu_blocks_override": None}
        ),
    )
    start = tmp_path / "start.json"
    start.write_text(json.dumps({"kind": "phases", "gpu": "h100", "step_overhead_s": 0.002}))
    out = tmp_path / "cv"
    argv = ["cross-validate", path, "--gpu", "h100", "--start", start, "--max-evals", "1"]
    argv += ["--max-stage-s", "3", "--fold-by", "experiment"]
    code, stdout, _ = run_main([*argv, "--out", out, "--no-progress"], capsys)
    assert code == 0 and "APE over 3 experiment(s)" in stdout
    folds = [json.loads((out / f"fold-{i}.json").read_text())["provenance"] for i in (0, 1, 2)]
    assert [f["held_out"] for f in folds] == [
        ["small-llama-2-7b"],
        ["small-llama-2-7b-b"],
        ["small-llama-3.1-8b"],
    ]
    assert folds[0]["experiments"] == ["small-llama-2-7b-b", "small-llama-3.1-8b"]
    meta = json.loads((out / "metadata.json").read_text())["config"]
    assert meta["validation"] == "leave one experiment out" and len(meta["folds"]) == 3
    one = write(tmp_path / "one.yaml", experiment())
    code, _, err = run_main([*argv[:1], one, *argv[2:]], capsys)
    assert code == 2 and "one experiment (small-llama-2-7b)" in err
    assert len(err.strip().splitlines()) == 1


def test_fit_compute_search_lm_moves_the_parameters_together_and_says_so(tmp_path, capsys):
    """``--search lm``: Levenberg-Marquardt's Jacobian probes each parameter, then a step
    moves them all; the result is never worse than the start, and the profile records the
    search."""
    path = write(tmp_path / "m.yaml")
    profile = tmp_path / "p.json"
    argv = ["fit-compute", path, "--gpu", "h100", "--out", profile, "--max-stage-s", "3"]
    code, stdout, err = run_main([*argv, "--search", "lm", "--max-evals", "12"], capsys)
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("eval ")]
    assert len(lines) <= 12 and "start" in lines[0]
    assert sum("(Jacobian)" in line for line in lines) >= 8  # one probe per parameter
    assert any("step (lambda" in line for line in lines)
    start_loss = float(lines[0].rsplit("loss ", 1)[1])
    final_loss = float(stdout.split("loss ", 1)[1].split()[0])
    assert final_loss <= start_loss
    loaded = PhaseProfile.from_dict(json.loads(profile.read_text()), source=str(profile))
    assert loaded.provenance is not None and loaded.provenance["search"] == "lm"
    code, _, err = run_main([*argv, "--search", "simplex"], capsys)
    assert code == 2 and "--search" in err


def test_fit_compute_takes_a_gpu_named_by_its_product_name_for_its_preset(tmp_path, capsys):
    """An experiment on "NVIDIA H100 80GB HBM3" (nvidia-smi's name) is on --gpu h100, where
    fit-compute refused it as 'experiments on NVIDIA H100 80GB HBM3, not --gpu h100'."""
    named = experiment(
        gpu="NVIDIA H100 80GB HBM3",
        load={"type": "constant", "stages": [{"rate": 4, "duration": 5}]},
        measured=[{"stage": "all", "ttft_ms": {"mean": 22.0}, "e2e_ms": {"mean": 210.0}}],
    )
    args = ["fit-compute", write(tmp_path / "m.yaml", named), "--gpu", "h100"]
    args += ["--out", tmp_path / "p.json", "--max-evals", "1", "--max-stage-s", "3"]
    code, stdout, err = run_main(args, capsys)
    assert code == 0 and "training error" in stdout, err
