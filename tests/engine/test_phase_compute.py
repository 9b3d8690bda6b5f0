"""The per-phase compute model: each phase responds to what it should, the profiles (shipped
and calibrated) load, and bad profiles are one-line errors naming the file."""

from __future__ import annotations

import json
import warnings

import pytest
from support import SAMPLE, run_main

from kvsim import simulate
from kvsim.core.errors import InputError, InputWarning
from kvsim.engine.compute_model import (
    ComputeParams,
    LinearCompute,
    StepBatch,
    default_compute_profile,
    load_compute_profile,
    make_compute,
)
from kvsim.engine.phase_compute import (
    NUMBERS,
    PHASES,
    PhaseCompute,
    PhaseProfile,
    shipped_gpus,
    shipped_profile,
)
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import ModelSpec, get_model

LLAMA8 = get_model("llama-3.1-8b")
H200 = shipped_profile("h200")


def model8(tp: int = 1) -> PhaseCompute:
    assert H200 is not None
    return PhaseCompute(LLAMA8, H200, tp=tp)


def prefill(n: int, context: int = 0) -> StepBatch:
    return StepBatch(1, 1, n, 0, context, n * context + n * (n + 1) / 2, 0)


def decode(seqs: int, context: int) -> StepBatch:
    return StepBatch(seqs, 0, 0, seqs, seqs * context, seqs * (context + 1.0), seqs * context)


def test_empty_step_takes_no_time():
    f = model8()
    empty = StepBatch(0, 0, 0, 0, 0, 0.0, 0)
    assert f(empty) == 0.0 and set(f.phases(empty).values()) == {0.0}
    assert tuple(f.phases(decode(1, 10))) == PHASES


def test_lm_head_runs_per_request_not_per_prompt_token():
    f, p = model8(), H200
    assert p is not None
    # one request: the same LM head whether its prompt chunk is 100 or 8000 tokens
    assert f.phases(prefill(100))["lm_head"] == f.phases(prefill(8000))["lm_head"] > 0
    # a few rows are memory-bound: one read of the vocab x hidden weight
    lm_bytes = LLAMA8.vocab_size * LLAMA8.hidden_size * 2
    bw = p.hbm_bytes_per_s * p.weight_bandwidth_efficiency
    assert f.phases(decode(8, 100))["lm_head"] == pytest.approx(lm_bytes / bw)
    # many rows are compute-bound: the LM head grows with them
    rows = 4096
    flops = 2.0 * LLAMA8.vocab_size * LLAMA8.hidden_size * rows
    got = f.phases(decode(rows, 10))["lm_head"]
    assert got == pytest.approx(flops / (p.peak_flops * p.gemm_efficiency))
    assert got > 2 * f.phases(decode(8, 10))["lm_head"]


def test_all_reduce_only_under_tensor_parallelism():
    assert model8(1).phases(prefill(1024))["all_reduce"] == 0.0
    p = H200
    assert p is not None
    size = 1024 * LLAMA8.hidden_size * 2
    for tp in (2, 4, 8):  # TP 6 (which Llama's 32 heads refuse): the multimem test below
        if tp < 6:  # the ring's: each GPU beyond one adds a hop, each byte 2 (tp - 1)/tp
            fixed, wire = (tp - 1) * p.allreduce_latency_s, 2 * (tp - 1) / tp * size
        else:  # multimem on an H200: two hops whatever tp, each byte once
            fixed, wire = 2 * p.allreduce_latency_s, size
        expect = 2 * LLAMA8.num_layers * (fixed + wire / p.allreduce_bytes_per_s)
        assert model8(tp).phases(prefill(1024))["all_reduce"] == pytest.approx(expect)
    # and the GEMMs split across the workers
    assert model8(2).phases(prefill(8192))["gemm"] == pytest.approx(
        model8(1).phases(prefill(8192))["gemm"] / 2
    )


