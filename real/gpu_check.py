"""One-shot device check: ``PYTHONPATH=. python3 -m real.gpu_check --out DIR``.

Runs from a checkout with nothing installed (it needs only torch, numpy, pandas, click,
pyarrow, msgspec, which the H200 image lacks: carry its wheel, and, for the batched copy,
cuda-bindings), in well under 4 minutes on one H200,
and writes ``DIR/gpu_check.json`` after every section (so a crash or a timeout still leaves
everything measured so far) and ``DIR/profile.json`` after calibration. Sections:

1. environment: GPU, torch and CUDA versions, the copy path (``cuMemcpyBatchAsync`` or
   ``copy_``, plus vLLM's Triton gather kernel for small-page loads when it resolved),
   whether the host pool could be page-locked (refused otherwise, unless
   ``--allow-unpinned``);
2. calibration: the copy curve (H2D, D2H, both at once; 4 KiB to 64 MiB), the profile;
3. bandwidth: :class:`RealTransferBackend` jobs of 2 MiB blocks (Llama-3.1-8B, 16 tokens)
   at scattered block and chunk ids, in both layouts: stores alone, loads alone, both;
4. integrity: stores, loads and compute at once, every loaded byte checked, both layouts;
5. small pages: H2D jobs of 16 KiB per-layer pages (where vLLM launches its gather
   kernel) through the kernel and through DMA, every loaded byte checked;
6. validation: the bundled Bailian sample simulated (with the calibrated profile) and run.

Then one line per goal, each starting with PASS or FAIL:

* H2D and D2H each >= 45 GB/s for >= 2 MiB blocks in both layouts; >= 75 GB/s both ways;
* 0 mismatched bytes under concurrent loads, stores and compute;
* small-page loads byte-exact through the gather kernel and DMA (both GB/s reported);
* median simulated-vs-measured job time error < 10 % (the TTFT error is reported).

The exit status is 1 when a byte mismatched or a section crashed, else 0. On CPU the same
code runs with small sizes (``--small``, the default there; its GB/s are CPU numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
from real.calibrate import BOTH, D2H, H2D, KIB, MIB, calibrate, gbps_at_least
from real.copy_path import LOAD_MODES, CopyPath, KernelLoadCopy, default_copy_path
from real.device import Device, cpu_stand_in, cuda_available
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.lifetime import release_when_idle
from real.transfer import RealTransferBackend
from real.triton_load import GatherKernel, resolve_gather_kernel

if TYPE_CHECKING:
    from kvsim.engine.transfer_model import TransferModelParams

GOAL_ONE_WAY_GBPS = 45.0
GOAL_BOTH_GBPS = 75.0
GOAL_MEDIAN_ERR = 0.10
SMALL_PAGE_BYTES = 16 * KIB  # under vLLM's 28 KiB kernel threshold
LAYOUTS = (BLOCK_FIRST, LAYER_MAJOR)


class ReportFile:
    """The report, rewritten whole (atomically) after every section."""

    def __init__(self, out_dir: str | None) -> None:
        self.data: dict[str, Any] = {}
        self.path = os.path.join(out_dir, "gpu_check.json") if out_dir else None
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=2, default=str)
        os.replace(tmp, self.path)


def _pool(device: Device, layout: HostLayout, chunks: int, allow_unpinned: bool) -> HostPool:
    pin = device.is_cuda
    return HostPool(layout, chunks, pin=pin, require_pin=pin and not allow_unpinned)


# --------------------------------------------------------------------------- bandwidth


def backend_bandwidth(
    device: Device,
    layout: str,
    *,
    geometry: KVGeometry,
    blocks: int,
    jobs: int,
    blocks_per_job: int,
    gate_s: float = 0.0,
    allow_unpinned: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """GB/s of backend jobs at scattered ids: stores alone, loads alone, then both at once
    (stores from the lower half of the GPU cache, loads into the upper half). Each burst
    is queued behind a ``gate_s`` spin on the compute stream (every job waits for it), so
    the copies run back to back on the device however fast Python submits them."""
    rng = random.Random(seed)
    gpu = GpuKVCache(geometry, blocks, layout, device.torch_device)
    host = _pool(device, HostLayout(geometry, 1, layout), blocks, allow_unpinned)
    backend: RealTransferBackend | None = None
    try:
        backend = RealTransferBackend(device, gpu, host, fill_on_store=False, verify_loads=False)
        half = blocks // 2
        job_id = 0

        def burst(directions: tuple[str, ...]) -> dict[str, Any]:
            nonlocal job_id
            assert backend is not None
            first = len(backend.records)
            device.sleep(device.compute_stream, gate_s, until=device.clock() + gate_s)
            for _ in range(jobs):
                for d in directions:
                    job_id += 1
                    lo = 0 if d == STORE else half
                    g = rng.sample(range(lo, lo + half), blocks_per_job)
                    c = rng.sample(range(lo, lo + half), blocks_per_job)
                    nbytes = blocks_per_job * geometry.block_bytes
                    backend.submit(TransferJob(job_id, d, g, c, nbytes, blocks_per_job), 0.0)
            backend.drain()
            recs = backend.records[first:]
            span = max(r.end_time for r in recs) - min(r.start_time for r in recs)
            out: dict[str, Any] = {"gbps": sum(r.nbytes for r in recs) / span / 1e9}
            for d in directions:
                mine = [r for r in recs if r.direction == d]
                busy = max(r.end_time for r in mine) - min(r.start_time for r in mine)
                out[d + "_gbps"] = sum(r.nbytes for r in mine) / busy / 1e9
            out["copies_per_job"] = recs[0].copies
            return out

        burst((STORE, LOAD))  # warm-up
        return {
            "layout": layout,
            "pinned": host.pinned,
            "block_bytes": geometry.block_bytes,
            "blocks_per_job": blocks_per_job,
            "d2h": burst((STORE,)),
            "h2d": burst((LOAD,)),
            "both": burst((STORE, LOAD)),
        }
    finally:
        release_when_idle(device, host, gpu, backend)


# --------------------------------------------------------------------------- integrity


def integrity_under_compute(
    device: Device,
    layout: str,
    *,
    geometry: KVGeometry,
    gpu_blocks: int,
    chunks: int,
    rounds: int,
    blocks_per_job: int,
    compute_s: float,
    allow_unpinned: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """Stores and loads through :class:`RealTransferBackend` while compute runs.

    As vLLM's manager does, a chunk is loaded only once its store was reported complete,
    and no job ever writes memory that an unfinished job still reads or writes (the
    backend's ``busy_*`` sets); everything else runs concurrently."""
    rng = random.Random(seed)
    gpu = GpuKVCache(geometry, gpu_blocks, layout, device.torch_device)
    host = _pool(device, HostLayout(geometry, 1, layout), chunks, allow_unpinned)
    backend: RealTransferBackend | None = None
    try:
        backend = RealTransferBackend(device, gpu, host)
        stored: dict[int, str] = {}  # chunk -> key, stores reported complete
        storing: dict[int, dict[int, str]] = {}  # job id -> {chunk: key}
        job_id = 0
        t0 = device.clock()
        half = gpu_blocks // 2

        def account(results: list[Any]) -> None:
            for res in results:
                done = storing.pop(res.job_id, None)
                if done is not None and res.success:
                    stored.update(done)

        for r in range(rounds):
            busy_h = backend.busy_chunks()
            free_chunks = [c for c in range(chunks) if c not in busy_h]
            n = min(blocks_per_job, len(free_chunks))
            if n:  # the previous step's stores, submitted before this step's forward
                src = rng.sample(range(half), n)
                dst_chunks = rng.sample(free_chunks, n)
                keys = [f"r{r}b{i}" for i in range(n)]
                for c in dst_chunks:
                    stored.pop(c, None)  # being overwritten: not loadable until complete
                job_id += 1
                storing[job_id] = dict(zip(dst_chunks, keys))
                nbytes = n * geometry.block_bytes
                backend.submit(
                    TransferJob(job_id, STORE, src, dst_chunks, nbytes, n, keys), device.clock()
                )
            t_launch = device.clock()
            device.sleep(device.compute_stream, compute_s, until=t_launch + compute_s)
            busy_g = backend.busy_gpu_blocks()
            free_blocks = [b for b in range(half, gpu_blocks) if b not in busy_g]
            picks = rng.sample(list(stored), min(blocks_per_job, len(stored), len(free_blocks)))
            if picks:  # loads start after the forward, as the engine submits them
                dst = rng.sample(free_blocks, len(picks))
                job_id += 1
                nbytes = len(picks) * geometry.block_bytes
                keys = [stored[c] for c in picks]
                backend.submit(
                    TransferJob(job_id, LOAD, dst, picks, nbytes, len(picks), keys),
                    device.clock(),
                )
            account(backend.poll(device.clock()))
            if device.mode in ("cuda", "threaded"):  # the host waits out the forward
                _wait_until(device, t_launch + compute_s)
        account(backend.drain())
        elapsed = device.clock() - t0
        by_dir: dict[str, dict[str, Any]] = {}
        for d in (STORE, LOAD):
            recs = [x for x in backend.records if x.direction == d]
            busy = sum(x.duration for x in recs)
            nbytes = sum(x.nbytes for x in recs)
            by_dir[d] = {"jobs": len(recs), "gbps": nbytes / busy / 1e9 if busy > 0 else None}
        return {
            "layout": layout,
            "pinned": host.pinned,
            "rounds": rounds,
            "elapsed_s": elapsed,
            **backend.integrity.as_dict(),
            "directions": by_dir,
        }
    finally:
        release_when_idle(device, host, gpu, backend)


def _wait_until(device: Device, t: float) -> None:
    left = t - device.clock()
    if left > 0:
        time.sleep(left)


# --------------------------------------------------------------------------- small pages


def load_paths(device: Device) -> tuple[dict[str, CopyPath], str]:
    """``{"kernel": vLLM's choice with the gather kernel, "dma": the DMA path}`` (only
    ``dma`` when the kernel did not resolve) and why the kernel is or is not there."""
    path = device.copy_path()
    dma = path.dma if isinstance(path, KernelLoadCopy) else path
    kernel, why = resolve_gather_kernel(device)
    paths: dict[str, CopyPath] = {"dma": dma}
    if kernel is not None:
        paths = {"kernel": KernelLoadCopy(dma, kernel), "dma": dma}
    return paths, why


def small_page_loads(
    device: Device,
    *,
    geometry: KVGeometry,
    blocks: int,
    jobs: int,
    blocks_per_job: int,
    gate_s: float = 0.0,
    allow_unpinned: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """Loads of small layer-major pages through each load path, every byte checked.

    Every chunk is stored once with its own key; then, per path, the GPU cache is zeroed
    and ``jobs`` loads of ``blocks_per_job`` random chunks into random blocks queue behind
    a ``gate_s`` spin, so they run back to back. GB/s is bytes over the summed copy time of
    the jobs (start to end event of each: the byte check each load queues after its end
    event is not counted); ``jobs_by_path`` counts which path each job really took."""
    rng = random.Random(seed)
    paths, why = load_paths(device)
    gpu = GpuKVCache(geometry, blocks, LAYER_MAJOR, device.torch_device)
    host = _pool(device, HostLayout(geometry, 1, LAYER_MAJOR), blocks, allow_unpinned)
    backends: list[RealTransferBackend] = []
    try:
        store = RealTransferBackend(device, gpu, host, copy_path=paths["dma"])
        backends.append(store)
        job_id = 0
        for first in range(0, blocks, blocks_per_job):
            chunks = list(range(first, min(first + blocks_per_job, blocks)))
            job_id += 1
            nbytes = len(chunks) * geometry.block_bytes
            store.submit(
                TransferJob(job_id, STORE, chunks, chunks, nbytes, len(chunks), chunks), 0.0
            )
        store.drain()
        out: dict[str, Any] = {
            "page_bytes": geometry.page_bytes,
            "descriptors_per_job": blocks_per_job * geometry.num_layers,
            "pinned": host.pinned,
            "kernel_status": why,
        }
        for name, path in paths.items():
            backend = RealTransferBackend(device, gpu, host, copy_path=path)
            backends.append(backend)

            def burst(n: int, backend: RealTransferBackend = backend) -> list[Any]:
                nonlocal job_id
                first_rec = len(backend.records)
                device.sleep(device.compute_stream, gate_s, until=device.clock() + gate_s)
                for _ in range(n):
                    job_id += 1
                    src = rng.sample(range(blocks), blocks_per_job)
                    dst = rng.sample(range(blocks), blocks_per_job)
                    nbytes = blocks_per_job * geometry.block_bytes
                    backend.submit(
                        TransferJob(job_id, LOAD, dst, src, nbytes, blocks_per_job, src), 0.0
                    )
                backend.drain()
                return backend.records[first_rec:]

            burst(1)  # warm-up (the kernel compiles once per tile size)
            gpu.data.zero_()  # a load that copied nothing cannot pass its check
            before = dict(getattr(path, "jobs", {}))
            recs = burst(jobs)
            busy = sum(r.duration for r in recs)
            after = getattr(path, "jobs", {})
            routes = {k: v - before.get(k, 0) for k, v in after.items()} or {path.name: len(recs)}
            out[name] = {
                "path": path.name,
                "jobs_by_path": routes,
                "jobs": len(recs),
                "gbps": sum(r.nbytes for r in recs) / busy / 1e9 if busy > 0 else None,
                "failed_jobs": sum(not r.success for r in recs),
                **backend.integrity.as_dict(),
            }
        return out
    finally:
        release_when_idle(device, host, gpu, *backends)


# --------------------------------------------------------------------------- the check


def _sizes(small: bool) -> dict[str, Any]:
    if small:
        return {
            "calibrate": dict(
                sizes=(4 * KIB, 64 * KIB, 2 * MIB), counts=(1, 4), max_bytes=8 * MIB, repeats=1
            ),
            "geometry": KVGeometry(4, 2048),
            "bandwidth": dict(blocks=64, jobs=3, blocks_per_job=4, gate_s=0.002),
            "integrity": dict(gpu_blocks=32, chunks=48, rounds=6, blocks_per_job=4, compute_s=1e-3),
            "small_pages": dict(
                geometry=KVGeometry(8, SMALL_PAGE_BYTES), blocks=32, jobs=3, blocks_per_job=4
            ),
        }
    return {
        "calibrate": dict(max_bytes=256 * MIB, repeats=3),
        "geometry": KVGeometry(32, 64 * KIB),  # llama-3.1-8b, 16-token block: 2 MiB
        "bandwidth": dict(blocks=1024, jobs=12, blocks_per_job=32, gate_s=0.1),
        "integrity": dict(
            gpu_blocks=512, chunks=1024, rounds=60, blocks_per_job=32, compute_s=0.005
        ),
        # 32 layers of 16 KiB pages (a 512 KiB block): 1024 page descriptors per job
        "small_pages": dict(
            geometry=KVGeometry(32, SMALL_PAGE_BYTES),
            blocks=512,
            jobs=16,
            blocks_per_job=32,
            gate_s=0.1,
        ),
    }


def _environment(device: Device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device": device.kind,
        "mode": device.mode,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "copy_path": device.copy_path().name,
        "load_kernel": resolve_gather_kernel(device)[1],
    }
    if device.is_cuda:
        from real.copy_path import resolve_batch_copy

        env["gpu"] = torch.cuda.get_device_name(device.torch_device)
        env["cuda"] = torch.version.cuda
        env["batch_copy"] = resolve_batch_copy()[1]
    return env


def run_check(
    device: Device,
    *,
    small: bool,
    validation_trace: str | None = None,
    out_dir: str | None = None,
    allow_unpinned: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every section in turn; the report (also on disk after each section) is returned.
    A section that raises is recorded as ``{"error": ...}`` and the rest still run."""
    t0 = time.perf_counter()
    rep = ReportFile(out_dir)
    sizes = _sizes(small)
    rep.put("environment", _environment(device))
    say("environment: " + ", ".join(f"{k}={v}" for k, v in rep.data["environment"].items()))

    def section(name: str, fn: Callable[[], Any]) -> Any:
        s0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:
            value = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
            say(f"{name}: ERROR {value['error']}")
        rep.data.setdefault("section_s", {})[name] = time.perf_counter() - s0
        rep.put(name, value)
        return value

    params_box: list[TransferModelParams] = []

    def calibration() -> dict[str, Any]:
        params, fitted = calibrate(device, require_pin=not allow_unpinned, **sizes["calibrate"])
        params_box.append(params)
        if out_dir:
            with open(os.path.join(out_dir, "profile.json"), "w", encoding="utf-8") as f:
                f.write(params.to_json())
        one_way = {d: gbps_at_least(fitted, d, 2 * MIB) for d in (H2D, D2H, BOTH)}
        curve = {d: fitted["directions"][d]["effective_gbps"] for d in (H2D, D2H, BOTH)}
        say(format_curve(curve))
        return {
            "pinned": fitted["pinned"],
            "copy_path": fitted["copy_path"],
            "gbps_ge_2MiB": one_way,
            "curve_gbps": curve,
            "profile": params.to_dict(),
        }

    section("calibration", calibration)
    geometry = sizes["geometry"]
    section(
        "bandwidth",
        lambda: [
            backend_bandwidth(
                device, lay, geometry=geometry, allow_unpinned=allow_unpinned, **sizes["bandwidth"]
            )
            for lay in LAYOUTS
        ],
    )
    section(
        "integrity",
        lambda: [
            integrity_under_compute(
                device, lay, geometry=geometry, allow_unpinned=allow_unpinned, **sizes["integrity"]
            )
            for lay in LAYOUTS
        ],
    )
    section(
        "small_pages",
        lambda: small_page_loads(device, allow_unpinned=allow_unpinned, **sizes["small_pages"]),
    )
    section(
        "validation",
        lambda: _validation(
            device, params_box[0] if params_box else None, small, validation_trace, allow_unpinned
        ),
    )
    goals = evaluate_goals(rep.data)
    rep.data["wall_s"] = time.perf_counter() - t0
    rep.put("goals", goals)
    return rep.data


def _validation(
    device: Device,
    params: TransferModelParams | None,
    small: bool,
    trace: str | None,
    allow_unpinned: bool,
) -> dict[str, Any]:
    from dataclasses import replace

    from real.validate import ValidationSpec, default_trace, run_validation

    if params is None:
        raise RuntimeError("no calibrated profile (the calibration section failed)")
    trace = trace or default_trace()
    spec = ValidationSpec.small_for_tests() if small else ValidationSpec.for_gpu_check()
    spec = replace(spec, allow_unpinned=allow_unpinned)
    return run_validation(trace, spec, device=device, params=params).summary()


# --------------------------------------------------------------------------- goals


def _ok(section: Any) -> TypeGuard[Any]:
    return section is not None and not (isinstance(section, dict) and "error" in section)


def evaluate_goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``{"goal", "passed", "detail"}`` per goal of the issue, from the sections."""
    goals = []
    bw = data.get("bandwidth")
    for key, label, floor in (
        ("h2d", "H2D", GOAL_ONE_WAY_GBPS),
        ("d2h", "D2H", GOAL_ONE_WAY_GBPS),
        ("both", "both directions", GOAL_BOTH_GBPS),
    ):
        goal = f"{label} >= {floor:g} GB/s for 2 MiB blocks in both layouts"
        if not _ok(bw):
            goals.append({"goal": goal, "passed": False, "detail": "not measured"})
            continue
        vals = {b["layout"]: b[key]["gbps"] for b in bw}
        goals.append(
            {
                "goal": goal,
                "passed": all(v >= floor for v in vals.values()),
                "detail": ", ".join(f"{k} {v:.1f}" for k, v in vals.items()),
            }
        )
    integ = data.get("integrity")
    goal = "0 mismatched bytes under concurrent loads, stores and compute"
    if _ok(integ):
        bad = sum(i["mismatched_bytes"] for i in integ)
        checked = sum(i["checked_blocks"] for i in integ)
        goals.append(
            {
                "goal": goal,
                "passed": bad == 0 and checked > 0,
                "detail": f"{bad} mismatched bytes, {checked} blocks checked",
            }
        )
    else:
        goals.append({"goal": goal, "passed": False, "detail": "not measured"})
    goals.append(_small_page_goal(data.get("small_pages")))
    v = data.get("validation")
    goal = f"median job-time error < {GOAL_MEDIAN_ERR:.0%} after calibrate"
    if _ok(v):
        err = v["job_err_median_pct"]
        goals.append(
            {
                "goal": goal,
                "passed": err is not None and err < GOAL_MEDIAN_ERR * 100,
                "detail": (
                    f"{_fmt(err)} % over {v['jobs_measured']} jobs; TTFT median error "
                    f"{_fmt(v['ttft_err_median_pct'])} %, {v['integrity_mismatched_bytes']} "
                    f"mismatched bytes"
                ),
            }
        )
    else:
        goals.append({"goal": goal, "passed": False, "detail": "not measured"})
    return goals


def _small_page_goal(sp: Any) -> dict[str, Any]:
    """Byte-exact small-page loads through DMA and through the kernel, which must have
    copied every job of its run (vLLM's rule picks it for all of them)."""
    goal = (
        f"small-page H2D loads ({SMALL_PAGE_BYTES // KIB} KiB pages) byte-exact via kernel and DMA"
    )
    if not _ok(sp):
        return {"goal": goal, "passed": False, "detail": "not measured"}
    dma, kernel = sp["dma"], sp.get("kernel")
    runs = [dma] if kernel is None else [kernel, dma]
    exact = all(
        r["mismatched_bytes"] == 0 and r["checked_blocks"] > 0 and not r["failed_jobs"]
        for r in runs
    )
    dma_part = f"DMA ({dma['path']}) {_fmt(dma['gbps'])} GB/s"
    if kernel is None:
        parts = [f"kernel not available ({sp['kernel_status']})", dma_part]
        kernel_ran = False
    else:
        parts = [f"kernel {_fmt(kernel['gbps'])} GB/s", dma_part]
        if kernel["gbps"] and dma["gbps"]:
            parts.append(f"kernel/DMA x{kernel['gbps'] / dma['gbps']:.2f}")
        kernel_ran = kernel["jobs_by_path"].get(GatherKernel.name, 0) == kernel["jobs"] > 0
    bad = sum(r["mismatched_bytes"] for r in runs)
    checked = sum(r["checked_blocks"] for r in runs)
    parts.append(f"{bad} mismatched bytes, {checked} blocks checked")
    return {"goal": goal, "passed": exact and kernel_ran, "detail": ", ".join(parts)}


def format_curve(curves: dict[str, dict[str, float]]) -> str:
    sizes = sorted({int(s) for c in curves.values() for s in c})
    lines = ["bandwidth GB/s by copy size:", "  size      " + "".join(f"{d:>9}" for d in curves)]
    for s in sizes:
        label = f"{s // MIB} MiB" if s >= MIB else f"{s // KIB} KiB"
        vals = "".join(f"{curves[d].get(str(s), float('nan')):9.2f}" for d in curves)
        lines.append(f"  {label:<10}{vals}")
    return "\n".join(lines)


def format_goals(goals: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"{'PASS' if g['passed'] else 'FAIL'} {g['goal']}: {g['detail']}" for g in goals
    )


def _fmt(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def exit_status(data: dict[str, Any]) -> int:
    """1 when a section crashed or a byte mismatched, else 0."""
    sections = ("calibration", "bandwidth", "integrity", "small_pages", "validation")
    if any(not _ok(data.get(s)) for s in sections):
        return 1
    if any(i["mismatched_bytes"] for i in data["integrity"]):
        return 1
    small = data["small_pages"]
    if any(small[k]["mismatched_bytes"] for k in ("kernel", "dma") if k in small):
        return 1
    return 1 if data["validation"].get("integrity_mismatched_bytes", 1) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small sizes (default on CPU)")
    ap.add_argument("--trace", default=None, help="trace for the validation run")
    ap.add_argument("--out", default=None, help="folder for gpu_check.json and profile.json")
    ap.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="go on when page-locking host memory fails (numbers then measure pageable copies)",
    )
    ap.add_argument(
        "--load-path",
        choices=LOAD_MODES,
        default=None,
        help="CPU->GPU jobs: vLLM's rule (auto, the default; KVSIM_LOAD_PATH), DMA only, or "
        "the Triton gather kernel for every load from pinned memory",
    )
    args = ap.parse_args(argv)
    device = Device("cuda") if cuda_available() else cpu_stand_in()
    if args.load_path is not None:
        device.set_copy_path(default_copy_path(device, load=args.load_path))

    def say(line: str) -> None:
        print(line, flush=True)

    data = run_check(
        device,
        small=args.small or not device.is_cuda,
        validation_trace=args.trace,
        out_dir=args.out,
        allow_unpinned=args.allow_unpinned,
        say=say,
    )
    say(f"kvsim gpu_check on {data['environment'].get('gpu', device.kind)}: {data['wall_s']:.1f} s")
    say(format_goals(data["goals"]))
    return exit_status(data)


if __name__ == "__main__":
    sys.exit(main())
