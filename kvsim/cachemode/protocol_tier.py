"""The CPU-tier half of one cache-mode request, through the full manager protocol.

:class:`ProtocolTier` drives any object with vLLM's ``OffloadingManager`` calls (kvsim's
:class:`~kvsim.manager.offload.OffloadManager` with any policy, or an adapter around vLLM's own
manager) exactly as the connector does for a request that runs alone: lookup, load,
store offers, finish. It is the reference the fused tiers are checked against.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol, cast

from kvsim.core.context import chunk_positions
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import ManagerCounters, ManagerProtocol
from kvsim.policies.base import EvictionPolicy


def offer_bounds(
    store_chunks: int,
    computed_tokens: int,
    input_tokens: int,
    chunk_tokens: int,
    prefill_step: int | None,
) -> Sequence[int]:
    """End chunk of each store offer: one offer of every chunk, or one per prefill step.

    With chunked prefill a chunk is offered in the step that schedules its last token, and a
    failed offer is retried, together with the new chunks, in the next step.
    """
    if not prefill_step:
        return (store_chunks,)
    computed = min(computed_tokens, input_tokens - 1)
    return [
        min(store_chunks, min(end, input_tokens) // chunk_tokens)
        for end in range(computed + prefill_step, input_tokens + prefill_step, prefill_step)
    ]


def offer_stores(
    manager: Any,
    keys: Sequence[ChunkKey],
    ctx: Any,
    next_store: int,
    store_chunks: int,
    computed_tokens: int,
    input_tokens: int,
    chunk_tokens: int,
    prefill_step: int | None,
) -> tuple[int, int, int]:
    """Offer chunks ``next_store:store_chunks`` for store, at :func:`offer_bounds`, as the
    connector does (a failed offer is retried with the next step's chunks); complete what is
    accepted. Returns ``(stored, evicted, failed offers)``. One loop for the CPU tier alone
    and for the tiered manager."""
    stored = evicted = failed = 0
    if store_chunks <= next_store:
        return stored, evicted, failed
    bounds = offer_bounds(store_chunks, computed_tokens, input_tokens, chunk_tokens, prefill_step)
    for upto in bounds:
        if upto <= next_store:
            continue
        out = manager.prepare_store(keys[next_store:upto], ctx)
        if out is None:
            failed += 1
            continue
        next_store = upto
        if out.keys_to_store:
            stored += len(out.keys_to_store)
            evicted += len(out.evicted_keys)
            manager.complete_store(out.keys_to_store, ctx)
    return stored, evicted, failed


class _HasPolicy(Protocol):
    """kvsim's manager, for inspection: it exposes its eviction policy."""

    policy: EvictionPolicy


class ProtocolTier:
    """One request's CPU-tier calls (steps 2-5 of :mod:`kvsim.cachemode.driver`) on a manager."""

    name = "protocol"

    def __init__(
        self, manager: ManagerProtocol[Any], chunk_tokens: int, prefill_step: int | None
    ) -> None:
        self.manager = manager
        self.chunk_tokens = chunk_tokens
        self.prefill_step = prefill_step
        # optional: kvsim's manager keeps counters; an adapter around vLLM's may not
        self.counters: ManagerCounters | None = getattr(manager, "counters", None)

    @property
    def num_resident(self) -> int | None:
        resident: int | None = getattr(self.manager, "num_resident", None)
        return resident

    def resident_keys(self) -> list[ChunkKey]:
        """Resident keys, least recently used first when the policy can tell (kvsim's
        manager only: it needs the manager's ``policy``)."""
        policy = cast(_HasPolicy, self.manager).policy
        order = getattr(policy, "eviction_order", None)
        return order() if order is not None else list(policy.keys())

    def serve(
        self,
        req_id: Hashable,
        keys: list[ChunkKey],
        local_tokens: int,
        store_chunks: int,
        input_tokens: int,
    ) -> tuple[int, int, int, int, int]:
        """Returns ``(cpu_hit_tokens, stored, evicted, failed_offers, skipped)`` in chunks."""
        manager = self.manager
        tpc = self.chunk_tokens
        counters = self.counters
        skipped_before = counters.stores_skipped if counters is not None else 0
        n_chunks = len(keys)
        ctx = manager.new_context(req_id, chunk_positions(keys, tpc))
        manager.on_new_request(ctx)

        next_store = 0
        cpu_hit_tokens = 0
        if n_chunks * tpc - local_tokens >= tpc:
            start = local_tokens // tpc
            count, _pending = manager.lookup_prefix(keys[start:])
            hit_tokens = tpc * (start + count) - local_tokens
            if hit_tokens >= tpc:
                load_keys = keys[start : start + count]
                manager.prepare_load(load_keys, ctx)
                manager.complete_load(load_keys, ctx)
                cpu_hit_tokens = hit_tokens
                next_store = start + count

        stored, evicted, failed = offer_stores(
            manager,
            keys,
            ctx,
            next_store,
            store_chunks,
            local_tokens + cpu_hit_tokens,
            input_tokens,
            tpc,
            self.prefill_step,
        )
        manager.on_request_finished(ctx)
        skipped = counters.stores_skipped - skipped_before if counters is not None else 0
        return cpu_hit_tokens, stored, evicted, failed, skipped
