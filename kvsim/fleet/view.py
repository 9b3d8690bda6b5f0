"""The router's view of a fleet, and its lag.

Each instance answers two questions through a :class:`Probe`: its load (queue, running,
free KV) and how much of a request's prefix it holds, per tier. The held prefix is looked
up in the instance's own hash maps (the GPU pool's block map at key-unit granularity, the
CPU tier's chunk map, the shared store's), one lookup per held unit and one for the first
miss: the router's cost grows with the request's prefix and the number of instances, never
with what the fleet caches (llm-d's KV-cache indexer is a map of block hash -> pods for the
same reason). No instance's blocks are ever scanned.

``--router-staleness-ms`` makes the view lag: the load the router sees is the one sampled
at the last arrival at least that long ago, and a chunk routed to an instance within that
time is not yet seen there (its KV event has not reached the indexer), so a burst of one
new prefix spreads and a burst onto one idle instance piles up, as in real fleets.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from kvsim.core.keys import ChunkKey, KeyLayout
from kvsim.fleet.routers import InstanceView, Router, RouteRequest, checked_route
from kvsim.traces.model import Request

#: one instance's load: (waiting, running, free GPU KV blocks, used share of them)
Load = tuple[int, int, int, float]


class Probe(Protocol):
    """One instance as the fleet reads it (no side effects on the instance)."""

    def load(self, now: float) -> Load: ...

    def held(
        self, unit_keys: Sequence[int], chunk_keys: Sequence[ChunkKey], prompt_tokens: int
    ) -> tuple[int, int]:
        """Prompt tokens held on the GPU, then in the CPU tier right after them."""

    def routed(self, now: float) -> None:
        """A request was routed here at ``now``."""


class FleetRouter:
    """Builds the views, asks the router, keeps what the lag hides."""

    def __init__(
        self,
        probes: Sequence[Probe],
        router: Router,
        name: str,
        layout: KeyLayout,
        gpu_block_tokens: int,
        staleness_s: float = 0.0,
        shared_contains: Callable[[ChunkKey], bool] | None = None,
    ) -> None:
        self.probes = list(probes)
        self.router = router
        self.name = name
        self.layout = layout
        self.gpu_block_tokens = gpu_block_tokens
        self.lag = staleness_s
        self.shared_contains = shared_contains
        self.needs_prefix = bool(getattr(router, "needs_prefix", True))
        n = len(self.probes)
        self.routed_requests = [0] * n
        self.routed_tokens = [0] * n
        #: per instance: (sample time, load) at past arrivals, oldest first
        self._history: list[deque[tuple[float, Load]]] = [deque() for _ in range(n)]
        self._seen: list[Load | None] = [None] * n
        #: per instance: chunk key -> time it was routed there (only while younger than lag)
        self._recent: list[dict[ChunkKey, float]] = [{} for _ in range(n)]
        self._recent_log: deque[tuple[float, int, Sequence[ChunkKey]]] = deque()

    def route(
        self,
        req: Request,
        now: float,
        unit_keys: Sequence[int] | None = None,
        chunk_keys: Sequence[ChunkKey] | None = None,
    ) -> int:
        """The instance for ``req`` arriving at ``now`` (keys: the request's, if made)."""
        if self.needs_prefix and unit_keys is None:
            unit_keys = self.layout.unit_keys(req.block_hashes, req.prompt_tokens)
            chunk_keys = self.layout.chunk_keys(unit_keys)
        current = [p.load(now) for p in self.probes]
        loads = self._lagged(current, now) if self.lag > 0 else current
        rreq = RouteRequest(
            req.request_id,
            now,
            req.prompt_tokens,
            req.output_tokens,
            req.session_id,
            req.block_hashes[0] if req.block_hashes else None,
            -(-(req.prompt_tokens + max(1, req.output_tokens)) // self.gpu_block_tokens),
            tuple(req.block_hashes),
        )
        views = []
        for i, (waiting, running, free, usage) in enumerate(loads):
            g = c = s = 0
            if self.needs_prefix:
                assert unit_keys is not None and chunk_keys is not None
                g, c, s = self._held(i, unit_keys, chunk_keys, req.prompt_tokens, now)
            views.append(
                InstanceView(
                    i,
                    waiting,
                    running,
                    free,
                    usage,
                    self.routed_requests[i],
                    self.routed_tokens[i],
                    g,
                    c,
                    s,
                )
            )
        index = checked_route(self.router, self.name, rreq, views)
        self.routed_requests[index] += 1
        self.routed_tokens[index] += req.prompt_tokens
        self.probes[index].routed(now)
        if self.lag > 0:  # the state this arrival leaves, as a later lagged view sees it
            current[index] = self.probes[index].load(now)
            for i, load in enumerate(current):
                self._history[i].append((now, load))
        if self.lag > 0 and self.needs_prefix and chunk_keys:
            recent = self._recent[index]
            for key in chunk_keys:
                recent.setdefault(key, now)
            self._recent_log.append((now, index, chunk_keys))
        return index

    def _lagged(self, current: list[Load], now: float) -> list[Load]:
        """Each instance's load as sampled after the last arrival at least ``lag`` ago
        (before any: idle, all its KV free)."""
        horizon = now - self.lag
        out = []
        for i, load in enumerate(current):
            hist = self._history[i]
            while hist and hist[0][0] <= horizon:
                self._seen[i] = hist.popleft()[1]
            seen = self._seen[i]
            out.append(seen if seen is not None else (0, 0, load[2], 0.0))
        self._forget_recent(horizon)
        return out

    def _forget_recent(self, horizon: float) -> None:
        log = self._recent_log
        while log and log[0][0] <= horizon:
            t, i, keys = log.popleft()
            recent = self._recent[i]
            for key in keys:
                if recent.get(key) == t:
                    del recent[key]

    def _held(
        self,
        i: int,
        unit_keys: Sequence[int],
        chunk_keys: Sequence[ChunkKey],
        prompt_tokens: int,
        now: float,
    ) -> tuple[int, int, int]:
        """Tokens of the prompt instance ``i`` holds on its GPU, its CPU tier and the
        shared tier (consecutive), as the lagged view sees them."""
        gpu, cpu = self.probes[i].held(unit_keys, chunk_keys, prompt_tokens)
        tpc = self.layout.chunk_tokens
        local = gpu + cpu
        if self.lag > 0 and local:
            recent = self._recent[i]
            horizon = now - self.lag
            visible = 0
            for key in chunk_keys[: math.ceil(local / tpc)]:
                if recent.get(key, -math.inf) > horizon:
                    break
                visible += 1
            local = min(local, visible * tpc)
            gpu = min(gpu, local)
            cpu = local - gpu
        shared = 0
        contains = self.shared_contains
        if contains is not None:
            start = -(-local // tpc)
            n = 0
            for key in chunk_keys[start:]:
                if not contains(key):
                    break
                n += 1
            shared = max(0, min(prompt_tokens, (start + n) * tpc) - local) if n else 0
        return gpu, cpu, shared
