"""The device check script: runs from the checkout on the device image's packages only,
writes each section whole (through kvsim.core.io) as it completes, falls back to pageable
memory only when pinning is refused and says so, keeps to its time budget, and prints one
line per goal naming what is copied and the published figure it is held against."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from real import check_copies, check_env, check_goals, gpu_check
from real.device import Device
from real.host_pool import PinError
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, KVGeometry
from real.triton_load import GatherKernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What the H200 image has besides the standard library (Triton: real.triton_load imports it on
# a GPU only), plus what the check carries as a wheel (the image lacks msgspec, kvsim's schema
# library: unpacked in `.gpu_deps/`, carried).
DEVICE_IMAGE = {"torch", "triton", "numpy", "pandas", "click", "pyarrow", "cuda", "kvsim", "real"}
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

SECTION_FILES = {f"{name}.json" for name in gpu_check.SECTIONS}


def quiet(_line: str) -> None:
    return None


def test_runs_from_the_checkout_on_the_device_image_packages(tmp_path):
    """``PYTHONPATH=. python3 -m real.gpu_check --out DIR``; kvsim and real import nothing
    outside the image's set; one status line per goal, each naming its reference; every
    section and the profile on disk."""
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
    goals = [ln for ln in proc.stdout.splitlines() if ln.startswith(("PASS ", "FAIL ", "SKIP "))]
    assert len(goals) == 12 and all("(reference: " in ln for ln in goals)
    assert any(ln.startswith("PASS 0 mismatched bytes") for ln in goals)
    assert "INFO calibrated GB/s by copy size" in proc.stdout and "2 MiB" in proc.stdout
    assert "INFO GB/s through backend jobs by copy size" in proc.stdout
    files = set(os.listdir(out))
    assert SECTION_FILES | {"gpu_check.json", "profile.json", "goals.txt", "goals.json"} <= files
    assert not [f for f in files if f.startswith(".")]  # no temporary file left behind
    rep = json.loads((out / "gpu_check.json").read_text())
    for name in gpu_check.SECTIONS:
        assert "error" not in rep[name] and "skipped" not in rep[name], name
        assert json.loads((out / f"{name}.json").read_text()) == rep[name]
    assert all(it["checked_blocks"] > 0 and it["mismatched_bytes"] == 0 for it in rep["integrity"])
    assert rep["validation"]["integrity_mismatched_bytes"] == 0
    # the decisions that do not depend on the machine's load (real.lockstep)
    assert rep["validation"]["lockstep_hit_decisions_identical"] is True
    assert rep["validation"]["lockstep_jobs_identical"] is True
    assert rep["validation"]["lockstep_checked_blocks"] > 0
    assert rep["validation"]["noise_jobs"] > 0 and rep["validation"]["job_noise_median_pct"] > 0
    assert rep["calibration"]["pinned"] is torch.cuda.is_available()  # pinned on any GPU
    sizes = {(r["layout"], r["copy_bytes"]) for r in rep["bandwidth"]}
    assert (BLOCK_FIRST, 2 << 20) in sizes and (LAYER_MAJOR, 64 << 10) in sizes


def test_every_file_is_written_whole_through_core_io(tmp_path, monkeypatch):
    written: list[str] = []
    real_writer = gpu_check.atomic_write

    def spy(path, *args, **kwargs):
        written.append(os.path.basename(path))
        return real_writer(path, *args, **kwargs)

    monkeypatch.setattr(gpu_check, "atomic_write", spy)
    monkeypatch.setattr(gpu_check, "_validation", lambda *a: {"skipped": "not in this test"})
    gpu_check.run_check(
        Device("cpu"), plan=gpu_check.PLANS["tiny"], out_dir=str(tmp_path), say=quiet
    )
    assert set(os.listdir(tmp_path)) == set(written)
    assert written.index("environment.json") < written.index("calibration.json")


@pytest.mark.parametrize("layout", [BLOCK_FIRST, LAYER_MAJOR])
@pytest.mark.parametrize("kind,seed", [("eager", 0), ("deferred", 0), ("deferred", 1)])
def test_integrity_has_no_false_mismatches_when_work_completes_out_of_order(kind, seed, layout):
    """Loads into blocks that an unverified load still writes, and checks made only when a
    job is seen finished, reported intact blocks as corrupted (turn 2, fault 1)."""
    res = check_copies.integrity_under_compute(
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
    """A kill mid-check keeps every section that completed, each in its own file."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(check_copies, "integrity_under_compute", killed)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.run_check(
            Device("cpu"), plan=gpu_check.PLANS["tiny"], out_dir=str(tmp_path), say=quiet
        )
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    done = {"environment", "pinning", "timing", "calibration", "bandwidth", "small_pages"}
    assert done <= set(rep) and "integrity" not in rep
    assert {f"{n}.json" for n in done} <= set(os.listdir(tmp_path))
    assert (tmp_path / "profile.json").exists()


