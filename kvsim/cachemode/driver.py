"""Cache-mode replay: requests one at a time, in trace order, with no notion of time.

Per request, as vLLM's connector does it with both tiers:
0. (with ``prefill_chunk_tokens``) the uncached prompt is scheduled in steps of that many
   tokens, and each step offers the chunks it completes, as vLLM's chunked prefill does;
1. the GPU prefix cache finds its longest cached prefix (never the whole prompt);
2. the CPU tier is scanned from ``floor(gpu_hit / chunk)`` up to the first non-HIT;
3. the CPU hits are loaded (``prepare_load`` + ``complete_load``);
4. the complete prompt chunks after the loaded ones are offered for store; with no CPU
   load every chunk from chunk 0 is offered, so GPU hits reach the CPU tier;
5. the store completes, then ``on_request_finished`` commits the request's accesses.

Memory is bounded by the cache state: rows stream to ``row_sink`` (or in lists to
``batch_sink``) and are not kept unless the caller keeps them. A file trace is read from its
columns (:func:`kvsim.traces.source.request_records`), without a ``Request`` per row;
:func:`write_requests_csv` formats the rows a batch at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

from kvsim.cachemode.fused_arc import FusedARCTier
from kvsim.cachemode.fused_lru import FusedLRUTier
from kvsim.cachemode.fused_tier import FusedTier
from kvsim.cachemode.protocol_tier import ProtocolTier
from kvsim.cachemode.row_writer import csv_rows
from kvsim.cachemode.tier import Emit, ReplayLoop, RequestRow, RunTotals, Tier
from kvsim.core.io import atomic_path
from kvsim.manager.gpu_cache import GpuBlockPool
from kvsim.manager.offload import ManagerProtocol, OffloadManager, admission_from_config
from kvsim.options.config import CacheConfig, applied_store_threshold
from kvsim.policies.arc import ARCPolicy
from kvsim.policies.lru import LRUPolicy
from kvsim.policies.registry import config_policy_class
from kvsim.traces.model import Request
from kvsim.traces.source import request_records

if TYPE_CHECKING:
    from kvsim.tiering.store import TierStore
    from kvsim.traces.columns import Record

REQUEST_COLUMNS = (
    "request",
    "arrival_s",
    "prompt_tokens",
    "prompt_blocks",
    "gpu_hit_blocks",
    "cpu_hit_blocks",
    "stored_blocks",
    "evicted_blocks",
    "skipped_blocks",
    "store_failed",
)


#: rows handed to a ``batch_sink`` at once (at least)
BATCH_ROWS = 2048

#: requests in a part of a run (replayed between two ``progress`` calls and batch checks)
PART_ROWS = 1024

#: a run's totals, in the order the replay loops count them: the requests, the sums of the
#: rows' columns from prompt_tokens to evicted_blocks (stored and evicted counted in chunks
#: by the loops), and the failed stores
_TOTALS = ("requests", *REQUEST_COLUMNS[2:8], "store_failures")


def _discard(row: RequestRow) -> None:
    """The emit of a run that keeps no rows."""


def _both(row_sink: Emit, batch: list[RequestRow]) -> Emit:
    """An emit that gives each row to ``row_sink`` and keeps it in ``batch``."""

    def emit(row: RequestRow) -> None:
        row_sink(row)
        batch.append(row)

    return emit


#: policy class -> its fused tier (exact classes: a user's subclass runs the protocol)
FUSED_TIERS: dict[type, type[FusedTier]] = {LRUPolicy: FusedLRUTier, ARCPolicy: FusedARCTier}


def fused_tier_class(config: CacheConfig) -> type[FusedTier] | None:
    """The fused tier for the configured policy, if it has one."""
    return FUSED_TIERS.get(config_policy_class(config))


class CacheReplay:
    """Drives one CPU tier (kvsim's, or an adapter around vLLM's manager) through a trace.

    ``fused=None`` picks the fused tier (:mod:`kvsim.cachemode.fused_tier`: the same decisions,
    several times faster) for kvsim's own ``lru`` and ``arc``, and the full manager
    protocol otherwise; ``fused=False`` always runs the protocol. ``tier_stores``: secondary
    tier index -> a store shared with other replays (a fleet's shared tier).
    """

    def __init__(
        self,
        config: CacheConfig,
        manager: ManagerProtocol[Any] | None = None,
        requests_for_future: Iterable[Request] | None = None,
        *,
        fused: bool | None = None,
        tier_stores: Mapping[int, TierStore] | None = None,
    ) -> None:
        self.config = config
        self.layout = config.layout
        tiered = bool(config.secondary_tiers)
        fused_tier = fused_tier_class(config) if manager is None and not tiered else None
        if fused and fused_tier is None:
            raise ValueError(
                "the fused tier runs kvsim's own 'lru' and 'arc' only, "
                "without a manager of the caller's or secondary tiers"
            )
        self.tier: Tier
        if tiered:  # secondary tiers: kvsim's tiering manager, through the full protocol
            if manager is not None:
                raise ValueError("secondary tiers run kvsim's tiering manager, not the caller's")
            self.manager: ManagerProtocol[Any] | None = None
            from kvsim.cachemode.tiered_tier import TieredProtocolTier

            self.tier = TieredProtocolTier.from_config(config, requests_for_future, tier_stores)
        elif fused_tier is not None and fused is not False:
            self.tier = fused_tier(
                config.num_chunks,
                config.chunk_tokens,
                config.prefill_chunk_tokens,
                admission_from_config(config),
            )
            self.manager = None
        else:
            if manager is None:
                manager = OffloadManager.from_config(config, requests_for_future)
            self.manager = manager
            self.tier = ProtocolTier(manager, config.chunk_tokens, config.prefill_chunk_tokens)
        self.gpu = GpuBlockPool(config.gpu_blocks)
        self.totals = dict.fromkeys(_TOTALS, 0)
        self._loop: ReplayLoop | None = None  # replay_records' loop, chosen once

    def run(
        self,
        requests: Iterable[Request],
        row_sink: Callable[[RequestRow], object] | None = None,
        *,
        batch_sink: Callable[[list[RequestRow]], object] | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> dict[str, Any]:
        """Replay ``requests`` in order; each one's row (:data:`REQUEST_COLUMNS`) goes to
        ``row_sink``, and to ``batch_sink`` in lists of at least :data:`BATCH_ROWS` (the
        last one shorter; each list is the sink's to keep); ``progress(n)`` hears of every
        ``n`` requests replayed. Returns the running summary."""
        done = self._run_parts(requests, row_sink, batch_sink, progress)
        upc = self.layout.units_per_chunk
        t = self.totals
        for name, value in zip(_TOTALS, done):
            t[name] += value * upc if name in ("stored_blocks", "evicted_blocks") else value
        return self.summary()

    def replay_records(self, records: Iterable[Record], emit: Emit) -> None:
        """Replay ``records`` now, through :meth:`run`'s loop, and add them to the totals:
        a fleet hands each instance its requests as it routes them."""
        loop = self._loop
        if loop is None:
            loop = self._loop = self._replay_loop()
        counts = loop(records, emit)
        upc = self.layout.units_per_chunk
        t = self.totals
        for name, value in zip(_TOTALS, counts):
            t[name] += value * upc if name in ("stored_blocks", "evicted_blocks") else value

    def _run_parts(
        self,
        requests: Iterable[Request],
        row_sink: Callable[[RequestRow], object] | None,
        batch_sink: Callable[[list[RequestRow]], object] | None,
        progress: Callable[[int], object] | None,
    ) -> list[int]:
        """:meth:`run`'s loop over parts of the run (see :data:`PART_ROWS`); the totals.
        (Parts change no decision: only how often ``progress`` hears.)"""
        replay = self._replay_loop()
        batch: list[RequestRow] = []
        emit: Emit = _discard if row_sink is None else row_sink
        if batch_sink is not None:
            emit = batch.append if row_sink is None else _both(row_sink, batch)
        done = [0] * 8
        records = request_records(requests)
        while True:  # a part is read as it is replayed: one record at a time in memory
            counts = replay(islice(records, PART_ROWS), emit)
            if not counts[0]:
                break
            done = [a + b for a, b in zip(done, counts)]
            if batch_sink is not None and len(batch) >= BATCH_ROWS:
                batch_sink(batch[:])
                batch.clear()
            if progress is not None:
                progress(counts[0])
        if batch_sink is not None and batch:
            batch_sink(batch[:])
        return done

    def _replay_loop(self) -> ReplayLoop:
        """The loop for this configuration: the fused LRU tier's own whole-run loop where a
        chunk is one trace block and no GPU cache sits before the CPU tier (the common
        ``kvsim replay``), else :meth:`_replay_requests`."""
        layout = self.layout
        if layout.split == 1 and layout.units_per_chunk == 1 and not self.gpu.enabled:
            loop = self.tier.whole_run_loop()  # block ids are its chunk keys
            if loop is not None:
                return loop
        return self._replay_requests

    def _replay_requests(self, records: Iterable[Record], emit: Emit) -> RunTotals:
        """Replay ``records`` a request at a time through the tier's :meth:`serve`; returns
        the counts to add to :data:`_TOTALS` (stored and evicted in chunks)."""
        layout = self.layout
        unit_tokens = layout.unit_tokens
        units_per_chunk = layout.units_per_chunk
        tpc = layout.chunk_tokens
        unit_keys_of, chunk_keys_of = layout.unit_keys, layout.chunk_keys
        serve = self.tier.serve
        gpu = self.gpu
        gpu_on = gpu.enabled
        gpu_blocks = gpu.num_blocks
        n_req = n_tokens = n_units = n_gpu = n_cpu = n_stored = n_evicted = n_fail = 0

        for request_id, arrival_s, input_tokens, _, block_hashes, _ in records:
            unit_keys = unit_keys_of(block_hashes, input_tokens)
            chunk_keys = chunk_keys_of(unit_keys)
            n_chunks = len(chunk_keys)

            gpu_hit = 0
            store_chunks = n_chunks
            if gpu_on:
                if unit_keys:
                    gpu_hit = gpu.match_prefix(unit_keys, (input_tokens - 1) // unit_tokens)
                needed = -(-input_tokens // unit_tokens)
                held = gpu.acquire_cached(unit_keys[:gpu_hit]) if gpu_hit else []
                fresh = gpu.allocate(min(needed, gpu_blocks) - gpu_hit) or []
                allocated_units = gpu_hit + len(fresh)
                store_chunks = min(n_chunks, allocated_units * unit_tokens // tpc)

            cpu_hit_tokens, stored, evicted, failed, skipped = serve(
                request_id, chunk_keys, gpu_hit * unit_tokens, store_chunks, input_tokens
            )

            if gpu_on:
                complete_fresh = min(len(unit_keys), allocated_units) - gpu_hit
                if complete_fresh > 0:
                    gpu.cache_blocks(
                        fresh[:complete_fresh], unit_keys[gpu_hit : gpu_hit + complete_fresh]
                    )
                gpu.free(held + fresh)

            n_req += 1
            n_tokens += input_tokens
            n_units += len(unit_keys)
            n_gpu += gpu_hit
            cpu_units = cpu_hit_tokens // unit_tokens
            n_cpu += cpu_units
            n_stored += stored
            n_evicted += evicted
            n_fail += failed
            emit(
                (
                    request_id,
                    arrival_s,
                    input_tokens,
                    len(unit_keys),
                    gpu_hit,
                    cpu_units,
                    stored * units_per_chunk,
                    evicted * units_per_chunk,
                    skipped * units_per_chunk,
                    failed > 0,
                )
            )
        return n_req, n_tokens, n_units, n_gpu, n_cpu, n_stored, n_evicted, n_fail

    def summary(self) -> dict[str, Any]:
        t = self.totals
        cfg = self.config
        tier = self.tier
        counters = tier.counters
        upc = self.layout.units_per_chunk
        blocks = t["prompt_blocks"]
        ratio = (lambda x: x / blocks) if blocks else (lambda x: 0.0)
        chunk_bytes = cfg.chunk_bytes
        stored_chunks = t["stored_blocks"] // upc
        out: dict[str, Any] = {
            "requests": t["requests"],
            "prompt_tokens": t["prompt_tokens"],
            "prompt_blocks": blocks,
            "block_tokens": cfg.block_tokens,
            "unit_tokens": self.layout.unit_tokens,
            "gpu_hit_blocks": t["gpu_hit_blocks"],
            "cpu_hit_blocks": t["cpu_hit_blocks"],
            "gpu_hit_ratio": ratio(t["gpu_hit_blocks"]),
            "cpu_hit_ratio": ratio(t["cpu_hit_blocks"]),
            "combined_hit_ratio": ratio(t["gpu_hit_blocks"] + t["cpu_hit_blocks"]),
            "chunks_stored": stored_chunks,
            "chunks_evicted": t["evicted_blocks"] // upc,
            "chunks_skipped_by_threshold": counters.stores_skipped if counters is not None else 0,
            "allocation_failures": t["store_failures"],
            "bytes_loaded": t["cpu_hit_blocks"] * chunk_bytes // upc
            if chunk_bytes is not None
            else None,
            "bytes_stored": stored_chunks * chunk_bytes if chunk_bytes is not None else None,
            "cpu_chunks": cfg.num_chunks,
            "chunk_tokens": cfg.chunk_tokens,
            "chunk_bytes": chunk_bytes,
            "cpu_resident_chunks": tier.num_resident,
            "gpu_blocks": cfg.gpu_blocks,
            "gpu_evictions": self.gpu.evictions,
            "policy": cfg.policy,
            "tier": self.tier.name,
            "admission": cfg.admission,
            "store_threshold": applied_store_threshold(cfg.admission, cfg.store_threshold),
        }
        out.update(tier.summary(blocks, self.layout.unit_tokens, chunk_bytes))
        return out


#: each column's Arrow type in a ``--requests-csv`` file
_CSV_TYPES = ("int64", "double", *["int64"] * 7, "bool")


def write_requests_csv(
    path: str | os.PathLike[str],
    replay: CacheReplay,
    requests: Iterable[Request],
    progress: Callable[[int], object] | None = None,
) -> dict[str, Any]:
    """Replay ``requests`` and write their rows to a CSV at ``path`` (header
    :data:`REQUEST_COLUMNS`), formatted a batch at a time by Arrow's CSV writer
    (:mod:`kvsim.cachemode.row_writer`), gzipped where ``path`` ends in ``.gz``, as a
    trace's is; the file is written whole or not at all. Returns the summary."""
    gzip = os.fspath(path).endswith(".gz")
    with (
        atomic_path(path) as tmp,
        csv_rows(tmp, list(zip(REQUEST_COLUMNS, _CSV_TYPES)), gzip=gzip) as write,
    ):
        return replay.run(requests, batch_sink=write, progress=progress)
