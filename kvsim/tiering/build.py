"""A :class:`~kvsim.tiering.manager.TieredManager` from a run's configuration."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import cast

from kvsim.core.errors import InputError
from kvsim.manager.offload import OffloadManager
from kvsim.options.config import CacheConfig
from kvsim.options.tiers import TierSpec
from kvsim.policies.base import FuturePolicy
from kvsim.policies.registry import make_eviction_policy
from kvsim.tiering.backpressure import EMADetector
from kvsim.tiering.devices import tier_device
from kvsim.tiering.manager import TieredManager, no_time
from kvsim.tiering.primary import PrimaryTier
from kvsim.tiering.secondary import SecondaryTier
from kvsim.tiering.store import BoundedStore, TierStore, UnboundedStore
from kvsim.traces.model import Request


def build_tiered_manager(
    config: CacheConfig,
    requests: Iterable[Request] | None = None,
    *,
    instant: bool = True,
    clock: Callable[[], float] = no_time,
    stores: Mapping[int, TierStore] | None = None,
) -> TieredManager:
    """The CPU tier of ``config`` with its ``secondary_tiers`` behind it. ``instant``:
    every tier transfer finishes when submitted (cache mode); ``requests``: the trace's
    future, for a policy that reads it (Belady); ``stores``: tier index -> a store that
    several managers share (a fleet's shared tier, :mod:`kvsim.fleet.shared`), used
    instead of a new one."""
    for index, spec in enumerate(config.secondary_tiers):
        where = f"secondary tier {index + 1}:{spec.type}"
        tier_device(spec, where)  # a bad device is an error in either mode
        if instant and spec.load_rule is not None:
            raise InputError(
                f"{where}: load rule {spec.load_rule!r} weighs transfer time against "
                "recompute time, which cache mode does not model; use kvsim simulate"
            )
    primary = cast(PrimaryTier, PrimaryTier.from_config(config, requests))
    chunk_bytes = config.chunk_bytes or 0
    tiers = [
        SecondaryTier(
            spec,
            index,
            stores[index]
            if stores and index in stores
            else tier_store(spec, index, config, requests),
            None if spec.backpressure is None else EMADetector(spec.backpressure, clock),
            instant=instant,
        )
        for index, spec in enumerate(config.secondary_tiers)
    ]
    return TieredManager(primary, tiers, chunk_bytes=chunk_bytes, clock=clock)


def tier_capacity_chunks(spec: TierSpec, chunk_bytes: int | None, where: str) -> int | None:
    """A bounded tier's capacity in CPU-tier chunks (None: unbounded, as vLLM's)."""
    if spec.capacity_chunks is not None:
        return spec.capacity_chunks
    if spec.capacity_bytes is None:
        return None
    if not chunk_bytes:
        raise InputError(f"{where}: a capacity in bytes needs --model to size chunks")
    chunks = spec.capacity_bytes // chunk_bytes
    if chunks < 1:
        raise InputError(
            f"{where}: capacity {spec.capacity_bytes} bytes holds no {chunk_bytes}-byte chunk"
        )
    return chunks


def tier_store(
    spec: TierSpec, index: int, config: CacheConfig, requests: Iterable[Request] | None
) -> TierStore:
    """What tier ``index`` holds: unbounded (vLLM's), or a capacity under a kvsim policy."""
    where = f"secondary tier {index + 1}:{spec.type}"
    capacity = tier_capacity_chunks(spec, config.chunk_bytes, where)
    if capacity is None:
        return UnboundedStore()
    name = spec.eviction_policy or "lru"
    try:
        policy = make_eviction_policy(name, capacity)
    except InputError as exc:
        raise InputError(f"{where}: {str(exc).removeprefix('--policy: ')}") from None
    if getattr(policy, "needs_future", False):
        if requests is None:
            raise InputError(f"{where}: policy {name!r} needs the trace's future")
        cast(FuturePolicy, policy).prepare_future(requests, config.layout)
    return BoundedStore(OffloadManager(capacity, policy))
