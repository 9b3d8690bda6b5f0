"""Secondary tiers as a user asks for them: vLLM 0.33's ``secondary_tiers`` JSON (the
``TieringOffloadingSpec`` keys of ``kv_connector_extra_config``) and the CLI shorthand
``--tier fs:capacity=2TiB``, checked and turned into frozen :class:`TierSpec` values.

This module is vocabulary only (layer 0): it validates and records. The tiers themselves
run in :mod:`kvsim.tiering`.

kvsim accepts vLLM's tier configuration as is; keys of its own, all prefixed ``kvsim_``,
go beyond vLLM (whose ``fs`` and ``obj`` tiers have no capacity limit):
``kvsim_capacity`` (bytes, or text such as ``"2TiB"``), ``kvsim_capacity_chunks`` and
``kvsim_eviction_policy`` (any kvsim eviction policy, default ``lru``); for timed mode
``kvsim_device`` (a device preset of :mod:`kvsim.tiering.devices` or a device JSON file;
it changes timing only, not what vLLM would do) and ``kvsim_load_rule`` (``pays-off``:
skip promotions that cannot beat recomputing, beyond vLLM; ``off``, the default: vLLM's).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.units import GIB, human_bytes

#: the ``spec_name`` that makes vLLM read ``secondary_tiers``
TIERING_SPEC_NAME = "TieringOffloadingSpec"

#: tier types kvsim runs -> the vLLM constructor keys each accepts (besides ``type``,
#: ``backpressure`` and the ``kvsim_`` keys)
TIER_KEYS: dict[str, frozenset[str]] = {
    "fs": frozenset(
        {"root_dir", "n_read_threads", "n_write_threads", "enable_kv_events", "locality"}
    ),
    "obj": frozenset({"store_config", "prefix", "io_threads", "enable_kv_events", "locality"}),
    "example": frozenset({"custom_param"}),
}
#: vLLM tier types that answer peer instances, which a one-instance replay cannot model
PEER_TIERS = frozenset({"p2p", "kvcr"})
#: tiers whose existence checks answer a step later (vLLM's ``AsyncLookupManager``)
ASYNC_LOOKUP_TIERS = frozenset({"fs", "obj"})
KVSIM_TIER_KEYS = frozenset(
    {
        "kvsim_capacity",
        "kvsim_capacity_chunks",
        "kvsim_eviction_policy",
        "kvsim_device",
        "kvsim_load_rule",
    }
)
#: ``kvsim_load_rule`` values: ``off`` is vLLM's behaviour, ``pays-off`` goes beyond it
LOAD_RULES = ("off", "pays-off")
#: vLLM keys that size a tier's I/O thread pools: (read threads, write threads)
_THREAD_KEYS = {
    "n_read_threads": (True, False),
    "n_write_threads": (False, True),
    "io_threads": (True, True),
}

DETECTORS = ("EMABackpressureDetector",)
DROP_POLICIES = ("ThrottledDropPolicy", "DropStorePolicy")
_VLLM_BACKPRESSURE_MODULE = "vllm.v1.kv_offload.tiering.backpressure."
_DETECTOR_NUMBERS = (
    "high_water_s",
    "low_water_s",
    "alpha",
    "warmup_completions",
    "decay_half_life_s",
    "cooldown_s",
    "failure_threshold",
)

# vLLM's EMABackpressureDetector defaults (seconds per MiB of store latency)
LOCAL_WATER_S = (0.010, 0.002)
NETWORK_WATER_S = (0.050, 0.010)
DEFAULT_ALPHA = 0.15
DEFAULT_WARMUP_COMPLETIONS = 10
DEFAULT_DECAY_HALF_LIFE_S = 2.0
DEFAULT_COOLDOWN_S = 1.0
DEFAULT_FAILURE_THRESHOLD = 3

_UNIT_BYTES = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": GIB,
    "tib": 2**40,
    "pib": 2**50,
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")


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


def parse_byte_size(value: object, where: str) -> int:
    """Bytes from a JSON number or text such as ``2TiB``, ``500 GB``, ``1.5e12``."""
    if isinstance(value, bool):
        raise InputError(f"{where}: expected a size in bytes, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
        if unit not in _UNIT_BYTES:
            known = "B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB"
            raise InputError(f"{where}: unknown unit {m.group(2)!r} in {value!r} (use {known})")
    else:
        raise InputError(f"{where}: expected a size such as 2TiB or 500GB, got {value!r}")
    size = number * _UNIT_BYTES[unit]
    if not math.isfinite(size) or size < 1:
        raise InputError(f"{where}: a size must be at least 1 byte, got {value!r}")
    return int(size)


def parse_secondary_tiers(
    extra: dict[str, Any], source: str = "--vllm-config"
) -> tuple[TierSpec, ...]:
    """The tiers of a ``kv_connector_extra_config`` (none without ``secondary_tiers``)."""
    tiers = extra.get("secondary_tiers")
    if tiers is None:
        return ()
    if extra.get("spec_name") != TIERING_SPEC_NAME:
        raise InputError(
            f"{source}: secondary_tiers needs spec_name {TIERING_SPEC_NAME!r} "
            f"(vLLM's CPUOffloadingSpec ignores them), got {extra.get('spec_name')!r}"
        )
    if not isinstance(tiers, list):
        raise InputError(f"{source}: secondary_tiers must be a list of tier configurations")
    defaults = extra.get("backpressure")
    if defaults is not None and not isinstance(defaults, dict):
        raise InputError(f"{source}: backpressure must be an object, got {defaults!r}")
    return tuple(
        _parse_tier(tier, defaults, f"{source}: secondary_tiers[{i}]")
        for i, tier in enumerate(tiers)
    )


def as_tier_specs(tiers: object, source: str = "secondary_tiers") -> tuple[TierSpec, ...]:
    """Tiers given directly (the API's ``secondary_tiers``, the CLI's ``--tier``): parsed
    :class:`TierSpec` values as they are, vLLM tier objects checked and parsed."""
    if isinstance(tiers, (str, bytes)) or not isinstance(tiers, (list, tuple)):
        raise InputError(f"{source} must be a list of tier configurations, got {tiers!r}")
    return tuple(
        tier if isinstance(tier, TierSpec) else _parse_tier(tier, None, f"{source}[{i}]")
        for i, tier in enumerate(tiers)
    )


def _parse_tier(tier: object, bp_defaults: dict[str, Any] | None, where: str) -> TierSpec:
    if not isinstance(tier, dict):
        raise InputError(f"{where}: expected an object, got {tier!r}")
    kind = tier.get("type")
    if not kind or not isinstance(kind, str):
        raise InputError(f"{where}: a secondary tier must include 'type'")
    if "module_path" in tier:
        raise InputError(
            f"{where}: out-of-tree tier {kind!r} cannot run in kvsim; "
            f"model it as one of {', '.join(TIER_KEYS)}"
        )
    if kind in PEER_TIERS:
        raise InputError(
            f"{where}: tier {kind!r} serves peer vLLM instances, which a one-instance "
            f"replay does not model (kvsim runs {', '.join(TIER_KEYS)})"
        )
    if kind not in TIER_KEYS:
        raise InputError(
            f"{where}: unknown secondary tier type {kind!r}; known: {', '.join(TIER_KEYS)}"
        )
    allowed = TIER_KEYS[kind] | KVSIM_TIER_KEYS | {"type", "backpressure"}
    unknown = sorted(set(tier) - allowed)
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(unknown)} for a {kind!r} tier; "
            f"known: {', '.join(sorted(allowed - {'type'}))}"
        )
    locality = tier.get("locality")
    if locality is not None and locality not in ("LOCAL", "REMOTE"):
        raise InputError(f"{where}: locality must be 'LOCAL' or 'REMOTE', got {locality!r}")
    return TierSpec(
        type=kind,
        locality=locality,
        backpressure=_merged_backpressure(tier, bp_defaults, kind, locality, where),
        **_capacity(tier, where),
        **_timing(tier, where),
    )


def _timing(tier: dict[str, Any], where: str) -> dict[str, Any]:
    """The keys timed mode reads: the device, the load rule and the I/O thread counts."""
    out: dict[str, Any] = {}
    device = tier.get("kvsim_device")
    if device is not None:
        if not isinstance(device, str) or not device.strip():
            raise InputError(f"{where}.kvsim_device must be a preset name or a JSON path")
        out["device"] = device.strip()
    rule = tier.get("kvsim_load_rule")
    if rule is not None:
        if rule not in LOAD_RULES:
            raise InputError(
                f"{where}.kvsim_load_rule must be one of {', '.join(LOAD_RULES)}, got {rule!r}"
            )
        out["load_rule"] = None if rule == "off" else rule
    for key, (reads, writes) in _THREAD_KEYS.items():
        if key not in tier:
            continue
        n = tier[key]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"{where}.{key} must be a whole number >= 1, got {n!r}")
        if reads:
            out["n_read_threads"] = n
        if writes:
            out["n_write_threads"] = n
    return out


def _capacity(tier: dict[str, Any], where: str) -> dict[str, Any]:
    """The ``kvsim_`` capacity keys (beyond vLLM), checked."""
    out: dict[str, Any] = {}
    if "kvsim_capacity" in tier and "kvsim_capacity_chunks" in tier:
        raise InputError(f"{where}: give kvsim_capacity or kvsim_capacity_chunks, not both")
    if "kvsim_capacity" in tier:
        out["capacity_bytes"] = parse_byte_size(tier["kvsim_capacity"], f"{where}.kvsim_capacity")
    if "kvsim_capacity_chunks" in tier:
        chunks = tier["kvsim_capacity_chunks"]
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise InputError(
                f"{where}.kvsim_capacity_chunks must be a whole number >= 1, got {chunks!r}"
            )
        out["capacity_chunks"] = chunks
    if "kvsim_eviction_policy" in tier:
        policy = tier["kvsim_eviction_policy"]
        if not isinstance(policy, str) or not policy:
            raise InputError(f"{where}.kvsim_eviction_policy must be a policy name, got {policy!r}")
        if not out:
            raise InputError(
                f"{where}: kvsim_eviction_policy needs a capacity (kvsim_capacity or "
                "kvsim_capacity_chunks); without one the tier never evicts, as in vLLM"
            )
        out["eviction_policy"] = policy
    elif out:
        out["eviction_policy"] = "lru"
    return out


def _merged_backpressure(
    tier: dict[str, Any],
    defaults: dict[str, Any] | None,
    kind: str,
    locality: str | None,
    where: str,
) -> BackpressureSpec | None:
    """vLLM's merge: top-level ``backpressure`` fields under the tier's own, then the
    detector's defaults for the tier type and locality; None when neither is given."""
    own = tier.get("backpressure")
    if own is not None and not isinstance(own, dict):
        raise InputError(f"{where}.backpressure must be an object, got {own!r}")
    merged: dict[str, Any] = {**(defaults or {}), **(own or {})}
    if not merged and "backpressure" not in tier:
        return None
    where = f"{where}.backpressure"
    detector = _class_name(
        merged.pop("backpressure_cls", None), DETECTORS, where, "backpressure_cls"
    )
    policy = merged.pop("policy_cls", None)
    policy = (
        "ThrottledDropPolicy"
        if policy is None
        else _class_name(policy, DROP_POLICIES, where, "policy_cls")
    )
    unknown = sorted(set(merged) - set(_DETECTOR_NUMBERS))
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}")
    for key, value in merged.items():
        if key == "failure_threshold" and value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise InputError(f"{where}.{key} must be a number, got {value!r}")
    remote = locality == "REMOTE" or kind == "obj"
    high, low = NETWORK_WATER_S if remote else LOCAL_WATER_S
    merged.setdefault("high_water_s", high)
    merged.setdefault("low_water_s", low)
    if kind in ("fs", "obj"):
        merged.setdefault("failure_threshold", DEFAULT_FAILURE_THRESHOLD)
    spec = BackpressureSpec(detector=detector, policy=policy, **merged)
    if not 0 < spec.alpha <= 1:
        raise InputError(f"{where}.alpha must be in (0, 1], got {spec.alpha}")
    if spec.low_water_s > spec.high_water_s:
        raise InputError(
            f"{where}: low_water_s ({spec.low_water_s}) must be <= high_water_s "
            f"({spec.high_water_s})"
        )
    if spec.failure_threshold is not None and spec.failure_threshold < 1:
        raise InputError(f"{where}.failure_threshold must be >= 1, got {spec.failure_threshold}")
    return spec


