"""A :class:`kvsim.specs.models.ModelSpec` from a Hugging Face ``config.json``, so ``--model``
takes the very file ``vllm serve`` reads, for models kvsim has no preset of.

KV geometry, as vLLM derives it:

- layers ``num_hidden_layers``; KV heads ``num_key_value_heads`` (absent: one per attention
  head, as in HF's MHA models); ``head_dim`` (absent or null: ``hidden_size //
  num_attention_heads``);
- MLA (DeepSeek-V2/V3, Kimi K2): ``kv_lora_rank`` set -> one latent of ``kv_lora_rank +
  qk_rope_head_dim`` elements per token and layer;
- dtype ``torch_dtype`` (or transformers 5's ``dtype``): bfloat16 / float16, and float32 as
  vLLM's ``--dtype auto`` serves it, downcast to 16 bits; absent: 16 bits likewise.

A multimodal config's language model (``text_config``) is used when the top level has no
layers. Parameter counts (weights for the timed engine's GPU memory and roofline) are
estimated from the shapes: embeddings (and an untied LM head), attention projections (MLA's
low-rank ones), gated MLPs, and MoE experts (routed, shared, router; DeepSeek's
``first_k_dense_replace`` dense layers), without norms and biases (under 0.1 %).

Also read: ``quantization_config.quant_method`` ``fp8`` or ``mxfp4`` (the weights' storage;
another method is an error rather than a silent 16-bit sizing), ``sliding_window`` (unless
``use_sliding_window`` is false, as Qwen's configs say) over the layers ``layer_types``
marks ``sliding_attention`` (no ``layer_types``: all layers), and the model's length as
vLLM 0.33 derives its ``max_model_len`` (:func:`max_model_lens`). The CPU tier still stores
every layer per token.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.io import read_json

__all__ = [
    "max_model_lens",
    "model_fields_from_hf_config",
    "model_fields_from_mapping",
    "read_hf_config",
]

#: quantization_config.quant_method -> kvsim's weight dtype (kvsim.specs.models.WEIGHT_DTYPES)
_QUANT_METHODS = {"fp8": "fp8", "mxfp4": "mxfp4"}

#: config dtype -> bytes per element vLLM serves it in (float32 is downcast by --dtype auto)
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 2, "float": 2}


def read_hf_config(path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """``(file, mapping)`` of a ``config.json`` given as the file or its folder."""
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise InputError("no config.json in this folder", source=path)
    data = read_json(file)
    if not isinstance(data, dict):
        raise InputError("a Hugging Face config.json must be a JSON object", source=file)
    return file, data


class _Fields:
    """Typed reads of one config mapping; a missing or wrong field is one line naming the
    file and the key."""

    def __init__(self, data: Mapping[str, Any], source: str):
        self.data = data
        self.source = source

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, key: str, default: int | None = None, low: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise InputError(f"missing key {key!r}", source=self.source)
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(
                f"{key} must be an integer >= {low}, got {value!r}", source=self.source
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise InputError(f"{key} must be true or false, got {value!r}", source=self.source)
        return value

    def dtype_bytes(self) -> int:
        key = "torch_dtype" if "torch_dtype" in self.data else "dtype"
        value = self.data.get(key)
        if value is None:
            return 2
        if not isinstance(value, str) or value.strip().lower() not in _DTYPE_BYTES:
            known = ", ".join(sorted(_DTYPE_BYTES))
            raise InputError(f"{key}: unknown dtype {value!r}; known: {known}", source=self.source)
        return _DTYPE_BYTES[value.strip().lower()]


#: the keys vLLM 0.33 reads a model's length from (``derive_max_model_len_and_key``): the
#: smallest one given
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
#: RoPE types whose ``factor`` vLLM does not apply to that length (their length is already
#: the scaled one, or they do not stretch it: ``_get_and_verify_max_len``)
_UNSCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
#: the length vLLM assumes for a config that gives none (with a warning)
VLLM_ASSUMED_MAX_MODEL_LEN = 2048


def _rope_parameters(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The config's RoPE parameter sets (one per layer type where nested), as transformers
    5 standardizes them for vLLM: ``rope_parameters``, else the older ``rope_scaling``
    (its ``type`` read as ``rope_type``); none: plain RoPE."""
    rope = data.get("rope_parameters") or data.get("rope_scaling")
    if not isinstance(rope, Mapping):
        return []
    if rope and all(isinstance(v, Mapping) for v in rope.values()):  # by layer type
        return [v for v in rope.values() if v]
    return [rope]


