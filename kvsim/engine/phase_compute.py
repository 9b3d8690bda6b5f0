"""Step time as a sum of phases, each its own roofline: the default on H100 and H200.

One roofline for the whole forward pass (:class:`kvsim.engine.compute_model.RooflineCompute`)
lets a long prefill's attention hide the weight reads, and charges the LM head for every
prompt token. A forward pass is a sequence of kernels that do not overlap, so here each
phase is a ``max(flops / rate, bytes / bandwidth)`` of its own and the step is their sum,
per tensor-parallel worker (``T`` tokens scheduled, ``S`` requests scheduled, ``d`` bytes
per weight or activation element, ``L`` layers, ``H`` hidden size, ``V`` vocabulary;
``kv_bytes_per_token`` in the KV cache's own dtype)::

    gemm       max(2 * P * T / (peak * gemm_eff),  W(T) * d / (hbm * weight_bw_eff))
    attention  prefill rows: max(4 * L * heads * dim * pairs / (peak * prefill_attn_eff),
                                 kv_bytes_per_token * (context + T) / (hbm * decode_attn_eff))
               + decode rows: the same over their own pairs and context
               + S * L * attention_seq_layer_s (each row's fixed cost in every layer)
    lm_head    max(2 * V * H * S / (peak * gemm_eff),  V * H * d / (hbm * weight_bw_eff))
    all_reduce 2 * L * ((tp - 1) * latency + 2 * (tp - 1) / tp * T * H * d / allreduce_bw)  (tp > 1)
               tp 6, 8 (multimem): 2 * L * (2 * latency + T * H * d / allreduce_bw)
    overhead   step_overhead_s

``P`` is the non-embedding parameters a token goes through (the MoE active ones) and
``W(T)`` the non-embedding weights read: all dense ones and, of ``N`` routed experts with
``k`` per token, the expected share ``1 - (1 - k/N)^T`` that ``T`` tokens activate (each
token picks ``k`` distinct experts, uniformly: an expert escapes one token with
probability ``1 - k/N``, all ``T`` with its ``T``-th power), read at ``moe_efficiency`` of
the dense weights' rate (fused-MoE kernels stream their weights less well). Weight bytes
are per part: the model's ``weight_dtype`` (fp8: one byte; mxfp4: the experts in 4.25
bits), embeddings and LM head in 16 bits; FP8 weights run their GEMMs at
``FP8_GEMM_SPEEDUP`` times the BF16 rate (Hopper's FP8 tensor cores). Sliding-window
layers attend to at most ``window`` keys per query and read at most ``window`` tokens'
KV per request.

The all-reduce is the textbook ring's cost (latency per step of its ``2 (tp - 1)``, bytes
per GPU on the wire): ``latency`` is one all-reduce's fixed cost between two GPUs, and each
further GPU adds as much. Published H100 microbenchmarks of the kernels vLLM v0.15.1 picks
for decode-sized tensors (0.5-4 MiB: its custom all-reduce, one-stage at TP 2 and two-stage
at TP 4, inside CUDA graphs) put the fixed part at about 4.4 us at TP 2 and 12.8 us at TP 4
and the bus bandwidth at about 200 GB/s, not NCCL's 370 GB/s for large messages
(docs/accuracy.md, "The all-reduce"). At TP 6 and 8 on Hopper and Blackwell (capabilities
9.0 and 10.0) vLLM v0.15.1 sends decode-sized tensors through torch symmetric memory's
multimem all-reduce (its custom all-reduce stops at 512 and 256 KiB there): the NVSwitch
reduces and multicasts, so the fixed part stops growing with the GPUs (two hops, the
switch's way in and out, whatever ``tp``) and the time grows as the tensor's bytes over the
same bandwidth. The same H100 benchmark at TP 6 (13-31 us for 0.5-4 MiB) and vLLM PR
42324's SM 9.0 multimem rows (11-27 us) fit that within 3 us with the 4.4-us hop; the ring
would charge five to seven hops.

Three costs scale with requests rather than tokens: ``attention_seq_layer_s`` per request
and layer (what an attention kernel does for each request whatever its KV bytes: its page
table and query loads, the split-KV combine; without it a fit on grouped-query models
lowers ``decode_attention_efficiency`` to carry those costs and then over-charges a model
with large KV per token), ``seq_overhead_s`` per request scheduled
in a step (input preparation, sampling, detokenizing and streaming its token) and
``request_overhead_s`` once per request outside the engine (the client's HTTP round trip
and the server's tokenizer), which ``kvsim accuracy`` adds to each request's TTFT and
E2E; a trace's arrivals are the engine's, so ``kvsim simulate`` does not. The LM
head runs on one row per scheduled request, finished prompt or not: vLLM 0.33 computes
logits at ``query_start_loc[1:] - 1`` for every request and drops the partial prefills'
samples (``v1/worker/gpu_model_runner.py``), so it grows with requests, not prompt tokens.
Decode attention reads the KV of each decoding request's context; prefill attention
computes its (query, key) pairs. An empty step takes no time.

The coefficients come from a profile, ``{"kind": "phases", "gpu": NAME, ...}``: the shipped
ones (``kvsim/data/compute_phases_<gpu>.json``, every number with its ``sources`` entry)
or one ``kvsim calibrate-compute`` measured. A profile naming a shipped GPU may give only
the numbers it changes; the rest come from the shipped profile.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from kvsim.core.errors import InputError
from kvsim.engine.compute_file import NUMBERS, OPTIONAL, PhasesProfileFile
from kvsim.engine.step_batch import StepBatch
from kvsim.options.schema import load
from kvsim.specs.models import ModelSpec

KIND = "phases"
#: FP8 tensor-core GEMMs against BF16 on Hopper (H100 datasheet: 3,958 vs 1,979 TFLOPS
#: with sparsity); an assumption on other GPUs
FP8_GEMM_SPEEDUP = 2.0
PHASES = ("gemm", "attention_prefill", "attention_decode", "lm_head", "all_reduce", "overhead")
_ZERO_PARTS = (0.0,) * len(PHASES)
#: GPU presets whose vLLM v0.15.1 all-reduce at :data:`MULTIMEM_TP` is symmetric memory's
#: multimem (``SYMM_MEM_ALL_REDUCE_MAX_SIZES`` has capabilities 9.0 and 10.0, and both list
#: 6 and 8 in ``_WORLD_SIZES_MULTIMEM``); every other GPU and TP degree takes the ring
MULTIMEM_GPUS = frozenset({"h100", "h200", "gh200", "b200"})
MULTIMEM_TP = frozenset({6, 8})


@dataclass(frozen=True)
class PhaseProfile:
    """The coefficients of the per-phase model on one GPU type, with where each comes from."""

    gpu: str
    peak_flops: float  # dense BF16 FLOP/s
    hbm_bytes_per_s: float
    gemm_efficiency: float  # of peak_flops: GEMMs (and the LM head) when compute-bound
    weight_bandwidth_efficiency: float  # of hbm: GEMMs reading their weights when memory-bound
    prefill_attention_efficiency: float  # of peak_flops: attention over (query, key) pairs
    decode_attention_efficiency: float  # of hbm: attention reading the KV cache
    allreduce_bytes_per_s: float  # bus bandwidth of a decode-sized all-reduce between TP workers
    allreduce_latency_s: float  # fixed cost of one all-reduce between two GPUs, x (tp - 1)
    step_overhead_s: float  # fixed cost of one forward pass (launches, sampling)
    seq_overhead_s: float = 0.0  # per request scheduled in a step
    moe_efficiency: float = 1.0  # routed experts' weight reads, of weight_bandwidth
    request_overhead_s: float = 0.0  # once per request, outside the engine (client path)
    attention_seq_layer_s: float = 0.0  # attention's fixed cost per request and layer
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    provenance: Mapping[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def from_dict(cls, data: Any, source: str = "compute profile") -> PhaseProfile:
        """A ``"kind": "phases"`` profile, checked by :class:`PhasesProfileFile`; numbers it
        leaves out come from the shipped profile of the GPU it names (an error when there
        is none)."""
        f = load(PhasesProfileFile, data, source=source)
        gpu = f.gpu.strip().lower()
        values, sources = f.given(), dict(f.sources)
        missing = [k for k in NUMBERS if k not in values]
        if missing:
            base = shipped_profile(gpu)
            if base is None and all(k in OPTIONAL for k in missing):
                values.update({k: OPTIONAL[k] for k in missing})
            elif base is None:
                raise InputError(
                    f"missing {', '.join(missing)} (no profile ships for gpu {gpu!r} to "
                    f"take them from; shipped: {', '.join(shipped_gpus())})",
                    source=source,
                )
            else:
                values = {**{k: getattr(base, k) for k in missing}, **values}
                sources = {**{k: base.sources.get(k, "") for k in missing}, **sources}
        return cls(gpu=gpu, sources=sources, provenance=f.provenance, **values)

    def to_dict(self) -> dict[str, Any]:
        """The profile JSON: what :meth:`from_dict` reads back."""
        out: dict[str, Any] = {"kind": KIND, "gpu": self.gpu}
        out.update({k: getattr(self, k) for k in NUMBERS})
        out["sources"] = dict(self.sources)
        if self.provenance is not None:
            out["provenance"] = dict(self.provenance)
        return out

    def to_json(self, **extra: Any) -> str:
        return json.dumps({**self.to_dict(), **extra}, indent=2) + "\n"


_DATA = "data"
_PREFIX, _SUFFIX = "compute_phases_", ".json"


def shipped_gpus() -> list[str]:
    """GPU presets that ship a phases profile (``kvsim/data/compute_phases_<gpu>.json``)."""
    folder = resources.files("kvsim").joinpath(_DATA)
    names = (p.name for p in folder.iterdir() if p.is_file())
    return sorted(
        n[len(_PREFIX) : -len(_SUFFIX)]
        for n in names
        if n.startswith(_PREFIX) and n.endswith(_SUFFIX)
    )


@functools.cache
def shipped_profile(gpu: str) -> PhaseProfile | None:
    """The phases profile kvsim ships for ``gpu``, or None."""
    name = f"{_PREFIX}{gpu.strip().lower()}{_SUFFIX}"
    path = resources.files("kvsim").joinpath(_DATA).joinpath(name)
    if not path.is_file():
        return None
    from kvsim.core.io import parse_json

    where = f"kvsim/{_DATA}/{name}"
    return PhaseProfile.from_dict(parse_json(path.read_text(encoding="utf-8"), where), where)


class PhaseCompute:
    """Callable step-time model: one model on one GPU type at tensor parallel ``tp``."""

    def __init__(
        self, model: ModelSpec, profile: PhaseProfile, tp: int = 1, dtype_bytes: int | None = None
    ) -> None:
        if tp < 1:
            raise InputError(f"--tp must be positive, got {tp}")
        self.model, self.profile, self.tp = model, profile, tp
        hidden = model.hidden_size or model.num_attention_heads * model.head_dim
        lm_params = float(model.vocab_size * hidden)  # 0 when the vocabulary is unknown
        embeddings = model.embedding_params
        total = model.num_params - embeddings
        active = model.active_params - embeddings
        if active <= 0:
            raise InputError(
                f"{model.name}: its active parameters ({model.active_params:g}) must exceed "
                f"its embeddings ({embeddings:g})"
            )
        if total < active:
            raise InputError(f"{model.name}: active parameters exceed the total")
        k, n = model.experts_per_token, model.num_experts
        self._experts = model.routed_expert_params if active < total else 0.0
        self._share = k / n if self._experts and 0 < k < n else 0.0
        if not self._share:
            self._experts = 0.0
        self._dense = total - self._experts
        self._total, self._active = total, active
        # bytes per weight: one size for all when dtype_bytes is given (callers before dtypes)
        dense_b, expert_b, emb_b = (
            (model.weight_element_bytes(part) for part in ("dense", "expert", "embedding"))
            if dtype_bytes is None
            else (float(dtype_bytes),) * 3
        )
        self._dense_b, self._expert_b, self._emb_b = dense_b, expert_b, emb_b
        p = profile
        flops = p.peak_flops
        hbm = p.hbm_bytes_per_s
        self._act_b = float(model.default_dtype_bytes)  # activations on the all-reduce wire
        self._hidden = hidden
        # one all-reduce: hops x latency + share x bytes / bandwidth (module docstring)
        if tp in MULTIMEM_TP and p.gpu in MULTIMEM_GPUS:
            self._ar_hops, self._ar_share = 2.0, 1.0
        else:
            self._ar_hops, self._ar_share = float(tp - 1), 2.0 * (tp - 1) / tp
        speedup = FP8_GEMM_SPEEDUP if model.weight_dtype == "fp8" and dtype_bytes is None else 1
        self._gemm_flops = flops * p.gemm_efficiency * speedup
        self._lm_flops = flops * p.gemm_efficiency
        self._weight_bw = hbm * p.weight_bandwidth_efficiency
        self._expert_bw = self._weight_bw * p.moe_efficiency
        self._attn_flops = flops * p.prefill_attention_efficiency
        self._kv_bw = hbm * p.decode_attention_efficiency
        dim = model.kv_lora_rank + model.qk_rope_head_dim if model.is_mla else model.head_dim
        self._flops_per_pair = 4.0 * model.num_layers * model.num_attention_heads * dim / tp
        self._kv_bytes_per_token = model.kv_bytes_per_token(tp=tp)  # the KV cache's dtype
        self._lm_params = lm_params / tp
        self._window = model.sliding_window or 0
        self._full_share = model.full_attention_layers / model.num_layers if self._window else 1.0
        self._seq_layers = model.num_layers * p.attention_seq_layer_s

    def weight_bytes(self, tokens: int) -> float:
        """Non-embedding weight bytes one worker reads for ``tokens`` tokens: all dense
        weights and the expected share of routed experts the tokens activate (uniform
        routing); an MoE without expert counts reads at most ``active x tokens``."""
        dense, experts = self._weight_parts(tokens)
        return (dense * self._dense_b + experts * self._expert_b) / self.tp

    def expected_experts_touched(self, tokens: int) -> float:
        """Expected distinct routed experts per layer ``tokens`` tokens activate (uniform
        routing, ``k`` distinct experts per token): ``N (1 - (1 - k/N)^T)``."""
        if not self._share:
            return 0.0
        n = self.model.num_experts
        return n * (1.0 - (1.0 - self._share) ** tokens)

    def _weight_parts(self, tokens: int) -> tuple[float, float]:
        """``(dense, routed expert)`` parameters read for ``tokens`` tokens."""
        if self._share:
            hit = 1.0 - (1.0 - self._share) ** tokens
            return self._dense, self._experts * hit
        if self._active < self._total:
            return min(self._total, self._active * max(1, tokens)), 0.0
        return self._total, 0.0

    def phases(self, batch: StepBatch) -> dict[str, float]:
        """Seconds of each phase of ``batch`` (all zero for an empty step)."""
        return dict(zip(PHASES, self._parts(batch), strict=True))

    def _parts(self, batch: StepBatch) -> tuple[float, ...]:
        """The phases' seconds in :data:`PHASES` order."""
        tokens = batch.prefill_tokens + batch.decode_tokens
        if tokens <= 0:
            return _ZERO_PARTS
        gemm, lm_head, all_reduce, overhead = self._parts_of_shape(tokens, batch.num_seqs)
        decode_ctx = batch.decode_context
        decode_pairs = decode_ctx + batch.decode_tokens
        prefill_pairs = max(0.0, batch.attention_pairs - decode_pairs)
        prefill_read = max(0, batch.context_tokens - decode_ctx) + batch.prefill_tokens
        return (
            gemm,
            self._layers_attention(
                prefill_pairs, prefill_read, batch.prefill_tokens, batch.num_prefill_seqs
            ),
            self._layers_attention(
                decode_pairs, decode_pairs, batch.decode_tokens, batch.decode_tokens
            ),
            lm_head,
            all_reduce,
            overhead,
        )

    def _parts_of_shape(self, tokens: int, rows: int) -> tuple[float, float, float, float]:
        """``(gemm, lm_head, all_reduce, overhead)``: the phases that depend only on the
        step's tokens and sequences."""
        p = self.profile
        dense, experts = self._weight_parts(tokens)
        gemm = max(
            2.0 * self._active * tokens / self.tp / self._gemm_flops,
            dense * self._dense_b / self.tp / self._weight_bw
            + experts * self._expert_b / self.tp / self._expert_bw,
        )
        lm_head = (
            max(
                2.0 * self._lm_params * rows / self._lm_flops,
                self._lm_params * self._emb_b / self._weight_bw,
            )
            if rows > 0 and self._lm_params > 0
            else 0.0
        )
        all_reduce = 0.0
        if self.tp > 1:
            wire = self._ar_share * tokens * self._hidden * self._act_b
            fixed = self._ar_hops * p.allreduce_latency_s
            all_reduce = 2 * self.model.num_layers * (fixed + wire / p.allreduce_bytes_per_s)
        return gemm, lm_head, all_reduce, p.step_overhead_s + p.seq_overhead_s * rows

    def _layers_attention(self, pairs: float, kv_tokens: float, queries: int, seqs: int) -> float:
        """Attention of all layers: full ones over ``pairs`` reading ``kv_tokens``; sliding
        ones over at most ``window`` keys per query and ``window`` tokens per request; and
        each layer's fixed cost for each of the ``seqs`` requests."""
        fixed = seqs * self._seq_layers if pairs > 0 else 0.0
        full = self._attention(pairs, kv_tokens) * self._full_share
        if self._full_share >= 1.0:
            return full + fixed
        w = self._window
        sliding = self._attention(min(pairs, queries * w), min(kv_tokens, queries + seqs * w))
        return full + sliding * (1.0 - self._full_share) + fixed

    def _attention(self, pairs: float, kv_tokens: float) -> float:
        """Attention over ``pairs`` (query, key) pairs reading ``kv_tokens`` tokens' KV."""
        if pairs <= 0:
            return 0.0
        return max(
            self._flops_per_pair * pairs / self._attn_flops,
            self._kv_bytes_per_token * kv_tokens / self._kv_bw,
        )

    def __call__(self, batch: StepBatch) -> float:
        return sum(self._parts(batch))

    def decode_seconds(self, seqs: int) -> Callable[[int], float]:
        """The seconds of a decode-only step of ``seqs`` requests, one token each, as a
        function of the tokens they read (``context``; they attend over ``context + seqs``
        pairs): the same float, bit for bit, as calling this model on that batch
        (:func:`kvsim.engine.quiet_decode.quiet_batch`), with what depends only on
        ``seqs`` computed once. Quiet decode runs time thousands of such steps a run."""
        gemm, lm_head, all_reduce, overhead = self._parts_of_shape(seqs, seqs)
        prefill = self._layers_attention(0.0, 0, 0, 0)
        attention = self._layers_attention

        def seconds(context: int) -> float:
            pairs = context + seqs
            return sum(
                (gemm, prefill, attention(pairs, pairs, seqs, seqs), lm_head, all_reduce, overhead)
            )

        return seconds
