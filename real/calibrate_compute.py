"""Compute calibration: time the forward pass's pieces with torch and fit the per-phase model.

On the device given (CUDA, or CPU tensors without it) this times, for one model at one
tensor-parallel shard:

* one layer's GEMMs (QKV, output projection, gate+up, down) for a few token counts, and
  the LM head for one row and a decode batch of rows;
* causal prefill attention (``scaled_dot_product_attention``) over a few prompt lengths;
* decode attention (one query per request) of a batch over the same context lengths.

Each point keeps the median of a few timed trials. The efficiencies of
:mod:`kvsim.engine.phase_compute` are then the best achieved rate of their points over the
peak: the GEMMs' FLOP/s (and their weight bytes/s), the prefill attention's FLOP/s, the
decode attention's KV bytes/s. The peaks are the GPU preset's data-sheet figures when the
GPU is known (``--gpu``, or the CUDA device's name), else the best rates measured here (a
CPU run: efficiencies of 1 at its best points). What one device cannot measure (the
all-reduce between TP workers, the per-step overhead) comes from the shipped profile of
that GPU, or of the H200 when none ships, and its ``sources`` entry says so.

The GEMM shapes come from the model's figures: attention projections from its heads and
head size, the MLP from the rest of a layer's non-embedding active parameters (for an MoE
that is the active experts' MLPs taken as one dense MLP). MLA models are refused: their
projections are not in the model's figures.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvsim.core.errors import InputError
from kvsim.engine.phase_compute import NUMBERS, PhaseProfile, shipped_profile
from kvsim.specs.hardware import GPUS, GpuSpec
from kvsim.specs.models import ModelSpec
from real.machine import check_device_fits, check_fits

MIB = 1 << 20
FALLBACK_GPU = "h200"  # whose shipped profile supplies what one device cannot measure


@dataclass(frozen=True)
class ComputeCalibration:
    """What to measure: token counts, context lengths, decode batch, trials, a weight cap."""

    tokens: tuple[int, ...]
    contexts: tuple[int, ...]
    decode_batch: int
    trials: int
    max_weight_bytes: int | None = None  # cap on one weight matrix (CPU: keeps it small)

    @classmethod
    def for_device(cls, device: torch.device) -> ComputeCalibration:
        if device.type == "cuda":
            return cls((1, 8, 32, 128, 512, 2048, 8192), (1024, 4096, 16384), 32, 10)
        return cls((1, 16, 128), (128, 512), 4, 2, 32 * MIB)


@dataclass(frozen=True)
class Point:
    """One timed operation: its kind, size, median seconds, FLOPs and bytes read."""

    kind: str  # gemm, lm_head, prefill_attention, decode_attention
    size: int  # tokens (gemm), rows (lm_head), context tokens (attention)
    seconds: float
    flops: float
    nbytes: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "size": self.size,
            "seconds": self.seconds,
            "flops": self.flops,
            "bytes": self.nbytes,
        }


def resolve_device(kind: str) -> torch.device:
    """``auto`` (CUDA when available), ``cuda`` or ``cpu``."""
    available = torch.cuda.is_available()
    if kind == "auto":
        kind = "cuda" if available else "cpu"
    if kind == "cuda" and not available:
        raise InputError("--device cuda: torch.cuda.is_available() is False on this machine")
    return torch.device(kind)


def detect_gpu(device: torch.device) -> GpuSpec | None:
    """The preset whose name the CUDA device's name contains (the longest such name)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    found = [g for key, g in GPUS.items() if key in name]
    return max(found, key=lambda g: len(g.name)) if found else None


