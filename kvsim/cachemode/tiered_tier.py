"""Cache mode with secondary tiers: one request's calls on a
:class:`~kvsim.tiering.TieredManager`, in engine steps but without time.

A request runs alone, as in :mod:`kvsim.cachemode.protocol_tier`, with vLLM's step structure
wherever the tiers make it matter:

1. **Lookup steps.** The connector scans the chunks after the GPU hit: a HIT or
   HIT_PENDING counts, a RETRY keeps the scan going, a MISS ends it. While the scan is
   not settled (some HIT_PENDING or RETRY) the request waits: the step ends
   (``on_schedule_end``: the step's promotions are submitted, the tiers' existence checks
   go out) and the next step scans again.
2. **Zero-time tiers.** Every tier transfer finishes when it is submitted and is collected
   at the manager's next poll (the next lookup or store), and every existence check is
   answered before the next step, exactly as the CPU tier's own loads and stores complete
   within the request in cache mode. So a chunk on an ``fs`` tier costs the request two
   waiting steps (the check, then the promotion), one on an ``example`` tier one step.
3. **The settled step.** The hits load (all are in the CPU tier by now), the request's
   new chunks are stored to the CPU tier and each completed store cascades to every
   secondary tier; the step ends with the request scheduled; the request finishes.

A scan that has not settled after :data:`MAX_LOOKUP_STEPS` steps is a *stall*: vLLM would
keep the request waiting (for example while promotions into a CPU tier smaller than the
prompt keep evicting one another). kvsim counts it and runs the request without a load.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from kvsim.cachemode.protocol_tier import ProtocolTier
from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import LookupResult, ManagerProtocol
from kvsim.options.config import CacheConfig
from kvsim.options.tiers import describe_tier
from kvsim.tiering import TieredManager
from kvsim.tiering.build import build_tiered_manager, tier_capacity_chunks
from kvsim.tiering.metrics import PROMOTION_ALLOCATION_FAILURES
from kvsim.traces.model import Request

#: lookup steps after which a request that still waits counts as stalled
MAX_LOOKUP_STEPS = 16

_HIT = LookupResult.HIT
_PENDING = LookupResult.HIT_PENDING
_RETRY = LookupResult.RETRY


class TieredProtocolTier(ProtocolTier):
    """The CPU tier and its secondary tiers for cache mode (``tier`` in the summary:
    ``tiered``): the protocol tier whose scan waits for the tiers, whose loads are
    attributed to the tier they came from and whose finish ends the request's step."""

    name = "tiered"

    def __init__(self, manager: TieredManager, chunk_tokens: int, prefill_step: int | None) -> None:
        # the protocol's calls but ``lookup_prefix``: the scan is :meth:`_lookup`'s own
        super().__init__(cast("ManagerProtocol[Any]", manager), chunk_tokens, prefill_step)
        self.tiered = manager
        #: tokens loaded per source: [0] was in the CPU tier, [i + 1] promoted from tier i
        self.hit_tokens = [0] * (len(manager.tiers) + 1)
        self.steps_waited = 0
        self.requests_waited = 0
        self.requests_stalled = 0

    @classmethod
    def from_config(
        cls, config: CacheConfig, requests_for_future: Iterable[Request] | None = None
    ) -> TieredProtocolTier:
        """The configured CPU tier and secondary tiers, with zero-time transfers."""
        manager = build_tiered_manager(config, requests_for_future, instant=True)
        return cls(manager, config.chunk_tokens, config.prefill_chunk_tokens)

    def resident_keys(self) -> list[ChunkKey]:
        """The CPU tier's keys, least recently used first when the policy can tell."""
        policy = self.tiered.primary.policy
        order = getattr(policy, "eviction_order", None)
        return order() if order is not None else list(policy.keys())

    def _lookup(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> int:
        """Scan step after step until the scan settles; 0 hits for a stalled request."""
        manager = self.tiered
        for step in range(MAX_LOOKUP_STEPS):
            count, defer = manager.scan_prefix(keys, ctx)  # the connector's prefix scan
            if not defer:
                if step:
                    self.requests_waited += 1
                return count
            manager.on_schedule_end()
            self.steps_waited += 1
        self.requests_waited += 1
        self.requests_stalled += 1
        return 0

    def _load(self, keys: Sequence[ChunkKey], ctx: RequestContext, first_tokens: int) -> None:
        """Load, then count each loaded chunk's new tokens (the first may be partly a GPU
        hit) for the tier it came from."""
        super()._load(keys, ctx, first_tokens)
        source = self.tiered.load_source
        hit = self.hit_tokens
        tpc = self.chunk_tokens
        for i, key in enumerate(keys):
            hit[source(key, ctx)] += first_tokens if i == 0 else tpc

    def _finish(self, keys: list[ChunkKey], ctx: RequestContext) -> None:
        """The step ends with the request scheduled, then the request finishes."""
        self.tiered.on_schedule_end(new_req_ids=(ctx.req_id,))
        super()._finish(keys, ctx)

    def summary(
        self, prompt_blocks: int, unit_tokens: int, chunk_bytes: int | None
    ) -> dict[str, Any]:
        """The tiers' part of the replay summary: hits per tier (a CPU-tier hit was in the
        CPU tier at lookup, a tier hit was promoted from it for the request), promoted,
        cascaded and dropped chunks, and what went beyond vLLM (a capacity)."""
        manager = self.tiered
        ratio = (lambda x: x / prompt_blocks) if prompt_blocks else (lambda x: 0.0)
        cpu_blocks = self.hit_tokens[0] // unit_tokens
        out: dict[str, Any] = {
            "secondary_tiers": ", ".join(
                describe_tier(t.spec, i) for i, t in enumerate(manager.tiers)
            ),
            "cpu_tier_hit_blocks": cpu_blocks,
            "cpu_tier_hit_ratio": ratio(cpu_blocks),
        }
        for index, tier in enumerate(manager.tiers):
            name = f"tier{index + 1}_{tier.tier_type}"
            blocks = self.hit_tokens[index + 1] // unit_tokens
            c = tier.counters
            capacity = tier_capacity_chunks(tier.spec, chunk_bytes, name)
            out.update(
                {
                    f"{name}_hit_blocks": blocks,
                    f"{name}_hit_ratio": ratio(blocks),
                    f"{name}_promoted_chunks": c.promoted_chunks,
                    f"{name}_cascaded_chunks": c.cascaded_chunks,
                    f"{name}_dropped_chunks": c.dropped_chunks,
                    f"{name}_promotion_failures": c.promotion_failures,
                    f"{name}_cascade_failures": c.cascade_failures,
                    f"{name}_read_bytes": c.promoted_chunks * chunk_bytes if chunk_bytes else None,
                    f"{name}_written_bytes": c.cascaded_chunks * chunk_bytes
                    if chunk_bytes
                    else None,
                    f"{name}_resident_chunks": len(tier.store),
                    f"{name}_capacity_chunks": capacity,
                    f"{name}_evicted_chunks": tier.store.evicted_chunks,
                    f"{name}_eviction": (
                        "none: no capacity limit, as vLLM"
                        if capacity is None
                        else f"{tier.spec.eviction_policy}: kvsim capacity, beyond vLLM"
                    ),
                }
            )
        counters, _ = manager.take_stats()
        out["promotion_allocation_failures"] = int(
            counters.get((PROMOTION_ALLOCATION_FAILURES, ""), 0)
        )
        out["requests_waited"] = self.requests_waited
        out["lookup_steps_waited"] = self.steps_waited
        out["requests_stalled"] = self.requests_stalled
        return out
