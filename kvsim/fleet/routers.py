"""Routers: which instance of a fleet serves a request.

A router sees the request (:class:`RouteRequest`) and a read-only view of every instance
(:class:`InstanceView`: its queue, running requests, free KV and how much of this request's
prefix it holds, per tier) and returns an instance index. The built-ins:

* ``round-robin``: instance ``n mod N`` for the fleet's n-th request;
* ``random``: uniform, from the run's seed;
* ``least-loaded``: fewest waiting + running requests as the (possibly stale) view shows
  them (ties: the lowest index);
* ``session``: a stable hash (SplitMix64, not Python's ``hash``) of the request's session,
  else of its conversation: a request whose prompt repeats at least half of an earlier
  prompt (a later turn repeats the earlier turns) joins that request's conversation, any
  other starts one (a shared system prompt alone does not join them); when that
  instance is full (requests waiting and not enough free KV for this one) the
  least-loaded one instead;
* ``prefix-aware``: llm-d's endpoint picker with its precise prefix-cache, queue and
  KV-utilisation scorers (each in [0, 1], summed with weights; the highest wins, ties
  broken by the seeded generator as llm-d's max-score picker breaks them at random).

A plugin is ``module:Class``: ``Class(instances, seed)`` then ``route(request, views) ->
int`` per request; a class attribute ``needs_prefix = False`` spares the fleet the prefix
lookups. A plugin that raises, or returns anything but an index, ends the run with one
line naming it (:func:`checked_route`).
"""

from __future__ import annotations

import importlib
import inspect
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvsim.core.errors import InputError, did_you_mean
from kvsim.options.fleet import ROUTERS

__all__ = [
    "CPU_SAVES",
    "GPU_SAVES",
    "SHARED_SAVES",
    "InstanceView",
    "RouteRequest",
    "Router",
    "checked_route",
    "make_router",
    "stable_hash",
]

