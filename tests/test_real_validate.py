"""Validation on CPU tensors: the same engine, manager and policies, simulated vs real."""

from __future__ import annotations

import json

import pytest

from kvsim.cli import main
from real.device import Device
from real.validate import ValidationSpec, default_trace, run_validation


@pytest.fixture(scope="module")
def report():
    return run_validation(default_trace(), ValidationSpec.small_for_tests(), device=Device("cpu"))


def test_hit_decisions_identical_and_every_loaded_byte_intact(report):
    s = report.summary()
    assert s["requests"] == 26
    assert s["hit_decisions_identical"] and s["first_difference"] is None
    assert report.integrity["checked_blocks"] > 50  # later turns really load from the CPU tier
    assert report.integrity["mismatched_blocks"] == 0 and report.integrity["mismatched_bytes"] == 0
    assert s["failed_jobs"] == 0
    cpu_hits = report.tables["real_requests"]["cpu_hit_tokens"].sum()
    assert cpu_hits > 0


def test_comparison_covers_every_job_and_request(report):
    t = report.transfers
    assert t["all"]["n"] == report.runs["real"]["transfer_jobs"] > 0
    assert t["store"]["n"] > 0 and t["load"]["n"] > 0
    assert t["matched_to_simulated_run"]["n"] == t["all"]["n"]  # same jobs in both runs
    assert report.ttft["n"] == 26
    bw = report.bandwidth
    assert bw["store_d2h"]["achieved_gbps"] > 0 and bw["load_h2d"]["achieved_gbps"] > 0
    # the real job table adds up to what the engine asked for
    jobs = report.tables["real_jobs"]
    assert jobs["nbytes"].sum() == report.tables["simulated_transfers"]["bytes"].sum()
    json.dumps(report.as_dict())  # the report is plain JSON


def test_failed_copy_goes_through_the_engine_and_manager():
    spec = ValidationSpec.small_for_tests()
    rep = run_validation(
        default_trace(),
        spec,
        device=Device("cpu"),
        fault=lambda job: job.job_id in (1, 2) and job.direction == "store",
    )
    assert rep.runs["real"]["failed_jobs"] == 2
    assert rep.integrity["mismatched_blocks"] == 0  # a failed store never serves a load
    # the engine passed success=False to complete_store: the stored-bytes count shrinks
    real_tr = rep.tables["real_jobs"]
    assert (~real_tr["success"]).sum() == 2


def test_validate_command_prints_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "validate",
                default_trace(),
                "--model",
                "llama-3.2-1b",
                "--cpu-chunks",
                "300",
                "--gpu-kv-blocks",
                "60",
                "--limit",
                "6",
                "--time-scale",
                "0.01",
                "--compute-scale",
                "0.1",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "hit_decisions_identical" in text and "integrity_mismatched_blocks" in text
    data = json.loads(out.read_text())
    assert data["integrity"]["mismatched_blocks"] == 0
    assert data["hits"]["requests"] == 6 and data["spec"]["model"] == "llama-3.2-1b"


def test_validate_rejects_bad_layout(capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "validate",
                default_trace(),
                "--cpu-chunks",
                "10",
                "--max-gpu-kv-gib",
                "-1",
                "--device",
                "cpu",
            ]
        )
    assert exc.value.code == 2 and "max-gpu-kv-gib" in capsys.readouterr().err
