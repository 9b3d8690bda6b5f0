"""One GPU run that answers every question: ``PYTHONPATH=. python3 -m real.gpu_check --out DIR``.

Runs from a checkout with nothing installed beyond the device image (torch, numpy, pandas,
click, pyarrow; cuda-bindings for vLLM's batched copy; Triton for its gather kernel; pytest
for the last section) and msgspec, which the H200 image lacks: unpack its wheel into
``.gpu_deps/`` at the checkout's root (it is put on ``sys.path`` when present; the command is
in docs/real-backend.md) and carry that folder. It runs in under five minutes on one H200 with
no network. Sections, in order (each within a time budget, ``--budget-s``; one that would
not fit is skipped):

1. ``environment``: versions (torch, CUDA runtime and driver, Triton, cuda-bindings), the
   GPU, its PCIe generation and width (read while a copy runs) and NUMA node, the host,
   the copy paths that resolved (:mod:`real.check_env`);
2. ``pinning``: whether ``cudaHostRegister`` works here and its seconds per GiB;
3. ``timing``: event resolution and the quantum of absolute event times;
4. ``calibration``: the copy curve (H2D, D2H, both; 4 KiB to 64 MiB) -> ``profile.json``;
5. ``bandwidth``: H2D, D2H and both-ways GB/s through the backend's own jobs for copies of
   4 KiB to 64 MiB in both layouts (:mod:`real.check_copies`);
6. ``small_pages``: loads of 4-32 KiB pages with the gather kernel forced on and off;
7. ``integrity``: stores, loads and compute at once, every loaded byte checked;
8. ``validation``: the calibrated profile, then simulated vs measured on a slice of
   Mooncake's conversation trace (its turns of conversations, so later turns load):
   job times (model alone, simulated run), TTFT, each beside the measurement's noise;
   hit decisions on the wall clock and in lockstep -> ``validation_report.json`` and the
   slice itself, ``conversation_slice.jsonl``;
9. ``tests``: ``pytest tests/real`` on this machine -> ``tests.txt``.

Every section's result is written, whole, as it completes (``DIR/<section>.json`` and the
running ``DIR/gpu_check.json``, through :mod:`kvsim.core.io`), so a crash or a timeout keeps
what was done. Host memory must be page-locked on CUDA: when ``cudaHostRegister`` is
refused the check says so and measures pageable memory instead (and only then). It ends
with INFO lines (machine, clock, GB/s by copy size) and one line per goal, each PASS, FAIL
or SKIP with the published figure it is held against (:mod:`real.check_goals`). The exit
status is 1 when a section crashed or was skipped, a byte mismatched, a test failed or the
validation's lockstep run (:mod:`real.lockstep`) did not make the simulation's decisions.

On CPU the same code runs on the threaded stand-in with sizes for a small machine (the
``cpu`` plan: a check of the machinery, its GB/s CPU numbers); ``--small`` runs the
seconds-long plan the test suite uses.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from real.carried_deps import child_pythonpath, missing_modules, use_carried_deps

use_carried_deps()

from kvsim.core.errors import InputError  # noqa: E402
from kvsim.core.io import atomic_write, refuse_filling_folder  # noqa: E402
from real import check_copies, check_env, check_goals  # noqa: E402
from real.calibrate import BOTH, CPU_COLD_SPAN_FACTOR, D2H, H2D, KIB, MIB, calibrate  # noqa: E402
from real.copy_path import LOAD_MODES, default_copy_path  # noqa: E402
from real.device import Device, cpu_stand_in, cuda_available  # noqa: E402
from real.host_pool import PinError  # noqa: E402
from real.kv_cache import KVGeometry  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELF_TEST = (
    "tests/real/test_real_gpu_check.py::test_runs_from_the_checkout_on_the_device_image_packages"
)


@dataclass(frozen=True)
class Plan:
    """Sizes of every section (``estimates``: seconds each needs, for the budget)."""

    name: str
    calibrate: dict[str, Any]
    grid: dict[str, Any]
    small_pages: dict[str, Any]
    integrity: dict[str, Any]
    validation: str  # a ValidationSpec constructor: for_gpu_check, for_cpu_check, ...
    pin_gib: tuple[float, ...] = (1.0, 4.0)
    run_tests: bool = False
    budget_s: float = math.inf
    estimates: dict[str, float] = field(default_factory=dict)


GRID_SIZES = (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 2 * MIB, 4 * MIB, 16 * MIB, 64 * MIB)
PLANS = {
    "gpu": Plan(
        "gpu",
        calibrate=dict(max_bytes=256 * MIB, repeats=3),
        grid=dict(sizes=GRID_SIZES, job_bytes=64 * MIB, jobs=4, pool_bytes=512 * MIB),
        small_pages=dict(
            page_sizes=(4 * KIB, 8 * KIB, 16 * KIB, 24 * KIB, 32 * KIB),
            layers=32,
            blocks=256,
            jobs=8,
            blocks_per_job=32,
        ),
        integrity=dict(
            geometry=KVGeometry(32, 64 * KIB),  # Llama-3.1-8B, 16-token blocks: 2 MiB
            gpu_blocks=512,
            chunks=1024,
            rounds=60,
            blocks_per_job=32,
            compute_s=0.005,
        ),
        validation="for_gpu_check",
        run_tests=True,
        budget_s=270.0,
        estimates=dict(
            environment=30,
            pinning=10,
            timing=5,
            calibration=40,
            bandwidth=60,
            small_pages=30,
            integrity=20,
            validation=100,
            tests=30,
        ),
    ),
    "cpu": Plan(
        "cpu",
        calibrate=dict(
            sizes=tuple(4 * KIB << i for i in range(0, 13, 2)),
            counts=(1, 8),
            max_bytes=32 * MIB,
            repeats=2,
            span_bytes=CPU_COLD_SPAN_FACTOR * 32 * MIB,
        ),
        grid=dict(
            sizes=(4 * KIB, 64 * KIB, 2 * MIB), job_bytes=4 * MIB, jobs=3, pool_bytes=32 * MIB
        ),
        small_pages=dict(page_sizes=(16 * KIB,), layers=8, blocks=32, jobs=3, blocks_per_job=4),
        integrity=dict(
            geometry=KVGeometry(4, 2048),
            gpu_blocks=32,
            chunks=48,
            rounds=12,
            blocks_per_job=4,
            compute_s=1e-3,
        ),
        validation="for_cpu_check",
    ),
    "tiny": Plan(
        "tiny",
        calibrate=dict(
            sizes=(4 * KIB, 64 * KIB, 2 * MIB), counts=(1, 4), max_bytes=8 * MIB, repeats=1
        ),
        grid=dict(sizes=(64 * KIB, 2 * MIB), job_bytes=256 * KIB, jobs=2, pool_bytes=4 * MIB),
        small_pages=dict(page_sizes=(16 * KIB,), layers=8, blocks=16, jobs=2, blocks_per_job=4),
        integrity=dict(
            geometry=KVGeometry(4, 2048),
            gpu_blocks=32,
            chunks=48,
            rounds=6,
            blocks_per_job=4,
            compute_s=1e-3,
        ),
        validation="small_for_tests",
    ),
}


class Report:
    """The results so far: each section written whole as it completes, and the running
    ``gpu_check.json`` rewritten with it, through the atomic writers of
    :mod:`kvsim.core.io` (nothing at all without ``out_dir``)."""

    def __init__(self, out_dir: str | None) -> None:
        self.out_dir = out_dir
        self.data: dict[str, Any] = {}

    def path(self, name: str) -> str | None:
        return os.path.join(self.out_dir, name) if self.out_dir else None

    def put(self, name: str, value: Any) -> None:
        self.data[name] = value
        self.write_json(f"{name}.json", value)
        self.write_json("gpu_check.json", self.data)

    def write_json(self, name: str, value: Any) -> None:
        self.write_text(name, json.dumps(value, indent=2, default=str) + "\n")

    def write_text(self, name: str, text: str) -> None:
        path = self.path(name)
        if path is not None:
            with atomic_write(path, encoding="utf-8") as f:
                f.write(text)


class Runner:
    """Runs sections in turn within the budget; a section that raises is recorded as
    ``{"error"}``; one refused page-locked memory is run again on pageable memory (and
    every later one with it), saying so."""

    def __init__(self, report: Report, plan: Plan, budget_s: float, say: Callable[[str], None]):
        self.report, self.plan, self.say = report, plan, say
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.unpinned = False

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def run(self, name: str, fn: Callable[[bool], Any]) -> Any:
        need = self.plan.estimates.get(name, 0.0)
        if self.left() < need:
            value: Any = {"skipped": f"out of time: {self.left():.0f} s left, needs ~{need:g}"}
            self.say(f"{name}: SKIPPED ({value['skipped']})")
            self.report.put(name, value)
            return value
        s0 = time.perf_counter()
        try:
            try:
                value = fn(self.unpinned)
            except PinError as exc:
                if self.unpinned:
                    raise
                self.unpinned = True
                self.say(
                    f"{name}: pinning refused ({exc}); measured again on pageable "
                    "memory, as is every later section: their GB/s are staged copies"
                )
                value = fn(True)
                if isinstance(value, dict):
                    value["pin_refused"] = str(exc)
        except Exception as exc:
            value = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
            self.say(f"{name}: ERROR {value['error']}")
        self.report.data.setdefault("section_s", {})[name] = time.perf_counter() - s0
        self.report.put(name, value)
        return value


def run_check(
    device: Device,
    *,
    plan: Plan,
    trace: str | None = None,
    out_dir: str | None = None,
    budget_s: float | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every section in turn; the report (on disk after each section) is returned."""
    report = Report(out_dir)
    runner = Runner(report, plan, plan.budget_s if budget_s is None else budget_s, say)
    runner.run("environment", lambda _u: check_env.environment(device))
    pin = runner.run("pinning", lambda _u: check_env.pinning_cost(device, plan.pin_gib))
    if isinstance(pin, dict) and pin.get("works") is False:
        runner.unpinned = True
        say(
            f"pinning refused ({pin['error']}): every section runs on pageable memory, so "
            "its GB/s measure staged copies"
        )
    runner.run("timing", lambda _u: check_env.timing_quantum(device))
    params: list[Any] = []
    runner.run("calibration", lambda u: _calibration(device, plan, u, report, params, say))
    runner.run("bandwidth", lambda u: _section(device, check_copies.copy_size_grid, plan.grid, u))
    runner.run(
        "small_pages",
        lambda u: _section(device, check_copies.small_page_loads, plan.small_pages, u),
    )
    runner.run(
        "integrity",
        lambda u: [
            check_copies.integrity_under_compute(device, layout, allow_unpinned=u, **plan.integrity)
            for layout in check_copies.LAYOUTS
        ],
    )
    runner.run("validation", lambda u: _validation(device, plan, trace, u, report, params))
    runner.run("tests", lambda _u: _tests(device, plan, runner.left(), report))
    report.data["wall_s"] = time.perf_counter() - runner.t0
    report.put("goals", check_goals.evaluate_goals(report.data))
    return report.data


