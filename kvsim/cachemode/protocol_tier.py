"""The CPU-tier half of one cache-mode request, through the full manager protocol.

:class:`ProtocolTier` drives any object with vLLM's ``OffloadingManager`` calls (kvsim's
:class:`~kvsim.manager.offload.OffloadManager` with any policy, or an adapter around vLLM's own
manager) exactly as the connector does for a request that runs alone: the steps of
:meth:`kvsim.cachemode.tier.Tier.serve` as protocol calls. It is the reference the fused
tiers are checked against.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol, cast

from kvsim.cachemode.tier import Tier
from kvsim.core.context import chunk_positions
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import ManagerCounters, ManagerProtocol
from kvsim.policies.base import EvictionPolicy


class _HasPolicy(Protocol):
    """kvsim's manager, for inspection: it exposes its eviction policy."""

    policy: EvictionPolicy


class ProtocolTier(Tier):
    """One request's CPU-tier calls on a manager (``tier`` in the summary: ``protocol``)."""

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

    def _begin(self, req_id: Hashable, keys: list[ChunkKey]) -> Any:
        manager = self.manager
        ctx = manager.new_context(req_id, chunk_positions(keys, self.chunk_tokens))
        manager.on_new_request(ctx)
        return ctx

    def _lookup(self, keys: Sequence[ChunkKey], ctx: Any) -> int:
        count, _pending = self.manager.lookup_prefix(keys)
        return count

    def _load(self, keys: Sequence[ChunkKey], ctx: Any, first_tokens: int) -> None:
        self.manager.prepare_load(keys, ctx)
        self.manager.complete_load(keys, ctx)

    def _store(
        self, offer: list[ChunkKey], retry: bool, keys: list[ChunkKey], ctx: Any
    ) -> tuple[int, int] | None:
        manager = self.manager
        out = manager.prepare_store(offer, ctx)
        if out is None:
            return None
        if not out.keys_to_store:
            return 0, 0
        manager.complete_store(out.keys_to_store, ctx)
        return len(out.keys_to_store), len(out.evicted_keys)

    def _finish(self, keys: list[ChunkKey], ctx: Any) -> None:
        self.manager.on_request_finished(ctx)