#: what one held token saves, by where it is held (a recomputed token saves nothing): a GPU
#: block saves all of its prefill; a CPU chunk its prefill less the PCIe load (about 10% of
#: it: 128 KiB/token at ~50 GB/s against a prefill of ~20k tokens/s, llama-3.1-8b on H200);
#: a shared-tier chunk less a NIC load (about 20% of it at 200 Gbit/s). docs/fleets.md.
GPU_SAVES = 1.0
CPU_SAVES = 0.9
SHARED_SAVES = 0.8


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a router knows of a request when it arrives."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    session_id: int | None
    #: the prompt's first block id (its prefix group), None for an empty or unhashed prompt
    group: int | None
    #: GPU KV blocks the request needs to run (prompt and output)
    kv_blocks_needed: int
    #: the trace's prefix-chained block ids (equal ids: equal prefixes)
    block_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One instance as the router sees it (lagged by ``--router-staleness-ms``).

    Cache mode has no queues: ``waiting`` is 0 and ``running`` the requests routed to the
    instance in the last ``--router-window-s`` trace seconds."""

    index: int
    waiting: int
    running: int
    free_kv_blocks: int
    kv_usage: float  # used share of the GPU KV blocks, 0..1
    routed_requests: int
    routed_tokens: int
    #: this request's prompt tokens the instance holds, by tier (consecutive: GPU first,
    #: then its CPU tier, then the shared tier); 0 when the router needs no prefix
    gpu_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    shared_hit_tokens: int = 0

    @property
    def load(self) -> int:
        return self.waiting + self.running


class Router(Protocol):
    """The protocol a plugin implements (``module:Class``)."""

    #: whether the views must carry the held prefix (costs lookups on every instance)
    needs_prefix: bool

    def route(self, request: RouteRequest, views: Sequence[InstanceView]) -> int:
        """The index of the instance that serves ``request``."""


def stable_hash(value: int) -> int:
    """SplitMix64 of ``value``: the same on every run and under every PYTHONHASHSEED."""
    z = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


class RoundRobin:
    needs_prefix = False

    def __init__(self, instances: int, seed: int = 0) -> None:
        self.n = instances
        self.next = 0

    def route(self, request: RouteRequest, views: Sequence[InstanceView]) -> int:
        i = self.next
        self.next = (i + 1) % self.n
        return i


class RandomRouter:
    needs_prefix = False

    def __init__(self, instances: int, seed: int = 0) -> None:
        self.n = instances
        self.rng = random.Random(seed)

    def route(self, request: RouteRequest, views: Sequence[InstanceView]) -> int:
        return self.rng.randrange(self.n)


def least_loaded(views: Sequence[InstanceView]) -> int:
    """Fewest waiting + running, then the lowest index (nothing the view does not lag)."""
    return min(views, key=lambda v: (v.load, v.index)).index


class LeastLoaded:
    needs_prefix = False

    def __init__(self, instances: int, seed: int = 0) -> None:
        self.n = instances

    def route(self, request: RouteRequest, views: Sequence[InstanceView]) -> int:
        return least_loaded(views)


class SessionRouter:
    """Sticky routing by session, else conversation; the least-loaded one when full."""

    needs_prefix = False

    def __init__(self, instances: int, seed: int = 0) -> None:
        self.n = instances
        self.fallbacks = 0
        #: block id -> the conversation that first sent it
        self._conversation: dict[int, int] = {}

    def conversation(self, request: RouteRequest) -> int:
        """The conversation of a request without a session (see the module)."""
        blocks = request.block_hashes
        known = self._conversation
        found = None
        for i in range(len(blocks) - 1, (len(blocks) - 1) // 2 - 1, -1):
            found = known.get(blocks[i])
            if found is not None:
                break
        key = request.request_id if found is None else found
        for block in blocks:
            known.setdefault(block, key)
        return key

    def route(self, request: RouteRequest, views: Sequence[InstanceView]) -> int:
        key = request.session_id
        if key is None:
            key = self.conversation(request)
        home = views[stable_hash(key) % self.n]
        if home.waiting and home.free_kv_blocks < request.kv_blocks_needed:
            self.fallbacks += 1
            return least_loaded(views)
        return home.index


class PrefixAware:
    """llm-d's scorers: ``prefix_weight * held + queue_weight * queue + kv_weight * kv``.

    * held: the share of the prompt the instance holds, each token weighted by what it
      saves where it is held (:data:`GPU_SAVES`, :data:`CPU_SAVES`, :data:`SHARED_SAVES`);
      llm-d's precise prefix-cache scorer scores the held block share;
    * queue: ``(max - load) / (max - min)`` over the fleet (1 when all are equal), llm-d's
      queue scorer (which reads the waiting queue; kvsim adds the running requests so that
      cache mode, with no queue, balances too);
    * kv: ``1 - kv_usage``, llm-d's KV-cache utilisation scorer.

    Defaults 3 / 2 / 2: llm-d's precise prefix-cache routing guide (docs/fleets.md).
    """

    needs_prefix = True

    def __init__(
        self,
        instances: int,
        seed: int = 0,
        prefix_weight: float = 3.0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
    ) -> None:
        self.n = instances
        self.rng = random.Random(seed)
        self.weights = (prefix_weight, queue_weight, kv_weight)

    def route(self, request: RouteRequest, views: Sequence[InstanceView]) -> int:
        wp, wq, wk = self.weights
        prompt = max(request.prompt_tokens, 1)
        loads = [v.load for v in views]
        lo, hi = min(loads), max(loads)
        span = hi - lo
        best: list[int] = []
        top = -1.0
        for v in views:
            held = (
                GPU_SAVES * v.gpu_hit_tokens
                + CPU_SAVES * v.cpu_hit_tokens
                + SHARED_SAVES * v.shared_hit_tokens
            ) / prompt
            queue = (hi - v.load) / span if span else 1.0
            score = wp * held + wq * queue + wk * (1.0 - v.kv_usage)
            if score > top:
                top, best = score, [v.index]
            elif score == top:
                best.append(v.index)
        return best[0] if len(best) == 1 else best[self.rng.randrange(len(best))]


BUILTIN: dict[str, type] = {
    "round-robin": RoundRobin,
    "random": RandomRouter,
    "least-loaded": LeastLoaded,
    "session": SessionRouter,
    "prefix-aware": PrefixAware,
}
assert tuple(BUILTIN) == ROUTERS


def router_plugin_class(name: str, option: str = "--router") -> type:
    """The class a plugin router ``module:Class`` names, loaded (a measurements file's
    router is checked so before anything runs); one that does not load, or is not a class
    (``os:system``), is one line naming ``option``."""
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InputError(f"{option} {name}: cannot load the plugin ({exc})") from None
    if not inspect.isclass(cls):
        raise InputError(f"{option} {name}: not a class, got a {type(cls).__name__}")
    return cls


def make_router(name: str, instances: int, seed: int = 0, **weights: float) -> Router:
    """The router ``name`` (a built-in or ``module:Class``) for ``instances`` instances;
    ``weights``: prefix-aware's (``prefix_weight``, ``queue_weight``, ``kv_weight``)."""
    if name == "prefix-aware":
        return PrefixAware(instances, seed, **weights)
    if name in BUILTIN:
        router: Router = BUILTIN[name](instances, seed)
        return router
    if ":" not in name:
        raise InputError(
            f"--router: unknown router {name!r}{did_you_mean(name, ROUTERS)}; "
            f"known: {', '.join(ROUTERS)}, or a plugin module:Class"
        )
    cls = router_plugin_class(name)
    attr = name.partition(":")[2]
    try:
        plugin = cls(instances, seed)
    except Exception as exc:  # a plugin's fault, reported as bad input
        raise InputError(f"--router {name}: {attr}({instances}, {seed}) raised {exc!r}") from None
    if not callable(getattr(plugin, "route", None)):
        raise InputError(f"--router {name}: the plugin has no route(request, views) method")
    return plugin  # without needs_prefix, the views carry the prefix (FleetRouter)


def checked_route(
    router: Router, name: str, request: RouteRequest, views: Sequence[InstanceView]
) -> int:
    """``router.route``, with a plugin's exception or a bad answer as one line."""
    try:
        answer: Any = router.route(request, views)
    except Exception as exc:
        raise InputError(
            f"--router {name}: route() raised {exc!r} on request {request.request_id}"
        ) from None
    try:
        index = None if isinstance(answer, bool) else operator.index(answer)
    except TypeError:
        index = None
    if index is None or not 0 <= index < len(views):
        raise InputError(
            f"--router {name}: route() returned {answer!r} for request {request.request_id}, "
            f"not an instance index 0..{len(views) - 1}"
        )
    return index
