"""Validation run: one trace through the same engine twice, simulated and real.

1. **simulated**: virtual clock, :class:`SimulatedTransferBackend` on the link model (the
   calibrated profile when given);
2. **real**: monotonic clock, :class:`RealTransferBackend` moving the KV bytes between a
   paged GPU cache and the pinned host pool; the forward pass is emulated with the
   modelled duration (:mod:`real.compute`: a sleep on the compute stream of an
   asynchronous device, so copies overlap compute as in serving).

On CUDA the host pool must be page-locked (an unpinned pool would measure staged,
synchronous copies) unless ``allow_unpinned``; on CPU the pool and the stand-in GPU cache
must fit the memory available (:mod:`real.machine`). Memory is released only once the
device is idle, even after an error (:mod:`real.lifetime`).

Both runs build their own manager and policy objects from the same config, with the same
engine parameters, compute model and GPU block count. The report compares per-request hit
decisions, transfer job durations, TTFT, achieved GB/s vs the link peak, and the integrity
of every loaded block. Two job-time comparisons answer two questions:

* *the link model* (measured vs the model's time for that job alone on the link): with a
  profile calibrated on the same machine this checks that calibration and the backend
  agree (self-consistency), not that the simulator predicts anything;
* *the simulator* (measured vs the duration the simulated run gave the matching job, with
  its queueing and both directions sharing the link), beside TTFT simulated vs measured.

Each error is reported beside the measurement's own noise (:mod:`real.job_noise`: a sample
of the run's jobs replayed alone) and the count of jobs behind it: with few load jobs, or an
error within the noise, the comparison shows less than its number suggests
(``caveats``). ``select="conversations"`` runs the turns of multi-turn conversations
(:mod:`real.trace_slice`), where later requests load what earlier ones stored.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvsim.api import make_options
from kvsim.core.errors import InputError
from kvsim.core.units import GIB
from kvsim.engine.clock import MonotonicClock, VirtualClock
from kvsim.engine.compute_model import StepBatch, default_compute_profile, make_compute
from kvsim.engine.engine import Engine, gpu_kv_blocks
from kvsim.engine.params import EngineParams
from kvsim.engine.transfer_model import TransferModelParams, get_link
from kvsim.specs.hardware import GpuSpec, get_gpu
from kvsim.specs.models import ModelSpec, get_model
from kvsim.traces import as_trace
from kvsim.traces.model import Request, Trace
from real import compare, job_noise
from real.compute import EmulatedCompute
from real.device import Device
from real.host_pool import HostLayout, HostPool, Register, Unregister
from real.kv_cache import GpuKVCache, KVGeometry
from real.lifetime import release_when_idle
from real.lockstep import LockstepBackend, compared
from real.machine import check_device_fits, check_fits
from real.trace_slice import WINDOW_PER_REQUEST, conversation_turns
from real.transfer import Fault, RealTransferBackend
from real.validation_report import ValidationReport, link_time, request_rows
from real.validation_spec import ValidationSpec

if TYPE_CHECKING:
    from kvsim.options.offload import CacheConfig
    from kvsim.traces.coerce import TraceLike


@dataclass(frozen=True)
class RunSetup:
    """What both runs share, resolved from a spec: the requests, the configuration, the
    engine parameters, the compute model, the geometry and the GPU block count."""

    spec: ValidationSpec
    model: ModelSpec
    gpu: GpuSpec
    link: TransferModelParams
    requests: list[Request]
    config: CacheConfig
    eparams: EngineParams
    forward: Callable[[StepBatch], float]
    geometry: KVGeometry
    host_layout: HostLayout
    n_blocks: int


def prepare(
    trace: TraceLike, spec: ValidationSpec, params: TransferModelParams | None = None
) -> RunSetup:
    """Resolve ``spec`` against ``trace`` (one-line errors for what cannot run)."""
    model: ModelSpec = spec.model if isinstance(spec.model, ModelSpec) else get_model(spec.model)
    if isinstance(spec.model, ModelSpec) and spec.cpu_chunks is None:
        raise InputError("a custom ModelSpec needs cpu_chunks (sizing by GiB needs a preset name)")
    gpu = get_gpu(spec.gpu)
    tr = selected_trace(trace, spec)
    requests = list(tr)
    if not requests:
        raise InputError("the trace has no requests" + _selected(spec))
    config = make_options(
        model=model.name if not isinstance(spec.model, ModelSpec) else None,
        cpu_gib=spec.cpu_gib if spec.cpu_chunks is None else None,
        cpu_chunks=spec.cpu_chunks,
        policy=spec.policy,
        seed=spec.seed,
    ).resolve(tr.block_tokens)
    unit = config.layout.unit_tokens
    geometry = KVGeometry.from_model(model, unit)
    base = EngineParams(
        gpu_block_tokens=unit,
        time_scale=spec.time_scale,
        poisson_rate=spec.poisson_rate,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
        seed=spec.seed,
        record_steps=False,
    )
    n_blocks = spec.gpu_blocks or min(
        gpu_kv_blocks(model, gpu, base),
        int(spec.max_gpu_kv_gib * GIB // geometry.block_bytes),
    )
    if n_blocks < 2:  # one is vLLM's null block (kvsim.specs.sizing.usable_gpu_blocks)
        raise InputError(
            f"--max-gpu-kv-gib {spec.max_gpu_kv_gib} holds fewer than two "
            f"{geometry.block_bytes}-byte blocks (vLLM keeps one as its null block)"
        )
    eparams = EngineParams(**{**base.as_dict(), "gpu_blocks": n_blocks})
    return RunSetup(
        spec,
        model,
        gpu,
        params or get_link(gpu.link),
        requests,
        config,
        eparams,
        make_compute(model, default_compute_profile(gpu), tp=eparams.tp),
        geometry,
        HostLayout(geometry, config.layout.units_per_chunk, spec.layout),
        n_blocks,
    )


def check_memory(s: RunSetup, device: Device) -> None:
    """What the run will allocate against what the machine has, before anything is: the
    host pool in host memory; the GPU KV cache on the CUDA device, or in host memory too
    for the CPU stand-in. One line naming the options that shrink the part that fails."""
    host_bytes = s.config.num_chunks * s.host_layout.row_bytes
    kv_bytes = s.n_blocks * s.geometry.block_bytes
    kv_hint = "use a smaller --max-gpu-kv-gib / --gpu-kv-blocks"
    if device.is_cuda:
        check_fits(host_bytes, "the host pool")
        what = f"the GPU KV cache ({s.n_blocks} blocks)"
        check_device_fits(kv_bytes, device.torch_device, what, kv_hint)
        return
    check_fits(
        host_bytes + kv_bytes,
        f"the host pool ({host_bytes / GIB:.2f} GiB) and the CPU stand-in for the GPU KV "
        f"cache ({s.n_blocks} blocks, {kv_bytes / GIB:.2f} GiB)",
        hint="use a smaller --cpu-gib / --cpu-chunks, --max-gpu-kv-gib / --gpu-kv-blocks",
    )


def simulate(
    setup: RunSetup, device: Device | None = None, backend: LockstepBackend | None = None
) -> tuple[Any, Any, float]:
    """The simulated run: ``(request table, transfer table, end time)``; with ``backend``
    the lockstep run (:mod:`real.lockstep`), the same run with real copies."""
    s = setup
    device = device or Device("cpu")
    sim = Engine(
        s.config,
        s.eparams,
        model=s.model,
        gpu=s.gpu,
        transfer=s.link,
        clock=VirtualClock(),
        backend=backend,
        compute=EmulatedCompute(s.forward, device, s.spec.compute_scale, enqueue=False),
    ).run(s.requests)
    sim_req, sim_tr = sim.recorder.request_table(), sim.recorder.transfer_table()
    if len(sim_req) and bool(sim_req.rejected.all()):
        raise InputError(
            f"--gpu-kv-blocks {s.n_blocks}: no request of the trace fits in the GPU cache, "
            "so nothing would be compared; give more blocks"
        )
    return sim_req, sim_tr, float(sim.clock.now())


def run_validation(
    trace: TraceLike,
    spec: ValidationSpec,
    *,
    device: Device | None = None,
    params: TransferModelParams | None = None,
    fault: Fault | None = None,
    pin: bool | None = None,
    register: Register | None = None,
    unregister: Unregister | None = None,
    lockstep: bool = True,
) -> ValidationReport:
    """Run ``trace`` simulated then real, and compare; then the lockstep run
    (:mod:`real.lockstep`: real copies on the simulated schedule) unless ``lockstep`` is
    False. ``params`` is the link model (default: the GPU preset's link); ``fault`` injects
    copy failures in the wall-clock run, ``register`` / ``unregister`` stand in for
    ``cudaHostRegister`` (tests)."""
    device = device or Device.auto()
    s = prepare(trace, spec, params)
    # memory first: refuse (one line) before simulating what could not run for real
    check_memory(s, device)
    pin = device.is_cuda if pin is None else pin
    host = HostPool(
        s.host_layout,
        s.config.num_chunks,
        pin=pin,
        require_pin=pin and not spec.allow_unpinned,
        register=register,
        unregister=unregister,
    )
    gpu_cache: GpuKVCache | None = None
    backend: RealTransferBackend | None = None
    keep: list[object] = []  # the lockstep run's backends
    try:
        gpu_cache = GpuKVCache(s.geometry, s.n_blocks, spec.layout, device)
        sim_req, sim_tr, sim_end = simulate(s, device)
        clock = MonotonicClock()
        device.set_clock(clock.now)
        backend = RealTransferBackend(device, gpu_cache, host, fault=fault)
        compute = EmulatedCompute(s.forward, device, spec.compute_scale, clock=clock.now)
        real = Engine(
            s.config,
            s.eparams,
            model=s.model,
            gpu=s.gpu,
            transfer=s.link,
            clock=clock,
            backend=backend,
            compute=compute,
        ).run(s.requests)
        backend.drain()
        device.run_pending()
        wall = clock.now()
        pinned = host.pinned
        noise = _noise(device, gpu_cache, host, backend, s)
        lock = _lockstep(s, device, gpu_cache, host, sim_req, sim_tr, keep) if lockstep else {}
    finally:
        release_when_idle(device, host, gpu_cache, backend, *keep)
    assert backend is not None and gpu_cache is not None  # the try block completed
    real_req, real_tr = real.recorder.request_table(), real.recorder.transfer_table()

    sim_rows, real_rows = request_rows(sim_req), request_rows(real_req)
    job_req = {int(r.job): (r.request, int(r.chunks)) for r in real_tr.itertuples(index=False)}
    real_jobs = [(rec, *job_req[rec.job_id]) for rec in backend.records if rec.job_id in job_req]
    sim_jobs = [
        (r.direction, r.request, int(r.chunks), float(r.duration_s))
        for r in sim_tr.itertuples(index=False)
        if r.success
    ]
    records = backend.records
    return ValidationReport(
        spec=spec,
        device=device.kind,
        pinned=pinned,
        link=s.link.to_dict(),
        hits={
            **compare.hit_decisions(sim_rows, real_rows),
            "first_batching_difference": compare.first_batching_difference(sim_req, real_req),
        },
        transfers=compare.transfer_durations(records, s.link, sim_jobs, real_jobs),
        ttft=compare.ttft(sim_rows, real_rows),
        bandwidth=compare.bandwidth(records, s.link),
        integrity=backend.integrity.as_dict(),
        noise=noise,
        lockstep=lock,
        runs={
            "simulated": {"requests": len(sim_req), "transfer_jobs": len(sim_tr), "end_s": sim_end},
            "real": {
                "requests": len(real_req),
                "transfer_jobs": len(records),
                "failed_jobs": sum(1 for r in records if not r.success),
                "wall_s": wall,
                "gpu_blocks": s.n_blocks,
                "chunks": s.config.num_chunks,
                "gpu_cache_bytes": gpu_cache.nbytes,
                "host_pool_bytes": host.nbytes,
                "copies": sum(r.copies for r in records),
                "descriptors": sum(r.descriptors for r in records),
            },
        },
        tables={
            "simulated_requests": sim_req,
            "real_requests": real_req,
            "simulated_transfers": sim_tr,
            "real_jobs": pd.DataFrame([asdict(r) for r in records]),
        },
    )


def _lockstep(
    s: RunSetup,
    device: Device,
    gpu_cache: GpuKVCache,
    host: HostPool,
    sim_req: pd.DataFrame,
    sim_tr: pd.DataFrame,
    keep: list[object],
) -> dict[str, Any]:
    """The lockstep run on the same memory once the device is idle (a new backend knows
    nothing of another's copies in flight), compared with the simulated run; its backend
    goes into ``keep``, so memory is released only once it is idle too."""
    device.run_pending()
    real = RealTransferBackend(device, gpu_cache, host)
    keep.append(real)
    lock_req, lock_tr, _ = simulate(s, device, LockstepBackend(s.link, real))
    real.drain()
    device.run_pending()
    return compared(sim_req, sim_tr, lock_req, lock_tr, real)


def _noise(
    device: Device,
    gpu_cache: GpuKVCache,
    host: HostPool,
    backend: RealTransferBackend,
    s: RunSetup,
) -> dict[str, Any]:
    """A sample of the run's jobs replayed alone (:mod:`real.job_noise`)."""
    picks = job_noise.sample_jobs(backend.records, backend.jobs, s.spec.noise_jobs)
    alone = job_noise.replay_alone(device, gpu_cache, host, picks, s.spec.noise_repeats)
    by_id = {r.job_id: r for r in backend.records}
    link = s.link.to_dict()
    return job_noise.noise_stats(
        alone,
        in_run=[by_id[j.job_id].duration for j in picks],
        modelled=[
            link_time(link, j.direction, by_id[j.job_id].nbytes, by_id[j.job_id].copies)
            for j in picks
        ],
    )


def selected_trace(trace: TraceLike, spec: ValidationSpec) -> Trace:
    """The requests a validation runs: the first ``limit``, or the first ``limit``
    conversation turns among ``WINDOW_PER_REQUEST x limit`` requests."""
    if spec.select == "all":
        return as_trace(trace, limit=spec.limit)
    window = as_trace(trace, limit=spec.limit and WINDOW_PER_REQUEST * spec.limit)
    return Trace.from_requests(conversation_turns(list(window), spec.limit), window.block_tokens)


def _selected(spec: ValidationSpec) -> str:
    return "" if spec.select == "all" else f" (--select {spec.select} kept none)"


def default_trace() -> str:
    """The bundled Bailian sample (26 chat requests): seconds, for tests."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "traces", "samples", "bailian_sample.jsonl")


def mooncake_trace() -> str:
    """Mooncake's conversation trace (12,031 requests, 512-token blocks) in the checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "traces", "mooncake_fast25_conversation_trace.jsonl")
