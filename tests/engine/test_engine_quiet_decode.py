"""Quiet decode iterations (``engine.QUIET_DECODE``, :mod:`kvsim.engine.quiet_decode`)
against the general path: random traces over the edges (preemptions, finishes, the batch
budget, arrivals in the middle of decode runs, transfers in flight, offloading on and off,
prefix caching on and off, prompt-only offers or not, tiny GPU caches that stall) and fleets
(open traces, closed loops whose sends follow any instance's finishes) give the same
requests, steps and transfers tables, bit for bit, and the runs did take the quiet path."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pandas as pd
import pytest

import kvsim
from kvsim.core.errors import EngineStalled
from kvsim.engine import engine as engine_module
from kvsim.engine import quiet_decode, quiet_loop
from kvsim.engine.bench import MODEL
from kvsim.engine.compute_model import LinearCompute
from kvsim.engine.engine import Engine
from kvsim.engine.params import EngineParams
from kvsim.engine.quiet_decode import quiet_batch
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.step_batch import StepBatch
from kvsim.engine.transfer_model import constant_link
from kvsim.manager.gpu_cache import GpuBlockPool
from kvsim.options.offload import CacheConfig
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import get_model
from kvsim.traces import Request, Trace

pytestmark = pytest.mark.filterwarnings("ignore::kvsim.report.serve_metrics.LoadWarning")

SEEDS = range(30)


def _trace(rng: random.Random, n: int, block: int) -> list[Request]:
    """Requests sharing a few prefixes, in bursts and trickles (arrivals fall inside decode
    runs), with outputs from one token to hundreds (long quiet stretches, finishes)."""
    prefixes = [[rng.randrange(1 << 40) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rng.choice([2, 20, 500]))
        shared = rng.choice(prefixes)
        hashes = shared[: rng.randrange(len(shared) + 1)]
        hashes += [rng.randrange(1 << 40) for _ in range(rng.randrange(4))]
        prompt = max(1, len(hashes) * block - rng.randrange(block)) if hashes else 1
        hashes = hashes or [rng.randrange(1 << 40)]
        output = rng.choice([1, 2, 3, 5, 20, 60, 200, 400])
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
        policy=rng.choice(["lru", "arc"]),
        model=MODEL,
    )
    params = EngineParams(
        gpu_blocks=rng.choice([30, 60, 120, 2000]),
        max_num_batched_tokens=rng.choice([2, 64, 256, 2048]),
        max_num_seqs=rng.choice([4, 16, 256]),
        long_prefill_token_threshold=rng.choice([0, 0, 40]),
        async_scheduling=seed % 5 != 0,
        enable_prefix_caching=rng.choice([True, False]),
        offload_prompt_only=rng.choice([True, False]),
    )
    link = constant_link(
        {
            "kind": "constant",
            "h2d_bytes_per_s": rng.choice([1e8, 25e9]),
            "d2h_bytes_per_s": rng.choice([1e8, 25e9]),
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


def _assert_identical(plain: tuple[Any, ...], quiet: tuple[Any, ...]) -> None:
    assert len(plain) == len(quiet)
    for a, b in zip(plain, quiet, strict=True):
        if isinstance(a, str):
            assert a == b
            continue
        assert isinstance(b, pd.DataFrame)
        assert list(a.columns) == list(b.columns)
        for name in a.columns:  # exact: NaNs equal, floats bit for bit
            pd.testing.assert_series_equal(a[name], b[name], check_exact=True, obj=name)


def _count_quiet(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the quiet iterations run."""
    seen = {"quiet": 0}
    quiet_run = quiet_loop.quiet_run

    def counting(engine: Engine, limit: Any) -> int:
        runs = quiet_run(engine, limit)
        seen["quiet"] += runs
        return runs

    monkeypatch.setattr(quiet_loop, "quiet_run", counting)
    return seen