def _class_name(value: object, known: tuple[str, ...], where: str, key: str) -> str:
    """A vLLM back-pressure class by short or full name, among those kvsim models."""
    if value is None:
        raise InputError(f"{where}: must include {key!r} (e.g. {known[0]!r})")
    name = value.removeprefix(_VLLM_BACKPRESSURE_MODULE) if isinstance(value, str) else value
    if name not in known:
        raise InputError(f"{where}.{key}: kvsim models {', '.join(known)}; got {value!r}")
    return str(name)


# --- the CLI shorthand ---

#: shorthand key -> the tier-config key it stands for
_SHORTHAND_KEYS = {
    "capacity": "kvsim_capacity",
    "chunks": "kvsim_capacity_chunks",
    "policy": "kvsim_eviction_policy",
    "device": "kvsim_device",
    "load_rule": "kvsim_load_rule",
}
#: tier-object key -> the shorthand key that stands for it
_SHORT_NAMES = {v: k for k, v in _SHORTHAND_KEYS.items()}


def tier_from_shorthand(text: str, where: str | None = None) -> dict[str, Any]:
    """``--tier TYPE[:KEY=VALUE,...]`` as a vLLM tier object, e.g. ``fs:capacity=2TiB``
    -> ``{"type": "fs", "kvsim_capacity": "2TiB"}``. Keys: ``capacity``, ``chunks``,
    ``policy`` (kvsim's) and the tier type's own vLLM keys (``locality=REMOTE``, ...).
    Errors name ``where`` (default ``--tier TEXT``)."""
    where = f"--tier {text}" if where is None else where
    kind, _, rest = text.partition(":")
    kind = kind.strip()
    if not kind:
        raise InputError(f"{where}: expected TYPE[:KEY=VALUE,...], e.g. fs:capacity=2TiB")
    tier: dict[str, Any] = {"type": kind}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise InputError(f"{where}: expected KEY=VALUE, got {item!r}")
        name = _SHORTHAND_KEYS.get(key, key)
        if name in tier:
            raise InputError(f"{where}: {key} given twice")
        tier[name] = int(value) if value.isdigit() else value
    if kind in TIER_KEYS:
        known = TIER_KEYS[kind] | set(_SHORTHAND_KEYS)
        unknown = sorted(
            k for k in tier if k != "type" and k not in known and k not in KVSIM_TIER_KEYS
        )
        if unknown:
            raise InputError(
                f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
    _parse_tier(tier, None, where)  # every other error, now, with the option's name
    return tier


def tier_to_shorthand(tier: Mapping[str, Any]) -> str:
    """A vLLM tier object in ``--tier``'s shorthand (:func:`tier_from_shorthand` reads it
    back); a value the shorthand has no form for, such as a ``backpressure`` object, is
    written as JSON."""
    parts = [
        f"{_SHORT_NAMES.get(k, k)}="
        + (v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":")))
        for k, v in tier.items()
        if k != "type"
    ]
    return f"{tier['type']}:{','.join(parts)}" if parts else str(tier["type"])


def describe_tier(spec: TierSpec, index: int) -> str:
    """``1:fs``, vLLM's metric label of the tier, with kvsim's capacity when it has one."""
    label = f"{index + 1}:{spec.type}"
    if spec.capacity_chunks is not None:
        return f"{label} ({spec.capacity_chunks} chunks, {spec.eviction_policy}; beyond vLLM)"
    if spec.capacity_bytes is not None:
        size = human_bytes(spec.capacity_bytes)
        return f"{label} ({size}, {spec.eviction_policy}; beyond vLLM)"
    return label
