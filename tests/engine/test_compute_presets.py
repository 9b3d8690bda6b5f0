"""The models behind public measurements (issue 25 §2): presets from their config.json, and
the compute model's MoE, tensor-parallel, weight-dtype and sliding-window terms, checked
against hand-computed values."""

from __future__ import annotations

import json

import pytest

from kvsim.core.errors import InputError, InputWarning
from kvsim.engine.compute_model import StepBatch
from kvsim.engine.engine import gpu_kv_blocks
from kvsim.engine.params import EngineParams
from kvsim.engine.phase_compute import FP8_GEMM_SPEEDUP, PhaseCompute, shipped_profile
from kvsim.specs.hardware import get_gpu
from kvsim.specs.model_configs import HF_CONFIGS, SOURCES
from kvsim.specs.models import get_model

H100 = shipped_profile("h100")


def compute(name: str, tp: int = 1, **changes) -> PhaseCompute:
    import dataclasses

    assert H100 is not None
    model = dataclasses.replace(get_model(name), **changes) if changes else get_model(name)
    return PhaseCompute(model, H100, tp=tp)


def decode(seqs: int, context: int) -> StepBatch:
    return StepBatch(seqs, 0, 0, seqs, seqs * context, seqs * (context + 1.0), seqs * context)


def test_presets_match_the_published_parameter_counts():
    counts = {  # billions, as the model cards state them
        "llama-2-7b": (6.74, 6.74),
        "llama-2-70b": (69.0, 69.0),
        "codellama-34b": (33.7, 33.7),
        "qwen3-14b": (14.8, 14.8),
        "qwen3-32b": (32.8, 32.8),
        "mixtral-8x7b": (46.7, 12.9),
        "mixtral-8x22b": (141.0, 39.0),
        "gpt-oss-120b": (116.8, 5.7),  # 5.1 B active without the embeddings
    }
    for name, (total, active) in counts.items():
        m = get_model(name)
        assert m.num_params / 1e9 == pytest.approx(total, rel=0.01), name
        assert m.active_params / 1e9 == pytest.approx(active, rel=0.02), name
    assert get_model("llama-2-7b").kv_bytes_per_token() == 32 * 2 * 32 * 128 * 2  # MHA
    assert get_model("llama-2-70b").kv_bytes_per_token(tp=4) == 80 * 2 * 2 * 128 * 2  # GQA


def test_a_preset_equals_its_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIGS["gpt-oss-120b"]))
    from_file, preset = get_model(str(path)), get_model("gpt-oss-120b")
    assert from_file.num_params == preset.num_params
    assert (from_file.sliding_window, from_file.sliding_window_layers) == (128, 18)
    assert from_file.weight_dtype == preset.weight_dtype == "mxfp4"
    path.write_text(json.dumps({**HF_CONFIGS["qwen3-32b"], "sliding_window": 4096}))
    assert get_model(str(path)).sliding_window is None  # use_sliding_window: false
    bad = {**HF_CONFIGS["llama-2-7b"], "quantization_config": {"quant_method": "awq"}}
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match="awq"):
        get_model(str(path))


