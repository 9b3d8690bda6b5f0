"""The compute profile JSON a user gives ``--compute-profile``, described once: a roofline
profile (:class:`RooflineProfileFile`: coefficients replacing the GPU preset's), a linear
step time (:class:`LinearProfileFile`) or a per-phase profile (:class:`PhasesProfileFile`,
what ``kvsim calibrate-compute`` writes and ``kvsim/data/compute_phases_<gpu>.json`` ship).
Validation, bounds, help texts, "did you mean" and the JSON Schema (``kvsim schema
compute-profile-phases`` and the others) come from these classes;
:mod:`kvsim.engine.compute_model` and :mod:`kvsim.engine.phase_compute` turn a checked
file into the model they run. Numbers must be finite
(:func:`kvsim.options.schema.not_finite`, the one home of that rule).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, field

from kvsim.options.schema import Schema

__all__ = [
    "MAY_BE_ZERO",
    "NUMBERS",
    "OPTIONAL",
    "ComputeKind",
    "LinearProfileFile",
    "PhasesProfileFile",
    "RooflineProfileFile",
]

_Positive = Annotated[float, Meta(gt=0)]
_NonNegative = Annotated[float, Meta(ge=0)]

PeakFlops = Annotated[_Positive, Meta(description="Dense BF16 FLOP/s.")]
HbmBytesPerS = Annotated[_Positive, Meta(description="HBM bandwidth, bytes/s.")]
StepOverheadS = Annotated[
    _NonNegative, Meta(description="Fixed cost of one forward pass (launches, sampling), s.")
]


class ComputeKind(Schema, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Which of the three a compute profile is (its other keys are read by that one)."""

    kind: Annotated[
        Literal["roofline", "linear", "phases"],
        Meta(description="roofline (the default), linear or phases."),
    ] = "roofline"


class RooflineProfileFile(Schema, frozen=True, kw_only=True):
    """One roofline for the whole forward pass; every key is optional and replaces the
    GPU preset's value."""

    kind: Literal["roofline"] = "roofline"
    peak_flops: PeakFlops | None = None
    hbm_bytes_per_s: HbmBytesPerS | None = None
    flops_efficiency: (
        Annotated[_Positive, Meta(description="Share of peak_flops reached (default 0.6).")] | None
    ) = None
    bandwidth_efficiency: (
        Annotated[_Positive, Meta(description="Share of HBM bandwidth reached (default 0.8).")]
        | None
    ) = None
    step_overhead_s: StepOverheadS | None = None

    def given(self) -> dict[str, float]:
        """The coefficients the file gives."""
        return {k: v for k, v in self.as_dict().items() if k != "kind" and v is not None}


class LinearProfileFile(Schema, frozen=True, kw_only=True):
    """``step_s + per_token_s * tokens``: the trivial step time runs can be compared under."""

    kind: Literal["linear"]
    step_s: Annotated[_NonNegative, Meta(description="Seconds of every non-empty step.")]
    per_token_s: Annotated[_NonNegative, Meta(description="Seconds per scheduled token.")]


#: the per-phase coefficients, in profile order; all > 0 except :data:`MAY_BE_ZERO`
NUMBERS = (
    "peak_flops",
    "hbm_bytes_per_s",
    "gemm_efficiency",
    "weight_bandwidth_efficiency",
    "prefill_attention_efficiency",
    "decode_attention_efficiency",
    "allreduce_bytes_per_s",
    "allreduce_latency_s",
    "step_overhead_s",
    "seq_overhead_s",
    "moe_efficiency",
    "request_overhead_s",
    "attention_seq_layer_s",
)
#: numbers a profile may leave out whatever its GPU (added after profiles were written)
OPTIONAL = {
    "seq_overhead_s": 0.0,
    "moe_efficiency": 1.0,
    "request_overhead_s": 0.0,
    "attention_seq_layer_s": 0.0,
}
MAY_BE_ZERO = frozenset(
    {
        "allreduce_latency_s",
        "step_overhead_s",
        "seq_overhead_s",
        "request_overhead_s",
        "attention_seq_layer_s",
    }
)


class PhasesProfileFile(Schema, frozen=True, kw_only=True):
    """The per-phase model's coefficients on one GPU type, each with where it comes from. A
    profile naming a GPU that ships one may give only the numbers it changes."""

    kind: Literal["phases"]
    gpu: Annotated[
        str,
        Meta(pattern=r"\S", description="The GPU the profile is for (h100, h200, ...)."),
    ]
    peak_flops: PeakFlops | None = None
    hbm_bytes_per_s: HbmBytesPerS | None = None
    gemm_efficiency: (
        Annotated[
            _Positive,
            Meta(description="Of peak_flops: GEMMs (and the LM head) when compute-bound."),
        ]
        | None
    ) = None
    weight_bandwidth_efficiency: (
        Annotated[_Positive, Meta(description="Of HBM: GEMMs reading their weights, memory-bound.")]
        | None
    ) = None
    prefill_attention_efficiency: (
        Annotated[_Positive, Meta(description="Of peak_flops: attention over (query, key) pairs.")]
        | None
    ) = None
    decode_attention_efficiency: (
        Annotated[_Positive, Meta(description="Of HBM: attention reading the KV cache.")] | None
    ) = None
    allreduce_bytes_per_s: (
        Annotated[
            _Positive, Meta(description="Bus bandwidth of a decode-sized all-reduce, bytes/s.")
        ]
        | None
    ) = None
    allreduce_latency_s: (
        Annotated[
            _NonNegative,
            Meta(
                description="Fixed cost of one all-reduce hop between two GPUs, s; x (tp - 1) "
                "on the ring, x 2 for multimem (TP 6 and 8 on Hopper and Blackwell)."
            ),
        ]
        | None
    ) = None
    step_overhead_s: StepOverheadS | None = None
    seq_overhead_s: (
        Annotated[_NonNegative, Meta(description="Per request scheduled in a step, s (0).")] | None
    ) = None
    moe_efficiency: (
        Annotated[
            _Positive,
            Meta(description="Routed experts' weight reads, of weight_bandwidth (1)."),
        ]
        | None
    ) = None
    request_overhead_s: (
        Annotated[
            _NonNegative,
            Meta(description="Once per request, outside the engine (client path), s (0)."),
        ]
        | None
    ) = None
    attention_seq_layer_s: (
        Annotated[
            _NonNegative,
            Meta(description="Attention's fixed cost per request and layer in a step, s (0)."),
        ]
        | None
    ) = None
    sources: Annotated[
        dict[str, str], Meta(description="Where each coefficient comes from, by its name.")
    ] = field(default_factory=dict)
    provenance: (
        Annotated[dict[str, Any], Meta(description="How a fit made the profile (kept as is).")]
        | None
    ) = None
    measurements: (
        Annotated[list[Any], Meta(description="What a calibration measured (kept as is).")] | None
    ) = None
    note: Annotated[str, Meta(description="Free text.")] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sources) - set(NUMBERS))
        if unknown:
            raise ValueError(f"sources: for unknown coefficient(s) {', '.join(unknown)}")

    def given(self) -> dict[str, float]:
        """The coefficients the file gives."""
        return {k: getattr(self, k) for k in NUMBERS if getattr(self, k) is not None}
