"""The object-cache protocol: every block is a get, a miss inserts it.

This is the model of the cache-research literature (and of libCacheSim): no prefixes,
no requests, no two-phase stores; one key at a time, hit or miss, and on a miss the key
is stored, evicting one resident key first when the cache is full. It drives kvsim's
own policy objects through the same hooks the offload manager uses (``touch`` for a hit;
``on_store_miss``, ``evict``, ``insert`` and ``mark_evictable`` for a miss), so the
textbook policies can be checked against published simulators on the same block stream.

The block stream of a trace is each request's chunk keys, head first, in trace order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey, KeyLayout
from kvsim.manager.offload import admission_from_config
from kvsim.options.config import CacheConfig
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.base import Chunk, EvictionPolicy, FuturePolicy
from kvsim.traces.model import Request

PROTOCOLS = ("prefix", "object")
_NOTHING: frozenset[ChunkKey] = frozenset()


def block_stream(requests: Iterable[Request], layout: KeyLayout) -> Iterator[ChunkKey]:
    """Every chunk key of every request, head first, in trace order."""
    unit_keys, chunk_keys = layout.unit_keys, layout.chunk_keys
    for req in requests:
        yield from chunk_keys(unit_keys(req.block_hashes, req.input_tokens))


@dataclass
class ObjectStats:
    """Counts of one object-protocol run (cumulative over ``ObjectCache.run`` calls)."""

    accesses: int = 0
    hits: int = 0
    evictions: int = 0
    bypassed: int = 0  # misses the admission policy kept out

    @property
    def misses(self) -> int:
        return self.accesses - self.hits

    @property
    def miss_ratio(self) -> float:
        return self.misses / self.accesses if self.accesses else 0.0


class ObjectCache:
    """One policy object under the get/insert-on-miss protocol."""

    def __init__(
        self, policy: EvictionPolicy, capacity: int, admission: AdmissionPolicy | None = None
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.policy = policy
        self.capacity = capacity
        self.admission = admission
        self.stats = ObjectStats()
        self._free: list[int] = []
        self._allocated = 0
        self._resident = 0
        self._ctx = RequestContext("object-stream")
        self._timed = bool(getattr(policy, "needs_future", False))

    def prepare(self, keys: Sequence[ChunkKey]) -> None:
        """Give an offline policy (Belady) the whole stream before it runs."""
        if self._timed:
            cast(FuturePolicy, self.policy).prepare_stream(keys)

    def run(self, keys: Iterable[ChunkKey]) -> ObjectStats:
        policy = self.policy
        get, touch = policy.get, policy.touch
        on_miss, evict, insert, ready = (
            policy.on_store_miss,
            policy.evict,
            policy.insert,
            policy.mark_evictable,
        )
        admission = self.admission
        record_offer = (
            admission.record_offer if admission is not None and admission.records_offers else None
        )
        stats = self.stats
        ctx = self._ctx
        t = stats.accesses
        hits = evictions = bypassed = 0
        for key in keys:
            if self._timed:
                ctx = RequestContext(t)
            t += 1
            one = (key,)
            chunk = get(key)
            if chunk is not None and chunk.ref_cnt >= 0:
                hits += 1
                touch(one, ctx)
                continue
            if chunk is not None:
                continue  # pending write cannot happen here; counted as a miss
            if record_offer is not None:
                record_offer(one)
            if admission is not None and not admission.admit([key]):
                bypassed += 1
                continue
            on_miss(one, ctx)
            if self._resident >= self.capacity:
                victims = evict(1, _NOTHING)
                if not victims:
                    raise RuntimeError(
                        f"policy {policy.name or type(policy).__name__} "
                        f"could not evict from a full cache"
                    )
                self._free.append(victims[0][1].chunk_id)
                evictions += 1
                self._resident -= 1
            if self._free:
                chunk_id = self._free.pop()
            else:
                chunk_id = self._allocated
                self._allocated += 1
            chunk = Chunk(chunk_id)
            insert(key, chunk, ctx)
            chunk.ref_cnt = 0
            ready(key)
            self._resident += 1
        stats.accesses = t
        stats.hits += hits
        stats.evictions += evictions
        stats.bypassed += bypassed
        return stats


def object_cache(config: CacheConfig) -> ObjectCache:
    """An empty object-protocol cache of ``config.num_chunks`` chunks with the configured
    eviction policy and admission rule (the one place they are built, for whole replays
    and for miniatures replayed in pieces); the admission rule is the manager's
    (:func:`~kvsim.manager.offload.admission_from_config`)."""
    from kvsim.policies.registry import make_eviction_policy

    policy = make_eviction_policy(config.policy, config.num_chunks, config.policy_module)
    return ObjectCache(policy, config.num_chunks, admission_from_config(config))


def object_replay(requests: Iterable[Request], config: CacheConfig) -> dict[str, Any]:
    """Replay a trace's block stream under the object protocol; returns a summary dict."""
    cache = object_cache(config)
    layout = config.layout
    if cache._timed:
        stream = list(block_stream(requests, layout))
        cache.prepare(stream)
        keys: Iterable[ChunkKey] = stream
    else:
        keys = block_stream(requests, layout)
    s = cache.run(keys)
    return {
        "protocol": "object",
        "accesses": s.accesses,
        "hits": s.hits,
        "misses": s.misses,
        "hit_ratio": 1.0 - s.miss_ratio if s.accesses else 0.0,
        "miss_ratio": s.miss_ratio,
        "evictions": s.evictions,
        "bypassed": s.bypassed,
        "capacity": config.num_chunks,
        "chunk_tokens": layout.chunk_tokens,
        "policy": config.policy,
        "admission": config.admission,
    }


def replay_config(
    requests: Iterable[Request], config: CacheConfig, protocol: str = "object"
) -> dict[str, Any]:
    """Object-protocol replay of a resolved :class:`kvsim.options.offload.CacheConfig`."""
    if protocol not in PROTOCOLS:
        from kvsim.core.errors import InputError

        raise InputError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if config.gpu_blocks:
        from kvsim.core.errors import InputError

        raise InputError("--protocol object models the CPU tier alone; drop --gpu-blocks")
    if config.secondary_tiers:
        from kvsim.core.errors import InputError

        raise InputError("--protocol object models the CPU tier alone; drop the secondary tiers")
    return object_replay(requests, config)