def test_all_reduce_fixed_part_grows_with_each_gpu_as_the_ring():
    """A decode-sized all-reduce at TP 4 costs what the published H100 microbenchmarks
    say about vLLM's custom all-reduce: about three times the fixed part of TP 2 (4.4 vs
    12.8 us) and 1.5 times its bytes per GPU; the shipped numbers play no part."""
    from dataclasses import replace

    assert H200 is not None
    p = replace(H200, allreduce_latency_s=4.4e-6, allreduce_bytes_per_s=2e11)
    one_step = decode(64, 1000)  # 64 tokens x 4,096 x 2 bytes = 0.5 MiB per all-reduce
    per_call = {
        tp: PhaseCompute(LLAMA8, p, tp=tp).phases(one_step)["all_reduce"] / (2 * 32)
        for tp in (2, 4, 8)
    }
    size = 64 * LLAMA8.hidden_size * 2
    assert per_call[2] == pytest.approx(4.4e-6 + size / 2e11)
    assert per_call[4] == pytest.approx(3 * 4.4e-6 + 1.5 * size / 2e11)
    # a GPU whose vLLM all-reduce at TP 8 is not multimem keeps the ring there
    ring8 = PhaseCompute(LLAMA8, replace(p, gpu="a100"), tp=8).phases(one_step)["all_reduce"]
    assert ring8 / (2 * 32) == pytest.approx(7 * 4.4e-6 + 1.75 * size / 2e11)


# vLLM's published H100 multimem all-reduce times (hidden size 8192, BF16), us by MiB:
# PR 24111's TP-6 rows and PR 42324's SM 9.0 rows up to 4 MiB
_MULTIMEM_US = {
    6: {0.5: 13, 1: 16, 1.5: 18, 2: 21, 3: 25, 4: 31},
    8: {0.5: 11, 1: 14, 1.5: 16, 2: 18, 3: 23, 4: 27},
}


@pytest.mark.parametrize("tp", sorted(_MULTIMEM_US))
def test_all_reduce_at_tp_6_and_8_on_hopper_is_two_hops_as_multimem(tp):
    """At TP 6 and 8 on an H100 or H200 vLLM's all-reduce is symmetric memory's multimem:
    with the microbenchmarks' own hop (4.4 us, TP 2's fixed part) and bandwidth (200 GB/s)
    the model lands within 3 us of every published decode-sized time, where the ring's
    five or seven hops would overshoot by more than 10 us."""
    from dataclasses import replace

    assert H200 is not None
    p = replace(H200, allreduce_latency_s=4.4e-6, allreduce_bytes_per_s=2e11)
    # hidden size 8192, BF16 activations; heads that TP 6 divides (vLLM refuses Llama-2-70B's
    # 64 at TP 6; the all-reduce reads only the hidden size)
    model = replace(get_model("llama-2-70b"), num_attention_heads=96, num_kv_heads=24)
    row_bytes = model.hidden_size * 2
    for gpu in ("h100", "h200"):
        f = PhaseCompute(model, replace(p, gpu=gpu), tp=tp)
        ring = PhaseCompute(model, replace(p, gpu="a100"), tp=tp)
        for mib, published_us in _MULTIMEM_US[tp].items():
            tokens = int(mib * 2**20 / row_bytes)
            step = decode(tokens, 100)
            per_call = f.phases(step)["all_reduce"] / (2 * model.num_layers)
            assert abs(per_call * 1e6 - published_us) < 3.0, (gpu, tp, mib, per_call)
            ring_call = ring.phases(step)["all_reduce"] / (2 * model.num_layers)
            assert ring_call * 1e6 - published_us > 10.0