def _section(device: Device, fn: Callable[..., Any], sizes: dict[str, Any], unpinned: bool) -> Any:
    device.reanchor()  # absolute event times from a young reference
    return fn(device, allow_unpinned=unpinned, **sizes)


def _calibration(
    device: Device,
    plan: Plan,
    unpinned: bool,
    report: Report,
    params: list[Any],
    say: Callable[[str], None],
) -> dict[str, Any]:
    device.reanchor()
    profile, fitted = calibrate(device, require_pin=not unpinned, **plan.calibrate)
    params.append(profile)
    report.write_text("profile.json", profile.to_json())
    curve = {d: fitted["directions"][d]["effective_gbps"] for d in (H2D, D2H, BOTH)}
    say(format_curve(curve))
    h2d = fitted["directions"][H2D]
    return {
        "pinned": fitted["pinned"],
        "copy_path": fitted["copy_path"],
        "curve_gbps": curve,
        "kernel": h2d.get("kernel"),
        "duplex_factor": fitted.get("duplex_factor"),
        "points_by_path": {k: len(v) for k, v in fitted["point_paths"].items()},
        "profile": profile.to_dict(),
    }


def _validation(
    device: Device,
    plan: Plan,
    trace: str | None,
    unpinned: bool,
    report: Report,
    params: list[Any],
) -> dict[str, Any]:
    from real.trace_slice import write_mooncake
    from real.validate import (
        ValidationSpec,
        default_trace,
        mooncake_trace,
        run_validation,
        selected_trace,
    )

    if not params:
        raise RuntimeError("no calibrated profile (the calibration section failed)")
    spec = replace(getattr(ValidationSpec, plan.validation)(), allow_unpinned=unpinned)
    trace = trace or (default_trace() if spec.select == "all" else mooncake_trace())
    slice_path = report.path("conversation_slice.jsonl")
    if spec.select != "all" and slice_path is not None:
        write_mooncake(list(selected_trace(trace, spec)), slice_path)
    rep = run_validation(trace, spec, device=device, params=params[0])
    report.write_json("validation_report.json", rep.as_dict())
    summary = rep.summary()
    summary["trace"] = os.path.relpath(trace, ROOT)
    summary["select"] = spec.select
    return summary


