"""The GPU check's copy sections, all through :class:`RealTransferBackend`'s own jobs.

* :func:`copy_size_grid`: H2D, D2H and both-ways GB/s for copies of 4 KiB to 64 MiB in both
  layouts. A *copy* is what one descriptor moves: a whole block in the block-first layout,
  one layer's page in the layer-major one, so each size gets its own geometry (block-first:
  8 layers of ``size / 8``; layer-major: pages of ``size``, up to 32 layers). Jobs take
  scattered block and chunk ids, queue behind a spin on the compute stream (every job
  waits for it) long enough for the host to submit them all, and GB/s is bytes over the
  time from the spin's end to the last job's end, measured between events;
* :func:`small_page_loads`: loads of small layer-major pages with vLLM's gather kernel
  forced on, and forced off (DMA), at several page sizes around vLLM's 28 KiB threshold,
  every loaded byte checked; GB/s over the jobs' own start-to-end times;
* :func:`integrity_under_compute`: stores, loads and emulated compute at once, as vLLM's
  manager orders them, every loaded byte compared with its key's pattern.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from kvsim.engine.copy_paths import load_uses_kernel
from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob, TransferResult
from real.copy_path import CopyPath, KernelLoadCopy
from real.device import Device, Event
from real.host_pool import HostLayout, HostPool
from real.kv_cache import BLOCK_FIRST, LAYER_MAJOR, GpuKVCache, KVGeometry
from real.lifetime import release_when_idle
from real.transfer import RealTransferBackend
from real.triton_load import GatherKernel, resolve_gather_kernel

KIB, MIB = 1 << 10, 1 << 20
LAYOUTS = (BLOCK_FIRST, LAYER_MAJOR)
BLOCK_FIRST_LAYERS = 8
MAX_LAYERS = 32


def host_pool(device: Device, layout: HostLayout, chunks: int, allow_unpinned: bool) -> HostPool:
    """A pool page-locked on CUDA (refused with :class:`PinError` unless allowed)."""
    pin = device.is_cuda
    return HostPool(layout, chunks, pin=pin, require_pin=pin and not allow_unpinned)


def copy_geometry(layout: str, copy_bytes: int, job_bytes: int) -> tuple[KVGeometry, int]:
    """The block geometry whose copies are ``copy_bytes`` in ``layout``, and the blocks of
    a job of about ``job_bytes`` (at least one)."""
    if layout == BLOCK_FIRST:
        layers = BLOCK_FIRST_LAYERS if copy_bytes % (8 * BLOCK_FIRST_LAYERS) == 0 else 1
        geometry = KVGeometry(layers, copy_bytes // layers)
    else:  # enough layers for four blocks a job
        geometry = KVGeometry(max(1, min(MAX_LAYERS, job_bytes // (4 * copy_bytes))), copy_bytes)
    return geometry, max(1, job_bytes // geometry.block_bytes)


def _gated_burst(
    device: Device,
    backend: RealTransferBackend,
    jobs: list[TransferJob],
    gate_s: float,
) -> dict[str, Any]:
    """Submit ``jobs`` behind a ``gate_s`` spin on the compute stream; bytes per second of
    each direction from the spin's end to its last job's end (between events)."""
    device.sleep(device.compute_stream, gate_s, until=device.clock() + gate_s)
    opened = device.new_event()
    opened.record(device.compute_stream)
    first = len(backend.records)
    t0 = time.perf_counter()
    for job in jobs:
        backend.submit(job, device.clock())
    submit_s = time.perf_counter() - t0
    gate_held = not opened.query()  # the copies could not start before the last submit
    tails: dict[str, Event] = {}
    for d in {j.direction for j in jobs}:
        tails[d] = device.new_event()
        tails[d].record(backend.streams[d])
    backend.drain()
    for tail in tails.values():
        tail.synchronize()  # an event's time is read only once it completed
    recs = backend.records[first:]
    out: dict[str, Any] = {"submit_s": submit_s, "gate_held": gate_held}
    spans = {}
    for d, tail in tails.items():
        spans[d] = tail.seconds_since(opened)
        nbytes = sum(r.nbytes for r in recs if r.direction == d and r.success)
        out[f"{d}_gbps"] = nbytes / spans[d] / 1e9 if spans[d] > 0 else None
    total = sum(r.nbytes for r in recs if r.success)
    out["gbps"] = total / max(spans.values()) / 1e9 if max(spans.values()) > 0 else None
    out["failed_jobs"] = sum(not r.success for r in recs)
    out["copies_per_job"] = recs[0].copies if recs else 0
    return out


def copy_size_grid(
    device: Device,
    *,
    sizes: Sequence[int],
    job_bytes: int,
    jobs: int,
    pool_bytes: int,
    layouts: Sequence[str] = LAYOUTS,
    allow_unpinned: bool = False,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per (layout, copy size): ``d2h``, ``h2d`` and ``both`` GB/s (see the module
    docstring), the copies per job after merging, which path the loads took, and whether
    the host kept ahead of the copies (``gate_held``)."""
    rows = []
    for layout in layouts:
        for size in sizes:
            rows.append(
                _grid_point(device, layout, size, job_bytes, jobs, pool_bytes, allow_unpinned, seed)
            )
    return rows