def _rope_type(rope: Mapping[str, Any]) -> Any:
    return rope.get("rope_type", rope.get("type", "default"))


def max_model_lens(data: Mapping[str, Any], source: str) -> tuple[int, int]:
    """``(longest, default)``: the ``max_model_len`` vLLM 0.33 starts with at most, and the
    one it takes when none is given, from a config (``_get_and_verify_max_len``; driven in
    ``tests/vllm/test_vllm_config_max_model_len.py``). The longest is the smallest of the
    length keys (``model_max_length`` overrides them; none: 0, no limit, and the default
    2,048, vLLM's assumption), times the
    RoPE ``factor`` of a scaling that stretches it (``linear``, ``dynamic``; not Gemma 3,
    whose length is already scaled); the default is that, or a long-RoPE model's
    ``original_max_position_embeddings``. ``data``: the text model's fields; errors name
    ``source``."""
    f = _Fields(data, source)
    lengths = [f.integer(k) for k in _LENGTH_KEYS if data.get(k) is not None]
    if data.get("model_max_length"):
        lengths = [f.integer("model_max_length")]
    if not lengths:  # vLLM then starts with any length given, and assumes 2048 otherwise
        return 0, VLLM_ASSUMED_MAX_MODEL_LEN
    longest: float = min(lengths)
    ropes = _rope_parameters(data)
    model_type = data.get("model_type")
    if ropes and "gemma3" not in (model_type if isinstance(model_type, str) else ""):
        factor: Any = 1.0
        for rope in ropes:  # the last stretching one's factor, as vLLM's loop leaves it
            if _rope_type(rope) not in _UNSCALED_ROPE:
                factor = rope.get("factor", factor)
        if factor is None:
            factor = 1.0
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
            raise InputError(
                f"rope factor must be a positive number, got {factor!r}", source=f.source
            )
        longest *= factor
    default = int(longest)
    if any(_rope_type(rope) == "longrope" for rope in ropes):
        default = f.integer("original_max_position_embeddings", default)
    return int(longest), default


