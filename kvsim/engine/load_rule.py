"""Load or recompute: what a prefix costs either way, and the opt-in rule (beyond vLLM).

vLLM always loads a hit, from any tier. A chunk on a slow tier can take longer to
promote and load than the GPU takes to compute it again. Two estimates, on the engine's
own models, decide:

* **load**: the promotion on the tier's device (:meth:`DeviceSpec.job_time`, the idle
  device, plus the read operations already queued there) and the CPU -> GPU copy on the
  link (:meth:`DirectionParams.job_time`);
* **recompute**: a prefill of the same tokens after the tokens before them, alone on the
  GPU in steps of ``max_num_batched_tokens``, under the engine's compute model
  (:func:`prefill_seconds`).

:class:`PaysOffRule` is the rule ``kvsim_load_rule: "pays-off"`` (``--tier-load-rule``):
the manager asks it before a secondary hit promotes a chunk. At a request's first such
hit on a tier the rule weighs the whole run that tier holds from there (the following
chunks of the prompt it has, which vLLM's batched existence check answers at once): the
run's promotion, spread over the tier's I/O threads, and its copy against computing the
same tokens. The verdict holds for the request: load the run, or treat it as a MISS (the
scan stops there and the request computes the rest). Judging chunk by chunk would weigh
one chunk on one thread against one chunk of compute, and refuse runs that load in
parallel far faster than they compute. The per-request report
(:func:`kvsim.engine.tier_report.request_columns`) compares the load the request really
waited for with the same recompute estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import lru_cache

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.engine.step_batch import StepBatch
from kvsim.engine.transfer_model import DirectionParams
from kvsim.tiering.devices import TierDevice


def prefill_seconds(
    compute: Callable[[StepBatch], float], tokens: int, context: int, step_tokens: int
) -> float:
    """Seconds to compute ``tokens`` prompt tokens after ``context`` cached ones, alone on
    the GPU, ``step_tokens`` a step (chunked prefill)."""
    total = 0.0
    done = 0
    while done < tokens:
        n = min(step_tokens, tokens - done)
        c = context + done
        total += compute(StepBatch(1, 1, n, 0, c, n * c + n * (n + 1) / 2, 0))
        done += n
    return total


class LoadCosts:
    """The two estimates for one engine: its compute model, link and chunk geometry."""

    def __init__(
        self,
        compute: Callable[[StepBatch], float],
        h2d: DirectionParams,
        *,
        chunk_tokens: int,
        chunk_bytes: int,
        kv_bytes_per_token: int,
        copies_per_token: float,
        step_tokens: int,
    ) -> None:
        self.h2d = h2d
        self.chunk_tokens = chunk_tokens
        self.chunk_bytes = chunk_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self.copies_per_token = copies_per_token
        self.recompute_s: Callable[[int, int], float] = lru_cache(maxsize=65536)(
            lambda tokens, context: prefill_seconds(compute, tokens, context, step_tokens)
        )

    def copy_s(self, tokens: int) -> float:
        """CPU -> GPU time of ``tokens`` tokens alone on the link (one worker's bytes)."""
        copies = max(1, round(tokens * self.copies_per_token))
        return self.h2d.job_time(tokens * self.kv_bytes_per_token, copies)

    def load_s(self, device: TierDevice, chunks: int) -> float:
        """Promote ``chunks`` chunks from ``device`` (behind its queued reads), then copy
        them to the GPU."""
        promote = device.spec.job_time(True, chunks, self.chunk_bytes) + device.read_backlog_s()
        return promote + self.copy_s(chunks * self.chunk_tokens)


class PaysOffRule:
    """The manager's promotion gate: promote a request's run from a tier only if loading
    it beats recomputing it. Counts the distinct (request, chunk) pairs it turned away, per
    tier."""

    def __init__(
        self,
        costs: LoadCosts,
        devices: list[TierDevice],
        stores: Sequence[Callable[[ChunkKey], bool]],
        tiers: set[int],
    ) -> None:
        self.costs = costs
        self.devices = devices
        self.stores = stores  # each tier's "holds this key"
        self.tiers = tiers  # tier indices the rule applies to
        self.skipped: list[set[tuple[Hashable, ChunkKey]]] = [set() for _ in devices]
        self._verdicts: dict[tuple[Hashable, int], bool] = {}

    def __call__(self, tier: int, key: ChunkKey, ctx: RequestContext, promoted: int) -> bool:
        if tier not in self.tiers:
            return True
        verdict = self._verdicts.get((ctx.req_id, tier))
        if verdict is None:
            verdict = self._judge(tier, key, ctx, promoted)
            self._verdicts[(ctx.req_id, tier)] = verdict
        if not verdict:
            self.skipped[tier].add((ctx.req_id, key))
        return verdict

    def _judge(self, tier: int, key: ChunkKey, ctx: RequestContext, promoted: int) -> bool:
        costs = self.costs
        tpc = costs.chunk_tokens
        positions = ctx.positions
        first_end = positions.get(key, tpc)
        later = sorted((end, k) for k, end in positions.items() if end > first_end)
        holds = self.stores[tier]
        run = 1
        for end, k in later:  # the consecutive chunks after this one that the tier holds
            if end != first_end + run * tpc or not holds(k):
                break
            run += 1
        chunks = promoted + run
        tokens = chunks * tpc
        run_end = first_end + (run - 1) * tpc
        recompute = costs.recompute_s(tokens, max(0, run_end - tokens))
        return costs.load_s(self.devices[tier], chunks) <= recompute
