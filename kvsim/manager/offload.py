"""The CPU offload manager: vLLM 0.33 ``CPUOffloadingManager`` semantics and method names.

The manager owns the chunk pool (fresh ids first, then a LIFO free list), reference
counts (-1 write pending, 0 evictable, >0 pinned by loads), the two-phase load/store
protocol, request-scoped access recording, events and gauges. Which chunk to evict is
the eviction policy's business; which new chunk may enter is the admission policy's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, NamedTuple, cast

from kvsim.core.context import RequestContext
from kvsim.core.errors import PolicyFault
from kvsim.core.keys import ChunkKey
from kvsim.manager.protocol import ManagerProtocol as ManagerProtocol  # re-exported
from kvsim.manager.protocol import StoreResult as StoreResult  # re-exported
from kvsim.options.config import CacheConfig
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.base import Chunk, EvictionPolicy, FuturePolicy
from kvsim.policies.registry import config_policy_class, make_admission, make_eviction_policy
from kvsim.report.metric_names import (
    ALLOCATION_SIZE_BUCKETS,
    CPU_ALLOCATION_SIZE,
    CPU_CACHE_READ_USAGE_PERC,
    CPU_CACHE_USAGE_PERC,
    CPU_CACHE_WRITE_USAGE_PERC,
    STORES_SKIPPED,
    Histogram,
)

if TYPE_CHECKING:
    from kvsim.traces.model import Request

_REF = attrgetter("ref_cnt")
_CHUNK_ID = attrgetter("chunk_id")
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


class LookupResult(IntEnum):
    """What ``lookup`` says of one key, as vLLM's enum (a pending write is not loadable yet)."""

    MISS = 0
    HIT = 1
    HIT_PENDING = 2
    RETRY = 3  # a secondary tier cannot tell yet (kvsim.tiering); the CPU tier never says it


class ProtocolError(RuntimeError):
    """The caller broke the manager's protocol (e.g. loading a chunk that is not ready)."""


class PrepareStoreOutput(NamedTuple):
    """A successful ``prepare_store``: the keys to copy, their chunk ids, the keys evicted."""

    keys_to_store: list[ChunkKey]
    chunk_ids: list[int]
    evicted_keys: list[ChunkKey]


@dataclass(frozen=True)
class OffloadingEvent:
    """Keys that entered or left the CPU tier, for vLLM's KV-cache event stream."""

    keys: list[ChunkKey]
    removed: bool
    metadata_only: bool = False
    medium: str = "CPU"


def _check_victims(policy: EvictionPolicy, victims: object, need: int) -> None:
    """What a plugin's ``evict`` must return: None, or exactly ``need`` (key, chunk) pairs."""
    if victims is None:
        return
    ok = (
        isinstance(victims, list)
        and len(victims) == need
        and all(isinstance(v, tuple) and len(v) == 2 for v in victims)
    )
    if not ok:
        raise PolicyFault(
            type(policy),
            "evict",
            f"must return None or a list of {need} (key, chunk) pairs, got {victims!r:.80}",
        )


@dataclass
class ManagerCounters:
    """Cumulative totals (kvsim's additions; vLLM resets its per-step values in get_stats)."""

    stored_chunks: int = 0
    evicted_chunks: int = 0
    loaded_chunks: int = 0
    failed_store_chunks: int = 0
    stores_skipped: int = 0
    allocation_failures: int = 0
    allocation_sizes: Histogram = field(default_factory=lambda: Histogram(ALLOCATION_SIZE_BUCKETS))


@dataclass(slots=True, eq=False)
class _RequestAccess:
    """Keys one request observed, in first-observation order (one KV-cache group)."""

    generation: int
    keys: list[ChunkKey] = field(default_factory=list)
    seen: set[ChunkKey] = field(default_factory=set)
    inserted: set[ChunkKey] = field(default_factory=set)
    reused: set[ChunkKey] = field(default_factory=set)
    store_miss: set[ChunkKey] = field(default_factory=set)
    finished: bool = False


