"""KV-cache geometry and compute shape of well-known models.

The numbers come from the published Hugging Face ``config.json`` of each model (the newer
presets are those files' fields, read by :mod:`kvsim.specs.hf_config` as ``--model
config.json`` is: :mod:`kvsim.specs.model_configs`). Only the fields that matter for
KV-cache sizing and the step-time model are kept.

Weights: ``weight_dtype`` is how vLLM stores them (``auto``: the model's dtype; ``fp8``: one
byte per linear-layer weight, embeddings and LM head in 16 bits, as vLLM's FP8 checkpoints;
``mxfp4``: the routed experts in 4-bit blocks with one 8-bit scale per 32 (4.25 bits), the
rest in 16 bits, as gpt-oss ships). Sliding-window layers (``sliding_window`` over
``sliding_window_layers`` of the layers; None: all of them, as Mistral-7B) attend to at
most ``sliding_window`` keys and keep only that many tokens' KV on the GPU.

Dense (GQA/MHA) models store K and V for every KV head of every layer. Under tensor
parallelism each worker holds ``max(1, num_kv_heads // tp)`` heads, as vLLM does
(KV heads are replicated when ``tp`` exceeds their number).

MLA models (DeepSeek-V2/V3) store one compressed latent per token and layer of
``kv_lora_rank + qk_rope_head_dim`` elements. vLLM replicates that latent on every TP
worker, so the per-worker byte count does not shrink with ``tp``. For MLA presets,
``num_kv_heads`` is 1 and ``head_dim`` is ``kv_lora_rank + qk_rope_head_dim``, the shape of
vLLM's ``MLAAttentionSpec``.

The KV cache's element size is the model's dtype unless ``--kv-cache-dtype`` says otherwise
(vLLM's names: ``fp8`` stores one byte per element, so a token's KV bytes halve against
bf16 and the same GiB hold twice the chunks). A model is a preset name or the path of a
Hugging Face ``config.json`` (:mod:`kvsim.specs.hf_config`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from kvsim.core.errors import InputError, did_you_mean

__all__ = [
    "HF_IDS",
    "HF_IDS_SAID",
    "HF_ID_NAMES",
    "KV_CACHE_DTYPES",
    "MODELS",
    "WEIGHT_DTYPES",
    "ModelSpec",
    "get_model",
    "kv_dtype_bytes",
    "packed_kv_dtype",
    "preset_of_hf_id",
    "resolve_model",
]

#: vLLM weight storage kvsim models -> bytes per quantized weight (None: the model's dtype)
WEIGHT_DTYPES: dict[str, float | None] = {
    "auto": None,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "mxfp4": 4.25 / 8,  # 4-bit values, one E8M0 scale per 32 (OCP MX spec)
}

#: vLLM ``--kv-cache-dtype`` values kvsim models -> bytes per element (None: the model's dtype)
KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}
#: vLLM values with packed layouts or per-block scales whose bytes per token kvsim does not model
_UNMODELLED_KV_DTYPES = (
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "int8_per_token_head",
    "fp8_per_token_head",
    "int4_per_token_head",
)


def packed_kv_dtype(kv_cache_dtype: str) -> bool:
    """Whether ``kv_cache_dtype`` is a vLLM value whose packed layout kvsim does not size."""
    key = kv_cache_dtype.strip().lower()
    return key in _UNMODELLED_KV_DTYPES or key.startswith(("turboquant", "octave"))


def kv_dtype_bytes(kv_cache_dtype: str) -> int | None:
    """Bytes per KV element of a vLLM ``--kv-cache-dtype`` (None for ``auto``: the model's)."""
    if not isinstance(kv_cache_dtype, str):
        raise InputError(f"--kv-cache-dtype must be text, got {kv_cache_dtype!r}")
    key = kv_cache_dtype.strip().lower()
    if key in KV_CACHE_DTYPES:
        return KV_CACHE_DTYPES[key]
    known = ", ".join(KV_CACHE_DTYPES)
    if packed_kv_dtype(key):
        raise InputError(
            f"--kv-cache-dtype {kv_cache_dtype!r}: a packed vLLM layout kvsim does not size; "
            f"use one of {known}"
        )
    raise InputError(f"--kv-cache-dtype: unknown value {kv_cache_dtype!r}; known: {known}")


@dataclass(frozen=True)
class ModelSpec:
    """KV-cache geometry and size of one model."""

    name: str
    num_layers: int
    num_kv_heads: int  # per model (before the TP split)
    head_dim: int
    num_attention_heads: int
    num_params: float  # total parameters (weight bytes for a roofline compute model)
    active_params: float  # = num_params for dense models; active per token for MoE
    is_mla: bool = False
    kv_lora_rank: int = 0  # MLA latent size per token per layer
    qk_rope_head_dim: int = 0  # MLA rope part per token per layer
    default_dtype_bytes: int = 2
    sliding_window: int | None = None  # tokens a sliding-window layer attends to
    # what the per-phase compute model (kvsim.engine.phase_compute) needs beyond the KV
    # geometry; 0 = unknown (that model then estimates: hidden = heads x head_dim, no
    # separate LM head). Values: the models' Hugging Face config.json.
    hidden_size: int = 0
    vocab_size: int = 0
    tie_word_embeddings: bool = False  # the LM head is the input embedding (counted once)
    num_experts: int = 0  # MoE: routed experts per layer (0: dense)
    experts_per_token: int = 0  # MoE: routed experts each token activates
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype (KV_CACHE_DTYPES); auto: the model's
    weight_dtype: str = "auto"  # WEIGHT_DTYPES: how the weights are stored
    expert_params: float = 0.0  # routed-expert weights of all layers (0: derived from k/N)
    sliding_window_layers: int | None = None  # layers using sliding_window (None: all)
    # vLLM's max_model_len from the config (kvsim.specs.hf_config): the longest it starts
    # with, and the one it takes when none is given (0: the longest; both 0: unknown)
    derived_max_model_len: int = 0
    default_max_model_len: int = 0

    def __post_init__(self) -> None:
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise InputError(
                f"{self.name}: unknown weight dtype {self.weight_dtype!r}; known: "
                f"{', '.join(WEIGHT_DTYPES)}"
            )

    @property
    def embedding_params(self) -> float:
        """Input embedding plus an untied LM head (0 when the vocabulary is unknown)."""
        hidden = self.hidden_size or self.num_attention_heads * self.head_dim
        return float(self.vocab_size * hidden) * (1 if self.tie_word_embeddings else 2)

    def weight_element_bytes(self, part: str) -> float:
        """Bytes per weight of ``part``: ``embedding`` (always the model's dtype), ``dense``
        (attention, dense MLPs, shared experts, routers) or ``expert`` (routed experts)."""
        q = WEIGHT_DTYPES[self.weight_dtype]
        if part == "embedding" or q is None:
            return float(self.default_dtype_bytes)
        if self.weight_dtype == "mxfp4" and part == "dense":
            return float(self.default_dtype_bytes)  # only the experts are MXFP4 (gpt-oss)
        return float(q)

    @property
    def routed_expert_params(self) -> float:
        """Weights of the routed experts, all layers: ``expert_params``, or for an MoE preset
        without it, ``(total - active) / (1 - k/N)`` (the inactive share is ``1 - k/N``)."""
        if self.expert_params:
            return self.expert_params
        k, n = self.experts_per_token, self.num_experts
        if 0 < k < n and self.active_params < self.num_params:
            return (self.num_params - self.active_params) / (1 - k / n)
        return 0.0

    def weight_bytes(self) -> float:
        """Bytes of all weights (before the TP split): what vLLM loads onto the GPUs."""
        experts = self.routed_expert_params
        dense = self.num_params - self.embedding_params - experts
        return (
            self.embedding_params * self.weight_element_bytes("embedding")
            + dense * self.weight_element_bytes("dense")
            + experts * self.weight_element_bytes("expert")
        )

    def with_weight_dtype(self, weight_dtype: str | None) -> ModelSpec:
        """This model with its weights stored as ``weight_dtype`` (None: unchanged)."""
        if weight_dtype is None:
            return self
        return replace(self, weight_dtype=weight_dtype.strip().lower())

    @property
    def full_attention_layers(self) -> int:
        """Layers attending to the whole context."""
        if not self.sliding_window:
            return self.num_layers
        sliding = self.sliding_window_layers
        return 0 if sliding is None else self.num_layers - sliding

    def gpu_kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV bytes per token that grow with the context on one GPU worker: the full-attention
        layers' (a sliding layer keeps at most ``sliding_window`` tokens per request, which
        vLLM's hybrid allocator frees as the window moves); all layers when every one slides."""
        full = self.full_attention_layers
        layers = full if full > 0 else self.num_layers
        return layers * self.kv_bytes_per_token_per_layer(tp=tp)

    @property
    def kv_element_bytes(self) -> int:
        """Bytes per stored KV element: ``kv_cache_dtype``'s, or the model's dtype."""
        d = kv_dtype_bytes(self.kv_cache_dtype)
        return self.default_dtype_bytes if d is None else d

    def with_kv_cache_dtype(self, kv_cache_dtype: str) -> ModelSpec:
        """This model with its KV cache stored as ``kv_cache_dtype`` (checked)."""
        kv_dtype_bytes(kv_cache_dtype)
        return replace(self, kv_cache_dtype=kv_cache_dtype.strip().lower())

    def _dtype(self, dtype_bytes: int | None) -> int:
        d = self.kv_element_bytes if dtype_bytes is None else dtype_bytes
        if d <= 0:
            raise InputError(f"--dtype-bytes must be positive, got {d}")
        return int(d)

    def kv_heads_per_worker(self, tp: int = 1, name: str = "--tp") -> int:
        """KV heads one worker holds at tensor-parallel size ``tp`` (1 for MLA).

        Raises InputError for a ``tp`` vLLM refuses to start with: its query heads must
        split evenly over the workers, and its KV heads too (or, with fewer KV heads than
        workers, each replicated on the same number of workers); ``name``: the option or
        key as the caller spells it (a measurements file's ``tp``)."""
        if tp <= 0:
            raise InputError(f"{name} must be positive, got {tp}")
        heads, kv = self.num_attention_heads, self.num_kv_heads
        if heads % tp:
            raise InputError(
                f"{name} {tp}: {self.name}'s {heads} attention heads do not split evenly over "
                f"{tp} workers (vLLM refuses to start); use a tp that divides {heads}"
            )
        if self.is_mla:
            return 1
        uneven = kv > 0 and (tp % kv if tp >= kv else kv % tp) != 0
        if uneven:
            raise InputError(
                f"{name} {tp}: {self.name}'s {kv} KV heads do not split evenly over (or "
                f"replicate evenly on) {tp} workers (vLLM refuses to start)"
            )
        return max(1, kv // tp)

    def kv_bytes_per_token_per_layer(self, dtype_bytes: int | None = None, tp: int = 1) -> int:
        """Bytes of KV cache one worker stores per token and layer (``dtype_bytes=None``:
        the KV cache's element size)."""
        d = self._dtype(dtype_bytes)
        heads = self.kv_heads_per_worker(tp)  # validates tp
        if self.is_mla:
            # The latent is replicated on every TP worker: no split.
            return (self.kv_lora_rank + self.qk_rope_head_dim) * d
        return 2 * heads * self.head_dim * d

    def kv_bytes_per_token(self, dtype_bytes: int | None = None, tp: int = 1) -> int:
        """Bytes of KV cache one worker stores per token, all layers."""
        return self.num_layers * self.kv_bytes_per_token_per_layer(dtype_bytes, tp)


_PRESETS = (
    ModelSpec(
        name="llama-3.2-1b",
        num_layers=16,
        num_kv_heads=8,
        head_dim=64,
        num_attention_heads=32,
        num_params=1.24e9,
        active_params=1.24e9,
        hidden_size=2048,
        vocab_size=128256,
        tie_word_embeddings=True,
        derived_max_model_len=131072,
    ),
    ModelSpec(
        name="llama-3.1-8b",
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        num_attention_heads=32,
        num_params=8.03e9,
        active_params=8.03e9,
        hidden_size=4096,
        vocab_size=128256,
        derived_max_model_len=131072,
    ),
    ModelSpec(
        name="llama-3.1-70b",
        num_layers=80,
        num_kv_heads=8,
        head_dim=128,
        num_attention_heads=64,
        num_params=70.6e9,
        active_params=70.6e9,
        hidden_size=8192,
        vocab_size=128256,
        derived_max_model_len=131072,
    ),
    ModelSpec(
        name="qwen2.5-7b",
        num_layers=28,
        num_kv_heads=4,
        head_dim=128,
        num_attention_heads=28,
        num_params=7.6e9,
        active_params=7.6e9,
        hidden_size=3584,
        vocab_size=152064,
        derived_max_model_len=32768,
    ),
    ModelSpec(
        name="qwen3-8b",
        num_layers=36,
        num_kv_heads=8,
        head_dim=128,
        num_attention_heads=32,
        num_params=8.2e9,
        active_params=8.2e9,
        hidden_size=4096,
        vocab_size=151936,
        derived_max_model_len=40960,
    ),
    ModelSpec(
        name="deepseek-v3",
        num_layers=61,
        num_kv_heads=1,  # one shared latent (vLLM MLAAttentionSpec)
        head_dim=512 + 64,  # kv_lora_rank + qk_rope_head_dim
        num_attention_heads=128,
        num_params=671e9,
        active_params=37e9,
        is_mla=True,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        hidden_size=7168,
        vocab_size=129280,
        num_experts=256,
        experts_per_token=8,
        derived_max_model_len=163840,
        # the published checkpoint is FP8 (config.json's quantization_config, 128x128
        # blocks): 84 GB a GPU at TP 8, which fits an H200 node and not an H100 one
        weight_dtype="fp8",
    ),
)


def _from_hf_configs() -> tuple[ModelSpec, ...]:
    from kvsim.specs.hf_config import model_fields_from_mapping
    from kvsim.specs.model_configs import HF_CONFIGS, SOURCES

    return tuple(
        ModelSpec(**model_fields_from_mapping(data, name, SOURCES[name]))
        for name, data in HF_CONFIGS.items()
    )


MODELS: dict[str, ModelSpec] = {m.name: m for m in (*_PRESETS, *_from_hf_configs())}

#: the Hugging Face ids ``vllm serve`` is given for each preset: its own repository and
#: the tuned variants whose config.json gives the same spec (the Qwen2.5 base model's
#: 131,072 positions differ from the preset's, its Instruct model's 32,768 do not; the
#: base Mixtral-8x22B has the smaller vocabulary). ``tests/options/test_sizing.py`` holds
#: them to SOURCES.
HF_IDS: dict[str, tuple[str, ...]] = {
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"),
    "llama-3.1-8b": (
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-8B",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
    ),
    "llama-3.1-70b": (
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Meta-Llama-3.1-70B",
        "meta-llama/Meta-Llama-3.1-70B-Instruct",
    ),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct",),
    "qwen3-8b": ("Qwen/Qwen3-8B",),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324"),
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"),
    "codellama-34b": ("codellama/CodeLlama-34b-hf", "codellama/CodeLlama-34b-Instruct-hf"),
    "qwen3-14b": ("Qwen/Qwen3-14B",),
    "qwen3-32b": ("Qwen/Qwen3-32B",),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    "mixtral-8x22b": ("mistralai/Mixtral-8x22B-Instruct-v0.1",),
    "gpt-oss-120b": ("openai/gpt-oss-120b",),
}
_PRESET_OF_HF_ID = {hf.lower(): name for name, ids in HF_IDS.items() for hf in ids}
#: every id, as written (for the closest one to a misspelt name)
HF_ID_NAMES = tuple(hf for ids in HF_IDS.values() for hf in ids)
#: how an unknown model's error says that ids are taken
HF_IDS_SAID = " (or their Hugging Face ids, such as meta-llama/Llama-3.1-8B-Instruct)"


def preset_of_hf_id(name: str) -> str | None:
    """The preset a Hugging Face id names (case-insensitively), or None."""
    return _PRESET_OF_HF_ID.get(name.strip().lower())


def get_model(name: str | os.PathLike[str]) -> ModelSpec:
    """A preset by name (case-insensitively), the model a Hugging Face ``config.json``
    describes (a path to the file, or to a folder holding one: a local folder wins, as
    ``vllm serve`` reads it), or a preset by its Hugging Face id (``HF_IDS``)."""
    text = os.fspath(name)
    key = str(text).strip().lower()
    if key in MODELS:
        return MODELS[key]
    if os.path.exists(text):
        from kvsim.specs.hf_config import model_fields_from_hf_config

        return ModelSpec(**model_fields_from_hf_config(text))
    preset = preset_of_hf_id(key)
    if preset is not None:
        return MODELS[preset]
    if key.endswith(".json"):  # a file meant, not a name: say it is missing
        raise InputError(f"{text}: no such file (a Hugging Face config.json path)")
    known = ", ".join(sorted(MODELS))
    hint = did_you_mean(text, MODELS) or did_you_mean(text, HF_ID_NAMES)
    raise InputError(
        f"unknown model {name!r}{hint}; known: {known}{HF_IDS_SAID}, or a Hugging Face "
        "config.json path"
    )


def resolve_model(
    model: ModelSpec | str | os.PathLike[str], kv_cache_dtype: str | None = None
) -> ModelSpec:
    """The model a run sizes with: a preset, a ``config.json`` or a spec, with its KV cache
    stored as ``kv_cache_dtype`` (None or ``auto``: the model's dtype)."""
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    return spec if kv_cache_dtype is None else spec.with_kv_cache_dtype(kv_cache_dtype)
