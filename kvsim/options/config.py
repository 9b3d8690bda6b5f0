"""A run's resolved configuration (:class:`CacheConfig`): what the manager, cache mode,
the timed engine and the tiers read. Plain frozen values, importable without the schema
library, so the core (and ``real.gpu_check`` on a bare GPU image) needs only the standard
library here. :class:`kvsim.options.offload.OffloadOptions` resolves into it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvsim.core.keys import KeyLayout
from kvsim.core.units import GIB
from kvsim.options.tier_spec import TierSpec
from kvsim.specs.models import ModelSpec

__all__ = [
    "THRESHOLD_FILTERS_FROM",
    "CacheConfig",
    "applied_store_threshold",
    "resolve_admission",
]

#: vLLM's ``store_threshold`` filters offers from this value on (below it: every offer is
#: stored); :func:`resolve_admission` is the one place that reads it
THRESHOLD_FILTERS_FROM = 2


def resolve_admission(admission: str, store_threshold: int) -> str:
    """The admission rule a run uses: vLLM's ``store_threshold >= 2`` turns the default
    ``always`` into the threshold rule. The one place that decides it."""
    if admission.lower() == "always" and store_threshold >= THRESHOLD_FILTERS_FROM:
        return "threshold"
    return admission


def applied_store_threshold(admission: str, store_threshold: int) -> int:
    """The ``store_threshold`` a run applies, for its summary: ``threshold:N``'s N, the
    threshold rule's least (2) when none was given, else ``store_threshold`` as given."""
    name, _, arg = resolve_admission(admission, store_threshold).partition(":")
    if name.lower() != "threshold":
        return store_threshold
    if arg:
        return int(arg)
    return max(store_threshold, THRESHOLD_FILTERS_FROM)


@dataclass(frozen=True)
class CacheConfig:
    """Everything cache-mode replay needs, resolved and validated."""

    num_chunks: int
    block_tokens: int
    chunk_tokens: int
    gpu_blocks: int = 0
    policy: str = "lru"
    policy_module: str | None = None
    admission: str = "always"
    store_threshold: int = 0
    max_tracker_size: int = 64_000
    chunk_bytes: int | None = None
    model: str | None = None
    seed: int = 0
    prefill_chunk_tokens: int | None = None
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype the chunk bytes were sized with
    secondary_tiers: tuple[TierSpec, ...] = ()  # behind the CPU tier (kvsim.tiering)
    #: ``model`` resolved, with its KV cache in ``kv_cache_dtype``: given by
    #: :meth:`OffloadOptions.resolve`, looked up here for a config built by hand
    model_spec: ModelSpec | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "admission", resolve_admission(self.admission, self.store_threshold)
        )
        spec = self.model_spec
        if self.model is None:
            spec = None
        elif spec is None or spec.name != self.model:  # by hand, or replace(model=...)
            from kvsim.specs.models import resolve_model

            spec = resolve_model(self.model, self.kv_cache_dtype)
        elif spec.kv_cache_dtype != self.kv_cache_dtype.strip().lower():
            spec = spec.with_kv_cache_dtype(self.kv_cache_dtype)
        object.__setattr__(self, "model_spec", spec)

    @property
    def layout(self) -> KeyLayout:
        return KeyLayout(self.block_tokens, self.chunk_tokens)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as plain values (the model by its name)."""
        out = asdict(self)
        del out["model_spec"]
        return out

    def capacity_summary(self, offload: bool = True) -> dict[str, Any]:
        """The CPU tier in the units memory is bought in, for a run's summary: the model,
        the KV dtype, KV bytes per token (all workers' copies), and ``cpu_bytes`` /
        ``cpu_gib``, the tier as vLLM allocates it (``num_chunks`` rows; at most the
        ``--cpu-gib`` asked for). Without a model the byte figures are None; without
        offloading they are 0."""
        from kvsim.specs.sizing import row_bytes

        out: dict[str, Any] = {"model": self.model, "kv_cache_dtype": self.kv_cache_dtype}
        chunk = self.chunk_bytes
        if chunk is None:
            return {**out, "kv_bytes_per_token": None, "cpu_bytes": None, "cpu_gib": None}
        size = self.num_chunks * row_bytes(chunk) if offload else 0
        return {
            **out,
            "kv_bytes_per_token": chunk // self.chunk_tokens,
            "cpu_bytes": size,
            "cpu_gib": size / GIB,
        }