def test_decode_step_is_memory_bound_and_plausible_on_h200():
    f, p = model8(), H200
    assert p is not None
    phases = f.phases(decode(64, 1000))
    weights = f.weight_bytes(64)
    assert weights == pytest.approx(6.98e9 * 2, rel=0.01)  # non-embedding weights, bf16
    assert phases["gemm"] == pytest.approx(
        weights / (p.hbm_bytes_per_s * p.weight_bandwidth_efficiency)
    )
    kv = LLAMA8.kv_bytes_per_token() * 64 * 1001
    fixed = 64 * LLAMA8.num_layers * p.attention_seq_layer_s  # per request and layer
    assert phases["attention_decode"] == pytest.approx(
        kv / (p.hbm_bytes_per_s * p.decode_attention_efficiency) + fixed
    )
    assert phases["attention_prefill"] == 0.0
    # an 8B decode step of 64 requests with ~1k context on an H200: 7-12 ms
    assert 0.007 < f(decode(64, 1000)) < 0.012
    # longer contexts cost KV reads, linearly
    grow = f.phases(decode(64, 8000))["attention_decode"] - fixed
    assert grow / (phases["attention_decode"] - fixed) == pytest.approx(8001 / 1001)


def test_long_prefill_attention_is_quadratic_and_gemms_linear():
    f = model8()
    small, large = f.phases(prefill(8192)), f.phases(prefill(16384))
    assert H200 is not None
    fixed = LLAMA8.num_layers * H200.attention_seq_layer_s  # one request's, every layer
    assert (large["attention_prefill"] - fixed) / (
        small["attention_prefill"] - fixed
    ) == pytest.approx(16384 * 16385 / (8192 * 8193))
    assert large["gemm"] / small["gemm"] == pytest.approx(2.0)
    assert small["attention_decode"] == 0.0
    assert 0.15 < f(prefill(8192)) < 0.6  # an 8k prompt of an 8B model on one H200
    # a chunk after a cached context computes its pairs against that context too
    assert (
        f.phases(prefill(2048, 30000))["attention_prefill"]
        > 4 * (f.phases(prefill(2048))["attention_prefill"])
    )


def test_mixed_batch_splits_attention_between_prefill_and_decode():
    f = model8()
    n, ctx = 2048, 5000
    both = StepBatch(33, 1, n, 32, 32 * ctx, n * (n + 1) / 2 + 32 * (ctx + 1), 32 * ctx)
    parts = f.phases(both)
    assert parts["attention_prefill"] == pytest.approx(f.phases(prefill(n))["attention_prefill"])
    assert parts["attention_decode"] == pytest.approx(f.phases(decode(32, ctx))["attention_decode"])
    # a caller that predates decode_context_tokens: context of a decode-only batch is decode's
    legacy = StepBatch(64, 0, 0, 64, 64 * 1000, 64 * 1001.0)
    assert f(legacy) == pytest.approx(f(decode(64, 1000)))


def test_moe_reads_the_experts_its_tokens_activate():
    assert H200 is not None
    ds = get_model("deepseek-v3")
    f = PhaseCompute(ds, H200, tp=8)
    one, few, many = f.weight_bytes(1), f.weight_bytes(16), f.weight_bytes(4096)
    embeddings = 2 * ds.vocab_size * ds.hidden_size
    q = ds.weight_element_bytes("expert")  # FP8, as published: one byte a weight
    assert q == ds.weight_element_bytes("dense") == 1
    total = (ds.num_params - embeddings) * q / 8
    assert one < few < many <= total
    assert one == pytest.approx((ds.active_params - embeddings) * q / 8)  # one token: active
    assert many == pytest.approx(total, rel=1e-6)  # thousands of tokens touch every expert


def test_a_model_without_vocabulary_has_no_separate_lm_head():
    assert H200 is not None
    spec = ModelSpec("bare", 4, 2, 64, 8, num_params=1e8, active_params=1e8)
    f = PhaseCompute(spec, H200)
    assert f.phases(decode(4, 10))["lm_head"] == 0.0
    assert f.weight_bytes(4) == pytest.approx(2e8)
    with pytest.raises(InputError, match="embeddings"):
        PhaseCompute(ModelSpec("small", 4, 2, 64, 8, 1e6, 1e6, vocab_size=10**6), H200)


