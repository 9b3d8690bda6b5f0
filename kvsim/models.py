"""KV-cache geometry of a few well-known models.

The numbers come from the published Hugging Face ``config.json`` of each model. Only the
fields that matter for KV-cache sizing (and, later, a roofline compute model) are kept.

Dense (GQA/MHA) models store K and V for every KV head of every layer. Under tensor
parallelism each worker holds ``max(1, num_kv_heads // tp)`` heads, as vLLM does
(KV heads are replicated when ``tp`` exceeds their number).

MLA models (DeepSeek-V2/V3) store one compressed latent per token and layer of
``kv_lora_rank + qk_rope_head_dim`` elements. vLLM replicates that latent on every TP
worker, so the per-worker byte count does not shrink with ``tp``. For MLA presets,
``num_kv_heads`` is 1 and ``head_dim`` is ``kv_lora_rank + qk_rope_head_dim``, the shape of
vLLM's ``MLAAttentionSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import InputError

__all__ = ["MODELS", "ModelSpec", "get_model"]


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
    sliding_window: int | None = None  # not used by the presets; supported by sizing

    def _dtype(self, dtype_bytes: int | None) -> int:
        d = self.default_dtype_bytes if dtype_bytes is None else dtype_bytes
        if d <= 0:
            raise InputError(f"--dtype-bytes must be positive, got {d}")
        return int(d)

    def kv_heads_per_worker(self, tp: int = 1) -> int:
        """KV heads one worker holds at tensor-parallel size ``tp`` (1 for MLA)."""
        if tp <= 0:
            raise InputError(f"--tp must be positive, got {tp}")
        if self.is_mla:
            return 1
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_per_layer(self, dtype_bytes: int | None = None, tp: int = 1) -> int:
        """Bytes of KV cache one worker stores per token and layer."""
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
    ),
    ModelSpec(
        name="llama-3.1-8b",
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        num_attention_heads=32,
        num_params=8.03e9,
        active_params=8.03e9,
    ),
    ModelSpec(
        name="llama-3.1-70b",
        num_layers=80,
        num_kv_heads=8,
        head_dim=128,
        num_attention_heads=64,
        num_params=70.6e9,
        active_params=70.6e9,
    ),
    ModelSpec(
        name="qwen2.5-7b",
        num_layers=28,
        num_kv_heads=4,
        head_dim=128,
        num_attention_heads=28,
        num_params=7.6e9,
        active_params=7.6e9,
    ),
    ModelSpec(
        name="qwen3-8b",
        num_layers=36,
        num_kv_heads=8,
        head_dim=128,
        num_attention_heads=32,
        num_params=8.2e9,
        active_params=8.2e9,
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
    ),
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in _PRESETS}


def get_model(name: str) -> ModelSpec:
    """Look a preset up by name, case-insensitively."""
    key = str(name).strip().lower()
    try:
        return MODELS[key]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise InputError(f"unknown model {name!r}; known: {known}") from None