class OffloadManager:
    """CPU tier bookkeeping; see docs/vllm-offload-semantics.md §2.

    It satisfies :class:`~kvsim.manager.protocol.ManagerProtocol` (see there for the call
    order and chunk states)
    and adds vLLM's ``lookup``, ``touch``, events, stats and ``reset_cache``.

    Attributes:
        num_chunks: the tier's capacity in chunks (chunk ids are ``0 .. num_chunks - 1``).
        policy: the eviction policy; it holds the same resident keys as the manager.
        admission: the admission policy (the default admits every key).
        events: stored and removed keys for :meth:`take_events`; None unless
            ``enable_events``.
        counters: cumulative totals since construction (:class:`ManagerCounters`).

    Invariants: ``num_resident == num_evictable + num_write_pending + pinned chunks``, and
    ``num_resident + num_free == num_chunks``; every resident key is the policy's too.
    """

    def __init__(
        self,
        num_chunks: int,
        policy: EvictionPolicy,
        admission: AdmissionPolicy | None = None,
        *,
        enable_events: bool = False,
    ) -> None:
        if num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {num_chunks}")
        self.num_chunks = num_chunks
        self.policy = policy
        # a plugin's faults are reported as the user's, one line; kvsim's own propagate
        self._user_policy = not type(policy).__module__.startswith("kvsim.")
        self.admission = admission if admission is not None else AdmissionPolicy()
        self._filters = self.admission.filters
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._num_allocated = 0
        self._free_list: list[int] = []
        self._num_evictable = 0
        self._num_write_pending = 0
        self._generation = 0
        self._skipped_since_stats = 0
        self._allocation_sizes_since_stats: list[int] = []
        self.counters = ManagerCounters()
        self._chunks: dict[ChunkKey, Chunk] = {}  # resident keys (the policy holds the same set)
        self._pool: list[Chunk] = []  # one Chunk object per chunk id, reused
        self._tracks = policy.tracks_evictability

    @classmethod
    def from_config(
        cls, config: CacheConfig, requests: Iterable[Request] | None = None
    ) -> OffloadManager:
        """The manager with the configured eviction and admission policies; ``requests`` is
        the trace's future, read only by a policy that needs it (Belady)."""
        policy = make_eviction_policy(config_policy_class(config), config.num_chunks)
        if getattr(policy, "needs_future", False):
            if requests is None:
                raise ValueError(f"policy {config.policy!r} needs the trace's future")
            cast(FuturePolicy, policy).prepare_future(requests, config.layout)
        return cls(config.num_chunks, policy, admission_from_config(config))

    # --- chunk pool ---

    @property
    def num_free(self) -> int:
        """Chunks holding no key (never used, or freed by an eviction or a failed store)."""
        return len(self._free_list) + self.num_chunks - self._num_allocated

    @property
    def num_resident(self) -> int:
        """Chunks holding a key: pending, ready or pinned."""
        return self._num_allocated - len(self._free_list)

    @property
    def num_evictable(self) -> int:
        """Ready chunks no load pins: what an eviction can take."""
        return self._num_evictable

    @property
    def num_write_pending(self) -> int:
        """Chunks whose store was prepared and has not completed."""
        return self._num_write_pending

    def _allocate(self, n: int) -> list[Chunk]:
        """Fresh ids first (0, 1, 2, ...), then the free list, LIFO."""
        start = self._num_allocated
        fresh = min(n, self.num_chunks - start)
        pool = self._pool
        if len(pool) < start + fresh:
            pool.extend(map(Chunk, range(len(pool), start + fresh)))
        out = pool[start : start + fresh]
        self._num_allocated = start + fresh
        reused = n - fresh
        if reused:
            free = self._free_list
            ids = free[-reused:]
            del free[-reused:]
            ids.reverse()  # pop() order
            out.extend(map(pool.__getitem__, ids))
        for chunk in out:
            chunk.ref_cnt = -1
        return out

    # --- request access state ---

    def _access(self, ctx: RequestContext) -> _RequestAccess:
        state: _RequestAccess | None = ctx.state.get(self)
        if state is None or state.generation != self._generation:
            state = _RequestAccess(self._generation)
            ctx.state[self] = state
        return state

    def _record_access(
        self, keys: Sequence[ChunkKey], ctx: RequestContext, reused: Sequence[ChunkKey]
    ) -> None:
        state = self._access(ctx)
        seen = state.seen
        new = [k for k in keys if k not in seen] if seen else keys
        if new:
            if state.finished:
                raise ProtocolError(f"request {ctx.req_id!r}: new keys observed after it finished")
            state.keys.extend(new)
            seen.update(new)
            self.policy.on_request_access(new, ctx)
        if reused:
            inserted = state.inserted
            state.reused.update([k for k in reused if k not in inserted] if inserted else reused)

    # --- OffloadingManager interface ---

    def new_context(self, req_id: Hashable, positions: dict[ChunkKey, int]) -> RequestContext:
        """A request context whose chunk keys end at the given token positions."""
        return RequestContext(req_id, positions)

    def on_new_request(self, ctx: RequestContext) -> None:
        """Start recording ``ctx``'s accesses (see :meth:`ManagerProtocol.on_new_request`)."""
        self._access(ctx)

    def lookup(self, key: ChunkKey, ctx: RequestContext | None = None) -> LookupResult:
        """MISS, HIT or HIT_PENDING; no side effects."""
        chunk = self._chunks.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.ref_cnt >= 0 else LookupResult.HIT_PENDING

    def lookup_prefix(self, keys: Iterable[ChunkKey]) -> tuple[int, bool]:
        """Scan like the connector: count HIT/HIT_PENDING keys up to the first MISS.

        Returns ``(count, any_pending)``; a pending key means the request must wait.
        """
        get = self._chunks.get
        count = 0
        pending = False
        for key in keys:
            chunk = get(key)
            if chunk is None:
                break
            if chunk.ref_cnt < 0:
                pending = True
            count += 1
        return count, pending

    def prepare_load(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> list[int]:
        """Pin ready chunks for reading; returns chunk ids co-indexed with ``keys``."""
        maybe_found = list(map(self._chunks.get, keys))
        if None in maybe_found:
            missing = keys[maybe_found.index(None)]
            raise ProtocolError(f"prepare_load: chunk {missing!r} is not resident")
        found = cast("list[Chunk]", maybe_found)  # None ruled out just above
        refs: list[int] = list(map(_REF, found))
        if refs and min(refs) < 0:
            raise ProtocolError(f"prepare_load: chunk {keys[refs.index(min(refs))]!r} is not ready")
        for chunk in found:
            chunk.ref_cnt += 1
        newly_pinned = refs.count(0)
        if newly_pinned:
            self._num_evictable -= newly_pinned
            if self._tracks:
                self.policy.mark_non_evictable_many([k for k, r in zip(keys, refs) if r == 0])
        self.counters.loaded_chunks += len(found)
        self._record_access(keys, ctx, reused=keys)
        return list(map(_CHUNK_ID, found))

    def touch(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """vLLM's ``touch``: mark resident ``keys`` recently used, the first most recent
        (:meth:`EvictionPolicy.touch`). Not part of :class:`ManagerProtocol`: vLLM 0.33's
        connector never calls it (a request's recency is committed when it finishes), and
        neither does kvsim; it stays for vLLM's interface, checked against vLLM's manager
        by ``tests/vllm/test_vllm_differential.py``."""
        self.policy.touch(keys, ctx)

    def complete_load(self, keys: Iterable[ChunkKey], ctx: RequestContext | None = None) -> None:
        """Unpin each key once (see :meth:`ManagerProtocol.complete_load`); raises
        :class:`ProtocolError` for a key that is not being loaded."""
        get = self._chunks.get
        unpinned: list[ChunkKey] = []
        for key in keys:
            chunk = get(key)
            if chunk is None or chunk.ref_cnt <= 0:
                raise ProtocolError(f"complete_load: chunk {key!r} is not being loaded")
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                unpinned.append(key)
        self._num_evictable += len(unpinned)
        if unpinned and self._tracks:
            self.policy.mark_evictable_many(unpinned)

    def prepare_store(
        self, offer: Iterable[ChunkKey], ctx: RequestContext
    ) -> PrepareStoreOutput | None:
        """All or nothing: allocate chunks for every admitted new key, or return None."""
        keys = list(offer)
        admission = self.admission
        if admission.records_offers:
            admission.record_offer(keys)
        to_store, ready_existing = self._split_offer(keys)
        # True while every offered key is recorded: none is pending, none was skipped
        whole_offer = len(to_store) + len(ready_existing) == len(keys)
        if self._filters and to_store:
            to_store, skipped = self._admit(to_store, ctx)
            whole_offer = whole_offer and not skipped
        state = self._access(ctx)
        if to_store:
            self._learn_store_misses(state, to_store, ctx)
        recorded = keys if whole_offer else _kept_in_order(keys, to_store, ready_existing)
        self._record_access(recorded, ctx, reused=ready_existing)
        if not to_store:
            return PrepareStoreOutput([], [], [])

        n = len(to_store)
        self._allocation_sizes_since_stats.append(n)
        self.counters.allocation_sizes.observe(n)
        need = n - self.num_free
        evicted_keys = self._evict_for_store(need, keys) if need > 0 else []
        if evicted_keys is None:
            return None
        chunks = self._allocate(n)
        self._chunks.update(zip(to_store, chunks))
        self.policy.insert_many(to_store, chunks, ctx)
        self._num_write_pending += n
        state.inserted.update(to_store)
        return PrepareStoreOutput(to_store, list(map(_CHUNK_ID, chunks)), evicted_keys)

    # --- prepare_store's steps ---

    def _split_offer(self, keys: list[ChunkKey]) -> tuple[list[ChunkKey], list[ChunkKey]]:
        """``(new keys, ready resident keys)`` of an offer, in offer order; keys whose write
        is still pending are in neither."""
        found = list(map(self._chunks.get, keys))
        if not any(found):  # the common case: nothing of the offer is resident
            return keys.copy(), []
        to_store: list[ChunkKey] = []
        ready: list[ChunkKey] = []
        for key, chunk in zip(keys, found):
            if chunk is None:
                to_store.append(key)
            elif chunk.ref_cnt >= 0:
                ready.append(key)
        return to_store, ready

    def _admit(self, candidates: list[ChunkKey], ctx: RequestContext) -> tuple[list[ChunkKey], int]:
        """The admitted candidates and how many were skipped (counted as vLLM does)."""
        offered = len(candidates)
        admitted = self.admission.admit(candidates, ctx)
        skipped = offered - len(admitted)
        if skipped:
            self._skipped_since_stats += skipped
            self.counters.stores_skipped += skipped
        return admitted, skipped

    def _learn_store_misses(
        self, state: _RequestAccess, to_store: list[ChunkKey], ctx: RequestContext
    ) -> None:
        """Show the policy the store candidates this request had not offered before."""
        store_miss = state.store_miss
        new_misses = [k for k in to_store if k not in store_miss] if store_miss else to_store
        if new_misses:
            self.policy.on_store_miss(new_misses, ctx)
            store_miss.update(new_misses)

    def _evict_for_store(self, need: int, offer: list[ChunkKey]) -> list[ChunkKey] | None:
        """Free ``need`` chunks, none of the offer's; their keys, or None (an allocation
        failure) when not enough chunks are evictable."""
        if need > self._num_evictable:
            self.counters.allocation_failures += 1
            return None
        try:
            victims = self.policy.evict(need, set(offer))
        except Exception as exc:
            if not self._user_policy:
                raise
            raise PolicyFault(type(self.policy), "evict", f"{type(exc).__name__}: {exc}") from None
        if self._user_policy:
            _check_victims(self.policy, victims, need)
        if victims is None:
            self.counters.allocation_failures += 1
            return None
        self._num_evictable -= len(victims)
        evicted_keys: list[ChunkKey] = list(map(_FIRST, victims))
        self._free_list.extend(map(_CHUNK_ID, map(_SECOND, victims)))
        chunks = self._chunks
        for key in evicted_keys:
            del chunks[key]
        self.counters.evicted_chunks += len(victims)
        if self.events is not None:
            self.events.append(OffloadingEvent(evicted_keys, removed=True))
        return evicted_keys

    def complete_store(
        self, keys: Iterable[ChunkKey], ctx: RequestContext | None = None, success: bool = True
    ) -> None:
        """Finish a store: chunks become evictable, or are dropped when the copy failed."""
        policy = self.policy
        resident = self._chunks
        get = resident.get
        done: list[ChunkKey] = []
        if success:
            key_list = keys if isinstance(keys, list) else list(keys)
            found = list(map(get, key_list))
            if None not in found and list(map(_REF, found)).count(-1) == len(found):
                done = key_list  # the common case: every key is a pending write of this job
                for written in cast("list[Chunk]", found):  # None ruled out just above
                    written.ref_cnt = 0
            else:
                for key, chunk in zip(key_list, found):
                    if chunk is not None and chunk.ref_cnt < 0:
                        chunk.ref_cnt = 0
                        done.append(key)
            if done and self._tracks:
                policy.mark_evictable_many(done)
            self._num_write_pending -= len(done)
            self._num_evictable += len(done)
            self.counters.stored_chunks += len(done)
        else:
            free = self._free_list
            for key in keys:
                chunk = get(key)
                if chunk is not None and chunk.ref_cnt < 0:
                    policy.remove(key)
                    del resident[key]
                    free.append(chunk.chunk_id)
                    done.append(key)
            self._num_write_pending -= len(done)
            self.counters.failed_store_chunks += len(done)
        if done and self.events is not None:
            self.events.append(
                OffloadingEvent(done, removed=not success, metadata_only=not success)
            )

    def on_request_finished(self, ctx: RequestContext) -> None:
        """Commit the request's recorded accesses to the policy, exactly once."""
        state = ctx.state.get(self)
        if state is None or state.generation != self._generation or state.finished:
            return
        state.finished = True
        keys = state.keys
        # some position unknown: keep first-observation order, as vLLM does
        with contextlib.suppress(KeyError):
            keys = sorted(keys, key=ctx.positions.__getitem__)
        self.policy.on_request_finished((keys,), state.inserted - state.reused, state.reused, ctx)

    def on_schedule_end(self) -> None:
        """The last manager call of an engine step (a no-op for the CPU tier)."""

    def take_events(self) -> Iterator[OffloadingEvent]:
        """The events since the last call, oldest first, and forget them (nothing without
        ``enable_events``). A failed store's event is kept only for its keys that are still
        absent: one stored again meanwhile was announced by its new store."""
        if self.events is None:
            return
        events, self.events = self.events, []
        get = self._chunks.get
        for event in events:
            if event.metadata_only:
                keys = [k for k in event.keys if get(k) is None]
                if not keys:
                    continue
                event = OffloadingEvent(keys, event.removed, True, event.medium)
            yield event

    def reset_cache(self) -> None:
        """Drop every chunk; admission counts survive (as in vLLM)."""
        self.policy.clear()
        self._chunks.clear()
        self._generation += 1
        self._num_evictable = 0
        self._num_write_pending = 0
        self._free_list.clear()
        self._num_allocated = 0

    def gauges(self) -> dict[str, float]:
        """vLLM's usage gauges, as fractions of the capacity: in use (pending or pinned),
        write (pending) and read (in use minus write)."""
        n = self.num_chunks
        used = self._num_allocated - len(self._free_list) - self._num_evictable
        usage = used / n if n else 0.0
        write = self._num_write_pending / n if n else 0.0
        return {
            CPU_CACHE_USAGE_PERC: usage,
            CPU_CACHE_WRITE_USAGE_PERC: write,
            CPU_CACHE_READ_USAGE_PERC: max(usage - write, 0.0),
        }

    def get_stats(self) -> dict[str, object]:
        """vLLM's per-step stats: gauges, allocation-size samples and skipped stores.

        Counts are since the last call."""
        stats: dict[str, object] = dict(self.gauges())
        stats[CPU_ALLOCATION_SIZE] = self._allocation_sizes_since_stats
        self._allocation_sizes_since_stats = []
        stats[STORES_SKIPPED] = self._skipped_since_stats
        self._skipped_since_stats = 0
        return stats


def _kept_in_order(
    keys: list[ChunkKey], to_store: list[ChunkKey], ready: list[ChunkKey]
) -> list[ChunkKey]:
    """The keys of ``keys`` that are in ``to_store`` or ``ready``, in ``keys``' order."""
    wanted = set(to_store)
    wanted.update(ready)
    return [k for k in keys if k in wanted]


def admission_from_config(config: CacheConfig) -> AdmissionPolicy | None:
    """The configured admission rule; None admits everything (vLLM's default)."""
    if config.admission == "always":
        return None
    return make_admission(
        config.admission,
        store_threshold=config.store_threshold,
        max_tracker_size=config.max_tracker_size,
        seed=config.seed,
        chunk_tokens=config.chunk_tokens,
    )
