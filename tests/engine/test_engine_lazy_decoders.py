"""The scheduler's lazy decoders (``engine.LAZY_DECODERS``) against the plain path: random
traces over the edges (preemptions, the budget running out mid-list, finishes, async and
sync loops, offloading on and off, prefix caching on and off, tiny GPU caches, chunked
prefill with a long-prefill threshold) give the same requests, steps and transfers tables,
exactly, and the runs do reach those edges with quiet decoders in play."""

from __future__ import annotations

import random
from typing import Any

import pandas as pd
import pytest

from kvsim.core.errors import EngineStalled
from kvsim.engine import engine as engine_module
from kvsim.engine.bench import MODEL
from kvsim.engine.compute_model import LinearCompute
from kvsim.engine.engine import Engine
from kvsim.engine.params import EngineParams
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.transfer_model import constant_link
from kvsim.options.offload import CacheConfig
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import get_model
from kvsim.traces import Request, Trace

SEEDS = range(24)


def _trace(rng: random.Random, n: int, block: int) -> list[Request]:
    """Requests sharing a few prefixes, arriving in bursts and trickles, with outputs from one
    token (finishes at once) to hundreds (long quiet stretches)."""
    prefixes = [[rng.randrange(1 << 40) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rng.choice([5, 50, 500]))
        shared = rng.choice(prefixes)
        hashes = shared[: rng.randrange(len(shared) + 1)]
        hashes += [rng.randrange(1 << 40) for _ in range(rng.randrange(4))]
        prompt = max(1, len(hashes) * block - rng.randrange(block)) if hashes else 1
        hashes = hashes or [rng.randrange(1 << 40)]
        output = rng.choice([1, 2, 3, 5, 20, 60, 200])
        out.append(Request(i, t, prompt, output, tuple(hashes)))
    return out


def _engine(seed: int) -> tuple[Engine, Trace]:
    rng = random.Random(seed)
    block = rng.choice([16, 32, 64])
    cpu = rng.choice([None, 4, 50, 400])
    config = CacheConfig(
        num_chunks=cpu or 1,
        block_tokens=block,
        chunk_tokens=block * rng.choice([1, 2]) if cpu else block,
        policy="lru",
        model=MODEL,
    )
    params = EngineParams(
        gpu_blocks=rng.choice([30, 60, 120, 2000]),
        max_num_batched_tokens=rng.choice([64, 256, 2048]),
        max_num_seqs=rng.choice([4, 16, 256]),
        long_prefill_token_threshold=rng.choice([0, 0, 40]),
        async_scheduling=seed % 2 == 0,
        enable_prefix_caching=rng.choice([True, False]),
        offload_prompt_only=rng.choice([True, False]),
    )
    link = constant_link(
        {
            "kind": "constant",
            "h2d_bytes_per_s": rng.choice([1e9, 25e9]),
            "d2h_bytes_per_s": rng.choice([1e9, 25e9]),
        }
    )
    engine = Engine(
        config,
        params,
        model=get_model(MODEL),
        gpu=get_gpu("h200"),
        compute=LinearCompute(0.01, 1e-5),
        transfer=link,
        offload=cpu is not None,
    )
    return engine, Trace.from_requests(_trace(rng, rng.randrange(20, 100), block), block)


def _tables(seed: int) -> tuple[Any, ...]:
    engine, trace = _engine(seed)
    try:
        engine.run(trace)
    except EngineStalled as exc:  # a tiny cache may stall: both paths must, the same way
        return (str(exc),)
    rec = engine.recorder
    return rec.request_table(), rec.step_table(), rec.transfer_table()


def _assert_identical(plain: tuple[Any, ...], lazy: tuple[Any, ...]) -> None:
    assert len(plain) == len(lazy)
    for a, b in zip(plain, lazy, strict=True):
        if isinstance(a, str):
            assert a == b
            continue
        assert isinstance(b, pd.DataFrame)
        assert list(a.columns) == list(b.columns)
        for name in a.columns:  # exact: NaNs equal, floats bit for bit
            pd.testing.assert_series_equal(a[name], b[name], check_exact=True, obj=name)


def test_lazy_decoders_give_the_plain_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {"quiet": 0, "woken_mid_list": 0, "preemptions": 0, "async": 0, "sync": 0}
    go_quiet, wake_from = Scheduler._go_quiet, Scheduler._wake_from

    def counting_go_quiet(self: Scheduler, *args: Any) -> None:
        before = self._n_quiet
        go_quiet(self, *args)
        seen["quiet"] += self._n_quiet - before

    def counting_wake_from(self: Scheduler, stop: Any) -> None:
        seen["woken_mid_list"] += sum(1 for r in self.running if r.q_end)
        wake_from(self, stop)

    monkeypatch.setattr(Scheduler, "_go_quiet", counting_go_quiet)
    monkeypatch.setattr(Scheduler, "_wake_from", counting_wake_from)
    for seed in SEEDS:
        monkeypatch.setattr(engine_module, "LAZY_DECODERS", False)
        plain = _tables(seed)
        monkeypatch.setattr(engine_module, "LAZY_DECODERS", True)
        lazy = _tables(seed)
        _assert_identical(plain, lazy)
        if len(plain) == 3:
            requests = plain[0]
            seen["preemptions"] += int(requests["preemptions"].sum())
            seen["async" if seed % 2 == 0 else "sync"] += 1
    # the runs reached the edges with quiet decoders about
    assert seen["quiet"] > 1000, seen
    assert seen["woken_mid_list"] > 10, seen  # budget out or a failed grow mid-list
    assert seen["preemptions"] > 10, seen
    assert seen["async"] > 5 and seen["sync"] > 5, seen


def test_a_quiet_decoder_preempted_from_the_tail_is_woken_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A preemption victim comes from the tail of the running list: when it is quiet its
    fields are materialised before ``_preempt`` reads them (else its in-flight and computed
    tokens would be those of the tick it went quiet)."""
    woken_victims = 0
    last_woken: list[Any] = [None]
    preempt, wake = Scheduler._preempt, Scheduler._wake

    def recording_wake(self: Scheduler, req: Any) -> None:
        last_woken[0] = req
        wake(self, req)

    def checking_preempt(self: Scheduler, req: Any) -> None:
        nonlocal woken_victims
        assert req.q_end == 0
        woken_victims += req is last_woken[0]
        preempt(self, req)

    monkeypatch.setattr(Scheduler, "_wake", recording_wake)
    monkeypatch.setattr(Scheduler, "_preempt", checking_preempt)
    monkeypatch.setattr(engine_module, "LAZY_DECODERS", True)
    for seed in SEEDS:
        _tables(seed)
    assert woken_victims > 3  # victims that were quiet when the loop reached for them
