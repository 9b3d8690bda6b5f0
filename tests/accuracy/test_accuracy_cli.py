"""``kvsim accuracy`` end to end on a shortened experiment, the metrics it derives from a
run checked by hand, and ``kvsim fit-compute`` writing a profile ``--compute-profile``
loads."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from measurements_small import experiment, write
from support import run_main

from kvsim.accuracy.run import METRICS, stage_metrics
from kvsim.engine.phase_compute import PhaseProfile


def test_accuracy_end_to_end(tmp_path, capsys):
    path = write(
        tmp_path / "m.yaml",
        experiment(),
        experiment(id="fleet", instances=2, router={"name": "round-robin"}),
    )
    out = tmp_path / "acc"
    code, stdout, err = run_main(["accuracy", path, "--out", out, "--no-progress"], capsys)
    assert code == 1  # the fleet experiment could not run: counted, after the other ran
    assert "kvsim: experiment fleet: instances: 2" in err
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
    assert [e["id"] for e in meta["config"]["experiments"]] == ["small-llama-2-7b", "fleet"]
    assert meta["config"]["experiments"][1]["error"].startswith("instances: 2")
    assert "e2e_mean" in stdout and "median" in stdout

    code, stdout, _ = run_main(
        ["accuracy", path, "--json", "--experiment", "small-llama-2-7b"], capsys
    )
    assert code == 0
    data = json.loads(stdout)
    assert data["summary"]["ttft_mean"]["n"] == 1 and not data["failures"]


def test_stage_metrics_by_hand():
    stages = pd.DataFrame(
        {
            "stage": [0, 1, "all"],
            "completed": [2, 0, 2],
            "duration": [1.6, 0.0, 2.0],
            "total_output_tokens": [22, 0, 22],
            "mean_ttft_ms": [15.0, 0.0, 15.0],
            "p90_ttft_ms": [19.0, 0.0, 19.0],
            "p99_ttft_ms": [19.9, 0.0, 19.9],
            "mean_e2el_ms": [550.0, 0.0, 550.0],
            "p90_e2el_ms": [590.0, 0.0, 590.0],
            "p99_e2el_ms": [599.0, 0.0, 599.0],
        }
    )
    m = stage_metrics(stages, 11, overhead_s=0.005)
    assert set(m) == {"0", "all"}  # a stage that completed nothing has no metrics
    assert m["0"]["ttft_mean"] == pytest.approx(20.0)  # the client's 5 ms added
    assert m["0"]["e2e_p99"] == pytest.approx(604.0)
    assert m["0"]["itl_mean"] == pytest.approx((555.0 - 20.0) / 10)  # overhead cancels
    assert m["0"]["requests_per_s"] == pytest.approx(2 / 1.605)  # span ends later too
    assert m["all"]["output_tokens_per_s"] == pytest.approx(22 / 2.005)


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


def test_closed_loops_run_and_impossible_settings_fail_with_a_reason(tmp_path):
    from kvsim.accuracy import accuracy

    closed = experiment(
        id="closed",
        load={"type": "concurrency", "stages": [{"concurrency": 4, "num_requests": 12}]},
        measured=[{"stage": "all", "e2e_ms": {"mean": 300.0}}],
    )
    too_long = experiment(id="too-long", vllm={**experiment()["vllm"], "max_model_len": 256})
    past = experiment(id="past", vllm={**experiment()["vllm"], "max_model_len": 8192})
    report = accuracy(write(tmp_path / "m.yaml", closed, too_long, past))
    by = {r.experiment: r for r in report.results}
    assert by["closed"].error is None and by["closed"].requests == 12
    assert "exceeds vllm.max_model_len 256" in (by["too-long"].error or "")
    assert "max_position_embeddings (4096)" in (by["past"].error or "")
    assert [f.experiment for f in report.failures] == ["too-long", "past"]