def test_moe_weights_read_follow_the_expected_experts_touched():
    f = compute("mixtral-8x7b")
    m = get_model("mixtral-8x7b")
    # 8 experts, top 2: one token touches 2; T tokens 8 * (1 - (3/4)^T)
    assert f.expected_experts_touched(1) == pytest.approx(2.0)
    assert f.expected_experts_touched(2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert f.expected_experts_touched(64) == pytest.approx(8.0, rel=1e-6)
    expert = 3 * 4096 * 14336  # one expert of one layer
    dense = m.num_params - m.embedding_params - 8 * 32 * expert
    for tokens in (1, 2, 5):
        touched = f.expected_experts_touched(tokens)
        assert f.weight_bytes(tokens) == pytest.approx((dense + touched * 32 * expert) * 2)
    # FLOPs follow the top-k experts only: 100 tokens cost the active parameters each
    prefill = StepBatch(1, 1, 4096, 0, 0, 4096 * 4097 / 2)
    gemm = f.phases(prefill)["gemm"]
    active = m.active_params - m.embedding_params
    assert gemm == pytest.approx(2 * active * 4096 / (H100.peak_flops * H100.gemm_efficiency))


def test_tensor_parallel_adds_two_all_reduces_per_layer():
    assert H100 is not None
    one, four = compute("llama-2-70b"), compute("llama-2-70b", tp=4)
    batch = decode(32, 1000)
    assert one.phases(batch)["all_reduce"] == 0.0
    wire = 2 * 3 / 4 * 32 * 8192 * 2  # ring all-reduce of T x hidden fp16 activations
    expected = 2 * 80 * (3 * H100.allreduce_latency_s + wire / H100.allreduce_bytes_per_s)
    assert four.phases(batch)["all_reduce"] == pytest.approx(expected)
    assert four.weight_bytes(32) == pytest.approx(one.weight_bytes(32) / 4)


def test_fp8_weights_halve_the_bytes_and_double_the_gemm_rate():
    base, fp8 = compute("llama-2-70b"), compute("llama-2-70b", weight_dtype="fp8")
    assert fp8.weight_bytes(8) == pytest.approx(base.weight_bytes(8) / 2)
    m = get_model("llama-2-70b")
    assert m.with_weight_dtype("fp8").weight_bytes() == pytest.approx(
        m.embedding_params * 2 + (m.num_params - m.embedding_params)
    )
    big = StepBatch(1, 1, 8192, 0, 0, 0.0)
    assert base.phases(big)["gemm"] == pytest.approx(FP8_GEMM_SPEEDUP * fp8.phases(big)["gemm"])
    oss = get_model("gpt-oss-120b")  # MXFP4 experts (4.25 bits), the rest 16-bit
    assert oss.weight_bytes() == pytest.approx(
        oss.routed_expert_params * 4.25 / 8 + (oss.num_params - oss.routed_expert_params) * 2
    )
    gpu = get_gpu("h100")
    blocks = gpu_kv_blocks(oss, gpu, EngineParams(tp=1, gpu_memory_utilization=0.9))
    assert blocks > 0  # 65 GB of weights: fits on one H100 only because of MXFP4
    with pytest.raises(InputError, match="does not fit"):  # 234 GB in bf16
        gpu_kv_blocks(oss.with_weight_dtype("bfloat16"), gpu, EngineParams(tp=1))


def test_deepseek_v3_fits_one_h200_node_in_its_published_fp8():
    """671B weights in FP8 are 84 GB a GPU at TP 8: room for KV on H200s (the usual
    one-node deployment), none on H100s (80 GB), and none at all in BF16."""
    ds, params = get_model("deepseek-v3"), EngineParams(tp=8, gpu_memory_utilization=0.9)
    assert ds.weight_bytes() / 8 == pytest.approx(84e9, rel=0.01)
    assert gpu_kv_blocks(ds, get_gpu("h200"), params) > 0
    for model, gpu in ((ds, "h100"), (ds.with_weight_dtype("bfloat16"), "h200")):
        with pytest.raises(InputError, match="does not fit"):
            gpu_kv_blocks(model, get_gpu(gpu), params)


def test_a_block_override_is_used_as_given_but_weights_that_cannot_load_are_said():
    """vLLM's num_gpu_blocks_override replaces the KV sizing, not the weights' load."""
    import warnings

    big = get_model("llama-2-70b")  # 129 GiB of fp16 weights
    with pytest.warns(InputWarning, match=r"weights \(128.5 GiB per GPU at tp=1\) do not fit"):
        assert gpu_kv_blocks(big, get_gpu("h100"), EngineParams(tp=1, gpu_blocks=500)) == 500
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu_kv_blocks(big, get_gpu("h100"), EngineParams(tp=2, gpu_blocks=500)) == 500


def test_a_kv_from_memory_too_small_for_max_model_len_is_said_and_the_run_goes_on():
    """Qwen3-32B on one H100: 2,495 usable blocks of 16 tokens hold 39,920 tokens, under its
    40,960 positions, so vLLM 0.33 would refuse to start (tests/vllm/test_vllm_kv_capacity.py
    drives its check); kvsim says so and runs, since its memory sizing is an estimate."""
    import warnings

    qwen, h100 = get_model("qwen3-32b"), get_gpu("h100")
    with pytest.warns(InputWarning, match=r"max_model_len 40,960 needs 2,560 .* 2,495 fit"):
        assert gpu_kv_blocks(qwen, h100, EngineParams(tp=1)) == 2496
    with pytest.warns(InputWarning, match=r"max_model_len 39,921 needs 2,496 .*is 39,920\)"):
        gpu_kv_blocks(qwen, h100, EngineParams(tp=1, max_model_len=39921))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpu_kv_blocks(qwen, h100, EngineParams(tp=1, max_model_len=39920))
        gpu_kv_blocks(qwen, h100, EngineParams(tp=2))  # twice the room
        # an override is used as given (vLLM 0.33 checks it too; older servers did not)
        gpu_kv_blocks(qwen, h100, EngineParams(tp=1, gpu_blocks=100))


def test_a_model_whose_every_layer_slides_is_short_only_of_its_windows_blocks():
    """Every layer sliding (Mistral-7B's config.json), vLLM 0.33 reserves a request's window
    less one plus the tokens in flight (twice the step budget with async scheduling: 4,095 +
    16,384), not max_model_len's 8,192 blocks (tests/vllm/test_vllm_kv_capacity.py drives
    its check): kvsim warned that vLLM refuses to start where it starts."""
    import dataclasses
    import warnings

    slides = dataclasses.replace(
        get_model("llama-3.1-8b"), sliding_window=4096, sliding_window_layers=None
    )
    h100 = get_gpu("h100")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu_kv_blocks(slides, h100, EngineParams(gpu_memory_utilization=0.26)) == 1664
    with pytest.warns(InputWarning, match=r"keeps up to 20,479 tokens .* 1,281 .* 1,255 fit"):
        gpu_kv_blocks(slides, h100, EngineParams(gpu_memory_utilization=0.25))


def test_sliding_window_layers_bound_their_attention_span():
    oss = compute("gpt-oss-120b")
    full = compute("gpt-oss-120b", sliding_window=None, sliding_window_layers=None)
    short, long = decode(8, 100), decode(8, 20000)
    assert oss.phases(short)["attention_decode"] == pytest.approx(
        full.phases(short)["attention_decode"]
    )  # within the 128-token window every layer reads the same
    # at 20k tokens half the layers read 128: about half the full-attention time (the
    # fixed cost per request and layer is the same for both)
    fixed = 8 * get_model("gpt-oss-120b").num_layers * oss.profile.attention_seq_layer_s
    ratio = (oss.phases(long)["attention_decode"] - fixed) / (
        full.phases(long)["attention_decode"] - fixed
    )
    assert ratio == pytest.approx(0.5 + 0.5 * (8 + 8 * 128) / (8 * 20001), rel=1e-3)
    m = get_model("gpt-oss-120b")
    assert m.gpu_kv_bytes_per_token() == 18 * 2 * 8 * 64 * 2  # the full layers only
    assert m.kv_bytes_per_token() == 36 * 2 * 8 * 64 * 2  # the CPU tier stores all


# The fields of each preset's config.json that sizing and the step-time model read,
# transcribed from the published files (huggingface.co/<repo>/blob/main/config.json) apart
# from kvsim's own table: (layers, hidden, heads, KV heads, head_dim, vocab, tied, experts,
# top-k, max_position_embeddings, weight dtype, sliding window, sliding layers)
AUDITED = {
    "llama-2-7b": (32, 4096, 32, 32, 128, 32000, False, 0, 0, 4096, "auto", None, None),
    "llama-2-70b": (80, 8192, 64, 8, 128, 32000, False, 0, 0, 4096, "auto", None, None),
    "codellama-34b": (48, 8192, 64, 8, 128, 32000, False, 0, 0, 16384, "auto", None, None),
    "llama-3.1-8b": (32, 4096, 32, 8, 128, 128256, False, 0, 0, 131072, "auto", None, None),
    "qwen3-14b": (40, 5120, 40, 8, 128, 151936, False, 0, 0, 40960, "auto", None, None),
    "qwen3-32b": (64, 5120, 64, 8, 128, 151936, False, 0, 0, 40960, "auto", None, None),
    "mixtral-8x7b": (32, 4096, 32, 8, 128, 32000, False, 8, 2, 32768, "auto", None, None),
    # vocab 32768: the Instruct model's (base v0.1: 32000), the file SOURCES names
    "mixtral-8x22b": (56, 6144, 48, 8, 128, 32768, False, 8, 2, 65536, "auto", None, None),
    "gpt-oss-120b": (36, 2880, 64, 8, 64, 201088, False, 128, 4, 131072, "mxfp4", 128, 18),
}


@pytest.mark.parametrize("name", sorted(AUDITED))
def test_the_benchmarked_presets_carry_their_config_json_fields(name):
    m = get_model(name)
    got = (
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        m.num_kv_heads,
        m.head_dim,
        m.vocab_size,
        m.tie_word_embeddings,
        m.num_experts,
        m.experts_per_token,
        m.derived_max_model_len,
        m.weight_dtype,
        m.sliding_window,
        m.sliding_window_layers,
    )
    assert got == AUDITED[name]
    if name == "mixtral-8x22b":
        assert "Mixtral-8x22B-Instruct-v0.1" in SOURCES[name]
    layers, kv_heads, head_dim = m.num_layers, m.num_kv_heads, m.head_dim
    full = layers - (m.sliding_window_layers or 0)
    for tp in (1, 2, 4, 8):  # K and V, each worker's share of the KV heads (at least one), bf16
        per_layer = 2 * max(1, kv_heads // tp) * head_dim * 2
        assert m.kv_bytes_per_token(tp=tp) == layers * per_layer, tp
        assert m.gpu_kv_bytes_per_token(tp=tp) == full * per_layer, tp


def test_gpt_oss_weights_are_mxfp4_experts_and_bf16_rest_by_hand():
    """openai/gpt-oss-120b: 128 experts of 3 x 2880 x 2880 in 36 layers at 4.25 bits;
    attention (q, o: 2880 x 4096; k, v: 2880 x 512), routers and the untied 201088-word
    embedding and LM head in bf16."""
    m = get_model("gpt-oss-120b")
    experts = 36 * 128 * 3 * 2880 * 2880
    attention = 36 * (2 * 2880 * 64 * 64 + 2 * 2880 * 8 * 64)
    rest = attention + 36 * 2880 * 128 + 2 * 201088 * 2880
    assert m.routed_expert_params == experts
    assert m.weight_bytes() == pytest.approx(experts * 4.25 / 8 + rest * 2)
    assert m.weight_bytes() / 1e9 == pytest.approx(65.2, abs=0.1)
    # one decode token reads 4 of 128 experts per layer, all of the 16-bit rest but the
    # embedding (the LM head is its own phase)
    f = compute("gpt-oss-120b")
    assert f.weight_bytes(1) == pytest.approx(
        experts * 4 / 128 * 4.25 / 8 + (attention + 36 * 2880 * 128) * 2
    )