def _grid_point(
    device: Device,
    layout: str,
    size: int,
    job_bytes: int,
    jobs: int,
    pool_bytes: int,
    allow_unpinned: bool,
    seed: int,
) -> dict[str, Any]:
    rng = random.Random(seed)
    geometry, per_job = copy_geometry(layout, size, job_bytes)
    blocks = 2 * max(2 * per_job, pool_bytes // (2 * geometry.block_bytes))
    gpu = GpuKVCache(geometry, blocks, layout, device)
    host = host_pool(device, HostLayout(geometry, 1, layout), blocks, allow_unpinned)
    backend: RealTransferBackend | None = None
    try:
        backend = RealTransferBackend(device, gpu, host, fill_on_store=False, verify_loads=False)
        path = backend.copy_path
        half = blocks // 2
        ids = iter(range(1, 1 << 30))

        def batch(directions: tuple[str, ...]) -> list[TransferJob]:
            out = []
            for _ in range(jobs):
                for d in directions:
                    lo = 0 if d == STORE else half
                    g = rng.sample(range(lo, lo + half), per_job)
                    c = rng.sample(range(lo, lo + half), per_job)
                    nbytes = per_job * geometry.block_bytes
                    out.append(TransferJob(next(ids), d, g, c, nbytes, per_job))
            return out

        t0 = time.perf_counter()
        warm = _gated_burst(device, backend, batch((STORE, LOAD)), 0.0)
        gate = 2 * warm["submit_s"] + 0.01  # the host submits a burst well inside it
        before = dict(getattr(path, "jobs", {}))
        row: dict[str, Any] = {
            "layout": layout,
            "copy_bytes": size,
            "layers": geometry.num_layers,
            "block_bytes": geometry.block_bytes,
            "blocks_per_job": per_job,
            "pinned": host.pinned,
            "d2h": _gated_burst(device, backend, batch((STORE,)), gate),
            "h2d": _gated_burst(device, backend, batch((LOAD,)), gate),
            "both": _gated_burst(device, backend, batch((STORE, LOAD)), gate),
        }
        after = getattr(path, "jobs", None)  # a path that chooses per job counts them
        row["load_paths"] = (
            {k: v - before.get(k, 0) for k, v in after.items()} if after else path.name
        )
        row["seconds"] = time.perf_counter() - t0
        return row
    finally:
        release_when_idle(device, host, gpu, backend)


# --------------------------------------------------------------------------- small pages


def load_paths(device: Device) -> tuple[dict[str, CopyPath], str]:
    """``{"kernel": every pinned load through the gather kernel, "dma": never}`` (only
    ``dma`` when the kernel did not resolve) and why the kernel is or is not there."""
    path = device.copy_path()
    dma = path.dma if isinstance(path, KernelLoadCopy) else path
    kernel, why = resolve_gather_kernel(device)
    paths: dict[str, CopyPath] = {"dma": dma}
    if kernel is not None:
        paths = {"kernel": KernelLoadCopy(dma, kernel, mode="kernel"), "dma": dma}
    return paths, why


def small_page_loads(
    device: Device,
    *,
    page_sizes: Sequence[int],
    layers: int,
    blocks: int,
    jobs: int,
    blocks_per_job: int,
    allow_unpinned: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """Per page size, loads of ``blocks_per_job`` random chunks into random layer-major
    blocks (``layers`` pages each) with the kernel forced on and forced off; which path
    vLLM's rule would pick (``auto``), GB/s over the jobs' summed start-to-end times (the
    byte check each load queues after its end event is not counted), and the check."""
    paths, why = load_paths(device)
    out: dict[str, Any] = {"kernel_status": why, "layers": layers, "pages": []}
    for page in page_sizes:
        geometry = KVGeometry(layers, page)
        descriptors = blocks_per_job * layers
        row = {
            "page_bytes": page,
            "descriptors_per_job": descriptors,
            "auto": "kernel" if load_uses_kernel(page, descriptors) else "dma",
        }
        row.update(
            _page_loads(device, geometry, paths, blocks, jobs, blocks_per_job, allow_unpinned, seed)
        )
        out["pages"].append(row)
    return out


def _page_loads(
    device: Device,
    geometry: KVGeometry,
    paths: dict[str, CopyPath],
    blocks: int,
    jobs: int,
    blocks_per_job: int,
    allow_unpinned: bool,
    seed: int,
) -> dict[str, Any]:
    rng = random.Random(seed)
    gpu = GpuKVCache(geometry, blocks, LAYER_MAJOR, device)
    host = host_pool(device, HostLayout(geometry, 1, LAYER_MAJOR), blocks, allow_unpinned)
    backends: list[RealTransferBackend] = []
    try:
        store = RealTransferBackend(device, gpu, host, copy_path=paths["dma"])
        backends.append(store)
        ids = iter(range(1, 1 << 30))
        for first in range(0, blocks, blocks_per_job):
            chunks = list(range(first, min(first + blocks_per_job, blocks)))
            nbytes = len(chunks) * geometry.block_bytes
            store.submit(
                TransferJob(next(ids), STORE, chunks, chunks, nbytes, len(chunks), chunks), 0.0
            )
        store.drain()
        out: dict[str, Any] = {"pinned": host.pinned}
        for name, path in paths.items():
            backend = RealTransferBackend(device, gpu, host, copy_path=path)
            backends.append(backend)
            gpu.data.zero_()  # a load that copied nothing cannot pass its check
            before = dict(getattr(path, "jobs", {}))
            results: list[TransferResult] = []
            for _ in range(jobs):
                src = rng.sample(range(blocks), blocks_per_job)
                dst = rng.sample(range(blocks), blocks_per_job)
                nbytes = blocks_per_job * geometry.block_bytes
                job = TransferJob(next(ids), LOAD, dst, src, nbytes, blocks_per_job, src)
                backend.submit(job, 0.0)
            results += backend.drain()
            recs = backend.records
            busy = sum(r.duration for r in recs)
            after = getattr(path, "jobs", {})
            routes = {k: v - before.get(k, 0) for k, v in after.items()} or {path.name: len(recs)}
            kernel = getattr(path, "kernel", None)
            out[name] = {
                "path": path.name,
                "jobs_by_path": routes,
                "jobs": len(recs),
                "gbps": sum(r.nbytes for r in recs) / busy / 1e9 if busy > 0 else None,
                "failed_jobs": sum(not r.success for r in results),
                "unprepared_launches": getattr(kernel, "unprepared_launches", None),
                **backend.integrity.as_dict(),
            }
        return out
    finally:
        release_when_idle(device, host, gpu, *backends)


def kernel_ran_every_job(run: dict[str, Any]) -> bool:
    """Whether the forced-kernel run's jobs all went through the gather kernel."""
    return bool(run["jobs"]) and run["jobs_by_path"].get(GatherKernel.name, 0) == run["jobs"]


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
    gpu = GpuKVCache(geometry, gpu_blocks, layout, device)
    host = host_pool(device, HostLayout(geometry, 1, layout), chunks, allow_unpinned)
    backend: RealTransferBackend | None = None
    try:
        backend = RealTransferBackend(device, gpu, host)
        stored: dict[int, str] = {}  # chunk -> key, stores reported complete
        storing: dict[int, dict[int, str]] = {}  # job id -> {chunk: key}
        job_id = 0
        t0 = device.clock()
        half = gpu_blocks // 2

        def account(results: list[TransferResult]) -> None:
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
        # a last load of what was stored: on a loaded host the stores of the rounds above can
        # all complete too late for any round to load them, and then nothing would be checked
        picks = rng.sample(list(stored), min(blocks_per_job, len(stored), gpu_blocks - half))
        if picks:
            job_id += 1
            dst = rng.sample(range(half, gpu_blocks), len(picks))
            keys = [stored[c] for c in picks]
            nbytes = len(picks) * geometry.block_bytes
            backend.submit(
                TransferJob(job_id, LOAD, dst, picks, nbytes, len(picks), keys), device.clock()
            )
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
