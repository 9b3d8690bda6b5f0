"""The CPU tier of cache mode: one interface, and the connector's per-request sequence
written once.

A cache-mode request runs alone, so the connector's calls for it collapse into one
sequence (steps 2-5 of :mod:`kvsim.cachemode.driver`): begin, scan the tier from the first
chunk the GPU does not hold, load the hits, offer the chunks after them for store (once, or
once per prefill step, a failed offer retried with the next step's chunks), finish.
:meth:`Tier.serve` is that sequence; a tier says how each step is done:

* :class:`~kvsim.cachemode.protocol_tier.ProtocolTier`: by the manager protocol's calls
  (kvsim's ``OffloadManager`` with any policy, or vLLM's own manager);
* :class:`~kvsim.cachemode.tiered_tier.TieredProtocolTier`: the same with secondary tiers
  (its scan waits for promotions, its loads are attributed to the tier they came from);
* :class:`~kvsim.cachemode.fused_tier.FusedTier`: by a policy's state directly, for vLLM's
  ``lru`` and ``arc`` (the same decisions, several times faster).

The step hooks take a context: whatever :meth:`Tier._begin` returned for the request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import ManagerCounters

if TYPE_CHECKING:
    from kvsim.traces.columns import Record

#: one request's row, in the driver's ``REQUEST_COLUMNS`` order
RequestRow = tuple[int, float, int, int, int, int, int, int, int, bool]

#: where a replay loop sends each request's row
Emit = Callable[[RequestRow], object]

#: a run's totals, as a replay loop counts them: requests, prompt tokens, prompt blocks,
#: GPU hit blocks, CPU hit blocks, stored chunks, evicted chunks, failed stores
RunTotals = tuple[int, int, int, int, int, int, int, int]

#: a loop that replays a part of a run: (records, emit) -> :data:`RunTotals`
ReplayLoop = Callable[[Iterable["Record"], Emit], RunTotals]


class TierResult(NamedTuple):
    """What one request did in the CPU tier (:meth:`Tier.serve`); counts in chunks."""

    #: prompt tokens loaded from the tier (0, or at least one chunk's worth past the GPU hit)
    cpu_hit_tokens: int
    #: chunks the request stored
    stored: int
    #: chunks evicted to make room for them
    evicted: int
    #: store offers whose allocation failed (each retried with the next offer, if any)
    failed_offers: int
    #: offered chunks the admission policy kept out
    skipped: int


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


class Tier(ABC):
    """One CPU tier as cache mode drives it: a request at a time, in trace order.

    Invariants: between two :meth:`serve` calls no request is running, so every resident
    chunk is ready and unpinned; a request's decisions depend only on the tier's state
    and the arguments (no clock, no randomness beyond a seeded admission policy).
    Subclasses implement the steps (``_begin`` ... ``_finish``); the order of the steps
    is :meth:`serve`'s alone.
    """

    #: the tier's name in the summary (``tier``)
    name: ClassVar[str]
    #: cumulative counters (stored, evicted, loaded, skipped, failures); None when the
    #: manager keeps none (an adapter around vLLM's own manager)
    counters: ManagerCounters | None
    #: tokens per chunk
    chunk_tokens: int
    #: chunked prefill's tokens per step (offers per step), or None: one offer per request
    prefill_step: int | None

    @property
    @abstractmethod
    def num_resident(self) -> int | None:
        """Chunks resident in the CPU tier now (None when the manager cannot tell)."""

    @abstractmethod
    def resident_keys(self) -> list[ChunkKey]:
        """The resident keys, the next victim first where the policy can tell."""

    def serve(
        self,
        req_id: Hashable,
        keys: list[ChunkKey],
        local_tokens: int,
        store_chunks: int,
        input_tokens: int,
    ) -> TierResult:
        """Run one request through the tier, as vLLM's connector does when it runs alone.

        Args:
            req_id: the request's id (handed to the manager's request context).
            keys: the request's chunk keys, head first (complete chunks of the prompt).
            local_tokens: prompt tokens the GPU prefix cache already holds; the scan starts
                at the chunk that holds token ``local_tokens``.
            store_chunks: how many leading chunks the request computed and may store (those
                the GPU could allocate); chunks before the loaded ones are not offered
                again when some load, else every chunk from chunk 0 is offered.
            input_tokens: the prompt's length (the last token is never a hit).

        Returns:
            :class:`TierResult`, in chunks.

        Invariants: the scan runs only when a whole chunk past the GPU hit can load; a
        load is at least one chunk's worth of new tokens; offers are cumulative (each ends
        at a later chunk, :func:`offer_bounds`) and a successful one is complete before
        the next; the request is finished exactly once, last.
        """
        tpc = self.chunk_tokens
        counters = self.counters
        skipped_before = counters.stores_skipped if counters is not None else 0
        ctx = self._begin(req_id, keys)
        next_store = cpu_hit_tokens = 0
        if len(keys) * tpc - local_tokens >= tpc:
            start = local_tokens // tpc
            count = self._lookup(keys[start:] if start else keys, ctx)
            hit_tokens = tpc * (start + count) - local_tokens
            if hit_tokens >= tpc:
                next_store = start + count
                self._load(keys[start:next_store], ctx, tpc * (start + 1) - local_tokens)
                cpu_hit_tokens = hit_tokens

        stored = evicted = failed = 0
        if store_chunks > next_store:
            bounds = offer_bounds(
                store_chunks, local_tokens + cpu_hit_tokens, input_tokens, tpc, self.prefill_step
            )
            for upto in bounds:
                if upto <= next_store:
                    continue
                out = self._store(keys[next_store:upto], failed > 0, keys, ctx)
                if out is None:
                    failed += 1
                    continue
                next_store = upto
                stored += out[0]
                evicted += out[1]
        self._finish(keys, ctx)
        skipped = counters.stores_skipped - skipped_before if counters is not None else 0
        return TierResult(cpu_hit_tokens, stored, evicted, failed, skipped)

    # --- the steps ---

    @abstractmethod
    def _begin(self, req_id: Hashable, keys: list[ChunkKey]) -> Any:
        """The request arrives; returns the context the other steps get."""

    @abstractmethod
    def _lookup(self, keys: Sequence[ChunkKey], ctx: Any) -> int:
        """How many leading ``keys`` (those after the GPU hit) can load (the connector's
        prefix scan; a tier may wait steps for it to settle)."""

    @abstractmethod
    def _load(self, keys: Sequence[ChunkKey], ctx: Any, first_tokens: int) -> None:
        """Load ``keys`` (the whole scanned hit) and complete the load.
        ``first_tokens``: the new tokens of the first key (the rest may be a GPU hit)."""

    @abstractmethod
    def _store(
        self, offer: list[ChunkKey], retry: bool, keys: list[ChunkKey], ctx: Any
    ) -> tuple[int, int] | None:
        """Offer ``offer`` for store and complete what is accepted; ``retry``: an offer of
        this request failed before; ``keys``: all the request's keys. Returns ``(stored,
        evicted)``, or None when the allocation failed (nothing changed but what the offer
        taught the policies)."""

    @abstractmethod
    def _finish(self, keys: list[ChunkKey], ctx: Any) -> None:
        """The request finishes: its accesses are committed."""

    # --- optional ---

    def whole_run_loop(self) -> ReplayLoop | None:
        """A loop that replays whole parts of a run where a chunk is one trace block and no
        GPU cache sits before the tier, making :meth:`serve`'s decisions; None: the
        driver calls :meth:`serve` per request."""
        return None

    def summary(
        self, prompt_blocks: int, unit_tokens: int, chunk_bytes: int | None
    ) -> dict[str, Any]:
        """The tier's own keys in the replay summary (none by default)."""
        return {}
