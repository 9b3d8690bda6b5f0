"""``kvsim bench --stages``: where a user's wait for ``kvsim replay`` goes, stage by stage.

The replay loop is a fraction of what a user waits for; start-up, reading the trace and
writing per-request rows count as much. Each stage is timed on its own (best of
``repeat``), and the whole command is timed as a user runs it, in a fresh process, minus
the interpreter's own start-up (``python -c pass``), against vLLM 0.33's manager loop alone
on the same requests when vLLM is importable (which excludes vLLM's parsing entirely),
timed as often, in turns with the command, and kept the same way (best of ``repeat``), so
that a noisy machine favours neither side. Reads are timed as the replay reads a trace:
its plain records.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pandas as pd

from kvsim.cachemode.bench import use_vllm, vllm_replay
from kvsim.cachemode.driver import CacheReplay, write_requests_csv
from kvsim.cachemode.tier import RequestRow
from kvsim.options.offload import CacheConfig, OffloadOptions
from kvsim.traces import Request, as_trace
from kvsim.traces import cache as trace_cache
from kvsim.traces.source import request_records

_T = TypeVar("_T")


def _best(run: Callable[[], _T], repeat: int) -> tuple[float, _T]:
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = run()
        best = min(best, time.perf_counter() - start)
    assert value is not None
    return best, value


def _process_seconds(argv: list[str], repeat: int, env: dict[str, str]) -> float:
    """Best wall time of a fresh process running ``argv`` (output discarded)."""

    def run() -> bool:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        return True

    return _best(run, repeat)[0]


@contextlib.contextmanager
def _cache_env(**values: str | None) -> Iterator[None]:
    """The trace cache's environment switched for a block (and the in-memory copy dropped)."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        trace_cache.forget()
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        trace_cache.forget()


def bench_stages(
    trace: str,
    *,
    cpu_chunks: int,
    policy: str = "lru",
    repeat: int = 3,
    with_vllm: bool | None = None,
) -> pd.DataFrame:
    """One row per stage: ``stage``, ``seconds`` and what it covers (``note``)."""
    rows: list[dict[str, Any]] = []

    def add(stage: str, seconds: float, note: str) -> None:
        rows.append({"stage": stage, "seconds": seconds, "note": note})

    with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
        env = {**os.environ, trace_cache.ENV_FOLDER: os.path.join(tmp, "cache")}
        env.pop(trace_cache.ENV_OFF, None)
        # a stage net of the interpreter is a difference of two timings: on a busy machine
        # it can come out below zero, which is read as nothing measurable (0)
        python = _process_seconds([sys.executable, "-c", "pass"], repeat, env)
        add("python", python, "interpreter start-up (subtracted below)")
        help_s = _process_seconds([sys.executable, "-m", "kvsim", "--help"], repeat, env)
        add("start-up", max(0.0, help_s - python), "kvsim --help")

        def read() -> int:
            trace_cache.forget()
            return sum(1 for _ in request_records(as_trace(trace)))

        with _cache_env(**{trace_cache.ENV_OFF: "1"}):
            cold, n = _best(read, repeat)
        add("read (parse)", cold, f"{n:,} requests, no cache")
        with _cache_env(**{trace_cache.ENV_FOLDER: env[trace_cache.ENV_FOLDER]}):
            read()  # fills the cache
            warm, _ = _best(read, repeat)
        add("read (cached)", warm, "second read of the same file")
        requests = list(as_trace(trace))

        block_tokens = as_trace(trace, limit=1).block_tokens
        config = OffloadOptions(cpu_chunks=cpu_chunks, policy=policy).resolve(block_tokens)
        loop, _ = _best(lambda: CacheReplay(config).run(requests, lambda row: None), repeat)
        add("replay", loop, f"{policy} at {cpu_chunks:,} chunks, rows discarded")
        csv_path = os.path.join(tmp, "requests.csv")
        both, _ = _best(lambda: write_requests_csv(csv_path, CacheReplay(config), requests), repeat)
        add("write", max(0.0, both - loop), "per-request CSV rows (replay+write minus replay)")

        argv = [sys.executable, "-m", "kvsim", "replay", trace, "--cpu-chunks", str(cpu_chunks)]
        argv += ["--policy", policy, "--requests-csv", csv_path, "--no-progress"]
        vllm = _vllm_loop(config, policy, requests, with_vllm)
        # the whole command and vLLM's loop take turns, so a slow spell of a noisy machine
        # falls on both sides alike; each keeps its best
        ends, loops = [], []
        for _ in range(repeat):
            ends.append(max(0.0, _process_seconds(argv, 1, env) - python))
            if vllm is not None:
                loops.append(vllm())
        end_to_end = min(ends)
        add("kvsim replay", end_to_end, "whole command, cached trace, minus interpreter start-up")
        if loops:
            seconds = min(loops)
            ratio = seconds / end_to_end
            note = f"best of {repeat}; kvsim replay is " + (
                f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"
            )
            add("vllm manager loop", seconds, note)
    return pd.DataFrame(rows)


def _vllm_loop(
    config: CacheConfig, policy: str, requests: list[Request], with_vllm: bool | None
) -> Callable[[], float] | None:
    """A timer of vLLM's manager loop over ``requests`` (its seconds per call), once it has
    been checked to make kvsim's decisions; None without vLLM (or for a policy vLLM lacks)."""
    if not use_vllm(with_vllm) or policy not in ("lru", "arc"):
        return None
    ours: list[RequestRow] = []
    CacheReplay(config).run(requests, ours.append)

    def timed() -> float:
        rows: list[RequestRow] = []
        start = time.perf_counter()
        vllm_replay(config, policy).run(requests, rows.append)
        seconds = time.perf_counter() - start
        if rows != ours:
            raise AssertionError("vLLM's manager made other decisions than kvsim's")
        return seconds

    return timed