def _language_model(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The text model's fields: the top level, or ``text_config`` of a multimodal config
    (which inherits the top level's dtype)."""
    if "num_hidden_layers" in data or "text_config" not in data:
        return data
    text = data["text_config"]
    if not isinstance(text, dict):
        raise InputError("text_config must be an object", source=source)
    inherited = {k: data[k] for k in ("torch_dtype", "dtype") if k in data and k not in text}
    return {**inherited, **text}


def _attention_params(f: _Fields, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Weights of one layer's attention projections (q, k, v, o; MLA's low-rank ones)."""
    if not f.has("kv_lora_rank"):
        return hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    kv_rank, rope = f.integer("kv_lora_rank"), f.integer("qk_rope_head_dim")
    nope = f.integer("qk_nope_head_dim", 0, low=0)
    v_dim = f.integer("v_head_dim", nope or head_dim)
    q_dim = heads * (nope + rope)
    q = (
        hidden * f.integer("q_lora_rank") + f.integer("q_lora_rank") * q_dim
        if f.has("q_lora_rank")
        else hidden * q_dim
    )
    kv = hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
    return q + kv + heads * v_dim * hidden


def _mlp_params(f: _Fields, hidden: int, layers: int) -> tuple[int, int, int, int, int]:
    """``(total, active, routed, experts, experts_per_token)`` of all layers' gated MLPs
    (``routed``: the routed experts' weights)."""
    dense = 3 * hidden * f.integer("intermediate_size")
    experts_key = next(
        (k for k in ("n_routed_experts", "num_local_experts", "num_experts") if f.has(k)), None
    )
    if experts_key is None:
        return dense * layers, dense * layers, 0, 0, 0
    experts = f.integer(experts_key)
    top_k_key = "num_experts_per_tok" if f.has("num_experts_per_tok") else "experts_per_token"
    top_k = f.integer(top_k_key)
    expert = 3 * hidden * f.integer("moe_intermediate_size", f.integer("intermediate_size"))
    shared = f.integer("n_shared_experts", 0, low=0) * expert
    if f.has("shared_expert_intermediate_size"):  # Qwen-MoE: one shared expert of its own size
        shared += 3 * hidden * f.integer("shared_expert_intermediate_size", low=0)
    router = hidden * experts
    dense_layers = min(layers, f.integer("first_k_dense_replace", 0, low=0))
    moe_layers = layers - dense_layers
    total = dense * dense_layers + moe_layers * (experts * expert + shared + router)
    active = dense * dense_layers + moe_layers * (top_k * expert + shared + router)
    return total, active, moe_layers * experts * expert, experts, top_k


def _weight_dtype(f: _Fields) -> str:
    """The weights' storage from ``quantization_config`` (none: the model's dtype)."""
    q = f.data.get("quantization_config")
    if q is None:
        return "auto"
    method = q.get("quant_method") if isinstance(q, dict) else None
    if not isinstance(method, str) or method.strip().lower() not in _QUANT_METHODS:
        raise InputError(
            f"quantization_config.quant_method {method!r}: kvsim models "
            f"{', '.join(_QUANT_METHODS)} weights (or none)",
            source=f.source,
        )
    return _QUANT_METHODS[method.strip().lower()]


def _sliding(f: _Fields, layers: int) -> tuple[int | None, int | None]:
    """``(sliding_window, sliding layers)``; ``(None, None)`` for full attention only."""
    if not f.has("sliding_window") or f.data.get("use_sliding_window") is False:
        return None, None
    window = f.integer("sliding_window")
    types = f.data.get("layer_types")
    if types is None:
        return window, None
    if not isinstance(types, list) or len(types) != layers:
        raise InputError(
            f"layer_types must list one type per layer ({layers}), got {types!r}",
            source=f.source,
        )
    sliding = sum(1 for t in types if t == "sliding_attention")
    return (window, sliding) if sliding else (None, None)


def model_fields_from_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The :class:`kvsim.specs.models.ModelSpec` fields a Hugging Face ``config.json``
    (file or folder) describes (``get_model`` builds the spec: this module needs no import
    of it); its name is the path as given, so summaries say which file sized the run."""
    file, raw = read_hf_config(path)
    return model_fields_from_mapping(raw, os.fspath(path), file)


def model_fields_from_mapping(raw: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    """The spec fields of a ``config.json``'s mapping ``raw``, named ``name``; errors name
    ``source``."""
    file = source
    f = _Fields(_language_model(raw, file), file)
    layers = f.integer("num_hidden_layers")
    heads = f.integer("num_attention_heads")
    kv_heads = f.integer("num_key_value_heads", heads)
    hidden = f.integer("hidden_size")
    head_dim = f.integer("head_dim", hidden // heads)
    if head_dim < 1:  # derived: an explicit head_dim below 1 is refused by f.integer
        raise InputError(
            f"hidden_size {hidden} // num_attention_heads {heads} gives head_dim 0; give head_dim",
            source=file,
        )
    vocab = f.integer("vocab_size")
    tied = f.flag("tie_word_embeddings", False)
    mla = f.has("kv_lora_rank")
    if not mla and heads % kv_heads:  # each KV head serves a whole group of query heads
        raise InputError(
            f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}",
            source=file,
        )
    kv_rank = f.integer("kv_lora_rank") if mla else 0
    rope = f.integer("qk_rope_head_dim") if mla else 0
    attention = _attention_params(f, hidden, heads, kv_heads, head_dim)
    mlp_total, mlp_active, routed, experts, top_k = _mlp_params(f, hidden, layers)
    window, sliding_layers = _sliding(f, layers)
    longest, default = max_model_lens(f.data, file)
    embeddings = vocab * hidden * (1 if tied else 2)
    total = embeddings + layers * attention + mlp_total
    active = embeddings + layers * attention + mlp_active
    if not (math.isfinite(total) and total > 0):
        raise InputError("the shapes give no parameters", source=file)
    return dict(
        name=name,
        num_layers=layers,
        num_kv_heads=1 if mla else kv_heads,
        head_dim=kv_rank + rope if mla else head_dim,
        num_attention_heads=heads,
        num_params=float(total),
        active_params=float(active),
        is_mla=mla,
        kv_lora_rank=kv_rank,
        qk_rope_head_dim=rope,
        default_dtype_bytes=f.dtype_bytes(),
        hidden_size=hidden,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        num_experts=experts,
        experts_per_token=top_k,
        weight_dtype=_weight_dtype(f),
        expert_params=float(routed),
        sliding_window=window,
        sliding_window_layers=sliding_layers,
        derived_max_model_len=longest,
        default_max_model_len=default,
    )