def test_shipped_profiles_load_and_cite_a_source_for_every_number():
    assert shipped_gpus() == ["h100", "h200"]
    for name in ("h100", "h200"):
        p = shipped_profile(name)
        assert p is not None and p.gpu == name
        gpu = get_gpu(name)
        assert (p.peak_flops, p.hbm_bytes_per_s) == (gpu.peak_flops, gpu.hbm_bytes_per_s)
        assert set(p.sources) == set(NUMBERS)
        for key, text in p.sources.items():
            cited = any(s in text for s in ("http", "github.com", "arXiv", "datasheet"))
            assert cited or "assumption" in text or "fitted by kvsim fit-compute" in text, key
        assert "datasheet" in p.sources["peak_flops"]
        assert PhaseProfile.from_dict(p.to_dict()) == p  # the JSON round-trips
        assert p.provenance is not None and "training" in p.provenance["note"]
    assert shipped_profile("a100") is None


def test_the_prior_profile_is_whole_and_owes_nothing_to_a_fit():
    """``examples/h100-prior-profile.json``, where a cross-validation fold's fit starts:
    it gives every number itself (none taken from the fitted shipped profile), each with
    a datasheet or an assumption as its source, and no provenance of a fit."""
    from support import ROOT

    path = ROOT / "examples" / "h100-prior-profile.json"
    data = json.loads(path.read_text())
    assert set(NUMBERS) <= set(data) and set(data["sources"]) == set(NUMBERS)
    assert "provenance" not in data
    for key, text in data["sources"].items():
        assert "fitted" not in text and (
            "assumption" in text or "datasheet" in text or "github.com" in text
        ), key
    prior = PhaseProfile.from_dict(data, source=str(path))
    shipped = shipped_profile("h100")
    assert shipped is not None and prior.peak_flops == shipped.peak_flops
    assert prior.request_overhead_s == 0.0 and prior.attention_seq_layer_s == 0.0
    from kvsim.accuracy.fit import FITTED

    # the shipped fit started here, on every training experiment
    assert shipped.provenance is not None and shipped.provenance["held_out"] == []
    assert shipped.provenance["started_from"] == {k: getattr(prior, k) for k in FITTED}


def test_phases_is_the_default_everywhere_scaled_from_the_h100_fit():
    for name in ("h100", "h200"):
        assert isinstance(default_compute_profile(get_gpu(name)), PhaseProfile)
        compute = make_compute(LLAMA8, default_compute_profile(get_gpu(name)))
        assert isinstance(compute, PhaseCompute)
    h100 = shipped_profile("h100")
    a100 = default_compute_profile(get_gpu("a100"))
    assert isinstance(a100, PhaseProfile) and h100 is not None
    assert (a100.gpu, a100.hbm_bytes_per_s) == ("a100", get_gpu("a100").hbm_bytes_per_s)
    assert a100.weight_bandwidth_efficiency == h100.weight_bandwidth_efficiency
    assert "a100 GPU spec" in a100.sources["peak_flops"]
    assert a100.sources["step_overhead_s"].startswith("the h100 profile's")
    assert isinstance(make_compute(LLAMA8, a100), PhaseCompute)
    res = simulate(SAMPLE, limit=5, record_steps=False, gpu="h200")
    assert res.config["compute"]["kind"] == "phases"
    assert res.config["compute"]["gpu"] == "h200"


def test_a_gpu_spec_named_h200_with_other_peaks_keeps_the_efficiencies():
    from msgspec.structs import replace  # GpuSpec is a Schema (msgspec Struct)

    custom = replace(get_gpu("h200"), hbm_bytes_per_s=5.5e12)
    got = default_compute_profile(custom)
    assert isinstance(got, PhaseProfile) and H200 is not None
    assert got.hbm_bytes_per_s == 5.5e12 and got.gemm_efficiency == H200.gemm_efficiency
    assert "GPU spec" in got.sources["hbm_bytes_per_s"]
    assert default_compute_profile(get_gpu("h200")) is H200


