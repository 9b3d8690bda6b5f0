"""Secondary tiers as a user asks for them, described once: vLLM 0.33's
``secondary_tiers`` objects (the ``TieringOffloadingSpec`` keys of
``kv_connector_extra_config``: :data:`TierConfig`, one class per tier type, and
:class:`BackpressureConfig`) and the CLI shorthand ``--tier fs:capacity=2TiB``, checked and
turned into the frozen :class:`~kvsim.options.tier_spec.TierSpec` values the run reads.
Validation, bounds, help texts, "did you mean" and the JSON Schema (``kvsim schema
secondary-tier``, ``kvsim schema backpressure``) come from these classes.

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
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from kvsim.core.errors import InputError, did_you_mean
from kvsim.core.units import GIB
from kvsim.options.schema import Schema, fields, load
from kvsim.options.tier_spec import (
    DEFAULT_FAILURE_THRESHOLD,
    LOCAL_WATER_S,
    NETWORK_WATER_S,
    TIERING_SPEC_NAME,
    BackpressureSpec,
    TierSpec,
    describe_tier,
)

__all__ = [
    "LOAD_RULES",
    "PEER_TIERS",
    "TIERING_SPEC_NAME",
    "TIER_TYPES",
    "BackpressureConfig",
    "BackpressureSpec",
    "ExampleTier",
    "FsTier",
    "ObjTier",
    "TierConfig",
    "TierSpec",
    "as_tier_specs",
    "describe_tier",
    "parse_byte_size",
    "refuse_unmodelled_tiers",
    "tier_from_shorthand",
    "tier_specs",
    "tier_to_shorthand",
]

#: vLLM tier types that answer peer instances, which a one-instance replay cannot model
PEER_TIERS = frozenset({"p2p", "kvcr"})
#: ``kvsim_load_rule`` values: ``off`` is vLLM's behaviour, ``pays-off`` goes beyond it
LOAD_RULES = ("off", "pays-off")
_VLLM_BACKPRESSURE_MODULE = "vllm.v1.kv_offload.tiering.backpressure."

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


def _byte_size(value: object) -> int:
    """Bytes from a number or text such as ``2TiB``, ``500 GB``, ``1.5e12`` (a
    ``ValueError`` saying what is wrong otherwise)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size in bytes, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
        if unit not in _UNIT_BYTES:
            known = "B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB"
            raise ValueError(f"unknown unit {m.group(2)!r} in {value!r} (use {known})")
    else:
        raise ValueError(f"expected a size such as 2TiB or 500GB, got {value!r}")
    size = number * _UNIT_BYTES[unit]
    if not size >= 1 or size == float("inf"):
        raise ValueError(f"a size must be at least 1 byte, got {value!r}")
    return int(size)


def parse_byte_size(value: object, where: str) -> int:
    """Bytes from a JSON number or text such as ``2TiB``, ``500 GB``, ``1.5e12``."""
    try:
        return _byte_size(value)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None


#: the vLLM back-pressure classes kvsim models, by short or full name
Detector = Literal[
    "EMABackpressureDetector",
    "vllm.v1.kv_offload.tiering.backpressure.EMABackpressureDetector",
]
DropPolicy = Literal[
    "ThrottledDropPolicy",
    "DropStorePolicy",
    "vllm.v1.kv_offload.tiering.backpressure.ThrottledDropPolicy",
    "vllm.v1.kv_offload.tiering.backpressure.DropStorePolicy",
]

_Seconds = Annotated[float, Meta(ge=0)]


