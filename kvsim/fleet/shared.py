"""The tier a fleet's instances share (``--shared-tier``).

One store behind every instance's CPU tier, looked up, loaded from and stored to by all of
them: ``pool``, a pooled store in other hosts' memory (LMCache's server, Mooncake Store),
run as vLLM's ``obj`` tier; ``fs``, vLLM's ``fs`` tier on a path every instance mounts.
Each instance runs it as one more secondary tier (vLLM's ``TieringOffloadingSpec``
semantics: promotions into its CPU tier, cascades from it) whose store is the one object
all instances share, so a chunk one instance writes is a hit for every other. In timed mode
each instance reaches it over its own link (a device preset: ``nic-100g``, ``nic-200g``,
``nic-400g`` for a pool, ``nvme`` for fs), so its copies queue on that link like every
other transfer; the pool's own aggregate bandwidth is not modelled.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from kvsim.core.errors import InputError
from kvsim.options.config import CacheConfig
from kvsim.options.fleet import FLEET_DEFAULTS, FleetOptions, fleet_option_name
from kvsim.options.tiers import TierSpec, parse_byte_size
from kvsim.policies.registry import eviction_policy_class
from kvsim.tiering.build import tier_store
from kvsim.tiering.store import TierStore
from kvsim.traces.model import Request

#: tier type and default link of each kind
KINDS = {"pool": ("obj", "nic-200g"), "fs": ("fs", "nvme")}
#: link names -> device presets (kvsim/data/tier_devices.json)
LINK_DEVICES = {
    "nic-100g": "nic-100g",
    "nic-200g": "nic-200g",
    "nic-400g": "nic-400g",
    "nvme": "nvme-gen4",
}
_CHUNKS = re.compile(r"\s*(\d+)\s*chunks?\s*", re.IGNORECASE)


def shared_tier_spec(fleet: FleetOptions) -> TierSpec | None:
    """The shared tier as a secondary tier, or None without ``--shared-tier`` or with a
    capacity of 0 (a tier that can hold nothing is not looked up: no lookup latency)."""
    if fleet.shared_tier is None:
        for name in ("shared_tier_capacity", "shared_tier_eviction", "shared_tier_link"):
            if getattr(fleet, name) != FLEET_DEFAULTS[name]:
                raise InputError(f"{fleet_option_name(name)} needs --shared-tier")
        return None
    kind, link = KINDS[fleet.shared_tier]
    device = LINK_DEVICES[fleet.shared_tier_link or link]
    capacity_bytes = capacity_chunks = None
    text = fleet.shared_tier_capacity
    if text is not None:
        m = _CHUNKS.fullmatch(text)
        if m:
            capacity_chunks = int(m.group(1))
        elif text.strip() == "0":
            capacity_chunks = 0
        else:
            capacity_bytes = parse_byte_size(text, "--shared-tier-capacity")
    if capacity_chunks == 0:  # holds nothing, so no instance asks it: no shared tier
        return None
    bounded = capacity_bytes is not None or capacity_chunks is not None
    if bounded:  # named as the user gave it, not as the tier it becomes
        eviction_policy_class(fleet.shared_tier_eviction, option="--shared-tier-eviction")
    return TierSpec(
        kind,
        capacity_bytes=capacity_bytes,
        capacity_chunks=capacity_chunks,
        eviction_policy=fleet.shared_tier_eviction if bounded else None,
        device=device,
    )


def with_shared_tier(config: CacheConfig, spec: TierSpec) -> tuple[CacheConfig, int]:
    """``config`` with the shared tier behind its own secondary tiers, and its index."""
    index = len(config.secondary_tiers)
    return dataclasses.replace(config, secondary_tiers=(*config.secondary_tiers, spec)), index


def shared_store(
    config: CacheConfig, index: int, requests: Iterable[Request] | None = None
) -> TierStore:
    """The one store the instances share (built as that tier's own store would be)."""
    return tier_store(config.secondary_tiers[index], index, config, requests)
