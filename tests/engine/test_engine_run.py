"""Whole runs: conservation, determinism, physics sanity, pluggable parts, API and CLI."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from click.testing import CliRunner
from support import SAMPLE, expect_overload
from test_engine_helpers import CHUNK_BYTES, make_engine, req

from kvsim.api import simulate
from kvsim.cli import cli
from kvsim.core.errors import InputError
from kvsim.engine.clock import MonotonicClock
from kvsim.engine.compute_model import (
    ComputeParams,
    RooflineCompute,
    StepBatch,
    load_compute_profile,
)
from kvsim.engine.engine import Engine, gpu_kv_blocks
from kvsim.engine.params import EngineParams
from kvsim.engine.sim_backend import SimulatedTransferBackend
from kvsim.engine.transfer_protocol import STORE
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import get_model
from kvsim.traces import Request, Trace, open_trace


def reuse_trace(n: int = 60) -> Trace:
    """20 documents of 16 blocks, asked about round-robin, one request a second."""
    reqs = []
    for i in range(n):
        d = i % 20
        hashes = (*tuple(d * 1000 + j for j in range(16)), 100000 + i)
        reqs.append(Request(i, float(i), 16 * 512 + 300, 16, hashes))
    return Trace.from_requests(reqs, 512)


@pytest.fixture(scope="module")
def small_run():
    return simulate(SAMPLE, cpu_gib=8, gpu_kv_blocks=300 * 32, limit=80, time_scale=3, policy="arc")


@expect_overload
def test_conservation(small_run):
    r, tr = small_run.requests, small_run.transfers
    trace = list(open_trace(SAMPLE, limit=80))
    assert len(r) == 80 and not r.rejected.any()
    assert r.finish_s.notna().all()
    assert r.output_tokens.sum() == sum(max(1, q.output_tokens) for q in trace)
    chunk_bytes = 512 * get_model("llama-3.1-8b").kv_bytes_per_token()
    assert (tr.bytes == tr.chunks * chunk_bytes).all()
    s = small_run.summary
    assert s["store_bytes"] == s["chunks_stored"] * chunk_bytes
    assert s["load_bytes"] == s["chunks_loaded"] * chunk_bytes
    # a hit covering the whole prompt still computes its last token
    whole = r.gpu_hit_tokens + r.cpu_hit_tokens >= r.prompt_tokens
    assert (
        r.gpu_hit_tokens + r.cpu_hit_tokens + r.computed_prompt_tokens
        == r.prompt_tokens + whole.astype(int)
    ).all()
    assert (r.recomputed_tokens >= 0).all()
    assert (tr.start_s >= tr.submit_s).all() and (tr.end_s > tr.start_s).all()
    assert (r.first_token_s >= r.arrival_s).all() and (r.finish_s >= r.first_token_s).all()


@expect_overload
def test_steps_table_has_vllm_gauges(small_run):
    st = small_run.steps
    for col in (
        "cpu_cache_usage_perc",
        "cpu_cache_write_usage_perc",
        "cpu_cache_read_usage_perc",
        "allocation_sizes_count",
        "stores_skipped",
        "gpu_kv_usage",
        "allocation_failures_total",
    ):
        assert col in st.columns
    assert st.cpu_cache_write_usage_perc.max() > 0
    assert (st.end_s >= st.start_s).all() and st.start_s.is_monotonic_increasing
    assert (
        st.prefill_tokens.sum() + st.decode_tokens.sum()
        == small_run.requests.eval(
            "prompt_tokens + output_tokens - 1 - gpu_hit_tokens - cpu_hit_tokens"
            " + recomputed_tokens"
        ).sum()
    )


@expect_overload
def test_determinism_with_poisson_retiming():
    kw = dict(cpu_gib=8, gpu_kv_blocks=100 * 32, limit=40, poisson_rate=0.5, seed=7)
    a, b = simulate(SAMPLE, **kw), simulate(SAMPLE, **kw)
    for name in ("requests", "transfers", "steps"):
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name])
    assert a.summary == b.summary
    c = simulate(SAMPLE, **{**kw, "seed": 8})
    assert not c.requests.arrival_s.equals(a.requests.arrival_s)


def test_time_scale_stretches_arrivals():
    r = simulate(SAMPLE, limit=10, time_scale=2.0, record_steps=False)
    trace = list(open_trace(SAMPLE, limit=10))
    assert list(r.requests.arrival_s) == [2.0 * q.arrival_s for q in trace]
    assert not r.summary["offload"] and r.transfers.empty


def test_offloading_lowers_median_ttft_and_says_why():
    res = simulate(reuse_trace(), cpu_gib=64, gpu_kv_blocks=40 * 32, baseline=True)
    s = res.summary
    assert s["median_ttft_ms"] < 0.5 * s["baseline_median_ttft_ms"]
    assert s["cpu_hit_tokens"] > 0.5 * s["total_input_tokens"]
    assert s["baseline_gpu_hit_tokens"] == 0  # the GPU cache is too small for the reuse distance
    assert s["load_bytes"] > 0 and s["pcie_h2d_util"] > 0
    assert s["computed_prompt_tokens"] < s["baseline_computed_prompt_tokens"]


def test_roofline_compute_model():
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    params = ComputeParams(gpu.peak_flops, gpu.hbm_bytes_per_s, 0.5, 0.5, 0.001)
    f = RooflineCompute(model, params)
    assert f(StepBatch(0, 0, 0, 0, 0, 0.0)) == 0.0
    decode = f(StepBatch(1, 0, 0, 1, 1000, 1001.0))  # memory bound: weights dominate
    weights = model.num_params * 2
    expect = (weights + model.kv_bytes_per_token() * 1001) / (gpu.hbm_bytes_per_s * 0.5) + 0.001
    assert decode == pytest.approx(expect)
    n = 8192
    prefill = f(StepBatch(1, 1, n, 0, 0, n * (n + 1) / 2))  # compute bound
    flops = 2 * model.active_params * n + 4 * 32 * 32 * 128 * n * (n + 1) / 2
    assert prefill == pytest.approx(flops / (gpu.peak_flops * 0.5) + 0.001)


def test_compute_profile_overrides(tmp_path):
    base = ComputeParams.for_gpu(get_gpu("h100"))
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"flops_efficiency": 0.3, "step_overhead_s": 0.0}))
    got = load_compute_profile(p, base)
    assert (
        got.flops_efficiency == 0.3
        and got.step_overhead_s == 0.0
        and got.peak_flops == base.peak_flops
    )
    p.write_text(json.dumps({"flops": 1}))
    with pytest.raises(InputError, match="unknown key"):
        load_compute_profile(p, base)


def test_gpu_kv_blocks_from_memory():
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    n = gpu_kv_blocks(model, gpu, EngineParams(gpu_block_tokens=512))
    avail = gpu.memory_bytes * 0.92 - model.num_params * 2 - 2.5 * 2**30
    assert n == int(avail // (131072 * 512))
    assert 1500 < n < 2000
    # vLLM's 16-token blocks: 32 times as many
    assert gpu_kv_blocks(model, gpu, EngineParams()) == int(avail // (131072 * 16))
    with pytest.raises(InputError, match="does not fit"):
        gpu_kv_blocks(get_model("llama-3.1-70b"), get_gpu("l40s"), EngineParams())


@pytest.mark.parametrize("block", [16, 32])
def test_the_summary_reports_the_gpu_kv_in_vllm_blocks(block):
    """``gpu_kv_blocks`` x ``gpu_block_tokens`` is the GPU's KV in tokens: both in vLLM's
    blocks, not the trace's 512-token hash units (the summary once gave 512 here)."""
    s = simulate(SAMPLE, cpu_gib=8, limit=5, gpu_block_tokens=block).summary
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    assert s["gpu_block_tokens"] == block
    assert s["gpu_kv_blocks"] == gpu_kv_blocks(model, gpu, EngineParams(gpu_block_tokens=block))