def test_roofline_and_linear_profiles_still_choose_their_models(tmp_path):
    path = tmp_path / "roof.json"
    path.write_text('{"kind": "roofline", "flops_efficiency": 0.5}')
    res = simulate(SAMPLE, limit=5, record_steps=False, gpu="h200", compute_profile=path)
    assert res.config["compute"]["kind"] == "roofline"
    assert res.config["compute"]["flops_efficiency"] == 0.5
    path.write_text('{"kind": "linear", "step_s": 0.01, "per_token_s": 0}')
    loaded = load_compute_profile(path, ComputeParams.for_gpu(get_gpu("h200")))
    assert isinstance(loaded, LinearCompute) and make_compute(LLAMA8, loaded) is loaded


def test_a_partial_profile_takes_the_rest_from_the_shipped_one(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "phases", "gpu": "H100", "gemm_efficiency": 0.4}))
    got = load_compute_profile(path, ComputeParams.for_gpu(get_gpu("h100")))
    base = shipped_profile("h100")
    assert isinstance(got, PhaseProfile) and base is not None
    assert got.gpu == "h100" and got.gemm_efficiency == 0.4
    assert got.hbm_bytes_per_s == base.hbm_bytes_per_s
    assert got.sources["hbm_bytes_per_s"] == base.sources["hbm_bytes_per_s"]
    slower = PhaseCompute(LLAMA8, got)(prefill(8192))
    assert slower > PhaseCompute(LLAMA8, base)(prefill(8192))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"kind": "phases", "gpu": "h200", "gemm_eff": 0.5},
            r"gemm_eff: unknown key \(did you mean 'gemm_efficiency'",
        ),
        (
            {"kind": "phasez", "gpu": "h200"},
            "kind: must be one of linear, phases, roofline, got 'phasez'",
        ),
        ({"kind": "phases"}, r"gpu: missing \(a required key\)"),
        (
            {"kind": "phases", "gpu": "h200", "gemm_efficiency": -1},
            "gemm_efficiency: .*> 0.*got -1$",
        ),
        ({"kind": "phases", "gpu": "h200", "gemm_efficiency": 0}, "gemm_efficiency: .*> 0.*got 0$"),
        (
            {"kind": "phases", "gpu": "h200", "peak_flops": True},
            "peak_flops: Expected `float.*got True",
        ),
        (
            {"kind": "phases", "gpu": "h200", "step_overhead_s": "1"},
            "step_overhead_s: Expected `float.*got '1'",
        ),
        ({"kind": "phases", "gpu": "b200", "gemm_efficiency": 0.5}, "missing .*b200"),
        (
            {"kind": "phases", "gpu": "h200", "sources": ["x"]},
            r"sources: Expected `object`, got \['x'\]",
        ),
        (
            {"kind": "phases", "gpu": "h200", "sources": {"flops": "x"}},
            "sources: for unknown coefficient\\(s\\) flops",
        ),
        (
            {"kind": "phases", "gpu": "h200", "measurements": {}},
            r"measurements: Expected `array.*got \{\}",
        ),
    ],
)
def test_bad_profiles_are_errors_naming_the_file(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=message) as exc:
        load_compute_profile(path, ComputeParams.for_gpu(get_gpu("h200")))
    assert str(path) in str(exc.value)


def test_step_overhead_may_be_zero_and_a_foreign_profile_warns(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "phases", "gpu": "h100", "step_overhead_s": 0}))
    with pytest.warns(InputWarning, match="a profile for h100 on --gpu h200"):
        res = simulate(SAMPLE, limit=3, record_steps=False, gpu="h200", compute_profile=path)
    assert res.config["compute"]["step_overhead_s"] == 0.0