class BackpressureConfig(Schema, frozen=True, kw_only=True):
    """vLLM's back-pressure of a tier (``EMABackpressureDetector`` and a drop policy): the
    top-level ``backpressure`` gives every tier's defaults, a tier's own ``backpressure``
    overrides them key by key; what neither gives is vLLM's default for the tier's type
    and locality."""

    backpressure_cls: (
        Annotated[
            Detector,
            Meta(description="The detector (kvsim models EMABackpressureDetector)."),
        ]
        | UnsetType
    ) = UNSET
    policy_cls: (
        Annotated[
            DropPolicy,
            Meta(description="The drop policy (default ThrottledDropPolicy)."),
        ]
        | UnsetType
    ) = UNSET
    high_water_s: (
        Annotated[
            _Seconds,
            Meta(description="Store latency per MiB above which stores are dropped, s."),
        ]
        | UnsetType
    ) = UNSET
    low_water_s: (
        Annotated[_Seconds, Meta(description="Store latency per MiB below which they resume, s.")]
        | UnsetType
    ) = UNSET
    alpha: (
        Annotated[float, Meta(gt=0, le=1, description="EMA weight of a new sample (0.15).")]
        | UnsetType
    ) = UNSET
    warmup_completions: (
        Annotated[int, Meta(ge=0, description="Completions before the detector acts (10).")]
        | UnsetType
    ) = UNSET
    decay_half_life_s: (
        Annotated[float, Meta(gt=0, description="Half-life of the EMA while idle, s (2).")]
        | UnsetType
    ) = UNSET
    cooldown_s: (
        Annotated[_Seconds, Meta(description="Time dropping lasts at least, s (1).")] | UnsetType
    ) = UNSET
    failure_threshold: (
        Annotated[
            int, Meta(ge=1, description="Failed stores that trip it (fs, obj: 3; null: off).")
        ]
        | UnsetType
        | None
    ) = UNSET

    def resolve(self, kind: str, locality: str | None, where: str) -> BackpressureSpec:
        """The detector with vLLM's defaults for the tier's type and locality filled in."""
        given = self.as_dict()
        if "backpressure_cls" not in given:
            raise InputError(
                f"{where}: must include 'backpressure_cls' (e.g. 'EMABackpressureDetector')"
            )
        detector = given.pop("backpressure_cls").removeprefix(_VLLM_BACKPRESSURE_MODULE)
        policy = given.pop("policy_cls", "ThrottledDropPolicy").removeprefix(
            _VLLM_BACKPRESSURE_MODULE
        )
        remote = locality == "REMOTE" or kind == "obj"
        high, low = NETWORK_WATER_S if remote else LOCAL_WATER_S
        given.setdefault("high_water_s", high)
        given.setdefault("low_water_s", low)
        if kind in ("fs", "obj"):
            given.setdefault("failure_threshold", DEFAULT_FAILURE_THRESHOLD)
        spec = BackpressureSpec(detector=detector, policy=policy, **given)
        if spec.low_water_s > spec.high_water_s:
            raise InputError(
                f"{where}: low_water_s ({spec.low_water_s}) must be <= high_water_s "
                f"({spec.high_water_s})"
            )
        return spec

    def under(self, defaults: BackpressureConfig | None) -> BackpressureConfig:
        """These keys over ``defaults``' (vLLM's merge of the top-level ``backpressure``)."""
        if defaults is None:
            return self
        return BackpressureConfig(**{**defaults.as_dict(), **self.as_dict()})


_Count = Annotated[int, Meta(ge=1)]
_Locality = Annotated[
    Literal["LOCAL", "REMOTE"], Meta(description="Where the tier's storage is (vLLM's).")
]


