"""Step time of one forward pass: which model, and the single-roofline one.

The default everywhere is the per-phase model of :mod:`kvsim.engine.phase_compute`: the
H100 profile fitted to published measurements (``kvsim fit-compute``), and on other GPUs
that profile with their datasheet peaks. With a ``"kind": "roofline"`` profile it is this
roofline of the model on the GPU plus a fixed overhead.

::

    flops = 2 * active_params * tokens + 4 * layers * q_heads * head_dim * attention_pairs
    bytes = weight_bytes + kv_bytes_per_token * (context_tokens_read + tokens)
    time  = max(flops / (peak_flops * flops_efficiency),
                bytes / (hbm_bytes_per_s * bandwidth_efficiency)) + step_overhead_s

all divided across ``tp`` GPUs. ``attention_pairs`` counts (query, key) pairs of the step:
a request computing n new tokens after c cached ones contributes ``n * c + n * (n + 1) / 2``.
An empty step (no tokens) takes no time.

Roofline profile JSON (``"kind": "roofline"`` or no kind; all keys optional, they replace
the preset's values)::

    {"peak_flops": 9.89e14, "hbm_bytes_per_s": 4.8e12, "flops_efficiency": 0.6,
     "bandwidth_efficiency": 0.8, "step_overhead_s": 0.002}

A per-phase profile is ``{"kind": "phases", "gpu": ..., ...}`` (:mod:`.phase_compute`).

The simplest model, for setting a run side by side with another simulator or with vLLM's
own scheduler: a step takes ``step_s + per_token_s * tokens``, nothing else::

    {"kind": "linear", "step_s": 0.01, "per_token_s": 1e-5}

Any callable ``(StepBatch) -> seconds`` can stand in for :class:`RooflineCompute`; a real
backend sleeps that long to emulate the forward pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvsim.core.io import read_json
from kvsim.engine.compute_file import ComputeKind, LinearProfileFile, RooflineProfileFile
from kvsim.engine.phase_compute import KIND as PHASES_KIND
from kvsim.engine.phase_compute import PhaseCompute, PhaseProfile, shipped_profile
from kvsim.engine.step_batch import StepBatch
from kvsim.options.schema import load
from kvsim.specs.hardware import GpuSpec
from kvsim.specs.models import ModelSpec

#: the fitted profile every GPU without its own scales by its datasheet peaks
SCALE_FROM = "h100"


@dataclass(frozen=True)
class ComputeParams:
    """Roofline coefficients of one GPU (a preset's figures, or a measured compute profile)."""

    peak_flops: float
    hbm_bytes_per_s: float
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.002

    @classmethod
    def for_gpu(cls, gpu: GpuSpec) -> ComputeParams:
        return cls(gpu.peak_flops, gpu.hbm_bytes_per_s)

    def with_profile(self, data: Any, source: str = "compute profile") -> ComputeParams:
        """These coefficients with those a roofline profile gives (checked by
        :class:`RooflineProfileFile`)."""
        return replace(self, **load(RooflineProfileFile, data, source=source).given())


@dataclass(frozen=True, slots=True)
class LinearCompute:
    """``step_s + per_token_s * tokens``: the trivial time model runs can be compared under."""

    step_s: float
    per_token_s: float

    @classmethod
    def from_dict(cls, data: Any, source: str = "compute profile") -> LinearCompute:
        """A ``"kind": "linear"`` profile, checked by :class:`LinearProfileFile`."""
        f = load(LinearProfileFile, data, source=source)
        return cls(f.step_s, f.per_token_s)

    def __call__(self, batch: StepBatch) -> float:
        tokens = batch.prefill_tokens + batch.decode_tokens
        return self.step_s + self.per_token_s * tokens if tokens > 0 else 0.0


ComputeProfile = ComputeParams | LinearCompute | PhaseProfile


def load_compute_profile(path: str | os.PathLike[str], base: ComputeParams) -> ComputeProfile:
    """A roofline profile (coefficients replacing ``base``'s), a ``"kind": "linear"`` one
    or a ``"kind": "phases"`` one."""
    path = os.fspath(path)
    data = read_json(path)
    kind = load(ComputeKind, data, source=path).kind
    if kind == "linear":
        return LinearCompute.from_dict(data, source=path)
    if kind == PHASES_KIND:
        return PhaseProfile.from_dict(data, source=path)
    return base.with_profile(data, source=path)


def default_compute_profile(gpu: GpuSpec) -> PhaseProfile:
    """The phases profile shipped for ``gpu`` (H100: fitted to measurements; H200: that
    fit with its datasheet's peaks); any other GPU gets the H100 profile with its own
    spec's peaks, labelled as such (its efficiencies and overheads are the H100's). A GPU
    spec named like a shipped profile with other peak figures keeps that profile's
    efficiencies with its own peaks."""
    profile = shipped_profile(gpu.name)
    scaled = profile is None
    if profile is None:
        profile = shipped_profile(SCALE_FROM)
        assert profile is not None, f"kvsim ships a {SCALE_FROM} profile"
    if not scaled and (profile.peak_flops, profile.hbm_bytes_per_s) == (
        gpu.peak_flops,
        gpu.hbm_bytes_per_s,
    ):
        return profile
    spec = f"the {gpu.name} GPU spec's figure"
    sources = dict(profile.sources)
    if scaled:
        sources = {k: f"the {SCALE_FROM} profile's, unscaled: {v}" for k, v in sources.items()}
    return replace(
        profile,
        gpu=gpu.name if scaled else profile.gpu,
        peak_flops=gpu.peak_flops,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        sources={**sources, "peak_flops": spec, "hbm_bytes_per_s": spec},
    )


def make_compute(
    model: ModelSpec, profile: ComputeProfile, tp: int = 1
) -> Callable[[StepBatch], float]:
    """The step-time model a profile describes, for ``model`` at tensor parallel ``tp``."""
    if isinstance(profile, LinearCompute):
        return profile
    if isinstance(profile, PhaseProfile):
        return PhaseCompute(model, profile, tp=tp)
    return RooflineCompute(model, profile, tp=tp)


def describe_compute(profile: ComputeProfile) -> dict[str, Any]:
    """What a run's config records of its compute model."""
    if isinstance(profile, LinearCompute):
        return {"step_s": profile.step_s, "per_token_s": profile.per_token_s}
    if isinstance(profile, PhaseProfile):
        return {k: v for k, v in profile.to_dict().items() if k != "sources"}
    return {"kind": "roofline", **profile.__dict__}


class RooflineCompute:
    """Callable step-time model for one model on one GPU type at tensor parallel ``tp``."""

    def __init__(
        self, model: ModelSpec, params: ComputeParams, tp: int = 1, dtype_bytes: int | None = None
    ) -> None:
        self.model = model
        self.params = params
        self.tp = tp
        d = model.default_dtype_bytes if dtype_bytes is None else dtype_bytes
        self._flops_per_token = 2.0 * model.active_params / tp
        self._attn_flops_per_pair = (
            4.0
            * model.num_layers
            * model.num_attention_heads
            * (model.kv_lora_rank + model.qk_rope_head_dim if model.is_mla else model.head_dim)
            / tp
        )
        scale = model.weight_bytes() / model.num_params if dtype_bytes is None else d
        self._weight_bytes_total = model.num_params * scale / tp
        self._weight_bytes_active = model.active_params * scale / tp
        self._kv_bytes_per_token = model.kv_bytes_per_token(d, tp)
        self._flops_rate = params.peak_flops * params.flops_efficiency
        self._bytes_rate = params.hbm_bytes_per_s * params.bandwidth_efficiency
        self._overhead = params.step_overhead_s

    def weight_bytes_read(self, tokens: int) -> float:
        """Dense models read every weight; MoE reads at most the experts the batch activates."""
        if self._weight_bytes_active >= self._weight_bytes_total:
            return self._weight_bytes_total
        return min(self._weight_bytes_total, self._weight_bytes_active * max(1, tokens))

    def __call__(self, batch: StepBatch) -> float:
        tokens = batch.prefill_tokens + batch.decode_tokens
        if tokens <= 0:
            return 0.0
        flops = self._flops_per_token * tokens + self._attn_flops_per_pair * batch.attention_pairs
        nbytes = self.weight_bytes_read(tokens) + self._kv_bytes_per_token * (
            batch.context_tokens + tokens
        )
        return max(flops / self._flops_rate, nbytes / self._bytes_rate) + self._overhead
