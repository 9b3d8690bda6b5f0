"""vLLM's connector configuration, described once: ``kv_connector_extra_config`` of the
OffloadingConnector (:class:`KVConnectorExtraConfig`: the keys kvsim models, those it
accepts and ignores, vLLM 0.33's defaults) inside the full ``--kv-transfer-config``
(:class:`KVTransferConfig`), and their translation into :class:`OffloadOptions` and the
timed engine's connector knobs.

A key the user did not give is ``UNSET`` (so a translation only overrides what was given);
:meth:`KVConnectorExtraConfig.value` reads a key or vLLM's default. See
``docs/vllm-offload-semantics.md`` section 1.1 for vLLM's own table.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType, field

from kvsim.core.errors import InputError
from kvsim.core.io import parse_json, read_json
from kvsim.options.config import resolve_admission
from kvsim.options.offload import Count, NonNegative, OffloadOptions, Text
from kvsim.options.schema import Schema, load
from kvsim.options.tier_spec import TIERING_SPEC_NAME
from kvsim.options.tiers import (
    BackpressureConfig,
    TierConfig,
    refuse_unmodelled_tiers,
    tier_specs,
)

__all__ = [
    "CONNECTOR_KNOBS",
    "KVConnectorExtraConfig",
    "KVTransferConfig",
    "engine_knobs_from_vllm_config",
    "extra_config",
    "load_vllm_config",
    "options_from_vllm_config",
    "refuse_engine_knobs_in_cache_mode",
]

OFFLOADING_CONNECTOR = "OffloadingConnector"
#: where a key goes in kvsim: ``options`` (OffloadOptions), ``engine`` (timed mode only),
#: ``ignored`` (accepted, no effect on what kvsim models)
USED, ENGINE, IGNORED = "options", "engine", "ignored"
#: the connector knobs only the timed engine models
CONNECTOR_KNOBS = ("offload_prompt_only", "sync_load_budget_bytes")


class KVConnectorExtraConfig(Schema, frozen=True):
    """vLLM 0.33 OffloadingConnector's ``kv_connector_extra_config``. Unknown keys are
    errors (with the closest known key); every key not given is ``UNSET``."""

    spec_name: (
        Annotated[
            Text,
            Meta(
                description=(
                    "vLLM's offloading spec: CPUOffloadingSpec (default), or "
                    "TieringOffloadingSpec, which reads secondary_tiers."
                ),
                extra_json_schema={"default": "CPUOffloadingSpec"},
                extra={"use": IGNORED},
            ),
        ]
        | UnsetType
    ) = UNSET
    spec_module_path: (
        Annotated[
            Text,
            Meta(description="Module of an out-of-tree spec (ignored).", extra={"use": IGNORED}),
        ]
        | UnsetType
    ) = UNSET
    cpu_bytes_to_use: (
        Annotated[
            Count | Annotated[float, Meta(ge=1)],
            Meta(
                description=(
                    "Host bytes of the CPU tier over all workers (vLLM requires it; "
                    "--kv-offloading-size X gives X * 2**30)."
                ),
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    num_cpu_blocks: (
        Annotated[
            Count,
            Meta(
                description="vLLM 0.11's size key: the CPU tier in offloaded blocks.",
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    block_size: (
        Annotated[
            Count,
            Meta(
                description=(
                    "Tokens per offloaded chunk, a multiple of the GPU block size (default: "
                    "one GPU block); not with blocks_per_chunk."
                ),
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    blocks_per_chunk: (
        Annotated[
            Count,
            Meta(
                description="GPU blocks per offloaded chunk (default 1).",
                extra_json_schema={"default": 1},
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    eviction_policy: (
        Annotated[
            Text,
            Meta(
                description="lru, arc, or a class name (with cache_policy_module_path).",
                extra_json_schema={"default": "lru"},
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    cache_policy_module_path: (
        Annotated[
            Text,
            Meta(
                description="Module to import eviction_policy from when it is not registered.",
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    store_threshold: (
        Annotated[
            NonNegative,
            Meta(
                description="Offers before a chunk is stored; >= 2 enables the filter.",
                extra_json_schema={"default": 0},
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    max_tracker_size: (
        Annotated[
            Count,
            Meta(
                description="Entries of the store_threshold counter table.",
                extra_json_schema={"default": 64_000},
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    secondary_tiers: (
        Annotated[
            list[TierConfig],
            Meta(
                description=(
                    "TieringOffloadingSpec's tiers behind the CPU tier (fs, obj, example; "
                    "kvsim schema secondary-tiers)."
                ),
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    backpressure: (
        Annotated[
            BackpressureConfig,
            Meta(
                description="Back-pressure defaults for every secondary tier.",
                extra={"use": USED},
            ),
        ]
        | UnsetType
    ) = UNSET
    tier_poll_interval_s: (
        Annotated[
            float,
            Meta(
                ge=0,
                description="Poll interval of vLLM's peer-tier thread, which kvsim does not run.",
                extra={"use": IGNORED},
            ),
        ]
        | UnsetType
    ) = UNSET
    offload_prompt_only: (
        Annotated[
            bool,
            Meta(
                description=(
                    "Store prompt chunks only, never decode chunks (timed mode; cache mode "
                    "models prompts only and refuses false)."
                ),
                extra_json_schema={"default": True},
                extra={"use": ENGINE},
            ),
        ]
        | UnsetType
    ) = UNSET
    sync_load_budget_bytes: (
        Annotated[
            NonNegative,
            Meta(
                description=(
                    "Per-step, per-worker bytes of CPU hits loaded in the same step (timed "
                    "mode; cache mode refuses > 0)."
                ),
                extra_json_schema={"default": 0},
                extra={"use": ENGINE},
            ),
        ]
        | UnsetType
    ) = UNSET
    self_describing_kv_events: (
        Annotated[
            bool,
            Meta(
                description="Rich BlockStored payloads (ignored: kvsim emits no KV events).",
                extra_json_schema={"default": False},
                extra={"use": IGNORED},
            ),
        ]
        | UnsetType
    ) = UNSET
    canonical_layout: (
        Annotated[
            bool,
            Meta(
                description="Topology-free host layout (ignored: the same bytes per chunk).",
                extra_json_schema={"default": False},
                extra={"use": IGNORED},
            ),
        ]
        | UnsetType
    ) = UNSET

    def __post_init__(self) -> None:
        if self.block_size is not UNSET and self.blocks_per_chunk is not UNSET:
            raise ValueError("block_size and blocks_per_chunk cannot be combined")
        if self.cpu_bytes_to_use is not UNSET and self.num_cpu_blocks is not UNSET:
            raise ValueError("give cpu_bytes_to_use or num_cpu_blocks, not both")
        tiering = self.spec_name == TIERING_SPEC_NAME
        if self.secondary_tiers is not UNSET and not tiering:
            raise ValueError(
                f"secondary_tiers needs spec_name {TIERING_SPEC_NAME!r} (vLLM's "
                f"{self.value('spec_name')} ignores them)"
            )
        threshold = self.store_threshold if self.store_threshold is not UNSET else 0
        if tiering and resolve_admission("always", threshold) != "always":
            raise ValueError(f"store_threshold is not supported for {TIERING_SPEC_NAME}")

    def given(self) -> dict[str, Any]:
        """The keys the user gave, with their values (vLLM's JSON as it was written)."""
        return self.as_dict()

    def value(self, key: str) -> Any:
        """``key``'s value, or vLLM's default when it was not given (None: no default)."""
        got = getattr(self, key)
        return VLLM_DEFAULTS.get(key) if got is UNSET else got


#: vLLM 0.33's default of every key that has one (the JSON Schema shows them too)
VLLM_DEFAULTS: dict[str, Any] = {
    "spec_name": "CPUOffloadingSpec",
    "blocks_per_chunk": 1,
    "eviction_policy": "lru",
    "store_threshold": 0,
    "max_tracker_size": 64_000,
    "offload_prompt_only": True,
    "sync_load_budget_bytes": 0,
    "self_describing_kv_events": False,
    "canonical_layout": False,
}


class KVTransferConfig(Schema, frozen=True):
    """vLLM's ``--kv-transfer-config`` for the OffloadingConnector (what ``vllm serve
    --kv-offloading-size`` sets up, written out); the measurements files embed one."""

    kv_connector: (
        Annotated[
            Literal["OffloadingConnector"],
            Meta(description="The connector: kvsim models vLLM's OffloadingConnector."),
        ]
        | None
    ) = None
    kv_role: (
        Annotated[
            Literal["kv_producer", "kv_consumer", "kv_both"],
            Meta(description="kv_both for offloading (vLLM asks for one; kvsim does not)."),
        ]
        | None
    ) = None
    kv_connector_extra_config: Annotated[
        KVConnectorExtraConfig, Meta(description="The connector's own keys.")
    ] = field(default_factory=KVConnectorExtraConfig)
    kv_connector_module_path: (
        Annotated[str, Meta(description="Module of an out-of-tree connector (ignored).")] | None
    ) = None
    engine_id: Annotated[str, Meta(description="Engine id for KV transfers (ignored).")] | None = (
        None
    )
    kv_buffer_device: (
        Annotated[str, Meta(description="Device buffering the KV cache (ignored).")] | None
    ) = None
    kv_port: Annotated[int, Meta(ge=0, description="KV connector port (ignored).")] = 14579
    enable_permute_local_kv: Annotated[
        bool, Meta(description="HND to NHD transfer feature flag (ignored).")
    ] = False
    kv_load_failure_policy: Annotated[
        Literal["recompute", "fail"],
        Meta(description="What a failed KV load does (kvsim's loads do not fail)."),
    ] = "fail"


def extra_config(data: Any, source: str = "--vllm-config") -> KVConnectorExtraConfig:
    """``data`` as a :class:`KVConnectorExtraConfig`: a validated one as it is, a mapping
    (the extra config itself, or a whole ``--kv-transfer-config`` holding one) checked."""
    if isinstance(data, KVConnectorExtraConfig):
        return data
    if isinstance(data, KVTransferConfig):
        return data.kv_connector_extra_config
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", source=source)
    if "kv_connector_extra_config" in data or "kv_connector" in data:
        # a whole --kv-transfer-config (its connector named, its extra config maybe not)
        inner = data.get("kv_connector_extra_config", {})
        if not isinstance(inner, dict):
            raise InputError("kv_connector_extra_config must be an object", source=source)
        where = "kv_connector_extra_config.secondary_tiers"
        refuse_unmodelled_tiers(inner.get("secondary_tiers"), where, source)
        return load(KVTransferConfig, data, source=source).kv_connector_extra_config
    refuse_unmodelled_tiers(data.get("secondary_tiers"), "secondary_tiers", source)
    return load(KVConnectorExtraConfig, data, source=source)


def load_vllm_config(text_or_path: str) -> KVConnectorExtraConfig:
    """Parse ``--vllm-config``: inline JSON, or a JSON file; either the extra config itself
    or a full ``--kv-transfer-config`` object holding ``kv_connector_extra_config``."""
    source = "--vllm-config"
    if os.path.exists(text_or_path):
        source = text_or_path
        data = read_json(text_or_path)
    else:
        if text_or_path.lstrip()[:1] not in ("{", "["):  # meant as a path, not inline JSON
            raise InputError("no such file (and not inline JSON)", source=text_or_path)
        data = parse_json(text_or_path, source)
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", source=source)
    return extra_config(data, source)


def options_from_vllm_config(
    extra: KVConnectorExtraConfig | dict[str, Any],
    base: OffloadOptions | None = None,
    source: str = "--vllm-config",
) -> OffloadOptions:
    """``base`` (default: the defaults) with what vLLM's ``kv_connector_extra_config``
    says, under vLLM's defaults: the chunk is one GPU block unless ``block_size`` or
    ``blocks_per_chunk`` say otherwise; a size given here replaces ``base``'s."""
    cfg = extra_config(extra, source)
    opts = base or OffloadOptions()
    changes: dict[str, Any] = {}
    if cfg.cpu_bytes_to_use is not UNSET:
        changes.update(cpu_bytes=int(cfg.cpu_bytes_to_use), cpu_chunks=None, cpu_gib=None)
    if cfg.num_cpu_blocks is not UNSET:
        changes.update(cpu_chunks=cfg.num_cpu_blocks, cpu_bytes=None, cpu_gib=None)
    if cfg.block_size is not UNSET:
        changes["chunk_tokens"] = cfg.block_size
    else:
        changes["chunk_tokens"] = cfg.value("blocks_per_chunk") * opts.gpu_block_tokens
    for key, option in (
        ("eviction_policy", "policy"),
        ("cache_policy_module_path", "policy_module"),
        ("store_threshold", "store_threshold"),
        ("max_tracker_size", "max_tracker_size"),
    ):
        if getattr(cfg, key) is not UNSET:
            changes[option] = getattr(cfg, key)
    tiers = [] if cfg.secondary_tiers is UNSET else cfg.secondary_tiers
    defaults = None if cfg.backpressure is UNSET else cfg.backpressure
    changes["secondary_tiers"] = tier_specs(tiers, defaults, source)
    return opts.with_(**changes)


def engine_knobs_from_vllm_config(
    extra: KVConnectorExtraConfig | dict[str, Any], source: str = "--vllm-config"
) -> dict[str, Any]:
    """The connector knobs of ``kv_connector_extra_config`` that only the timed engine
    models (``offload_prompt_only``, ``sync_load_budget_bytes``), those given only (its
    ``secondary_tiers`` are read by :func:`options_from_vllm_config`, as in cache mode)."""
    cfg = extra_config(extra, source)
    return {k: getattr(cfg, k) for k in CONNECTOR_KNOBS if getattr(cfg, k) is not UNSET}


def refuse_engine_knobs_in_cache_mode(
    extra: KVConnectorExtraConfig | dict[str, Any], source: str = "--vllm-config"
) -> None:
    """Cache mode has no steps and no decode: a connector knob that would change what vLLM
    does there is an error, not a silent no-op (their defaults are accepted)."""
    knobs = engine_knobs_from_vllm_config(extra, source)
    if knobs.get("sync_load_budget_bytes", 0) > 0:
        raise InputError(
            "sync_load_budget_bytes is about timing, which cache mode does not model; use "
            "kvsim simulate",
            source=source,
        )
    if knobs.get("offload_prompt_only") is False:
        raise InputError(
            "offload_prompt_only=false stores decode chunks, which cache mode (prompts only) "
            "does not model; use kvsim simulate",
            source=source,
        )