def layer_gemms(model: ModelSpec, tp: int = 1) -> list[tuple[int, int]]:
    """``(in, out)`` of one layer's GEMMs on one TP worker: QKV, output, gate+up, down."""
    if model.is_mla:
        raise InputError(
            f"calibrate-compute: {model.name} uses MLA, whose projections kvsim does not "
            "model; calibrate with a dense model of a similar hidden size"
        )
    hidden = model.hidden_size or model.num_attention_heads * model.head_dim
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    lm = model.vocab_size * hidden
    embeddings = lm if model.tie_word_embeddings else 2 * lm
    per_layer = (model.active_params - embeddings) / model.num_layers
    attention = hidden * (q + 2 * kv) + q * hidden
    intermediate = int((per_layer - attention) / (3 * hidden))
    if intermediate < 1:
        raise InputError(
            f"calibrate-compute: {model.name}'s parameters leave no MLP beside its attention"
        )
    shard = [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * intermediate), (intermediate, hidden)]
    # column-parallel layers split their outputs, row-parallel ones their inputs
    return [
        (k, max(1, n // tp)) if i in (0, 2) else (max(1, k // tp), n)
        for i, (k, n) in enumerate(shard)
    ]


class _Timer:
    """Median seconds of ``trials`` runs after one warm-up; CUDA events on a GPU."""

    def __init__(self, device: torch.device, trials: int) -> None:
        self.cuda = device.type == "cuda"
        self.trials = trials

    def __call__(self, fn: Callable[..., object], *args: Any) -> float:
        """Median seconds of ``fn(*args)``."""
        fn(*args)
        times = []
        for _ in range(self.trials):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*args)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn(*args)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def _chain(xs: Sequence[torch.Tensor], ws: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One layer's GEMMs, one after the other."""
    return [x @ w for x, w in zip(xs, ws)]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, gqa: bool
) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def _capped(k: int, n: int, elem: int, cap: int | None) -> int:
    return n if cap is None else max(1, min(n, cap // (k * elem)))


def _gemm_shapes(
    model: ModelSpec, plan: ComputeCalibration, tp: int, elem: int
) -> list[tuple[int, int]]:
    """``(in, out)`` of the weight matrices timed: one layer's GEMMs, capped."""
    return [(k, _capped(k, n, elem, plan.max_weight_bytes)) for k, n in layer_gemms(model, tp)]


def _lm_head_columns(
    model: ModelSpec, plan: ComputeCalibration, tp: int, hidden: int, elem: int
) -> int:
    return _capped(hidden, max(1, model.vocab_size // tp), elem, plan.max_weight_bytes)


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def peak_allocations(
    model: ModelSpec, plan: ComputeCalibration, tp: int, elem: int
) -> list[tuple[int, str, str]]:
    """``(bytes, what, option)`` of the largest point of each phase: what :func:`measure`
    holds at once there (inputs, weights and outputs; the attention kernels torch picks,
    flash-style on CPU and CUDA, keep no score matrix), and the option that sizes it."""
    shapes = _gemm_shapes(model, plan, tp, elem)
    t = max(plan.tokens)
    weights = sum(k * n for k, n in shapes)
    found = [
        (
            (weights + sum(t * (k + n) for k, n in shapes)) * elem,
            f"the layer GEMMs at {t:,} tokens",
            "--tokens",
        )
    ]
    hidden = shapes[0][0]
    if model.vocab_size:
        vocab = _lm_head_columns(model, plan, tp, hidden, elem)
        rows = max(1, plan.decode_batch)
        found.append(
            (
                (hidden * vocab + rows * (hidden + vocab)) * elem,
                f"the LM head for {rows:,} rows",
                "--decode-batch",
            )
        )
    heads = max(1, model.num_attention_heads // tp)
    kv_heads = model.kv_heads_per_worker(tp)
    c, b, dim = max(plan.contexts), plan.decode_batch, model.head_dim
    qkvo = 2 * heads + 2 * kv_heads  # query and output, key and value
    found.append((qkvo * c * dim * elem, f"prefill attention over {c:,} tokens", "--contexts"))
    decode = b * (2 * heads + 2 * kv_heads * c) * dim * elem
    found.append(
        (
            decode,
            f"decode attention of {b:,} requests over {c:,} tokens",
            "--contexts / --decode-batch",
        )
    )
    return found


def check_plan_fits(
    model: ModelSpec, device: torch.device, plan: ComputeCalibration, tp: int = 1
) -> None:
    """Refuse, in one line naming the option that sizes it, a point whose tensors the
    device cannot hold (CUDA memory on a GPU, host memory on CPU), before anything is
    allocated: torch's out-of-memory error would come mid-run, as a traceback."""
    elem = torch.empty((), dtype=_dtype(device)).element_size()
    for nbytes, what, option in peak_allocations(model, plan, tp, elem):
        what = f"calibrate-compute: {what} ({option})"
        hint = f"use a smaller {option}"
        if device.type == "cuda":
            check_device_fits(nbytes, device, what, hint)
        else:
            check_fits(nbytes, what, hint=hint)


def measure(
    model: ModelSpec,
    device: torch.device,
    plan: ComputeCalibration,
    tp: int = 1,
    dtype: torch.dtype | None = None,
) -> list[Point]:
    """Time the GEMMs, LM head and attention of ``model`` on ``device``."""
    dtype = dtype or _dtype(device)
    elem = torch.empty((), dtype=dtype).element_size()
    timer = _Timer(device, plan.trials)
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    points: list[Point] = []
    shapes = _gemm_shapes(model, plan, tp, elem)
    weights = [rand(k, n) for k, n in shapes]
    for t in plan.tokens:
        xs = [rand(t, k) for k, _ in shapes]
        secs = timer(_chain, xs, weights)
        flops = sum(2.0 * t * k * n for k, n in shapes)
        points.append(Point("gemm", t, secs, flops, sum(k * n * elem for k, n in shapes)))
    del weights
    hidden = shapes[0][0]
    if model.vocab_size:
        vocab = _lm_head_columns(model, plan, tp, hidden, elem)
        head = rand(hidden, vocab)
        for rows in sorted({1, plan.decode_batch}):
            x = rand(rows, hidden)
            secs = timer(torch.matmul, x, head)
            points.append(
                Point("lm_head", rows, secs, 2.0 * rows * hidden * vocab, hidden * vocab * elem)
            )
        del head
    points += _attention_points(model, device, plan, tp, rand, elem, timer)
    return points


def _attention_points(
    model: ModelSpec,
    device: torch.device,
    plan: ComputeCalibration,
    tp: int,
    rand: Callable[..., torch.Tensor],
    elem: int,
    timer: _Timer,
) -> list[Point]:
    """Causal prefill over each context length, then a decode batch reading it."""
    heads = max(1, model.num_attention_heads // tp)
    kv_heads = model.kv_heads_per_worker(tp)
    dim = model.head_dim
    gqa = heads != kv_heads  # grouped-query attention: K and V heads are shared
    points = []
    for c in plan.contexts:
        q, k, v = rand(1, heads, c, dim), rand(1, kv_heads, c, dim), rand(1, kv_heads, c, dim)
        secs = timer(_attend, q, k, v, True, gqa)
        pairs = c * (c + 1) / 2
        kv_bytes = 2.0 * c * kv_heads * dim * elem
        points.append(Point("prefill_attention", c, secs, 4.0 * heads * dim * pairs, kv_bytes))
    b = plan.decode_batch
    for c in plan.contexts:
        q = rand(b, heads, 1, dim)
        k, v = rand(b, kv_heads, c, dim), rand(b, kv_heads, c, dim)
        secs = timer(_attend, q, k, v, False, gqa)
        kv_bytes = 2.0 * b * c * kv_heads * dim * elem
        points.append(Point("decode_attention", c, secs, 4.0 * heads * dim * b * c, kv_bytes))
    return points


def fit(
    points: Sequence[Point], gpu: GpuSpec | None, where: str
) -> tuple[dict[str, float], dict[str, str]]:
    """Peaks and efficiencies from the points: each efficiency is its phase's best rate."""

    def best(kinds: tuple[str, ...], rate: Callable[[Point], float]) -> float:
        return max(rate(p) for p in points if p.kind in kinds and p.seconds > 0)

    gemm = ("gemm", "lm_head")
    flops_rate = best((*gemm, "prefill_attention"), lambda p: p.flops / p.seconds)
    bytes_rate = best((*gemm, "decode_attention"), lambda p: p.nbytes / p.seconds)
    peak = gpu.peak_flops if gpu else flops_rate
    hbm = gpu.hbm_bytes_per_s if gpu else bytes_rate
    values = {
        "peak_flops": peak,
        "hbm_bytes_per_s": hbm,
        "gemm_efficiency": best(gemm, lambda p: p.flops / p.seconds) / peak,
        "weight_bandwidth_efficiency": best(gemm, lambda p: p.nbytes / p.seconds) / hbm,
        "prefill_attention_efficiency": best(("prefill_attention",), lambda p: p.flops / p.seconds)
        / peak,
        "decode_attention_efficiency": best(("decode_attention",), lambda p: p.nbytes / p.seconds)
        / hbm,
    }
    if gpu:
        peaks = f"the {gpu.name} preset's data-sheet figure (kvsim.specs.hardware)"
    else:
        peaks = f"measured: the best rate of the points on {where}"
    sources = {
        "peak_flops": peaks,
        "hbm_bytes_per_s": peaks,
        "gemm_efficiency": f"measured on {where}: best FLOP/s of the layer GEMM and LM head points",
        "weight_bandwidth_efficiency": f"measured on {where}: best weight bytes/s of the "
        "layer GEMM and LM head points",
        "prefill_attention_efficiency": f"measured on {where}: best FLOP/s of causal "
        "scaled_dot_product_attention over the prompt lengths",
        "decode_attention_efficiency": f"measured on {where}: best KV bytes/s of one-query "
        "scaled_dot_product_attention over a decode batch",
    }
    return values, sources


def calibrate_compute(
    model: ModelSpec,
    device: torch.device,
    plan: ComputeCalibration | None = None,
    *,
    tp: int = 1,
    gpu: GpuSpec | None = None,
) -> tuple[PhaseProfile, list[Point]]:
    """Measure ``model``'s phases on ``device`` and return the fitted ``"kind": "phases"``
    profile and the points. ``gpu`` (default: detected from a CUDA device's name) supplies
    the peaks and names the profile."""
    if tp < 1:
        raise InputError(f"--tp must be positive, got {tp}")
    plan = plan or ComputeCalibration.for_device(device)
    gpu = gpu or detect_gpu(device)
    where = (
        f"{torch.cuda.get_device_name(device)}" if device.type == "cuda" else "cpu"
    ) + f" (torch {torch.__version__}, {model.name}, tp={tp})"
    check_plan_fits(model, device, plan, tp)
    points = measure(model, device, plan, tp)
    values, sources = fit(points, gpu, where)
    name = gpu.name if gpu else device.type
    base = shipped_profile(name) or shipped_profile(FALLBACK_GPU)
    assert base is not None
    for key in NUMBERS:
        if key not in values:  # what one device cannot measure
            values[key] = getattr(base, key)
            why = base.sources.get(key, "")
            sources[key] = f"not measured: the shipped {base.gpu} profile's value ({why})"
    numbers: dict[str, Any] = {k: float(v) for k, v in values.items()}
    return PhaseProfile(gpu=name, sources=sources, **numbers), points