def test_the_engine_tells_the_model_what_decodes_read():
    batches: list[StepBatch] = []

    def spy(batch: StepBatch) -> float:
        batches.append(batch)
        return 0.01

    from kvsim.engine.engine import Engine
    from kvsim.engine.params import EngineParams
    from kvsim.engine.transfer_model import LINK_PRESETS
    from kvsim.options.offload import CacheConfig
    from kvsim.traces import Request, Trace

    # staggered requests of 4 blocks and 6 output tokens: decodes run beside prefills
    reqs = [Request(i, 0.005 * i, 64, 6, tuple(range(10 * i, 10 * i + 4))) for i in range(12)]
    engine = Engine(
        CacheConfig(num_chunks=50, block_tokens=16, chunk_tokens=16, model="llama-3.1-8b"),
        EngineParams(gpu_blocks=200, max_num_batched_tokens=96),
        model=LLAMA8,
        gpu=get_gpu("h200"),
        compute=spy,
        transfer=LINK_PRESETS["pcie5"],
        offload=False,
    )
    engine.run(Trace.from_requests(reqs, 16))
    decoding = [b for b in batches if b.decode_tokens]
    assert decoding and all(b.decode_context_tokens is not None for b in batches)
    assert all(0 < b.decode_context <= b.context_tokens for b in decoding)
    assert all(b.decode_context == b.context_tokens for b in decoding if not b.num_prefill_seqs)
    assert any(b.num_prefill_seqs and b.decode_context < b.context_tokens for b in decoding)


def test_calibrated_profile_round_trips_and_simulates(tmp_path):
    torch = pytest.importorskip("torch")
    from real.calibrate_compute import ComputeCalibration, calibrate_compute, layer_gemms

    tiny = ModelSpec(
        "tiny", 2, 2, 16, 4, num_params=2.2e5, active_params=2.2e5, hidden_size=64, vocab_size=100
    )
    assert [k for k, _ in layer_gemms(tiny)] == [64, 64, 64, layer_gemms(tiny)[2][1] // 2]
    profile, points = calibrate_compute(
        tiny, torch.device("cpu"), ComputeCalibration((1, 8), (16, 32), 2, 1)
    )
    kinds = {p.kind for p in points}
    assert kinds == {"gemm", "lm_head", "prefill_attention", "decode_attention"}
    assert profile.gpu == "cpu" and set(profile.sources) == set(NUMBERS)
    # no GPU preset: the peaks are the best rates measured, so the best phase has 1
    flops = (profile.gemm_efficiency, profile.prefill_attention_efficiency)
    reads = (profile.weight_bandwidth_efficiency, profile.decode_attention_efficiency)
    assert max(flops) == pytest.approx(1.0) and max(reads) == pytest.approx(1.0)
    assert all(0 < e <= 1.0 for e in flops + reads)
    assert profile.sources["step_overhead_s"].startswith("not measured")
    path = tmp_path / "cpu.json"
    path.write_text(profile.to_json(measurements=[p.as_dict() for p in points]))
    loaded = load_compute_profile(path, ComputeParams.for_gpu(get_gpu("h200")))
    assert loaded == profile
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)  # a cpu profile on --gpu h200
        res = simulate(SAMPLE, limit=5, record_steps=False, gpu="h200", compute_profile=path)
    assert res.config["compute"]["gpu"] == "cpu"
    assert res.requests.first_token_s.notna().all()


