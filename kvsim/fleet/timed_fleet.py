"""A fleet in timed mode: N engines in one process, one event loop interleaving them by time.

Each engine is the single-engine :class:`kvsim.engine.engine.Engine`, driven through its
public step API (``start``, ``next_event``, ``handle_next``, ``arrive``, ``finish``). The
fleet holds the run's :class:`~kvsim.engine.arrivals.ArrivalSource` (a trace's arrivals,
or the benchmark client of :mod:`kvsim.workloads.source`, the same object one engine runs)
and a heap of the engines' next events; it always takes the earliest event, in the
engine's own order at equal times (transfer wake-ups, then arrivals, then steps; engines by
index), so an arrival is routed once every engine has seen the copies that ended by then.
A closed loop of clients hears every engine's finishes, each at its time. A fleet's cost is
its engines' plus the router's, which looks up the request's prefix in each instance
(:mod:`kvsim.fleet.view`).
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvsim.core.errors import EngineStalled, InputError
from kvsim.core.keys import ChunkKey
from kvsim.core.memory import release_freed_memory
from kvsim.engine.arrivals import ArrivalSource, TraceArrivals, arrival_times
from kvsim.engine.engine import Engine
from kvsim.engine.events import PHASE_ARRIVAL, EventKey, earliest
from kvsim.engine.setup import TimedSetup, engine_outputs, make_engine
from kvsim.engine.stage_report import stage_table
from kvsim.engine.summary import busy_time, summarize
from kvsim.engine.transfer_protocol import STORE
from kvsim.fleet.routers import make_router
from kvsim.fleet.shared import shared_store, shared_tier_spec, with_shared_tier
from kvsim.fleet.summary import balance_fields, merge_cache_summaries
from kvsim.fleet.view import FleetRouter, Load
from kvsim.manager.offload import LookupResult
from kvsim.options.fleet import FleetOptions
from kvsim.report.serve_metrics import BenchSettings
from kvsim.tiering.manager import TieredManager
from kvsim.traces.model import Request, Trace
from kvsim.workloads import Workload

_HIT = LookupResult.HIT


class EngineProbe:
    """A timed instance as the router reads it: its scheduler's queues, its GPU pool, its
    CPU tier. The GPU prefix is read a key unit at a time (a unit counts when its last
    GPU block is cached)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.unit_tokens = engine.layout.unit_tokens
        self.chunk_tokens = engine.layout.chunk_tokens
        self.per_unit = engine.scheduler.blocks_per_unit
        manager = engine.manager
        self.cpu = manager.primary if isinstance(manager, TieredManager) else manager

    def load(self, now: float) -> Load:
        e = self.engine
        sched = e.scheduler
        return sched.num_waiting, len(sched.running), e.pool.num_free, e.pool.usage()

    def routed(self, now: float) -> None:
        return

    def held(
        self, unit_keys: Sequence[int], chunk_keys: Sequence[ChunkKey], prompt_tokens: int
    ) -> tuple[int, int]:
        ut, tpc, per_unit = self.unit_tokens, self.chunk_tokens, self.per_unit
        pool = self.engine.pool
        g = 0
        if pool.enabled and self.engine.params.enable_prefix_caching:
            most = (prompt_tokens - 1) // ut
            last = per_unit - 1
            for key in unit_keys[:most]:  # the scheduler's block key of the unit's last block
                if not pool.match_prefix((key * per_unit + last,), 1):
                    break
                g += 1
        gpu_tokens = g * ut
        cpu = self.cpu
        if cpu is None:
            return gpu_tokens, 0
        start = gpu_tokens // tpc
        c = 0
        for key in chunk_keys[start:]:
            if cpu.lookup(key) is not _HIT:
                break
            c += 1
        cpu_tokens = max(0, min(prompt_tokens, (start + c) * tpc) - gpu_tokens) if c else 0
        return gpu_tokens, cpu_tokens


