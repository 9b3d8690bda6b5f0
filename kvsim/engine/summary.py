"""The summary of a timed run: vLLM-style latency metrics, load, hits, traffic, link use."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from kvsim.core.errors import InputWarning
from kvsim.engine.transfer_protocol import STORE
from kvsim.report.serve_metrics import (
    RUN_WITH_OFFLOAD,
    RUN_WITHOUT_OFFLOAD,
    BenchSettings,
    Load,
    bench_fields,
    inter_token_latencies,
)
from kvsim.specs.context import engine_max_model_len
from kvsim.specs.sizing import usable_gpu_blocks


def busy_time(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of ``[start, end)`` intervals."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    total = 0.0
    cur_s, cur_e = starts[order[0]], ends[order[0]]
    for s, e in zip(starts[order[1:]], ends[order[1:]]):
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return float(total + cur_e - cur_s)


def _refused_words(engine: Any, refused: int, total: int) -> str:
    """Why ``refused`` of ``total`` requests never ran, with the engine's limits: the
    summary's latencies are the others' (with every request refused, all zero), which a
    user who set ``--max-model-len`` too short would otherwise read as a result."""
    p = engine.params
    limits = [
        f"max_model_len {engine_max_model_len(engine.model, p.max_model_len):,}",
        f"what the GPU KV holds ({usable_gpu_blocks(engine.num_gpu_blocks) * p.gpu_block_tokens:,}"
        " tokens)",
    ]
    if not p.enable_chunked_prefill:
        limits.append(f"max_num_batched_tokens {p.max_num_batched_tokens:,} (no chunked prefill)")
    return (
        f"{refused:,} of {total:,} requests refused, as vLLM refuses a request longer than "
        f"{', or than '.join(limits)}: its server answers each with an error, and the "
        f"latencies are the {total - refused:,} others'"
    )


def summarize(
    engine: Any,
    requests: pd.DataFrame,
    transfers: pd.DataFrame,
    bench: BenchSettings | None = None,
    closed_loop: bool = False,
) -> dict[str, Any]:
    """The run's summary: vLLM ``bench serve``'s metrics (:mod:`kvsim.report.serve_metrics`, per
    ``bench``), the load (an overloaded or bursty run warns: a
    :class:`~kvsim.report.serve_metrics.LoadWarning`, unless its arrivals came from a
    closed loop of clients, which waits for the GPU by design), then kvsim's cache, traffic
    and link counters."""
    bench = bench or BenchSettings()
    done = requests[~requests["rejected"]]
    first_arrival = float(requests["arrival_s"].min()) if len(requests) else 0.0
    end = float(done["finish_s"].max()) if len(done) else first_arrival
    span = max(end - first_arrival, 1e-12)
    tp = engine.params.tp
    rec = engine.recorder
    itls = inter_token_latencies(rec.token_gaps())
    out: dict[str, Any] = {
        "requests": len(requests),
        "offload": engine.offload,
        "steps": engine.steps,
    }
    out.update(bench_fields(requests, itls, rec.token_times(), span, bench))
    load = Load.of(requests, itls, engine.busy_s, engine.steps, span)
    out.update(load.fields())
    said = load.warning(RUN_WITH_OFFLOAD if engine.offload else RUN_WITHOUT_OFFLOAD)
    if said is not None and not closed_loop:
        warnings.warn(said[0], said[1], stacklevel=2)
    refused = len(requests) - len(done)
    if refused:
        warnings.warn(_refused_words(engine, refused, len(requests)), InputWarning, stacklevel=2)
    out["kv_wait_total_s"] = float(done["kv_wait_s"].sum())
    out["gpu_hit_tokens"] = int(done["gpu_hit_tokens"].sum())
    out["cpu_hit_tokens"] = int(done["cpu_hit_tokens"].sum())
    out["computed_prompt_tokens"] = int(done["computed_prompt_tokens"].sum())
    out["recomputed_tokens"] = int(done["recomputed_tokens"].sum())
    out["preemptions"] = int(done["preemptions"].sum())
    out["gpu_kv_blocks"] = engine.num_gpu_blocks
    out["gpu_block_tokens"] = engine.params.gpu_block_tokens  # vLLM's block_size
    out["gpu_prefix_evictions"] = engine.pool.evictions
    out["deadlock_rescues"] = engine.rescues
    conn = engine.connector
    if conn is not None:
        is_store = transfers["direction"] == STORE
        loads, stores = transfers[~is_store], transfers[is_store]
        counters = engine.manager.counters
        out.update(
            {
                "load_jobs": len(loads),
                "store_jobs": len(stores),
                "load_bytes": int(loads["bytes"].sum()) * tp,
                "store_bytes": int(stores["bytes"].sum()) * tp,
                "chunks_loaded": int(loads["chunks"].sum()),
                "chunks_stored": int(stores["chunks"].sum()),
                "chunks_evicted": counters.evicted_chunks,
                "allocation_failures": conn.allocation_failures,
                "stores_skipped": counters.stores_skipped,
                "flush_and_sync_stall_s": conn.stall_time - conn.submit_host_time,
                "store_submit_stall_s": conn.submit_host_time,
                "pcie_h2d_util": busy_time(loads["start_s"].to_numpy(), loads["end_s"].to_numpy())
                / span,
                "pcie_d2h_util": busy_time(stores["start_s"].to_numpy(), stores["end_s"].to_numpy())
                / span,
                "cpu_chunks": engine.config.num_chunks,
                "chunk_tokens": engine.config.chunk_tokens,
                "policy": engine.config.policy,
            }
        )
    return out