def _tests(device: Device, plan: Plan, left_s: float, report: Report) -> dict[str, Any]:
    """``pytest tests/real`` in a child process (this check's own end-to-end test, which
    would start this check again, deselected), within what is left of the budget."""
    if device.is_cuda:
        import torch

        torch.cuda.empty_cache()  # the child process gets the GPU memory this one cached
    if not plan.run_tests or not device.is_cuda:
        why = (
            "no GPU: the suite runs these tests on the CPU stand-ins"
            if not device.is_cuda
            else f"the {plan.name} plan runs no tests"
        )
        return {"ran": False, "why": why}
    timeout = max(30.0, left_s - 5.0)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/real",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=--strict-markers",
        "--deselect",
        SELF_TEST,
    ]
    env = {**os.environ, "PYTHONPATH": child_pythonpath(ROOT)}
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        report.write_text("tests.txt", out)
        return {
            "returncode": -1,
            "summary": f"timed out after {timeout:.0f} s",
            "tail": out[-2000:],
        }
    report.write_text("tests.txt", proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    summary = lines[-1] if lines else (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {
        "returncode": proc.returncode,
        "summary": summary,
        "tail": (proc.stdout + proc.stderr)[-2000:],
    }


def format_curve(curves: dict[str, dict[str, float]]) -> str:
    sizes = sorted({int(s) for c in curves.values() for s in c})
    lines = [
        "INFO calibrated GB/s by copy size:",
        "INFO   size      " + "".join(f"{d:>9}" for d in curves),
    ]
    for s in sizes:
        label = f"{s // MIB} MiB" if s >= MIB else f"{s // KIB} KiB"
        vals = "".join(f"{curves[d].get(str(s), float('nan')):9.2f}" for d in curves)
        lines.append(f"INFO   {label:<10}{vals}")
    return "\n".join(lines)


SECTIONS = (
    "environment",
    "pinning",
    "timing",
    "calibration",
    "bandwidth",
    "small_pages",
    "integrity",
    "validation",
    "tests",
)


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _writes(name: str) -> bool:
    """Whether the check writes (replaces) ``name`` in its ``--out`` folder."""
    return name.endswith((".json", ".txt", ".jsonl"))


def check_args(args: argparse.Namespace) -> None:
    """Every argument, before any section runs (a section takes seconds to minutes): a
    missing trace or a bad budget would otherwise be reported at the end, an ``--out``
    that is a file as a traceback after the first section."""
    if args.budget_s is not None and not (0 < args.budget_s < math.inf):
        raise InputError(
            f"--budget-s must be a finite number of seconds above 0, got {args.budget_s:g}"
        )
    if args.trace is not None and not os.path.isfile(args.trace):
        why = "is not a file" if os.path.exists(args.trace) else "does not exist"
        raise InputError(f"--trace: {args.trace} {why}")
    check_trace(args.trace, plan_for(args.small))
    if args.out is None:
        return
    refuse_filling_folder("--out", args.out, _writes, [args.trace])
    try:  # the last check, so a refused run makes nothing: the folder, made now
        os.makedirs(args.out, exist_ok=True)
        with tempfile.TemporaryFile(dir=args.out):
            pass
    except OSError as exc:
        raise InputError(f"--out: cannot write in {args.out} ({exc.strerror or exc})") from None


def plan_for(small: bool) -> Plan:
    """The plan a run takes: ``tiny`` with ``--small``, else the device's."""
    return PLANS["tiny" if small else ("gpu" if cuda_available() else "cpu")]


def check_trace(trace: str | None, plan: Plan) -> None:
    """A ``--trace`` the validation section could not read, or in which it would find no
    request, is refused now: that section runs last, minutes into a GPU run. Skipped when
    a module the trace reader needs is missing (main says so)."""
    if trace is None or missing_modules():
        return
    from real.validate import ValidationSpec, selected_trace

    spec = getattr(ValidationSpec, plan.validation)()
    try:
        found = next(iter(selected_trace(trace, spec)), None) is not None
    except InputError as exc:
        raise InputError(f"--trace: {exc}") from None
    if not found:
        kept = "" if spec.select == "all" else f" (its {spec.select} selection kept none)"
        raise InputError(f"--trace: {trace} has no request for the validation section{kept}")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="gpu_check", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--small", action="store_true", help="the seconds-long plan of the tests")
    ap.add_argument("--trace", default=None, help="trace for the validation run")
    ap.add_argument("--out", default=None, help="folder for the section files and profile.json")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for all sections (default 270 on CUDA: with start-up, under five minutes)",
    )
    ap.add_argument(
        "--load-path",
        choices=LOAD_MODES,
        default=None,
        help="CPU->GPU jobs outside the small-page section: vLLM's rule (auto, the default; "
        "KVSIM_LOAD_PATH), DMA only, or the gather kernel for every load from pinned memory",
    )
    args = ap.parse_args(argv)
    try:
        check_args(args)
    except InputError as exc:
        ap.error(str(exc))
    for name in missing_modules():
        print(
            f"gpu_check: {name} is not importable here, so the validation section will fail: "
            "unpack its wheel into .gpu_deps/ (docs/real-backend.md, 'On a GPU machine with no "
            "network')",
            flush=True,
        )
    device = Device("cuda") if cuda_available() else cpu_stand_in()
    if args.load_path is not None:
        device.set_copy_path(default_copy_path(device, load=args.load_path))
    plan = plan_for(args.small)

    def say(line: str) -> None:
        print(line, flush=True)

    data = run_check(
        device, plan=plan, trace=args.trace, out_dir=args.out, budget_s=args.budget_s, say=say
    )
    try:
        check_goals.info_lines(data, say)
    except Exception as exc:  # a section of an unexpected shape: the goals still print
        say(f"INFO lines failed: {type(exc).__name__}: {exc}")
    env = data["environment"] if check_goals.ok(data["environment"]) else {}
    where = env.get("gpu", device.kind)
    say(f"kvsim gpu_check ({plan.name} plan) on {where}: {data['wall_s']:.1f} s")
    text = check_goals.format_goals(data["goals"])
    say(text)
    Report(args.out).write_text("goals.txt", text + "\n")
    return check_goals.exit_status(data, SECTIONS)


if __name__ == "__main__":
    sys.exit(main())