def test_a_request_past_the_models_positions_is_refused_or_cut_as_vllm_serves_it():
    """vLLM's default max_model_len is the model's positions (Llama-3.1-8B: 131,072): its
    server refuses an empty prompt or one that fills them, and cuts the output to what is
    left; the GPU (57,195 blocks of 16 tokens on an H200) would have held all three."""
    from kvsim.engine.bench import TwinKnobs, twin_engine

    positions = get_model("llama-3.1-8b").derived_max_model_len
    assert positions == 131072
    engine = twin_engine(TwinKnobs(block_tokens=16, gpu_blocks=60_000))
    trace = [
        Request(0, 0.0, positions, 10, ()),  # fills them: refused
        Request(1, 0.1, positions - 100, 300, ()),  # output cut to 100 tokens
        Request(2, 0.2, 0, 10, ()),  # empty: refused
        Request(3, 0.3, 1000, 10, ()),
    ]
    engine.run(Trace.from_requests(trace, 16))
    table = engine.recorder.request_table()
    assert list(table.rejected) == [True, False, True, False]
    assert list(table.output_tokens[~table.rejected]) == [100, 10]


def test_the_null_block_is_not_kv_capacity():
    """vLLM's BlockPool keeps block 0 as its null block: of N blocks (from memory or
    num_gpu_blocks_override) N - 1 hold KV, and a request that needs N is rejected."""
    from kvsim.engine.bench import TwinKnobs, twin_engine
    from kvsim.specs.sizing import usable_gpu_blocks

    assert usable_gpu_blocks(10) == 9
    with pytest.raises(InputError, match="null block"):
        usable_gpu_blocks(1)
    engine = twin_engine(TwinKnobs(block_tokens=64, gpu_blocks=10))
    assert (engine.num_gpu_blocks, engine.pool.num_blocks) == (10, 9)
    fits, too_long = Request(0, 0.0, 9 * 16 - 1, 1, (1, 2)), Request(1, 0.1, 9 * 16, 1, (3, 4))
    engine.run(Trace.from_requests([fits, too_long], 64))
    table = engine.recorder.request_table()
    assert list(table.rejected) == [False, True]
    with pytest.raises(InputError, match=r"--gpu-kv-blocks: .* >= 2"):
        twin_engine(TwinKnobs(block_tokens=64, gpu_blocks=1))


