"""A secondary tier as the run sees it once its configuration is checked: frozen
:class:`TierSpec` and :class:`BackpressureSpec` values (plain dataclasses, importable
without the schema library, like :class:`kvsim.options.config.CacheConfig`), and the
constants they are read with. :mod:`kvsim.options.tiers` checks a user's configuration
(vLLM's ``secondary_tiers`` JSON, ``--tier``) and builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.core.units import human_bytes

__all__ = [
    "ASYNC_LOOKUP_TIERS",
    "DEFAULT_ALPHA",
    "DEFAULT_COOLDOWN_S",
    "DEFAULT_DECAY_HALF_LIFE_S",
    "DEFAULT_FAILURE_THRESHOLD",
    "DEFAULT_WARMUP_COMPLETIONS",
    "LOCAL_WATER_S",
    "NETWORK_WATER_S",
    "TIERING_SPEC_NAME",
    "BackpressureSpec",
    "TierSpec",
    "describe_tier",
]

#: the ``spec_name`` that makes vLLM read ``secondary_tiers``
TIERING_SPEC_NAME = "TieringOffloadingSpec"
#: tiers whose existence checks answer a step later (vLLM's ``AsyncLookupManager``)
ASYNC_LOOKUP_TIERS = frozenset({"fs", "obj"})

# vLLM's EMABackpressureDetector defaults (seconds per MiB of store latency)
LOCAL_WATER_S = (0.010, 0.002)
NETWORK_WATER_S = (0.050, 0.010)
DEFAULT_ALPHA = 0.15
DEFAULT_WARMUP_COMPLETIONS = 10
DEFAULT_DECAY_HALF_LIFE_S = 2.0
DEFAULT_COOLDOWN_S = 1.0
DEFAULT_FAILURE_THRESHOLD = 3


@dataclass(frozen=True)
class BackpressureSpec:
    """One tier's back-pressure detector and drop policy, vLLM's defaults filled in."""

    detector: str = "EMABackpressureDetector"
    policy: str = "ThrottledDropPolicy"
    high_water_s: float = LOCAL_WATER_S[0]
    low_water_s: float = LOCAL_WATER_S[1]
    alpha: float = DEFAULT_ALPHA
    warmup_completions: int = DEFAULT_WARMUP_COMPLETIONS
    decay_half_life_s: float = DEFAULT_DECAY_HALF_LIFE_S
    cooldown_s: float = DEFAULT_COOLDOWN_S
    failure_threshold: int | None = None


@dataclass(frozen=True)
class TierSpec:
    """One secondary tier, in configuration order (its index is its place there)."""

    type: str
    locality: str | None = None
    backpressure: BackpressureSpec | None = None
    capacity_bytes: int | None = None  # beyond vLLM
    capacity_chunks: int | None = None  # beyond vLLM
    eviction_policy: str | None = None  # beyond vLLM; "lru" when a capacity is given
    device: str | None = None  # timed mode: a device preset or JSON path (None: the type's)
    load_rule: str | None = None  # beyond vLLM: "pays-off", or None (vLLM's: always load)
    n_read_threads: int | None = None  # vLLM's fs n_read_threads / obj io_threads
    n_write_threads: int | None = None  # vLLM's fs n_write_threads / obj io_threads

    @property
    def bounded(self) -> bool:
        return self.capacity_bytes is not None or self.capacity_chunks is not None

    @property
    def async_lookup(self) -> bool:
        return self.type in ASYNC_LOOKUP_TIERS


def describe_tier(spec: TierSpec, index: int) -> str:
    """``1:fs``, vLLM's metric label of the tier, with kvsim's capacity when it has one."""
    label = f"{index + 1}:{spec.type}"
    if spec.capacity_chunks is not None:
        return f"{label} ({spec.capacity_chunks} chunks, {spec.eviction_policy}; beyond vLLM)"
    if spec.capacity_bytes is not None:
        size = human_bytes(spec.capacity_bytes)
        return f"{label} ({size}, {spec.eviction_policy}; beyond vLLM)"
    return label
