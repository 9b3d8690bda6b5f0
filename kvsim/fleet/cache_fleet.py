"""A fleet in cache mode: N cache-mode replays behind one router, in trace order.

Each request is routed (the router sees every instance's load and held prefix, see
:mod:`kvsim.fleet.view`), then served whole by its instance, exactly as a single
``kvsim replay`` serves it (:meth:`kvsim.cachemode.CacheReplay.replay_records`). Cache
mode has no time, so an instance's load is the requests routed to it in the last
``--router-window-s`` seconds of trace time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvsim.cachemode import REQUEST_COLUMNS, CacheReplay
from kvsim.cachemode.fused_tier import FusedTier
from kvsim.cachemode.protocol_tier import ProtocolTier
from kvsim.cachemode.tier import RequestRow
from kvsim.cachemode.tiered_tier import TieredProtocolTier
from kvsim.core.keys import ChunkKey
from kvsim.fleet.routers import make_router
from kvsim.fleet.shared import shared_store, shared_tier_spec, with_shared_tier
from kvsim.fleet.summary import balance_fields, merge_cache_summaries
from kvsim.fleet.view import FleetRouter, Load
from kvsim.manager.offload import LookupResult
from kvsim.options.config import CacheConfig
from kvsim.options.fleet import FleetOptions
from kvsim.report.result import Result
from kvsim.traces.model import Request, Trace

_HIT = LookupResult.HIT


def cpu_prefix(tier: Any, keys: Sequence[ChunkKey]) -> int:
    """How many leading ``keys`` a cache-mode CPU tier holds (no side effects)."""
    if isinstance(tier, FusedTier):
        return tier.resident_prefix(keys)
    assert isinstance(tier, ProtocolTier)
    manager: Any = tier.tiered.primary if isinstance(tier, TieredProtocolTier) else tier.manager
    count = 0
    for key in keys:
        if manager.lookup(key) is not _HIT:
            break
        count += 1
    return count


class CacheProbe:
    """A cache-mode instance as the router reads it."""

    def __init__(self, replay: CacheReplay, window_s: float) -> None:
        self.replay = replay
        self.window = window_s
        self.arrivals: deque[float] = deque()
        self.unit_tokens = replay.layout.unit_tokens
        self.chunk_tokens = replay.layout.chunk_tokens

    def load(self, now: float) -> Load:
        arrivals = self.arrivals
        while arrivals and arrivals[0] <= now - self.window:
            arrivals.popleft()
        gpu = self.replay.gpu
        return 0, len(arrivals), gpu.num_free, gpu.usage()

    def routed(self, now: float) -> None:
        self.arrivals.append(now)

    def held(
        self, unit_keys: Sequence[int], chunk_keys: Sequence[ChunkKey], prompt_tokens: int
    ) -> tuple[int, int]:
        ut, tpc = self.unit_tokens, self.chunk_tokens
        gpu = self.replay.gpu
        g = 0
        if gpu.enabled and unit_keys:
            g = gpu.match_prefix(unit_keys, (prompt_tokens - 1) // ut)
        start = g * ut // tpc
        c = cpu_prefix(self.replay.tier, chunk_keys[start:])
        gpu_tokens = g * ut
        cpu_tokens = max(0, min(prompt_tokens, (start + c) * tpc) - gpu_tokens) if c else 0
        return gpu_tokens, cpu_tokens


def replay_fleet(
    tr: Trace,
    config: CacheConfig,
    fleet: FleetOptions,
    *,
    fused: bool | None = None,
    per_request: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Result:
    """Cache-mode replay of ``tr`` on ``fleet.instances`` instances of ``config``.

    Returns a :class:`Result` whose summary has every key of a single replay's (for the
    fleet as a whole, :mod:`kvsim.fleet.summary`) plus the fleet's; tables ``requests``
    (with the serving ``instance``, last) and ``instances`` (one row per instance)."""
    n = fleet.instances
    spec = shared_tier_spec(fleet)
    stores = None
    shared_prefix = None
    if spec is not None:
        config, index = with_shared_tier(config, spec)
        stores = {index: shared_store(config, index, tr)}
        shared_prefix = f"tier{index + 1}_{spec.type}"
    instances = [
        CacheReplay(config, requests_for_future=tr, fused=fused, tier_stores=stores)
        for _ in range(n)
    ]
    probes = [CacheProbe(r, fleet.router_window_s) for r in instances]
    router = make_router(
        fleet.router,
        n,
        config.seed,
        prefix_weight=fleet.router_prefix_weight,
        queue_weight=fleet.router_queue_weight,
        kv_weight=fleet.router_kv_weight,
    )
    shared = stores[len(config.secondary_tiers) - 1] if stores else None
    view = FleetRouter(
        probes,
        router,
        fleet.router,
        config.layout,
        config.layout.unit_tokens,
        fleet.router_staleness_ms / 1000.0,
        shared.contains if shared is not None else None,
    )
    rows: list[tuple[Any, ...]] = []
    routes: list[int] = []
    _run(tr, instances, view, rows, routes, per_request, progress)
    summaries = [r.summary() for r in instances]
    summary = merge_cache_summaries(summaries, shared_prefix)
    summary.update(_fleet_fields(fleet, view, summaries, shared_prefix))
    tables = {"instances": _instance_table(view, summaries, shared_prefix)}
    if per_request:
        import pandas as pd

        frame = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
        tables["requests"] = frame.assign(instance=routes)
    return Result(
        summary={"trace": str(tr.path), **summary, **config.capacity_summary()},
        tables=tables,
        config={**config.as_dict(), **fleet.as_dict()},
    )


def _run(
    tr: Iterable[Request],
    instances: list[CacheReplay],
    view: FleetRouter,
    rows: list[tuple[Any, ...]],
    routes: list[int],
    per_request: bool,
    progress: Callable[[int], None] | None,
) -> None:
    emit: Callable[[RequestRow], object] = rows.append if per_request else (lambda row: None)
    layout = view.layout
    needs = view.needs_prefix
    done = 0
    for req in tr:
        unit_keys = chunk_keys = None
        if needs:
            unit_keys = layout.unit_keys(req.block_hashes, req.prompt_tokens)
            chunk_keys = layout.chunk_keys(unit_keys)
        i = view.route(req, req.arrival_s, unit_keys, chunk_keys)
        record = (
            req.request_id,
            req.arrival_s,
            req.prompt_tokens,
            req.output_tokens,
            req.block_hashes,
            req.session_id,
        )
        instances[i].replay_records((record,), emit)
        if per_request:
            routes.append(i)
        done += 1
        if progress is not None and done % 256 == 0:
            progress(256)
    if progress is not None and done % 256:
        progress(done % 256)


def _hits(s: dict[str, Any], shared_prefix: str | None) -> tuple[int, int, int]:
    """GPU, CPU-tier and shared-tier hit blocks of one summary."""
    shared = s.get(f"{shared_prefix}_hit_blocks", 0) if shared_prefix else 0
    return s["gpu_hit_blocks"], s["cpu_hit_blocks"] - shared, shared


def _instance_table(
    view: FleetRouter, summaries: list[dict[str, Any]], shared_prefix: str | None
) -> Any:
    import pandas as pd

    rows = []
    total = sum(s["prompt_blocks"] for s in summaries) or 1
    for i, s in enumerate(summaries):
        gpu, cpu, shared = _hits(s, shared_prefix)
        blocks = s["prompt_blocks"] or 1
        rows.append(
            {
                "instance": i,
                "requests": view.routed_requests[i],
                "prompt_tokens": view.routed_tokens[i],
                "prompt_blocks": s["prompt_blocks"],
                "load_share": s["prompt_blocks"] / total,
                "gpu_hit_blocks": gpu,
                "cpu_hit_blocks": cpu,
                "shared_hit_blocks": shared,
                "gpu_hit_ratio": gpu / blocks,
                "cpu_hit_ratio": cpu / blocks,
                "shared_hit_ratio": shared / blocks,
                "combined_hit_ratio": (gpu + cpu + shared) / blocks,
                "hit_share": (gpu + cpu + shared)
                / max(1, sum(sum(_hits(t, shared_prefix)) for t in summaries)),
            }
        )
    return pd.DataFrame.from_records(rows)


def _fleet_fields(
    fleet: FleetOptions,
    view: FleetRouter,
    summaries: list[dict[str, Any]],
    shared_prefix: str | None,
) -> dict[str, Any]:
    blocks = sum(s["prompt_blocks"] for s in summaries)
    shared = sum(_hits(s, shared_prefix)[2] for s in summaries)
    return {
        "instances": fleet.instances,
        "router": fleet.router,
        "router_staleness_ms": fleet.router_staleness_ms,
        "shared_tier": fleet.shared_tier or "none",
        "shared_hit_blocks": shared,
        "shared_hit_ratio": shared / blocks if blocks else 0.0,
        **balance_fields(view.routed_requests, view.routed_tokens),
    }
