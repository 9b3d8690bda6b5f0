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
decisions, transfer job durations (measured vs the link model for that job, and vs the
simulated run's duration for the matching job), TTFT, achieved GB/s vs the link peak,
and the integrity of every loaded block.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvsim.api import make_options
from kvsim.core.errors import InputError
from kvsim.core.units import GIB
from kvsim.engine.clock import MonotonicClock, VirtualClock
from kvsim.engine.compute_model import default_compute_profile, make_compute
from kvsim.engine.engine import Engine, gpu_kv_blocks
from kvsim.engine.params import EngineParams
from kvsim.engine.transfer_model import TransferModelParams, get_link
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import ModelSpec, get_model
from kvsim.traces import as_trace
from real import compare
from real.compute import EmulatedCompute
from real.device import Device
from real.host_pool import HostLayout, HostPool, Register, Unregister
from real.kv_cache import LAYER_MAJOR, LAYOUTS, GpuKVCache, KVGeometry
from real.lifetime import release_when_idle
from real.machine import check_fits
from real.transfer import Fault, RealTransferBackend

if TYPE_CHECKING:
    from kvsim.traces.coerce import TraceLike

TINY_KV_MODEL = replace(
    get_model("llama-3.2-1b"), name="tiny-kv", num_layers=2, num_kv_heads=1, head_dim=16
)


@dataclass(frozen=True)
class ValidationSpec:
    """What to run; the same values drive both runs."""

    model: str | ModelSpec = "llama-3.1-8b"  # a preset name, or a ModelSpec (tests)
    cpu_gib: float | None = 16.0
    cpu_chunks: int | None = None
    limit: int | None = 500
    layout: str = LAYER_MAJOR
    gpu: str = "h200"
    gpu_blocks: int | None = None  # None: vLLM's budget, capped by max_gpu_kv_gib
    max_gpu_kv_gib: float = 48.0  # real GPU cache is allocated: keep it bounded
    time_scale: float = 1.0
    poisson_rate: float | None = None
    compute_scale: float = 1.0  # multiplies every modelled step (both runs)
    policy: str = "lru"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    seed: int = 0
    allow_unpinned: bool = False  # on CUDA, run even if page-locking the pool fails

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InputError(f"--layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.compute_scale <= 0:
            raise InputError(f"--compute-scale must be > 0, got {self.compute_scale}")
        if self.max_gpu_kv_gib <= 0:
            raise InputError(f"--max-gpu-kv-gib must be > 0, got {self.max_gpu_kv_gib}")

    @classmethod
    def small_for_tests(cls) -> ValidationSpec:
        """Seconds on CPU for the bundled Bailian sample (26 chat requests, 16-token
        blocks): llama-3.2-1b's compute with a tiny KV (2 KiB per block), and a GPU cache
        small enough that later turns hit the CPU tier."""
        return cls(
            model=TINY_KV_MODEL,
            cpu_gib=None,
            cpu_chunks=512,
            limit=None,
            gpu_blocks=60,
            time_scale=0.03,
            compute_scale=0.1,
            max_gpu_kv_gib=1.0,
        )

    @classmethod
    def for_gpu_check(cls) -> ValidationSpec:
        """About 40 s on one H200: the Bailian sample with llama-3.1-8b (2 MiB blocks), a
        16 GiB pinned tier and a GPU cache tight enough that later turns load from it."""
        return cls(cpu_gib=16.0, limit=None, gpu_blocks=60, time_scale=0.25)


@dataclass
class ValidationReport:
    """Simulated vs real run of one trace: compared hits, job times, TTFT, GB/s, integrity."""

    spec: ValidationSpec
    device: str
    pinned: bool
    link: dict[str, Any]
    hits: dict[str, Any]
    transfers: dict[str, Any]
    ttft: dict[str, Any]
    bandwidth: dict[str, Any]
    integrity: dict[str, int]
    runs: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def as_dict(self, per_item: bool = True) -> dict[str, Any]:
        """The whole report as JSON-ready values; ``per_item`` adds one row per request
        (hits and TTFT of both runs) and per real transfer job (measured vs modelled)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("tables", "spec")}
        d["spec"] = {
            k: (v.name if isinstance(v, ModelSpec) else v)
            for k, v in asdict(self.spec).items()
            if k != "model"
        }
        d["spec"]["model"] = (
            self.spec.model.name if isinstance(self.spec.model, ModelSpec) else self.spec.model
        )
        if per_item and self.tables:
            cols = ["request", "gpu_hit_tokens", "cpu_hit_tokens", "ttft_s"]
            sim = self.tables["simulated_requests"][cols]
            real = self.tables["real_requests"][cols]
            both = sim.merge(real, on="request", suffixes=("_sim", "_real"))
            d["requests"] = both.to_dict(orient="records")
            jobs = self.tables["real_jobs"]
            d["jobs"] = [
                {
                    "job": int(r.job_id),
                    "direction": r.direction,
                    "bytes": int(r.nbytes),
                    "copies": int(r.copies),
                    "success": bool(r.success),
                    "measured_s": float(r.end_time - r.start_time),
                    "modelled_s": _link_time(self.link, r.direction, int(r.nbytes), int(r.copies)),
                }
                for r in jobs.itertuples(index=False)
            ]
        return _clean(d)

    def summary(self) -> dict[str, Any]:
        """The compact comparison (what the CLI prints)."""
        t, bw = self.transfers, self.bandwidth
        out = {
            "device": self.device,
            "pinned": self.pinned,
            "link": self.link.get("link"),
            "requests": self.hits["requests"],
            "hit_decisions_identical": self.hits["all_identical"],
            "hit_decisions_same": self.hits["identical"],
            "first_difference": _first_diff(self.hits["first_difference"]),
            "jobs_measured": t["all"]["n"],
            "job_err_median_pct": t["all"]["median_abs_pct_err"],
            "job_err_p90_pct": t["all"]["p90_abs_pct_err"],
            "store_err_median_pct": t["store"]["median_abs_pct_err"],
            "load_err_median_pct": t["load"]["median_abs_pct_err"],
            "jobs_matched_to_sim": t["matched_to_simulated_run"]["n"],
            "matched_err_median_pct": t["matched_to_simulated_run"]["median_abs_pct_err"],
            "ttft_err_median_pct": self.ttft["median_abs_pct_err"],
            "ttft_err_p90_pct": self.ttft["p90_abs_pct_err"],
            "ttft_predicted_median_s": self.ttft.get("predicted_median_s"),
            "ttft_measured_median_s": self.ttft.get("measured_median_s"),
            "store_gbps": bw["store_d2h"]["achieved_gbps"],
            "store_link_peak_gbps": bw["store_d2h"]["link_peak_gbps"],
            "load_gbps": bw["load_h2d"]["achieved_gbps"],
            "load_link_peak_gbps": bw["load_h2d"]["link_peak_gbps"],
            "failed_jobs": self.runs["real"]["failed_jobs"],
            "integrity_checked_blocks": self.integrity["checked_blocks"],
            "integrity_mismatched_blocks": self.integrity["mismatched_blocks"],
            "integrity_mismatched_bytes": self.integrity["mismatched_bytes"],
            "real_wall_s": self.runs["real"]["wall_s"],
        }
        return _clean(out)


def _link_time(link: dict[str, Any], direction: str, nbytes: int, copies: int) -> float:
    params = TransferModelParams.from_dict(link)
    return (params.d2h if direction == "store" else params.h2d).job_time(nbytes, copies)


def _first_diff(d: Mapping[str, Any] | None) -> str | None:
    if d is None:
        return None
    return f"request {d['request']}: sim (gpu, cpu) hit tokens {d['simulated']} vs real {d['real']}"


def _clean(x: Any) -> Any:
    """JSON-ready: str keys, lists for tuples, None for NaN, Python scalars for numpy ones."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return _clean(x.item())
    return x


def _request_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            "request": r.request,
            "gpu_hit": int(r.gpu_hit_tokens),
            "cpu_hit": int(r.cpu_hit_tokens),
            "ttft": None if r.rejected or math.isnan(r.ttft_s) else float(r.ttft_s),
        }
        for r in df.itertuples(index=False)
    ]


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
) -> ValidationReport:
    """Run ``trace`` simulated then real, and compare. ``params`` is the link model
    (default: the GPU preset's link); ``fault`` injects copy failures, ``register`` /
    ``unregister`` stand in for ``cudaHostRegister`` (tests)."""
    device = device or Device.auto()
    model: ModelSpec = spec.model if isinstance(spec.model, ModelSpec) else get_model(spec.model)
    if isinstance(spec.model, ModelSpec) and spec.cpu_chunks is None:
        raise InputError("a custom ModelSpec needs cpu_chunks (sizing by GiB needs a preset name)")
    gpu = get_gpu(spec.gpu)
    link = params or get_link(gpu.link)
    tr = as_trace(trace, limit=spec.limit)
    requests = list(tr)
    if not requests:
        raise InputError("the trace has no requests")
    config = make_options(
        model=model.name if not isinstance(spec.model, ModelSpec) else None,
        cpu_gib=spec.cpu_gib if spec.cpu_chunks is None else None,
        cpu_chunks=spec.cpu_chunks,
        policy=spec.policy,
        seed=spec.seed,
    ).resolve(tr.block_tokens)
    layout = config.layout
    unit = layout.unit_tokens
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
    if n_blocks < 1:
        raise InputError(
            f"--max-gpu-kv-gib {spec.max_gpu_kv_gib} holds no {geometry.block_bytes}-byte block"
        )
    eparams = EngineParams(**{**base.as_dict(), "gpu_blocks": n_blocks})
    forward = make_compute(model, default_compute_profile(gpu), tp=eparams.tp)

    # memory first: refuse (one line) before simulating what could not run for real
    host_layout = HostLayout(geometry, layout.units_per_chunk, spec.layout)
    host_bytes = config.num_chunks * host_layout.row_bytes
    on_host = host_bytes + (0 if device.is_cuda else n_blocks * geometry.block_bytes)
    check_fits(on_host, "the host pool" + ("" if device.is_cuda else " and the CPU KV cache"))
    pin = device.is_cuda if pin is None else pin
    host = HostPool(
        host_layout,
        config.num_chunks,
        pin=pin,
        require_pin=pin and not spec.allow_unpinned,
        register=register,
        unregister=unregister,
    )
    gpu_cache: GpuKVCache | None = None
    backend: RealTransferBackend | None = None
    try:
        gpu_cache = GpuKVCache(geometry, n_blocks, spec.layout, device)

        # 1. simulated
        sim = Engine(
            config,
            eparams,
            model=model,
            gpu=gpu,
            transfer=link,
            clock=VirtualClock(),
            compute=EmulatedCompute(forward, device, spec.compute_scale, enqueue=False),
        ).run(requests)
        sim_req, sim_tr = sim.recorder.request_table(), sim.recorder.transfer_table()
        if len(sim_req) and bool(sim_req.rejected.all()):
            raise InputError(
                f"--gpu-kv-blocks {n_blocks}: no request of the trace fits in the GPU cache, "
                "so nothing would be compared; give more blocks"
            )

        # 2. real
        clock = MonotonicClock()
        device.set_clock(clock.now)
        backend = RealTransferBackend(device, gpu_cache, host, fault=fault)
        compute = EmulatedCompute(forward, device, spec.compute_scale, clock=clock.now)
        real = Engine(
            config,
            eparams,
            model=model,
            gpu=gpu,
            transfer=link,
            clock=clock,
            backend=backend,
            compute=compute,
        ).run(requests)
        backend.drain()
        device.run_pending()
        wall = clock.now()
        pinned = host.pinned
    finally:
        release_when_idle(device, host, gpu_cache, backend)
    assert backend is not None and gpu_cache is not None  # the try block completed
    real_req, real_tr = real.recorder.request_table(), real.recorder.transfer_table()

    sim_rows, real_rows = _request_rows(sim_req), _request_rows(real_req)
    job_req = {int(r.job): (r.request, int(r.chunks)) for r in real_tr.itertuples(index=False)}
    real_jobs = [(rec, *job_req[rec.job_id]) for rec in backend.records if rec.job_id in job_req]
    sim_jobs = [
        (r.direction, r.request, int(r.chunks), float(r.duration_s))
        for r in sim_tr.itertuples(index=False)
        if r.success
    ]
    records = backend.records
    report = ValidationReport(
        spec=spec,
        device=device.kind,
        pinned=pinned,
        link=link.to_dict(),
        hits=compare.hit_decisions(sim_rows, real_rows),
        transfers=compare.transfer_durations(records, link, sim_jobs, real_jobs),
        ttft=compare.ttft(sim_rows, real_rows),
        bandwidth=compare.bandwidth(records, link),
        integrity=backend.integrity.as_dict(),
        runs={
            "simulated": {
                "requests": len(sim_req),
                "transfer_jobs": len(sim_tr),
                "end_s": float(sim.clock.now()),
            },
            "real": {
                "requests": len(real_req),
                "transfer_jobs": len(records),
                "failed_jobs": sum(1 for r in records if not r.success),
                "wall_s": wall,
                "gpu_blocks": n_blocks,
                "chunks": config.num_chunks,
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
    return report


def default_trace() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "traces", "samples", "bailian_sample.jsonl")