def test_calibrate_compute_command_writes_a_profile_simulate_loads(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "compute.json"
    args = ["calibrate-compute", "--out", out, "--device", "cpu", "--model", "llama-3.2-1b"]
    args += ["--tokens", "1,4", "--contexts", "16,32", "--decode-batch", "2", "--trials", "1"]
    code, stdout, _ = run_main([*args, "--max-weight-mib", "1", "--gpu", "h100"], capsys)
    assert code == 0 and "gemm_efficiency" in stdout
    data = json.loads(out.read_text())
    assert data["kind"] == "phases" and data["gpu"] == "h100"
    assert data["peak_flops"] == get_gpu("h100").peak_flops  # the preset's data-sheet peak
    assert {m["kind"] for m in data["measurements"]} >= {"gemm", "lm_head"}
    code, stdout, _ = run_main(
        ["simulate", SAMPLE, "--limit", "3", "--gpu", "h100", "--compute-profile", out], capsys
    )
    assert code == 0, stdout
    code, _, err = run_main([*args[:-2], "--tokens", "1,x"], capsys)
    assert code == 2 and "--tokens" in err
    code, _, err = run_main(["calibrate-compute", "--out", out, "--model", "deepseek-v3"], capsys)
    assert code == 2 and "MLA" in err


def test_the_step_time_is_the_sum_of_its_phases_in_order():
    """``__call__`` adds the phases as ``phases()`` lists them (PHASES order), so a step's
    time is the same float whichever of the two a caller uses."""
    import random

    rng = random.Random(3)
    f = model8(2)
    for _ in range(200):
        seqs, ctx = rng.choice([rng.randint(1, 8), rng.randint(200, 1000)]), rng.randint(0, 5000)
        batch = decode(seqs, ctx) if rng.random() < 0.7 else prefill(seqs * 97, ctx)
        parts = f.phases(batch)
        assert tuple(parts) == PHASES
        total = 0.0
        for name in PHASES:
            total += parts[name]
        assert f(batch) == total


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt-oss-120b"])
def test_attention_pays_a_fixed_cost_per_request_and_layer(name):
    """``attention_seq_layer_s``: each request a step schedules costs each layer's
    attention that much on every worker, decode rows and prefill rows alike, whatever
    the tensor parallelism and sliding windows; nothing else moves."""
    from dataclasses import replace

    from kvsim.specs.models import MODELS

    assert H200 is not None
    model = MODELS[name]
    c = 4e-7
    for tp in (1, 4):
        plain, fixed = (
            PhaseCompute(model, replace(H200, attention_seq_layer_s=x), tp=tp) for x in (0.0, c)
        )
        for batch, rows in ((decode(37, 9_000), 37), (prefill(3_000, 500), 1)):
            a, b = plain.phases(batch), fixed.phases(batch)
            phase = "attention_decode" if batch.num_prefill_seqs == 0 else "attention_prefill"
            assert b[phase] - a[phase] == pytest.approx(rows * model.num_layers * c)
            assert {k: v for k, v in b.items() if k != phase} == {
                k: v for k, v in a.items() if k != phase
            }
        empty = StepBatch(0, 0, 0, 0, 0, 0.0)
        assert fixed(empty) == 0.0


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "gpt-oss-120b", "qwen3-32b"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_decode_seconds_is_the_models_time_of_the_quiet_batch_bit_for_bit(name, tp):
    """The quiet decode runs' shortcut (``decode_seconds``) against calling the model on the
    batch it stands for: the same float for every batch size and context, on dense, MoE,
    sliding-window and tensor-parallel models."""
    import random
    from dataclasses import replace

    from kvsim.engine.quiet_decode import decode_step_seconds, quiet_batch
    from kvsim.specs.models import MODELS

    assert H200 is not None
    per_layer = replace(H200, attention_seq_layer_s=3e-7)  # whatever a fit sets it to
    f = PhaseCompute(MODELS[name], per_layer, tp=tp)
    rng = random.Random(tp)
    for seqs in (1, 3, 64, 255):
        seconds = decode_step_seconds(f, seqs)  # the model's own shortcut
        for _ in range(50):
            context = rng.randint(seqs, seqs * 140_000)
            assert seconds(context) == f(quiet_batch(seqs, context)), (seqs, context)
    linear = LinearCompute(0.01, 1e-5)  # a model without the shortcut: the batch is timed
    assert decode_step_seconds(linear, 5)(100) == linear(quiet_batch(5, 100))