class _Tier(Schema, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    """The keys every tier type takes: back-pressure and kvsim's own (``kvsim_``)."""

    backpressure: (
        Annotated[
            BackpressureConfig,
            Meta(description="This tier's back-pressure, over the top-level backpressure."),
        ]
        | None
    ) = None
    kvsim_capacity: (
        Annotated[
            int | float | str,
            Meta(
                description=(
                    "Beyond vLLM: the tier's capacity, bytes or text such as 2TiB or 500GB."
                )
            ),
        ]
        | None
    ) = None
    kvsim_capacity_chunks: (
        Annotated[_Count, Meta(description="Beyond vLLM: the tier's capacity in chunks.")] | None
    ) = None
    kvsim_eviction_policy: (
        Annotated[
            str,
            Meta(
                min_length=1,
                description="Beyond vLLM: the bounded tier's eviction policy (default lru).",
            ),
        ]
        | None
    ) = None
    kvsim_device: (
        Annotated[
            str,
            Meta(
                pattern=r"\S",
                description=(
                    "Timed mode: a device preset (kvsim.tiering.devices) or a device JSON file."
                ),
            ),
        ]
        | None
    ) = None
    kvsim_load_rule: (
        Annotated[
            Literal["off", "pays-off"],
            Meta(description="pays-off (beyond vLLM): skip promotions slower than recomputing."),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        if self.kvsim_capacity is not None and self.kvsim_capacity_chunks is not None:
            raise ValueError("give kvsim_capacity or kvsim_capacity_chunks, not both")
        if self.kvsim_capacity is not None:
            try:
                _byte_size(self.kvsim_capacity)
            except ValueError as exc:
                raise ValueError(f"kvsim_capacity: {exc}") from None
        bounded = self.kvsim_capacity is not None or self.kvsim_capacity_chunks is not None
        if self.kvsim_eviction_policy is not None and not bounded:
            raise ValueError(
                "kvsim_eviction_policy needs a capacity (kvsim_capacity or "
                "kvsim_capacity_chunks); without one the tier never evicts, as in vLLM"
            )

    @property
    def kind(self) -> str:
        return str(self.__struct_config__.tag)

    def threads(self) -> tuple[int | None, int | None]:
        """vLLM's I/O thread counts of the tier: (read threads, write threads)."""
        return None, None

    def where(self) -> str | None:
        """The tier's ``locality``, where its type has one."""
        return None

    def to_spec(self, defaults: BackpressureConfig | None, where: str) -> TierSpec:
        """The run's value of this tier, the top-level back-pressure ``defaults`` merged."""
        kind, locality = self.kind, self.where()
        backpressure = None
        if self.backpressure is not None or (defaults is not None and defaults.as_dict()):
            merged = (self.backpressure or BackpressureConfig()).under(defaults)
            backpressure = merged.resolve(kind, locality, f"{where}.backpressure")
        bounded = self.kvsim_capacity is not None or self.kvsim_capacity_chunks is not None
        n_read, n_write = self.threads()
        return TierSpec(
            type=kind,
            locality=locality,
            backpressure=backpressure,
            capacity_bytes=(
                None if self.kvsim_capacity is None else _byte_size(self.kvsim_capacity)
            ),
            capacity_chunks=self.kvsim_capacity_chunks,
            eviction_policy=self.kvsim_eviction_policy or ("lru" if bounded else None),
            device=None if self.kvsim_device is None else self.kvsim_device.strip(),
            load_rule=None if self.kvsim_load_rule in (None, "off") else self.kvsim_load_rule,
            n_read_threads=n_read,
            n_write_threads=n_write,
        )


class FsTier(_Tier, frozen=True, kw_only=True, omit_defaults=True, tag="fs"):
    """vLLM's file-system tier (files under ``root_dir``)."""

    root_dir: Annotated[str, Meta(description="Where vLLM writes the files.")] | None = None
    n_read_threads: Annotated[_Count, Meta(description="Reading threads (16).")] | None = None
    n_write_threads: Annotated[_Count, Meta(description="Writing threads (16).")] | None = None
    enable_kv_events: Annotated[bool, Meta(description="vLLM's KV events (ignored).")] | None = None
    locality: _Locality | None = None

    def threads(self) -> tuple[int | None, int | None]:
        return self.n_read_threads, self.n_write_threads

    def where(self) -> str | None:
        return self.locality


class ObjTier(_Tier, frozen=True, kw_only=True, omit_defaults=True, tag="obj"):
    """vLLM's object-store tier."""

    store_config: Annotated[Any, Meta(description="The object store's configuration.")] = None
    prefix: Annotated[str, Meta(description="Key prefix of the objects.")] | None = None
    io_threads: Annotated[_Count, Meta(description="I/O threads (read and write).")] | None = None
    enable_kv_events: Annotated[bool, Meta(description="vLLM's KV events (ignored).")] | None = None
    locality: _Locality | None = None

    def threads(self) -> tuple[int | None, int | None]:
        return self.io_threads, self.io_threads

    def where(self) -> str | None:
        return self.locality


class ExampleTier(_Tier, frozen=True, kw_only=True, omit_defaults=True, tag="example"):
    """vLLM's example tier (in memory, instant)."""

    custom_param: Annotated[Any, Meta(description="The example tier's parameter.")] = None


#: one secondary tier of vLLM's ``secondary_tiers``, by its ``type``
TierConfig = FsTier | ObjTier | ExampleTier
#: tier types kvsim runs
TIER_TYPES: tuple[str, ...] = ("fs", "obj", "example")


class SecondaryTiers(Schema, frozen=True, kw_only=True):
    """The tiers of a ``TieringOffloadingSpec`` (what ``kvsim schema secondary-tiers``
    prints for editors; the same keys sit in ``kv_connector_extra_config``)."""

    secondary_tiers: Annotated[
        list[TierConfig], Meta(description="The tiers behind the CPU tier, in order.")
    ]
    backpressure: (
        Annotated[BackpressureConfig, Meta(description="Every tier's back-pressure defaults.")]
        | None
    ) = None


def refuse_unmodelled_tiers(tiers: object, where: str, source: str | None) -> None:
    """Tiers kvsim cannot run, refused with the reason before their keys are checked
    (:func:`refuse_unmodelled`, for each of a list)."""
    if isinstance(tiers, (list, tuple)):
        for i, tier in enumerate(tiers):
            refuse_unmodelled(tier, f"{where}[{i}]", source)


def refuse_unmodelled(tier: object, where: str, source: str | None) -> None:
    """An out-of-tree tier (``module_path``) or one of vLLM's peer tiers is an error that
    says why kvsim cannot run it."""
    if not isinstance(tier, Mapping):
        return
    kind = tier.get("type")
    if "module_path" in tier:
        raise InputError(
            f"{where}: out-of-tree tier {kind!r} cannot run in kvsim; "
            f"model it as one of {', '.join(TIER_TYPES)}",
            source=source,
        )
    if kind in PEER_TIERS:
        raise InputError(
            f"{where}: tier {kind!r} serves peer vLLM instances, which a one-instance "
            f"replay does not model (kvsim runs {', '.join(TIER_TYPES)})",
            source=source,
        )


def tier_specs(
    tiers: Sequence[TierConfig],
    defaults: BackpressureConfig | None,
    source: str | None = None,
    where: str = "secondary_tiers",
) -> tuple[TierSpec, ...]:
    """The run's values of checked tiers, in configuration order."""
    out = []
    for i, tier in enumerate(tiers):
        try:
            out.append(tier.to_spec(defaults, f"{where}[{i}]"))
        except InputError as exc:
            raise InputError(str(exc), source=source) from None
    return tuple(out)


def as_tier_specs(tiers: object, source: str = "secondary_tiers") -> tuple[TierSpec, ...]:
    """Tiers given directly (the API's ``secondary_tiers``, the CLI's ``--tier``): parsed
    :class:`TierSpec` values as they are, vLLM tier objects checked and parsed."""
    if isinstance(tiers, (str, bytes)) or not isinstance(tiers, (list, tuple)):
        raise InputError(f"{source} must be a list of tier configurations, got {tiers!r}")
    refuse_unmodelled_tiers(tiers, source, None)
    return tuple(
        tier
        if isinstance(tier, TierSpec)
        else load(TierConfig, tier, source=None, prefix=f"{source}[{i}]").to_spec(  # type: ignore[arg-type]
            None, f"{source}[{i}]"
        )
        for i, tier in enumerate(tiers)
    )


# --- the CLI shorthand ---

_TIER_CLASSES: dict[str, type[_Tier]] = {"fs": FsTier, "obj": ObjTier, "example": ExampleTier}

#: shorthand key -> the tier-config key it stands for
_SHORTHAND_KEYS = {
    "capacity": "kvsim_capacity",
    "chunks": "kvsim_capacity_chunks",
    "policy": "kvsim_eviction_policy",
    "device": "kvsim_device",
    "load_rule": "kvsim_load_rule",
}
_INTEGER = re.compile(r"[+-]?[0-9]+")
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
        # a signed whole number is a number (so -2 is out of range, not the wrong type)
        tier[name] = int(value) if _INTEGER.fullmatch(value) else value
    cls = _TIER_CLASSES.get(kind)
    if cls is not None:  # the shorthand's names and the tier type's vLLM keys
        known = [
            *_SHORTHAND_KEYS,
            *(f.name for f in fields(cls) if not f.name.startswith("kvsim_")),
        ]
        for key in tier:
            if key != "type" and key not in known and key not in _SHORT_NAMES:
                raise InputError(f"{where}: unknown key {key!r}{did_you_mean(key, known)}")
    refuse_unmodelled(tier, where, None)
    load(TierConfig, tier, source=where).to_spec(None, where)  # type: ignore[arg-type]
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
