"""Speed of cache-mode replay: blocks per second per policy, and against vLLM's own manager.

Ratios are measured in one run, on the same machine, on the same in-memory requests,
so they mean something even on a busy machine; absolute numbers are best-of-N.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import pandas as pd

from kvsim.cachemode import CacheReplay, fused_tier_class
from kvsim.cachemode.tier import RequestRow
from kvsim.core.errors import InputError
from kvsim.integrations.from_vllm import VllmManagerDriver, vllm_available
from kvsim.options.offload import CacheConfig, OffloadOptions
from kvsim.traces import Request

_T = TypeVar("_T")


def _best_time(run: Callable[[], _T], repeat: int) -> tuple[float, _T]:
    """The fastest time of ``repeat`` runs (``repeat >= 1``), and the last run's result."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def bench_replay(
    requests: Sequence[Request],
    block_tokens: int,
    *,
    cpu_chunks: int,
    policies: Sequence[str] = ("lru", "arc"),
    repeat: int = 3,
    with_vllm: bool | None = None,
    chunk_tokens: int | None = None,
) -> pd.DataFrame:
    """One row per (engine, policy): seconds, blocks/s, ratio to the first policy's kvsim
    rate (``vs_kvsim_lru``: pass lru first) and to LRU through the full protocol
    (``vs_protocol_lru``), hit ratio.

    For ``lru`` and ``arc`` the fused tier (engine ``kvsim``) is timed against the full
    manager protocol (engine ``kvsim-protocol``), which must make the same per-request decisions.
    ``with_vllm=None`` drives vLLM's ``CPUOffloadingManager`` too when vLLM is importable
    (lru and arc only), and checks that it makes kvsim's per-request decisions. Every
    engine's time is the best of ``repeat`` runs (vLLM's too: timing it once, as kvsim
    did before 2026-12-06, favoured kvsim)."""
    opts = OffloadOptions(cpu_chunks=cpu_chunks, chunk_tokens=chunk_tokens)
    blocks = sum(r.input_tokens // block_tokens for r in requests)
    with_vllm = use_vllm(with_vllm)
    table: list[dict[str, Any]] = []

    def timed(
        engine: str,
        policy: str,
        make: Callable[[], CacheReplay],
        runs: int,
        reference: list[RequestRow] | None,
    ) -> list[RequestRow]:
        rows: list[RequestRow] = []

        def run() -> dict[str, Any]:
            rows.clear()
            return make().run(requests, rows.append)

        seconds, summary = _best_time(run, runs)
        rate = blocks / seconds
        base_rate = (
            table[0]["blocks_per_s"] if table else rate
        )  # the first row (the CLI puts lru first)
        table.append(
            {
                "engine": engine,
                "policy": policy,
                "seconds": seconds,
                "blocks": blocks,
                "blocks_per_s": rate,
                "vs_kvsim_lru": rate / base_rate,
                "cpu_hit_ratio": summary["cpu_hit_ratio"],
                "same_decisions": None if reference is None else rows == reference,
                # how many times faster kvsim's default tier is than this engine
                "kvsim_speedup": None
                if reference is None
                else seconds / _seconds_of(table, policy),
            }
        )
        return list(rows)

    for policy in policies:
        cfg = opts.with_(policy=policy).resolve(block_tokens)
        ours = timed(
            "kvsim",
            policy,
            partial(CacheReplay, cfg, requests_for_future=requests),
            repeat,
            None,
        )
        if fused_tier_class(cfg) is not None:
            timed(
                "kvsim-protocol",
                policy,
                partial(CacheReplay, cfg, fused=False),
                repeat,
                ours,
            )
        if with_vllm and policy in ("lru", "arc"):
            timed(
                "vllm-0.33",
                policy,
                partial(vllm_replay, cfg, policy),
                repeat,
                ours,
            )
    frame = pd.DataFrame(table)
    protocol = frame[(frame["engine"] == "kvsim-protocol") & (frame["policy"] == "lru")]
    if len(protocol):
        # policies compared on one footing: every non-LRU policy runs the full protocol
        frame.insert(6, "vs_protocol_lru", frame["blocks_per_s"] / protocol["blocks_per_s"].iloc[0])
    return frame


def use_vllm(with_vllm: bool | None) -> bool:
    """Whether to drive vLLM's manager: when asked (an error if it is not importable), or
    when not told (None) and it is importable."""
    if with_vllm is None:
        return vllm_available()
    if with_vllm and not vllm_available():
        raise InputError(
            "--vllm: vLLM 0.33 is not importable here (pip install --no-deps vllm==0.33.0 "
            "-r .ci/vllm-0.33-cpu-requirements.txt)"
        )
    return with_vllm


def vllm_replay(config: CacheConfig, policy: str) -> CacheReplay:
    """Cache-mode replay driving vLLM's own manager (built inside the timed run)."""
    return CacheReplay(config, manager=VllmManagerDriver(config.num_chunks, policy))


def _seconds_of(table: list[dict[str, Any]], policy: str) -> float:
    seconds: float = next(
        r["seconds"] for r in table if r["engine"] == "kvsim" and r["policy"] == policy
    )
    return seconds