class CountingBackend:
    """A backend seen only through the protocol: wraps the simulated one and counts calls."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = {"submit": 0, "poll": 0, "wait": 0}

    def submit(self, job, now):
        self.calls["submit"] += 1
        self.inner.submit(job, now)

    def poll(self, now):
        self.calls["poll"] += 1
        return self.inner.poll(now)

    def wait(self, ids, now):
        self.calls["wait"] += 1
        return self.inner.wait(ids, now)

    def next_completion_time(self):
        return None  # like a real backend: the engine must poll

    def host_free_time(self):
        return self.inner.host_free_time()


def test_backend_and_clock_are_pluggable():
    from test_engine_helpers import link, one_second_steps

    from kvsim.options.offload import CacheConfig

    config = CacheConfig(num_chunks=50, block_tokens=16, chunk_tokens=16, model="llama-3.1-8b")
    backend = CountingBackend(SimulatedTransferBackend(link(0.001)))
    reqs = [req(0, 0, 48, 2, (0, 1, 2)), req(1, 0.02, 48, 2, (0, 1, 2))]
    eng = Engine(
        config,
        EngineParams(gpu_blocks=20, enable_prefix_caching=False),
        model=get_model("llama-3.1-8b"),
        gpu=get_gpu("h200"),
        compute=lambda b: one_second_steps(b) * 0.005,
        transfer=link(0.001),
        backend=backend,
        clock=MonotonicClock(),
    )
    eng.run(Trace.from_requests(reqs, 16))
    r = eng.recorder.request_table()
    assert r.finish_s.notna().all()
    assert backend.calls["submit"] == len(eng.recorder.transfers) >= 2
    assert not eng.connector.jobs


@expect_overload
def test_api_rejects_requests_too_long_for_the_gpu():
    res = simulate(SAMPLE, limit=20, gpu_kv_blocks=10 * 32, cpu_chunks=100, record_steps=False)
    r = res.requests
    assert r.rejected.any() and r[~r.rejected].finish_s.notna().all()
    assert res.summary["failed"] == int(r.rejected.sum())


@expect_overload
@pytest.mark.parametrize("save_steps", [True, False])
def test_cli_simulate_writes_tables_and_chrome_trace(tmp_path, save_steps):
    """--out writes the steps tables only with --save-steps; --chrome-trace draws the
    steps either way."""
    out, trace_file = tmp_path / "out", tmp_path / "out" / "trace.json"
    result = CliRunner().invoke(
        cli,
        [
            "simulate",
            SAMPLE,
            "--cpu-gib",
            "8",
            "--gpu-blocks",
            "3840",
            "--limit",
            "30",
            "--baseline",
            "--out",
            str(out),
            "--chrome-trace",
            str(trace_file),
            "--no-progress",
            *(["--save-steps"] if save_steps else []),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "median TTFT (ms)" in result.output and "no offload" in result.output
    steps = ("steps", "baseline_steps")
    for name in ("requests", "transfers", "baseline_requests", *(steps if save_steps else ())):
        parquet = pd.read_parquet(out / f"{name}.parquet")
        csv = pd.read_csv(out / f"{name}.csv")
        assert len(parquet) == len(csv) > 0
    if not save_steps:
        assert not [p for p in os.listdir(out) if "steps" in p]
    assert json.loads((out / "summary.json").read_text())["requests"] == 30
    events = json.loads(trace_file.read_text())["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert any(e["pid"] == 1 for e in xs) and any(e["pid"] == 2 for e in xs)
    assert all(e["dur"] >= 0 for e in xs)
    assert not list(tmp_path.rglob("*.tmp"))


def test_cli_bad_input_is_one_line():
    result = CliRunner().invoke(cli, ["simulate", SAMPLE, "--gpu", "z100", "--no-progress"])
    assert result.exit_code != 0
    assert "unknown GPU" in str(result.exception) or "unknown GPU" in result.output


def test_store_bytes_per_chunk_in_tiny_world():
    eng = make_engine().run(Trace.from_requests([req(0, 0, 48, 2, (0, 1, 2))], 16))
    tr = eng.recorder.transfer_table()
    assert list(tr[tr.direction == STORE].bytes) == [3 * CHUNK_BYTES]
    assert list(tr.copies) == [3 * 32]  # 16-token GPU blocks x 32 layers


def test_conservation_with_loads():
    res = simulate(reuse_trace(40), cpu_gib=64, gpu_kv_blocks=40 * 32)
    s, r, tr = res.summary, res.requests, res.transfers
    chunk_bytes = 512 * get_model("llama-3.1-8b").kv_bytes_per_token()
    assert s["chunks_loaded"] > 0 and s["load_bytes"] == s["chunks_loaded"] * chunk_bytes
    assert (tr.bytes == tr.chunks * chunk_bytes).all()
    assert r.finish_s.notna().all() and r.output_tokens.sum() == 40 * 16
    # a hit covering the whole prompt still computes its last token
    whole = r.gpu_hit_tokens + r.cpu_hit_tokens >= r.prompt_tokens
    assert (
        r.gpu_hit_tokens + r.cpu_hit_tokens + r.computed_prompt_tokens
        == r.prompt_tokens + whole.astype(int)
    ).all()
    # every loaded chunk was stored first, and the CPU tier never held more than it has
    assert s["chunks_stored"] >= len(set(range(20))) * 16
    assert res.steps.cpu_resident_chunks.max() <= s["cpu_chunks"]