def test_a_crashing_section_is_recorded_and_fails_its_goals(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("validation broke")

    monkeypatch.setattr(gpu_check, "_validation", broken)
    data = gpu_check.run_check(
        Device("cpu"), plan=gpu_check.PLANS["tiny"], out_dir=str(tmp_path), say=quiet
    )
    assert "validation broke" in data["validation"]["error"]
    assert check_goals.exit_status(data, gpu_check.SECTIONS) == 1
    lines = check_goals.format_goals(data["goals"]).splitlines()
    sim = [ln for ln in lines if "simulat" in ln or "calibrate vs backend" in ln]
    assert len(sim) == 3 and all(ln.startswith("FAIL") and "not measured" in ln for ln in sim)


def test_unpinned_only_when_pinning_is_refused_and_said(monkeypatch):
    """A section refused page-locked memory runs again on pageable memory, says so, and
    every later section runs unpinned too; a refusal found by the pinning section itself
    sends every section to pageable memory from the start."""
    said: list[str] = []
    runner = gpu_check.Runner(gpu_check.Report(None), gpu_check.PLANS["tiny"], 1e9, said.append)
    calls: list[bool] = []

    def section(unpinned):
        calls.append(unpinned)
        if not unpinned:
            raise PinError("cudaHostRegister failed (injected)")
        return {"ran": True}

    assert runner.run("bandwidth", section) == {
        "ran": True,
        "pin_refused": "cudaHostRegister failed (injected)",
    }
    assert runner.run("integrity", section) == {"ran": True}
    assert calls == [False, True, True] and "pinning refused" in said[0]
    seen: list[bool] = []
    monkeypatch.setattr(
        check_env, "pinning_cost", lambda d, s: {"works": False, "error": "refused (injected)"}
    )
    for name in ("copy_size_grid", "small_page_loads"):
        monkeypatch.setattr(
            check_copies,
            name,
            lambda *a, allow_unpinned, **k: seen.append(allow_unpinned) or {"ran": True},
        )
    said.clear()
    gpu_check.run_check(Device("cpu"), plan=gpu_check.PLANS["tiny"], say=said.append)
    assert seen == [True, True] and any("every section runs on pageable" in s for s in said)


def test_sections_that_would_overrun_the_budget_are_skipped(monkeypatch):
    plan = gpu_check.Plan(
        "budgeted", {}, {}, {}, {}, "small_for_tests", estimates={"environment": 0, "pinning": 1e6}
    )
    runner = gpu_check.Runner(gpu_check.Report(None), plan, 10.0, quiet)
    assert runner.run("environment", lambda u: {"ran": True}) == {"ran": True}
    assert "out of time" in runner.run("pinning", lambda u: {"ran": True})["skipped"]
    data = {**{s: {"ran": True} for s in gpu_check.SECTIONS}, "pinning": {"skipped": "x"}}
    assert check_goals.exit_status(data, gpu_check.SECTIONS) == 1


def test_the_tests_section_runs_the_real_suite_without_itself(monkeypatch, tmp_path):
    seen = {}

    def run(cmd, **kw):
        seen.update(cmd=cmd, **kw)
        return SimpleNamespace(returncode=0, stdout="....\n226 passed in 20.1s\n", stderr="")

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    cuda = SimpleNamespace(is_cuda=True)
    out = gpu_check._tests(cuda, gpu_check.PLANS["gpu"], 100.0, gpu_check.Report(str(tmp_path)))
    assert out == {
        "returncode": 0,
        "summary": "226 passed in 20.1s",
        "tail": "....\n226 passed in 20.1s\n",
    }
    assert seen["cmd"][1:4] == ["-m", "pytest", "tests/real"] and gpu_check.SELF_TEST in seen["cmd"]
    assert seen["cwd"] == gpu_check.ROOT and seen["timeout"] == 95.0
    assert (tmp_path / "tests.txt").read_text().endswith("226 passed in 20.1s\n")
    assert (
        gpu_check._tests(Device("cpu"), gpu_check.PLANS["gpu"], 100.0, gpu_check.Report(None))[
            "ran"
        ]
        is False
    )


def test_goals_name_what_is_copied_and_their_reference():
    row = {"gbps": 48.0, "copies_per_job": 32, "gate_held": True}
    grid = [
        {
            "layout": BLOCK_FIRST,
            "copy_bytes": 2 << 20,
            "pinned": True,
            "d2h": {**row, "gbps": 44.0},
            "h2d": row,
            "both": {**row, "gbps": 80.0},
        },
        {
            "layout": LAYER_MAJOR,
            "copy_bytes": 64 << 10,
            "pinned": True,
            "d2h": row,
            "h2d": {**row, "gate_held": False},
            "both": row,
        },
    ]
    goals = {g["goal"].split(" >=")[0]: g for g in check_goals.bandwidth_goals(grid)}
    assert goals["H2D of 2 MiB copies (block-first: one copy per block)"]["passed"]
    assert not goals["D2H of 2 MiB copies (block-first)"]["passed"]
    layer = goals["H2D of 64 KiB copies (layer-major: a 2 MiB block is 32 such pages)"]
    assert layer["passed"] and "a lower bound" in layer["detail"]
    assert "38.8-51.8 GB/s at 64 KiB" in layer["reference"]
    assert all(not g["passed"] for g in check_goals.bandwidth_goals({"error": "x"}))


def test_copy_geometry_gives_copies_of_the_size_asked():
    for size in (4 << 10, 64 << 10, 2 << 20, 64 << 20):
        bf, per_job = check_copies.copy_geometry(BLOCK_FIRST, size, 64 << 20)
        assert bf.block_bytes == size and per_job == max(1, (64 << 20) // size)
        lm, per_job = check_copies.copy_geometry(LAYER_MAJOR, size, 64 << 20)
        assert lm.page_bytes == size and 1 <= lm.num_layers <= 32 and per_job >= 1
    assert check_copies.copy_geometry(LAYER_MAJOR, 64 << 10, 64 << 20)[0].num_layers == 32


def test_pcie_link_reads_generation_width_numa_and_the_path_up(tmp_path):
    gpu = tmp_path / "pci0000:00" / "0000:00:01.0" / "0000:3b:00.0"
    gpu.mkdir(parents=True)
    for folder, speed, width in (
        (gpu.parent, "32.0 GT/s PCIe", "16"),
        (gpu, "16.0 GT/s PCIe", "8"),
    ):
        (folder / "current_link_speed").write_text(speed + "\n")
        (folder / "current_link_width").write_text(width + "\n")
    (gpu / "max_link_speed").write_text("32.0 GT/s PCIe\n")
    (gpu / "max_link_width").write_text("16\n")
    (gpu / "numa_node").write_text("1\n")
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "0000:3b:00.0").symlink_to(gpu)
    link = check_env.pcie_link("0000:3b:00.0", devices=str(devices))
    assert (link["current_gen"], link["current_width"]) == (4, "8")
    assert (link["max_gen"], link["max_width"], link["numa_node"]) == (5, "16", "1")
    assert link["upstream"] == [
        {"device": "0000:00:01.0", "speed": "32.0 GT/s PCIe", "width": "16"}
    ]
    assert "error" in check_env.pcie_link("0000:99:00.0", devices=str(devices))


def test_small_page_goal_needs_every_kernel_job_and_every_byte():
    run = {"path": "p", "gbps": 10.0, "jobs": 2, "failed_jobs": 0, "checked_blocks": 8}
    row = {
        "page_bytes": 16 * 1024,
        "auto": "kernel",
        "dma": {**run, "mismatched_bytes": 0, "jobs_by_path": {"copy_": 2}},
        "kernel": {
            **run,
            "gbps": 25.0,
            "mismatched_bytes": 0,
            "jobs_by_path": {GatherKernel.name: 2},
        },
    }
    ok = {"kernel_status": "ok", "pages": [row]}
    goal = check_goals.small_page_goal(ok)
    assert goal["passed"] and "kernel 25 GB/s, DMA (p) 10 GB/s" in goal["detail"]
    assert "kernel/DMA x2.50" in goal["detail"] and "16 blocks checked" in goal["detail"]

    def variant(**changes):
        return {**ok, "pages": [{**row, **changes}]}

    partial = variant(kernel={**row["kernel"], "jobs_by_path": {GatherKernel.name: 1, "copy_": 1}})
    corrupt = variant(kernel={**row["kernel"], "mismatched_bytes": 8})
    failed = variant(dma={**row["dma"], "failed_jobs": 1})
    for bad in (partial, corrupt, failed):
        assert not check_goals.small_page_goal(bad)["passed"]
    data = {
        "integrity": [{"mismatched_bytes": 0}],
        "validation": {"integrity_mismatched_bytes": 0},
    }
    sections = ("integrity", "validation", "small_pages")
    assert check_goals.exit_status({**data, "small_pages": ok}, sections) == 0
    assert check_goals.exit_status({**data, "small_pages": corrupt}, sections) == 1
    assert check_goals.exit_status({**data, "small_pages": {"error": "boom"}}, sections) == 1