def simulate_fleet(
    setup: TimedSetup,
    tr: Trace | Workload,
    offload: bool,
    fleet: FleetOptions,
    bench: BenchSettings,
    record_tokens: bool = False,
    progress: Callable[[int], None] | None = None,
    stages: Sequence[int] | None = None,
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """A timed run of ``tr`` (a trace, or a benchmark workload whose client sends to the
    fleet: a closed loop's N clients are N for the whole fleet) on ``fleet.instances``
    engines of ``setup``; returns the fleet's summary (every key of an engine's, for the
    fleet as a whole, then the fleet's) and tables: the engine's, each with the serving
    ``instance`` last (requests in routing order), ``instances``, and ``stages`` (every
    metric per load stage) for a workload or when ``stages`` gives each trace request's."""
    n = fleet.instances
    config = setup.config
    p = setup.params
    source: ArrivalSource
    if isinstance(tr, Workload):
        client = tr.source()
        source = client
        future: Trace | None = None if tr.closed else tr.trace()
    else:
        client = None
        source = TraceArrivals(arrival_times(tr, p.time_scale, p.poisson_rate, p.seed))
        future = tr
    spec = shared_tier_spec(fleet)
    stores = None
    shared_prefix = None
    if spec is not None:
        if not offload:
            raise InputError("--shared-tier sits behind each CPU tier: give it a size (--cpu-gib)")
        config, index = with_shared_tier(config, spec)
        stores = {index: shared_store(config, index, future)}
        shared_prefix = f"tier{index + 1}_{spec.type}"
    future = future if offload else None  # read only by policies that need it
    engines = [make_engine(setup, offload, future, progress, config, stores) for _ in range(n)]
    router = make_router(
        fleet.router,
        n,
        config.seed,
        prefix_weight=fleet.router_prefix_weight,
        queue_weight=fleet.router_queue_weight,
        kv_weight=fleet.router_kv_weight,
    )
    shared = next(iter(stores.values())) if stores else None
    view = FleetRouter(
        [EngineProbe(e) for e in engines],
        router,
        fleet.router,
        config.layout,
        setup.params.gpu_block_tokens,
        fleet.router_staleness_ms / 1000.0,
        shared.contains if shared is not None else None,
    )
    routes: dict[int, int] = {}
    stalled: EngineStalled | None = None
    try:
        _run(engines, view, source, stores is not None, routes)
    except EngineStalled as exc:  # one instance stalled: the fleet reports what ran
        stalled = exc
    if client is not None:
        stages = client.stage_of
    closed = isinstance(tr, Workload) and tr.load.type == "concurrency"
    with warnings.catch_warnings():  # an instance's overload: the fleet's summary warns
        warnings.simplefilter("ignore")
        parts = [_instance_outputs(e, bench, record_tokens, stalled) for e in engines]
    summary, tables = _outputs(
        engines, parts, routes, view, fleet, bench, shared_prefix, stages, closed, stalled
    )
    if stalled is not None:
        summary["stalled"] = str(stalled)
        summary["unfinished_requests"] = int((~_ended(tables["requests"])).sum())
        stalled.partial = (summary, tables)
        raise stalled
    return summary, tables


def _instance_outputs(
    engine: Engine, bench: BenchSettings, record_tokens: bool, stalled: EngineStalled | None
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """One instance's summary and tables (nothing for an instance the router never chose);
    after a stall, of the requests that ended on it (:func:`engine_outputs`' partial)."""
    if not engine.recorder.requests:
        return {}, {}
    if stalled is None:
        return engine_outputs(engine, bench, record_tokens)
    try:
        engine_outputs(engine, bench, record_tokens, stalled=EngineStalled(str(stalled)))
    except EngineStalled as exc:
        return exc.partial
    raise AssertionError("engine_outputs raises the stall it is given")


def _ended(requests: pd.DataFrame) -> pd.Series:
    """The requests that finished or were rejected (a stalled run's summary covers those)."""
    return requests["rejected"] | requests["finish_s"].notna()


def fleet_runner(fleet: FleetOptions, sized: bool) -> Callable[..., tuple[dict[str, Any], Any]]:
    """:func:`simulate_fleet` with :func:`kvsim.engine.setup.run_engine`'s signature; its
    baseline (no CPU tier) has no shared tier either. ``sized``: the run has a CPU tier."""
    if fleet.shared_tier is not None and not sized:
        raise InputError("--shared-tier sits behind each CPU tier: give it a size (--cpu-gib)")

    def run(
        setup: TimedSetup,
        tr: Trace | Workload,
        offload: bool,
        bench: BenchSettings,
        record_tokens: bool = False,
        progress: Callable[[int], None] | None = None,
        stages: Sequence[int] | None = None,
    ) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
        mine = fleet
        if not offload:
            mine = fleet.with_(shared_tier=None, shared_tier_capacity=None, shared_tier_link=None)
        return simulate_fleet(setup, tr, offload, mine, bench, record_tokens, progress, stages)

    return run


class _Feed:
    """The fleet's side of its :class:`~kvsim.engine.arrivals.ArrivalSource`, as an engine
    feeds its own: the source is asked for its next send at the start, after each send or
    wake-up and after finishes. When the source decides sends by finishes (a closed loop),
    each engine runs this object as its own source: it sends nothing itself (the fleet
    routes every send) and queues each finish, which the source hears at the finish's time
    (before a send at that time), so no send follows a finish from another engine's
    future."""

    wants_finishes = True

    def __init__(self, source: ArrivalSource, engines: list[Engine]) -> None:
        self.source = source
        self.pending: list[tuple[float, int, int]] = []  # (time, report order, request id)
        self._order = 0
        self.engines = engines
        relay = getattr(source, "wants_finishes", True)
        for e in engines:
            if relay:
                e.start(self, more_arrivals=True)
            else:
                e.start(more_arrivals=True)
        self.nxt = source.next_arrival(0.0)
        self.told = False  # the engines know that no more arrivals come
        # the engines' finishes reach the source, which may send at once (a closed loop): an
        # engine must not run ahead of the others (see horizon)
        self.relay = relay

    # --- the engines' source ---

    @property
    def done(self) -> bool:
        return self.source.done

    def next_arrival(self, now: float) -> tuple[float, Request | None] | None:
        return None

    def finished(self, request_id: int, t: float) -> None:
        self._order += 1
        heapq.heappush(self.pending, (t, self._order, request_id))

    # --- the fleet's loop ---

    def due(self, key: tuple[float, int] | None) -> int:
        """What comes before the engines' next event ``key``: finishes to hear
        (:data:`_HEAR`), a send or wake-up (:data:`_SEND`), or neither (0)."""
        pending, nxt = self.pending, self.nxt
        if (
            pending
            and (key is None or (pending[0][0], PHASE_ARRIVAL) <= key)
            and (nxt is None or pending[0][0] <= nxt[0])
        ):
            return _HEAR
        if nxt is not None and (key is None or (nxt[0], PHASE_ARRIVAL) <= key):
            return _SEND
        return 0

    def horizon(self) -> EventKey | None:
        """The key of the feed's next event (finishes to hear, a send or wake-up), or
        None: an engine's quiet steps stop before it."""
        pending, nxt = self.pending, self.nxt
        return earliest(
            (pending[0][0], PHASE_ARRIVAL) if pending else None,
            (nxt[0], PHASE_ARRIVAL) if nxt is not None else None,
        )

    def hear(self) -> None:
        """The source hears the earliest finishes (one step's), then is asked."""
        t = self.pending[0][0]
        self._tell(t)
        if self.nxt is None:
            self.ask(t)

    def ask(self, t: float) -> None:
        """After a send or wake-up at ``t``: finishes at ``t`` (a request refused on
        arrival) are heard first."""
        self._tell(t)
        self.nxt = self.source.next_arrival(t)
        if not self.told and self.nxt is None and self.source.done:
            self.tell_engines()

    def _tell(self, upto: float) -> None:
        pending, source = self.pending, self.source
        while pending and pending[0][0] <= upto:
            t, _, rid = heapq.heappop(pending)
            source.finished(rid, t)

    def tell_engines(self) -> None:
        """No more arrivals: an engine holding work it cannot move rescues or stalls."""
        self.told = True
        for e in self.engines:
            e.no_more_arrivals()


_HEAR, _SEND = 1, 2


class _Loop:
    """The fleet's event loop: the engines' next events in a heap, the arrivals beside."""

    def __init__(self, engines: list[Engine], shared: bool) -> None:
        self.engines = engines
        self.heap: list[tuple[float, int, int, int]] = []  # (time, phase, engine, version)
        self.versions = [0] * len(engines)
        self.drivers = [e.tiers for e in engines if e.tiers is not None] if shared else []

    def push(self, i: int) -> None:
        """Engine ``i``'s next event (its older entry, if any, is stale from now on)."""
        self.versions[i] += 1
        key = self.engines[i].next_event()
        if key is not None:
            heapq.heappush(self.heap, (key[0], key[1], i, self.versions[i]))

    def next_key(self) -> EventKey | None:
        heap, versions = self.heap, self.versions
        while heap and versions[heap[0][2]] != heap[0][3]:
            heapq.heappop(heap)
        return (heap[0][0], heap[0][1]) if heap else None

    def sync(self, t: float) -> None:
        """Finish every instance's tier jobs that ended by ``t`` (shared tier only)."""
        for d in self.drivers:
            if d.busy:
                d.advance(t)

    def step(self, feed_horizon: EventKey | None, others: bool) -> None:
        """Engine ``i``'s next event. Its quiet decode steps may run on until
        ``feed_horizon`` (the fleet's next arrival or finishes to hear) and, when
        ``others``, the other engines' next event: with a shared tier or a source that
        hears finishes, they may change what this engine sees; else the instances touch
        nothing of each other's between arrivals."""
        t, _, i, _ = heapq.heappop(self.heap)
        if self.drivers:
            self.sync(t)
        horizon = feed_horizon
        if others or self.drivers:
            horizon = earliest(horizon, self.next_key())
        self.engines[i].handle_next(horizon)
        self.push(i)


def _run(
    engines: list[Engine],
    view: FleetRouter,
    source: ArrivalSource,
    shared: bool,
    routes: dict[int, int],
) -> None:
    """The event loop over the fleet; fills ``routes`` (request id -> routing position) as
    it routes, so a stall (:class:`EngineStalled`, raised through) leaves what was routed.

    With a shared tier, every instance's tier jobs that ended by an event's time are
    finished before it (their writes land in the shared store then, as a file appears when
    its writer renames it, whether or not its own engine is stepping)."""
    feed = _Feed(source, engines)
    loop = _Loop(engines, shared)
    while True:
        key = loop.next_key()
        due = feed.due(key)
        if due == _HEAR:
            feed.hear()
        elif due == _SEND:
            assert feed.nxt is not None
            t, req = feed.nxt
            if req is not None:
                if loop.drivers:
                    loop.sync(t)
                i = view.route(req, t)
                routes[req.request_id] = len(routes)
                engines[i].arrive(t, req)
                loop.push(i)
            feed.ask(t)
        elif key is not None:
            loop.step(feed.horizon(), feed.relay)
        elif not feed.told:  # nothing can happen while the source waits: say so
            feed.tell_engines()
            for i in range(len(engines)):
                loop.push(i)
        else:
            break
    for e in engines:
        e.finish()


def _outputs(
    engines: list[Engine],
    parts: list[tuple[dict[str, Any], dict[str, pd.DataFrame]]],
    routes: dict[int, int],
    view: FleetRouter,
    fleet: FleetOptions,
    bench: BenchSettings,
    shared_prefix: str | None,
    stages: Sequence[int] | None = None,
    closed: bool = False,
    stalled: EngineStalled | None = None,
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    tables: dict[str, pd.DataFrame] = {}
    used = [(i, s, t) for i, (s, t) in enumerate(parts) if s]
    for name in used[0][2]:
        if name == "steps" and len(used) > 1:
            for e in engines:
                e.recorder.forget_steps()
            tables[name] = _join_steps([(i, t) for i, _, t in used])
            continue
        frames = [t[name].assign(instance=i) for i, _, t in used]
        tables[name] = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    req = tables["requests"]
    recorders = _Recorders(engines)
    if stages is not None:  # the fleet's requests per stage, as one engine's are
        stage = np.asarray(stages, dtype=np.int64)[req["request"].to_numpy()]
        req.insert(len(req.columns) - 1, "stage", stage)
        tables["stages"] = stage_table(req, recorders, stage, bench)  # type: ignore[arg-type]
    if len(engines) > 1:
        order = req["request"].map(routes)
        tables["requests"] = req.iloc[order.argsort(kind="stable")].reset_index(drop=True)
    fleet_view = _Fleet(engines, recorders)
    ended = tables["requests"]
    if stalled is not None:  # as one engine's: the summary covers the requests that ended
        ended = ended[_ended(ended)]
    summary = summarize(fleet_view, ended, tables["transfers"], bench, closed)
    if "pcie_h2d_util" in summary:  # each instance's own link, averaged
        span = _span(tables["requests"])
        for key, loads in (("pcie_h2d_util", False), ("pcie_d2h_util", True)):
            summary[key] = sum(_link_busy(t["transfers"], loads) for _, _, t in used) / (
                span * len(parts)
            )
    merged = merge_cache_summaries([s for _, s, _ in used], shared_prefix)
    for key, value in merged.items():
        summary.setdefault(key, value)
    shared = sum(s.get(f"{shared_prefix}_hit_tokens", 0) for s, _ in parts) if shared_prefix else 0
    prompt = summary.get("total_input_tokens", 0)
    summary.update(
        {
            "instances": fleet.instances,
            "router": fleet.router,
            "router_staleness_ms": fleet.router_staleness_ms,
            "shared_tier": fleet.shared_tier or "none",
            "shared_hit_tokens": shared,
            "shared_hit_ratio": shared / prompt if prompt else 0.0,
            **balance_fields(view.routed_requests, view.routed_tokens),
        }
    )
    tables["instances"] = _instance_table(parts, view, shared_prefix)
    return summary, tables


def _join_steps(parts: list[tuple[int, dict[str, pd.DataFrame]]]) -> pd.DataFrame:
    """The instances' steps tables (``parts``: instance index, tables) as one with an
    ``instance`` column, as ``pd.concat`` of each with its ``instance`` gives it, built
    column by column, each instance's column deleted from its table once copied: a fleet's
    steps table (3.9M rows for 16 instances on the Mooncake trace) is never held twice.
    The instances' steps tables are left without columns."""
    frames = [t["steps"] for _, t in parts]
    lengths = [len(f) for f in frames]
    columns: dict[str, np.ndarray] = {}
    for name in list(frames[0].columns):
        columns[name] = np.concatenate([f[name].to_numpy() for f in frames])
        for f in frames:
            del f[name]
        release_freed_memory()  # the next column cannot reuse the freed ones (core/memory.py)
    columns["instance"] = np.repeat(np.array([i for i, _ in parts], dtype=np.int64), lengths)
    return pd.DataFrame(columns, copy=False)


def _span(requests: pd.DataFrame) -> float:
    done = requests[~requests["rejected"]]
    first = float(requests["arrival_s"].min()) if len(requests) else 0.0
    end = float(done["finish_s"].max()) if len(done) else first
    return max(end - first, 1e-12)


def _link_busy(transfers: pd.DataFrame, stores: bool) -> float:
    rows = transfers[(transfers["direction"] == STORE) == stores]
    return busy_time(rows["start_s"].to_numpy(), rows["end_s"].to_numpy())


def _instance_table(
    parts: list[tuple[dict[str, Any], dict[str, pd.DataFrame]]],
    view: FleetRouter,
    shared_prefix: str | None,
) -> pd.DataFrame:
    """Per instance: requests, prompt tokens, hits per tier and their shares, queueing."""
    rows = []
    hits_total = 0
    for s, _ in parts:
        hits_total += s.get("gpu_hit_tokens", 0) + s.get("cpu_hit_tokens", 0)
    total_tokens = sum(view.routed_tokens) or 1
    for i, (s, t) in enumerate(parts):
        shared = s.get(f"{shared_prefix}_hit_tokens", 0) if shared_prefix else 0
        reqs = t.get("requests")
        if reqs is not None and len(reqs):
            done = reqs[~reqs["rejected"]]
            queue, ttft = done["queue_s"].to_numpy(), done["ttft_s"].to_numpy()
        else:  # an instance the router never chose
            queue = ttft = np.zeros(0)
        prompt = max(1, view.routed_tokens[i])
        gpu_hits, cpu_hits = s.get("gpu_hit_tokens", 0), s.get("cpu_hit_tokens", 0)
        rows.append(
            {
                "instance": i,
                "requests": view.routed_requests[i],
                "prompt_tokens": view.routed_tokens[i],
                "load_share": view.routed_tokens[i] / total_tokens,
                "gpu_hit_tokens": gpu_hits,
                "cpu_hit_tokens": cpu_hits - shared,
                "shared_hit_tokens": shared,
                "gpu_hit_ratio": gpu_hits / prompt,
                "cpu_hit_ratio": (cpu_hits - shared) / prompt,
                "shared_hit_ratio": shared / prompt,
                "hit_share": (gpu_hits + cpu_hits) / max(1, hits_total),
                "mean_queue_s": float(queue.mean()) if len(queue) else 0.0,
                "p99_queue_s": float(pd.Series(queue).quantile(0.99)) if len(queue) else 0.0,
                "mean_ttft_s": float(ttft.mean()) if len(ttft) else 0.0,
                "gpu_busy_frac": s.get("gpu_busy_frac", math.nan),
                "preemptions": s.get("preemptions", 0),
            }
        )
    return pd.DataFrame.from_records(rows)


class _Fleet:
    """The fleet as :func:`kvsim.engine.summary.summarize` reads one engine: counts summed,
    the GPU's busy time averaged (so busy share and sustainable rate are the fleet's),
    configuration instance 0's."""

    def __init__(self, engines: list[Engine], recorders: _Recorders | None = None) -> None:
        first = engines[0]
        self.params = first.params
        self.model = first.model
        self.offload = first.offload
        self.config = first.config
        self.layout = first.layout
        self.num_gpu_blocks = first.num_gpu_blocks
        self.steps = sum(e.steps for e in engines)
        self.busy_s = sum(e.busy_s for e in engines) / len(engines)
        self.rescues = sum(e.rescues for e in engines)
        self.recorder = recorders or _Recorders(engines)
        self.pool = _Sum(evictions=sum(e.pool.evictions for e in engines))
        conns = [e.connector for e in engines if e.connector is not None]
        self.connector = (
            _Sum(
                stall_time=sum(c.stall_time for c in conns),
                submit_host_time=sum(c.submit_host_time for c in conns),
                allocation_failures=sum(c.allocation_failures for c in conns),
            )
            if conns
            else None
        )
        managers = [e.manager for e in engines if e.manager is not None]
        self.manager = _Sum(
            counters=_Sum(
                evicted_chunks=sum(m.counters.evicted_chunks for m in managers),
                stores_skipped=sum(m.counters.stores_skipped for m in managers),
            )
        )


class _Sum:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


class _Recorders:
    """The engines' recorders as one: ``requests`` in the order of the concatenated
    requests table (engine by engine)."""

    def __init__(self, engines: list[Engine]) -> None:
        self.recorders = [e.recorder for e in engines]
        self.requests = [r for rec in self.recorders for r in rec.requests]

    def token_gaps(self) -> list[Any]:
        return [g for r in self.recorders for g in r.token_gaps()]

    def token_times(self, requests: Any = None) -> Any:
        if requests is not None:  # any recorder reads the requests it is given
            yield from self.recorders[0].token_times(requests)
            return
        for r in self.recorders:
            yield from r.token_times()
