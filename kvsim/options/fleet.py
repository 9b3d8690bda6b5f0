"""What a user asks of a fleet, described once: :class:`FleetOptions` (how many instances,
which router and its weights, how stale its view is, and a tier the instances share).

Vocabulary only (layer 0): the fleet itself runs in :mod:`kvsim.fleet`. The router weights'
defaults and their sources are documented in ``docs/fleets.md``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from kvsim.options.offload import Count, Text
from kvsim.options.schema import Schema, check_fields

__all__ = [
    "FLEET_DEFAULTS",
    "FLEET_FIELDS",
    "ROUTERS",
    "SHARED_LINKS",
    "FleetOptions",
    "fleet_option_name",
]

#: the built-in routers (a ``module:Class`` plugin is the other choice)
ROUTERS = ("round-robin", "random", "least-loaded", "session", "prefix-aware")

#: the shared tier's per-instance links: device presets of ``kvsim/data/tier_devices.json``
SHARED_LINKS = ("nic-100g", "nic-200g", "nic-400g", "nvme")

Weight = Annotated[float, Meta(ge=0.0)]
#: the most instances a fleet takes: beyond any deployment's engines, and short of the
#: memory a fleet of them takes before its first request (10,000 took 4.3 GB, 100,000 was
#: killed for memory)
MAX_INSTANCES = 4096


def fleet_option_name(field: str) -> str:
    """``router_staleness_ms`` -> ``--router-staleness-ms``."""
    return "--" + field.replace("_", "-")


class FleetOptions(Schema, frozen=True):
    """A fleet of identical instances behind one router, optionally sharing one tier."""

    instances: Annotated[
        Count,
        Meta(
            le=MAX_INSTANCES,
            description="Instances behind the router (default 1: the single engine).",
        ),
    ] = 1
    router: Annotated[
        Text,
        Meta(
            description=(
                "round-robin (default), random (seeded), least-loaded, session, "
                "prefix-aware, or a plugin module:Class (docs/fleets.md)."
            )
        ),
    ] = "round-robin"
    router_staleness_ms: Annotated[
        float,
        Meta(
            ge=0.0,
            description=(
                "The router sees each instance as it was this many ms ago (queues, free KV, "
                "blocks it holds), as KV events reach llm-d's indexer late (default 0)."
            ),
        ),
    ] = 0.0
    router_prefix_weight: Annotated[
        Weight, Meta(description="prefix-aware: weight of the held-prefix score (default 3).")
    ] = 3.0
    router_queue_weight: Annotated[
        Weight, Meta(description="prefix-aware: weight of the queue score (default 2).")
    ] = 2.0
    router_kv_weight: Annotated[
        Weight, Meta(description="prefix-aware: weight of the free-KV score (default 2).")
    ] = 2.0
    router_window_s: Annotated[
        float,
        Meta(
            gt=0.0,
            description=(
                "Cache mode has no queues: an instance's load is the requests routed to it "
                "in the last this many trace seconds (default 10)."
            ),
        ),
    ] = 10.0
    shared_tier: (
        Annotated[
            Literal["pool", "fs"],
            Meta(
                description=(
                    "One tier behind every instance's CPU tier that all look up, load from and "
                    "store to: pool (LMCache server, Mooncake Store) or fs (vLLM's fs tier on "
                    "a shared path). Default: none."
                )
            ),
        ]
        | None
    ) = None
    shared_tier_capacity: (
        Annotated[
            Text,
            Meta(
                description=(
                    "The shared tier's capacity (2TiB, 500GB, or chunks as 1000chunks); "
                    "default: none, as vLLM's fs tier."
                )
            ),
        ]
        | None
    ) = None
    shared_tier_eviction: Annotated[
        Text,
        Meta(description="The shared tier's eviction policy when it has a capacity (default lru)."),
    ] = "lru"
    shared_tier_link: (
        Annotated[
            Literal["nic-100g", "nic-200g", "nic-400g", "nvme"],
            Meta(
                description=(
                    "Each instance's link to the shared tier (timed mode): a 100/200/400 "
                    "Gbit/s NIC or a local NVMe (default nic-200g for pool, nvme for fs)."
                )
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        check_fields(self, names=fleet_option_name)

    def unread(self, timed: bool | None = None) -> list[str]:
        """The options given (away from their defaults) that this fleet never reads, each
        with why: a user who set them expects them to change the run, and they do not.

        Args:
            timed: the mode the fleet runs in, when known: cache mode (False) never reads
                the shared tier's link (it has no time), timed mode (True) never reads
                ``--router-window-s`` (its load is the scheduler's queues).

        Returns one clause per option (``--router-kv-weight (only the prefix-aware router
        reads the weights)``); empty when every option given is read."""
        out = []
        if timed is False and self.shared_tier is not None and self.shared_tier_link is not None:
            out.append("--shared-tier-link (cache mode has no time for a link to take)")
        if (
            timed is True
            and self.instances > 1
            and self.router_window_s != FLEET_DEFAULTS["router_window_s"]
        ):
            out.append(
                "--router-window-s (cache mode's stand-in for queues; timed mode routes on "
                "the scheduler's)"
            )
        if self.instances == 1:
            out += [
                f"{fleet_option_name(name)} (one instance has no router)"
                for name in _ROUTER_FIELDS
                if getattr(self, name) != FLEET_DEFAULTS[name]
            ]
        elif self.router != "prefix-aware":
            out += [
                f"{fleet_option_name(name)} (only the prefix-aware router reads the weights)"
                for name in _WEIGHT_FIELDS
                if getattr(self, name) != FLEET_DEFAULTS[name]
            ]
        # the shared tier's options without the tier are an error (fleet/shared.py)
        if (
            self.shared_tier is not None
            and self.shared_tier_capacity is None
            and self.shared_tier_eviction != FLEET_DEFAULTS["shared_tier_eviction"]
        ):
            out.append(
                "--shared-tier-eviction (the shared tier has no --shared-tier-capacity, so "
                "it never evicts)"
            )
        return out


FLEET_FIELDS: tuple[str, ...] = FleetOptions.__struct_fields__
FLEET_DEFAULTS: dict[str, object] = dict(
    zip(FLEET_FIELDS, FleetOptions.__struct_defaults__, strict=True)
)
_WEIGHT_FIELDS = ("router_prefix_weight", "router_queue_weight", "router_kv_weight")
_ROUTER_FIELDS = ("router", "router_staleness_ms", *_WEIGHT_FIELDS, "router_window_s")
