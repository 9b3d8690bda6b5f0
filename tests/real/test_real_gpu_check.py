"""The device check script: runs from the checkout on the device image's packages only,
writes its report as it goes, prints one PASS/FAIL line per goal, and its integrity
section reports no false corruption on a device that completes work out of order."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from real import gpu_check
from real.device import Device
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, KVGeometry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What the H200 image has besides the standard library, plus what the check carries as a
# wheel (the image lacks msgspec, kvsim's schema library: `.whl` in the run's carry).
DEVICE_IMAGE = {"torch", "numpy", "pandas", "click", "pyarrow", "cuda", "kvsim", "real"}
CARRIED = {"msgspec"}

_AUDITED_RUN = """
import json, runpy, sys
allowed = set(sys.argv[1].split(",")) | set(sys.stdlib_module_names)
audit_path = sys.argv[2]
bad = []
class Audit:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in allowed:
            return None
        f = sys._getframe(1)
        while f is not None and f.f_globals.get("__name__", "").startswith(
            ("importlib", "_frozen_importlib")
        ):
            f = f.f_back
        importer = f.f_globals.get("__name__", "") if f is not None else ""
        if importer.split(".")[0] in ("kvsim", "real"):
            bad.append([importer, name])
        return None
sys.meta_path.insert(0, Audit())
sys.argv = ["gpu_check", *sys.argv[3:]]
try:
    runpy.run_module("real.gpu_check", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
json.dump({"bad_imports": bad, "code": code}, open(audit_path, "w"))
sys.exit(code)
"""


def test_runs_from_the_checkout_on_the_device_image_packages(tmp_path):
    """``PYTHONPATH=. python3 -m real.gpu_check --out DIR``; kvsim and real import nothing
    outside the image's set; one PASS/FAIL line per goal; sections on disk."""
    out, audit = tmp_path / "out", tmp_path / "audit.json"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [
            *(sys.executable, "-c", _AUDITED_RUN, ",".join(DEVICE_IMAGE | CARRIED), str(audit)),
            *("--small", "--out", str(out)),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(audit.read_text())["bad_imports"] == []
    goals = [ln for ln in proc.stdout.splitlines() if ln.startswith(("PASS ", "FAIL "))]
    assert len(goals) == 6
    assert any(ln.startswith("PASS 0 mismatched bytes") for ln in goals)
    assert "bandwidth GB/s by copy size" in proc.stdout and "2 MiB" in proc.stdout
    rep = json.loads((out / "gpu_check.json").read_text())
    for name in (
        "environment",
        "calibration",
        "bandwidth",
        "integrity",
        "small_pages",
        "validation",
        "goals",
    ):
        assert name in rep and "error" not in rep[name], name
    assert all(it["checked_blocks"] > 0 and it["mismatched_bytes"] == 0 for it in rep["integrity"])
    assert rep["validation"]["integrity_mismatched_bytes"] == 0
    assert rep["small_pages"]["dma"]["mismatched_bytes"] == 0
    assert rep["calibration"]["pinned"] is torch.cuda.is_available()  # pinned on any GPU
    assert (out / "profile.json").exists()


@pytest.mark.parametrize("layout", [BLOCK_FIRST, LAYER_MAJOR])
@pytest.mark.parametrize("kind,seed", [("eager", 0), ("deferred", 0), ("deferred", 1)])
def test_integrity_has_no_false_mismatches_when_work_completes_out_of_order(kind, seed, layout):
    """Fault 1: loads into blocks that an unverified load still writes, and checks made
    only when a job is seen finished, reported intact blocks as corrupted."""
    res = gpu_check.integrity_under_compute(
        Device("cpu", mode=kind, seed=seed),
        layout,
        geometry=KVGeometry(4, 2048),
        gpu_blocks=32,
        chunks=48,
        rounds=12,
        blocks_per_job=4,
        compute_s=0.0,
        seed=seed,
    )
    assert res["checked_blocks"] >= 8
    assert res["mismatched_blocks"] == 0 and res["mismatched_bytes"] == 0


def test_results_are_on_disk_after_every_section(tmp_path, monkeypatch):
    """Fault 8: the report is written as it goes, so a kill mid-check keeps what ran."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "integrity_under_compute", killed)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.run_check(Device("cpu"), small=True, out_dir=str(tmp_path), say=lambda s: None)
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {"environment", "calibration", "bandwidth"} <= set(rep)
    assert rep["calibration"]["gbps_ge_2MiB"]["h2d"] > 0
    assert (tmp_path / "profile.json").exists()


def test_a_crashing_section_is_recorded_and_fails_its_goal(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("validation broke")

    monkeypatch.setattr(gpu_check, "_validation", broken)
    data = gpu_check.run_check(Device("cpu"), small=True, out_dir=str(tmp_path), say=lambda s: None)
    assert "validation broke" in data["validation"]["error"]
    assert gpu_check.exit_status(data) == 1
    lines = gpu_check.format_goals(data["goals"]).splitlines()
    assert len(lines) == 6 and lines[-1].startswith("FAIL") and "not measured" in lines[-1]
