"""Speed of cache-mode replay: blocks per second per policy, and against vLLM's own manager.

Ratios are measured in one run, on the same machine, on the same in-memory requests,
so they mean something even on a busy machine; absolute numbers are best-of-N.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from kvsim.config import OffloadOptions
from kvsim.replay import CacheReplay
from kvsim.traces import Request
from kvsim.vllm_driver import VllmManagerDriver, vllm_available


def _best_time(run: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def bench_replay(requests: Sequence[Request], block_tokens: int, *, cpu_chunks: int,
                 policies: Sequence[str] = ("lru", "arc"), repeat: int = 3, with_vllm: bool | None = None,
                 chunk_tokens: int | None = None) -> pd.DataFrame:
    """One row per (engine, policy): seconds, blocks/s, ratio to the first policy's kvsim
    rate (``vs_kvsim_lru``: pass lru first), hit ratio.

    ``with_vllm=None`` drives vLLM's ``CPUOffloadingManager`` too when vLLM is importable
    (lru and arc only), and checks that it makes the same per-request decisions.
    """
    opts = OffloadOptions(cpu_chunks=cpu_chunks, chunk_tokens=chunk_tokens)
    blocks = sum(r.input_tokens // block_tokens for r in requests)
    if with_vllm is None:
        with_vllm = vllm_available()
    rows = []
    base_rate = None
    for policy in policies:
        cfg = opts.with_(policy=policy).resolve(block_tokens)
        kv_rows: list = []

        def run_kvsim(cfg=cfg, kv_rows=kv_rows):
            kv_rows.clear()
            return CacheReplay(cfg, requests_for_future=requests).run(requests, kv_rows.append)

        seconds, summary = _best_time(run_kvsim, repeat)
        rate = blocks / seconds
        if base_rate is None:
            base_rate = rate  # the first policy is the reference (the CLI puts lru first)
        rows.append({"engine": "kvsim", "policy": policy, "seconds": seconds, "blocks": blocks,
                     "blocks_per_s": rate, "vs_kvsim_lru": rate / base_rate,
                     "cpu_hit_ratio": summary["cpu_hit_ratio"], "same_decisions": None})
        if with_vllm and policy in ("lru", "arc"):
            v_rows: list = []

            def run_vllm(cfg=cfg, v_rows=v_rows, policy=policy):
                v_rows.clear()
                driver = VllmManagerDriver(cfg.num_chunks, policy)
                return CacheReplay(cfg, manager=driver).run(requests, v_rows.append)

            v_seconds, v_summary = _best_time(run_vllm, 1)
            same = v_rows == kv_rows
            rows.append({"engine": "vllm-0.33", "policy": policy, "seconds": v_seconds, "blocks": blocks,
                         "blocks_per_s": blocks / v_seconds, "vs_kvsim_lru": (blocks / v_seconds) / base_rate,
                         "cpu_hit_ratio": v_summary["cpu_hit_ratio"], "same_decisions": same,
                         "kvsim_speedup": v_seconds / seconds})
    return pd.DataFrame(rows)