def _count_quiet_edges(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the quiet iterations that met the edges the quiet path covers beside the
    decoders: the queue's head refused for want of GPU blocks, the running requests at
    ``max_num_seqs`` with requests waiting, copies in flight (polled at each launch), and
    copies completed as a quiet batch is processed."""
    seen = {"head refused": 0, "seqs full": 0, "polls": 0, "completions": 0}

    def waiting(sched: Scheduler, steps: int) -> None:
        if sched.waiting:
            full = len(sched.running) >= sched.params.max_num_seqs
            seen["seqs full" if full else "head refused"] += steps

    schedule_quiet, advance_decoders = quiet_loop.schedule_quiet, quiet_loop.advance_decoders
    quiet_poll, complete = quiet_loop.quiet_poll, quiet_loop.complete

    def scheduled(sched: Scheduler) -> Any:
        waiting(sched, 1)
        return schedule_quiet(sched)

    def advanced(sched: Scheduler, starts: Any, ends: Any) -> None:
        waiting(sched, len(ends))
        advance_decoders(sched, starts, ends)

    def polling(engine: Engine) -> Any:
        poll = quiet_poll(engine)
        if not callable(poll):
            return poll

        def counted(t: float) -> Any:
            seen["polls"] += 1
            return poll(t)

        return counted

    def completing(*args: Any) -> int:
        done = complete(*args)
        seen["completions"] += done
        return done

    monkeypatch.setattr(quiet_loop, "schedule_quiet", scheduled)
    monkeypatch.setattr(quiet_loop, "advance_decoders", advanced)
    monkeypatch.setattr(quiet_loop, "quiet_poll", polling)
    monkeypatch.setattr(quiet_loop, "complete", completing)
    return seen


def test_quiet_decode_iterations_give_the_general_paths_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _count_quiet(monkeypatch)
    quiet_edges = _count_quiet_edges(monkeypatch)
    edges = {"preemptions": 0, "stalls": 0, "transfers": 0}
    for seed in SEEDS:
        monkeypatch.setattr(engine_module, "QUIET_DECODE", False)
        plain = _tables(seed)
        before = seen["quiet"]
        monkeypatch.setattr(engine_module, "QUIET_DECODE", True)
        quiet = _tables(seed)
        _assert_identical(plain, quiet)
        if len(plain) == 1:
            edges["stalls"] += 1
        else:
            edges["preemptions"] += int(plain[0]["preemptions"].sum())
            edges["transfers"] += len(plain[2]) * (seen["quiet"] > before)
    assert seen["quiet"] > 5000, seen  # the runs did take the quiet path, and reached
    assert edges["preemptions"] > 10 and edges["transfers"] > 100, edges  # the edges
    assert min(quiet_edges.values()) > 50, quiet_edges


FLEET_TRACE_SEEDS = range(4)


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "prefix-aware"])
def test_a_fleet_with_quiet_decode_iterations_has_the_general_paths_tables(
    monkeypatch: pytest.MonkeyPatch, router: str
) -> None:
    """Each instance's quiet iterations stop at the fleet's next arrival (the router reads
    every instance then): the tables are the general path's."""
    seen = _count_quiet(monkeypatch)
    for seed in FLEET_TRACE_SEEDS:
        rng = random.Random(seed)
        reqs = _trace(rng, 60, 16)
        opts = dict(cpu_gib=1, gpu_blocks=rng.choice([200, 3000]), instances=3, router=router)
        runs = []
        for quiet in (False, True):
            monkeypatch.setattr(engine_module, "QUIET_DECODE", quiet)
            runs.append(kvsim.simulate(reqs, **opts))
        for name in ("requests", "steps", "transfers", "instances"):
            pd.testing.assert_frame_equal(
                runs[0].tables[name], runs[1].tables[name], check_exact=True, obj=name
            )
    assert seen["quiet"] > 1000, seen


WORKLOAD = {
    "type": "shared_prefix",
    "num_groups": 3,
    "num_prompts_per_group": 4,
    "system_prompt_len": 2000,
    "question_len": 256,
    "output_len": 120,
}


@pytest.mark.parametrize("router", ["round-robin", "random", "least-loaded"])
def test_a_closed_loop_fleet_with_quiet_decode_iterations_has_the_general_paths_tables(
    monkeypatch: pytest.MonkeyPatch, router: str
) -> None:
    """A closed loop sends at any instance's finish: an instance's quiet iterations also
    stop at the other instances' next events, so no send lands in its past."""
    seen = _count_quiet(monkeypatch)
    load = {"type": "concurrency", "stages": [{"concurrency": 3, "num_requests": 30}]}
    opts = dict(workload=WORKLOAD, load=load, cpu_gib=8, gpu_blocks=400, instances=3)
    runs = []
    for quiet in (False, True):
        monkeypatch.setattr(engine_module, "QUIET_DECODE", quiet)
        runs.append(kvsim.simulate(**opts, router=router))
    for name in ("requests", "steps", "transfers"):
        pd.testing.assert_frame_equal(
            runs[0].tables[name], runs[1].tables[name], check_exact=True, obj=name
        )
    assert seen["quiet"] > 500, seen


def test_a_repeated_step_row_is_the_last_row_with_its_own_step_and_times():
    """``Recorder.repeat_step`` (the quiet rows after the second) across the moment the rows
    move into column chunks: the table equals one recorded row by row."""
    from kvsim.engine.recorder import STEP_ROWS, Recorder
    from kvsim.report import metric_names as m

    stats = {
        m.CPU_CACHE_USAGE_PERC: 0.25,
        m.CPU_CACHE_WRITE_USAGE_PERC: 0.125,
        m.CPU_CACHE_READ_USAGE_PERC: 0.125,
        m.CPU_ALLOCATION_SIZE: [3, 4],
        m.STORES_SKIPPED: 2,
    }

    fresh = {0, STEP_ROWS - 1, STEP_ROWS + 5}  # rows recorded whole; STEP_ROWS - 1 cuts

    def row(i: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
        seg = sum(1 for f in fresh if f <= i)  # what only a whole row changes
        floats = (i * 0.5, i * 0.5 + 0.25, seg * 0.01, 0.2 + i * 1e-3, seg / 8)
        return floats, (i, *(seg * 100 + k for k in range(1, 18)))

    plain, repeated = Recorder(), Recorder()
    for i in range(STEP_ROWS + 10):
        floats, ints = row(i)
        plain.step(floats, ints, stats)
        if i in fresh:
            repeated.step(floats, ints, stats)
        else:
            repeated.repeat_step(i, floats[0], floats[1], floats[3])
    pd.testing.assert_frame_equal(repeated.step_table(), plain.step_table(), check_exact=True)


def test_steady_decode_steps_counts_exactly_the_quiet_iterations_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``steady_decode_steps`` against ``quiet_decode_ready`` itself, with runs of quiet
    iterations done one by one: its count ``k`` at an iteration says that the next one is
    quiet with count ``k - 1`` when ``k > 1`` (unless the free GPU blocks fall short of its
    new blocks, which a decode run checks at each iteration), and not quiet when ``k == 1``.
    Not a bound that merely errs low: the count, at the edges the random traces reach (the
    last-but-one token; a chunk to offer)."""
    pending: dict[int, int | None] = {}
    checked = {"quiet": 0, "ends": 0, "short": 0}
    quiet_run = quiet_loop.quiet_run
    ready, steady = quiet_decode.quiet_decode_ready, quiet_decode.steady_decode_steps

    def fresh_run(engine: Engine, limit: Any) -> int:
        pending[id(engine.scheduler)] = None  # outside events may have changed everything
        return quiet_run(engine, limit)

    def short_of_blocks(sched: Scheduler) -> bool:
        need = sum(
            quiet_decode.new_blocks(r, r.num_computed + r.in_flight + 1, sched.unit)
            for r in sched.running
        )
        return need > sched.pool.num_free

    def checked_ready(sched: Any, processed: Any) -> bool:
        is_quiet = ready(sched, processed)
        k = pending.get(id(sched))
        if k is not None:  # the iteration that counted k is over
            if k > 1 and not is_quiet:
                assert short_of_blocks(sched), k
                checked["short"] += 1
            else:
                assert is_quiet == (k > 1), k
                checked["quiet" if is_quiet else "ends"] += 1
            pending[id(sched)] = -k if is_quiet else None  # the next count must be k - 1
        return is_quiet

    def counted(sched: Any, processed: Any) -> int:
        k = steady(sched, processed)
        expected = pending.get(id(sched))
        if expected is not None and expected < 0:
            assert k == -expected - 1, (k, expected)
        pending[id(sched)] = k or None
        return 0  # one iteration at a time

    monkeypatch.setattr(quiet_loop, "quiet_run", fresh_run)
    monkeypatch.setattr(quiet_loop, "quiet_decode_ready", checked_ready)
    monkeypatch.setattr(quiet_loop, "steady_decode_steps", counted)
    for seed in SEEDS:
        _tables(seed)
    assert checked["quiet"] > 1000 and checked["ends"] > 50, checked


def test_decode_runs_do_the_general_paths_block_work_in_its_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every GPU block allocation and every cache call, in order, with its blocks and keys,
    the free blocks it left and the engine's time: the same with quiet iterations and
    decode runs (which do a decode's block work inline) as on the general path. The tables
    cannot show a cache call one step late (a decode block's keys are its request's own);
    this can."""
    calls: list[tuple[Any, ...]] = []
    clock: list[Any] = []  # the running engine's clock

    def frozen(value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    def logging(name: str) -> Any:
        method = getattr(GpuBlockPool, name)

        def wrapper(self: GpuBlockPool, *args: Any) -> Any:
            result = method(self, *args)
            logged = (*map(frozen, args), frozen(result), self.num_free, clock[0].now())
            calls.append((name, *logged))
            return result

        return wrapper

    for name in ("allocate", "cache_blocks"):
        monkeypatch.setattr(GpuBlockPool, name, logging(name))
    runs = {"decode run": 0}
    decode_run = quiet_loop.decode_run

    def counting(engine: Engine, *args: Any) -> Any:
        out = decode_run(engine, *args)
        runs["decode run"] += out[1]
        return out

    monkeypatch.setattr(quiet_loop, "decode_run", counting)
    for seed in SEEDS:
        logs = []
        for quiet in (False, True):
            monkeypatch.setattr(engine_module, "QUIET_DECODE", quiet)
            calls.clear()
            engine, trace = _engine(seed)
            clock[:] = [engine.clock]
            with contextlib.suppress(EngineStalled):  # a tiny cache may stall (both paths)
                engine.run(trace)
            logs.append(list(calls))
        assert logs[0] == logs[1], seed
    assert runs["decode run"] > 3000, runs


def test_a_quiet_batch_is_the_step_batch_its_fields_make() -> None:
    """``quiet_batch`` builds its named tuple with ``tuple.__new__``: the same type, fields
    and derived values as the named tuple's own constructor."""
    for seqs, context in ((1, 0), (3, 17), (256, 1 << 40)):
        batch = quiet_batch(seqs, context)
        made = StepBatch(seqs, 0, 0, seqs, context, float(context + seqs), context)
        assert type(batch) is StepBatch and batch == made and batch._asdict() == made._asdict()
        assert (batch.tokens, batch.decode_context) == (made.tokens, made.decode_context)
