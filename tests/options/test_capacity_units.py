"""Capacity in GiB (issue 14, section 2): the MRC in GiB and tokens with its ceiling and the
GiB that reach 50 / 90 / 99 % of it, cpu_gib and the model in every summary and sweep row,
bytes people can read, reuse distances in GiB, vLLM's option names as aliases, fp8 KV,
Hugging Face config.json models, GPU spec files and the B200 preset.

The hand trace: one 512-token block per request, keys 1 1 1 1 1 1 2 1 2 1 2 3 1. LRU stack
depths of the reuses: five at depth 1, four at depth 2, one at depth 3 (13 accesses), so the
hit ratio is 5/13 at 1 chunk, 9/13 at 2 and 10/13 (the ceiling) from 3 on; 50 % of the
ceiling needs 1 chunk, 90 % 2 and 99 % 3. Llama-3.1-8B in bf16 stores 128 KiB per token,
64 MiB per chunk: 1/16 GiB.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support import SAMPLE, expect_overload, run_main

import kvsim
from kvsim.core.errors import InputError
from kvsim.core.units import human_bytes, is_byte_count, with_human_bytes
from kvsim.specs.hardware import GPUS, LINKS, get_gpu, load_gpu_spec, vllm_batch_defaults
from kvsim.specs.models import get_model, resolve_model
from kvsim.specs.sizing import size_for_model

HAND_KEYS = (1, 1, 1, 1, 1, 1, 2, 1, 2, 1, 2, 3, 1)
CHUNK_GIB = 64 / 1024  # Llama-3.1-8B, one 512-token chunk

LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "first_k_dense_replace": 3,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}
#: the l40s preset's figures under another name (a preset with a shipped compute profile,
#: h100 or h200, would differ: the profile is looked up by the GPU's name)
L40S_SPEC = {
    "name": "my-l40s",
    "peak_flops": 362e12,
    "hbm_bytes_per_s": 0.864e12,
    "memory_bytes": 46068 * 2**20,
    "link": "pcie4",
}


def write_json(path: Path, data: object) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def hand_trace(tmp_path: Path) -> str:
    path = tmp_path / "hand.jsonl"
    lines = [
        json.dumps({"timestamp": 100 * i, "input_length": 600, "output_length": 8, "hash_ids": [k]})
        for i, k in enumerate(HAND_KEYS)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def llama_config(tmp_path: Path) -> str:
    return write_json(tmp_path / "config.json", LLAMA_8B_CONFIG)


def cli_json(args: list[object], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = run_main([*args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def fails_in_one_line(args: list[object], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    code, out, err = run_main(args, capsys)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


# --------------------------------------------------------------------------- the MRC in GiB


def test_mrc_gib_and_reach_on_the_hand_trace(hand_trace):
    curve = kvsim.mrc(hand_trace, model="llama-3.1-8b")
    assert curve.exact_from == 1
    assert curve.ceiling == pytest.approx(10 / 13)
    t = curve.table.set_index("capacity")
    assert [t.at[c, "hit_ratio"] for c in (1, 2, 3)] == pytest.approx([5 / 13, 9 / 13, 10 / 13])
    assert list(curve.table["capacity_tokens"]) == [512 * c for c in curve.table["capacity"]]
    assert list(curve.table["cpu_gib"]) == pytest.approx(
        [CHUNK_GIB * c for c in curve.table["capacity"]]
    )
    reach = curve.reach()
    assert list(reach["fraction_of_ceiling"]) == [0.5, 0.9, 0.99]
    assert list(reach["capacity"]) == [1, 2, 3]
    assert list(reach["capacity_tokens"]) == [512, 1024, 1536]
    assert list(reach["cpu_gib"]) == pytest.approx([0.0625, 0.125, 0.1875])
    assert list(reach["hit_ratio"]) == pytest.approx([5 / 13, 9 / 13, 10 / 13])
    assert reach["exact"].all()


def test_mrc_cli_json_has_gib_reach_and_points(hand_trace, capsys):
    out = cli_json(
        ["mrc", hand_trace, "--model", "llama-3.1-8b", "--cpu-gib", "0.0625,0.125,1"], capsys
    )
    assert out["ceiling_hit_ratio"] == pytest.approx(10 / 13)
    assert out["chunk_row_bytes"] == 64 * 2**20 and out["model"] == "llama-3.1-8b"
    assert [r["cpu_gib"] for r in out["reach"]] == pytest.approx([0.0625, 0.125, 0.1875])
    assert [r["capacity"] for r in out["points"]] == [1, 2, 16]
    assert [r["hit_ratio"] for r in out["points"]] == pytest.approx([5 / 13, 9 / 13, 10 / 13])


def test_mrc_text_says_how_much_memory_reaches_the_ceiling(hand_trace, capsys):
    code, out, _ = run_main(["mrc", hand_trace, "--model", "llama-3.1-8b"], capsys)
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if "of ceiling" in line}
    assert rows["50%"][4:6] == ["0.07", "GiB"]  # 0.0625 rounded up: enough to buy
    assert rows["90%"][4:6] == ["0.13", "GiB"] and rows["99%"][4:6] == ["0.19", "GiB"]
    assert "chunk_row_bytes      67,108,864 (64.0 MiB)" in out


def test_mrc_without_a_model_has_tokens_but_no_gib(hand_trace):
    curve = kvsim.mrc(hand_trace)
    assert "cpu_gib" not in curve.table.columns and curve.gib(3) is None
    assert list(curve.reach()["capacity_tokens"]) == [512, 1024, 1536]


def test_mrc_points_equal_replays_at_those_sizes(capsys):
    sizes = [16.0, 64.0, 200.0]  # above exact_from (235 chunks, 14.7 GiB) on the sample
    curve = kvsim.mrc(SAMPLE, model="llama-3.1-8b", cpu_gib=sizes)
    assert curve.points is not None and curve.points["exact"].all()
    for row in curve.points.itertuples():
        s = kvsim.replay(SAMPLE, cpu_gib=row.cpu_gib_asked, per_request=False).summary
        assert row.capacity == s["cpu_chunks"]
        assert row.cpu_gib == pytest.approx(s["cpu_gib"])
        assert row.hit_ratio == pytest.approx(s["cpu_hit_ratio"], abs=1e-12)
    out = cli_json(["mrc", SAMPLE, "--model", "llama-3.1-8b", "--cpu-gib", "16,64,200"], capsys)
    assert [p["hit_ratio"] for p in out["points"]] == pytest.approx(list(curve.points.hit_ratio))


def test_mrc_takes_one_size_or_a_list_and_refuses_text():
    one = kvsim.mrc(SAMPLE, model="llama-3.1-8b", cpu_gib=64)
    listed = kvsim.mrc(SAMPLE, model="llama-3.1-8b", cpu_gib=[64])
    assert one.points is not None and one.points.equals(listed.points)
    for bad in ("64", ["64"], [True], object()):  # a string iterates, but not into sizes
        with pytest.raises(kvsim.InputError, match="cpu_gib takes a size in GiB"):
            kvsim.mrc(SAMPLE, model="llama-3.1-8b", cpu_gib=bad)


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_mrc_at_a_size_past_any_trace_is_the_ceiling(policy):
    """1e19 GiB is 1.6e20 chunks, past int64: every reuse hits (it was a numpy
    IndexError for lru and an OverflowError for the miniature curves)."""
    curve = kvsim.mrc(SAMPLE, model="llama-3.1-8b", cpu_gib=[1e19], policy=policy)
    assert curve.points is not None
    assert curve.points["capacity"].iloc[0] > 10**20  # the tier asked for, not a clamp
    assert curve.points["hit_ratio"].iloc[0] == pytest.approx(curve.ceiling)


def test_mrc_reach_gib_is_what_replay_needs(hand_trace):
    """The GiB reported for each share, given back as --cpu-gib, gets that hit ratio."""
    curve = kvsim.mrc(hand_trace, model="llama-3.1-8b")
    for row in curve.reach().itertuples():
        s = kvsim.replay(hand_trace, cpu_gib=row.cpu_gib, per_request=False).summary
        assert s["cpu_chunks"] == row.capacity
        assert s["cpu_hit_ratio"] == pytest.approx(row.hit_ratio)


def test_mrc_figure_has_gib_axis_and_ceiling(hand_trace, tmp_path, capsys):
    png = tmp_path / "mrc.png"
    code, _, err = run_main(
        ["mrc", hand_trace, "--model", "llama-3.1-8b", "--plot", png, "--csv", tmp_path / "c.csv"],
        capsys,
    )
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "c.csv").read_text().splitlines()[0] == (
        "capacity,hit_ratio,miss_ratio,capacity_tokens,cpu_gib,policy,exact,model"
    )
    from kvsim import plots

    fig = plots.mrc(kvsim.mrc(hand_trace, model="llama-3.1-8b"), ceiling=10 / 13)
    ax = fig.axes[0]
    assert "GiB" in ax.get_xlabel()
    assert any(
        list(line.get_ydata()) == pytest.approx([10 / 13, 10 / 13]) for line in ax.get_lines()
    )


# --------------------------------------------------------------------------- summaries


def test_replay_summary_has_model_and_cpu_gib(capsys):
    s = kvsim.replay(SAMPLE, cpu_chunks=100, limit=30, per_request=False).summary
    assert s["model"] == "llama-3.1-8b" and s["kv_cache_dtype"] == "auto"
    assert s["cpu_bytes"] == 100 * 64 * 2**20 and s["cpu_gib"] == pytest.approx(6.25)
    obj = kvsim.replay(SAMPLE, cpu_chunks=100, limit=30, protocol="object").summary
    assert obj["cpu_gib"] == pytest.approx(6.25) and obj["model"] == "llama-3.1-8b"
    out = cli_json(["replay", SAMPLE, "--cpu-gib", "10", "--limit", "30"], capsys)
    assert out["cpu_gib"] == 10.0 and out["cpu_chunks"] == 160 and out["model"] == "llama-3.1-8b"


def test_simulate_summary_has_cpu_gib():
    s = kvsim.simulate(SAMPLE, cpu_gib=8, limit=5).summary
    assert s["cpu_gib"] == 8.0 and s["model"] == "llama-3.1-8b"
    assert kvsim.simulate(SAMPLE, limit=5).summary["cpu_gib"] == 0.0  # no offloading


def test_sweep_rows_carry_cpu_gib_and_model(llama_config):
    spec = {
        "mode": "cache",
        "traces": [SAMPLE],
        "limit": 30,
        "options": {"model": llama_config},
        "grid": {"cpu_chunks": [100, 400], "kv_cache_dtype": ["auto", "fp8"]},
    }
    df = kvsim.sweep(spec, executor="serial")
    assert (df["status"] == "ok").all()
    assert set(df["model"]) == {llama_config}
    got = {(r.cpu_chunks, r.kv_cache_dtype): r.cpu_gib for r in df.itertuples()}
    assert got == {
        (100, "auto"): 6.25,
        (400, "auto"): 25.0,
        (100, "fp8"): 3.125,
        (400, "fp8"): 12.5,
    }


def test_human_readable_bytes(capsys):
    assert human_bytes(512) == "512 B"
    assert human_bytes(64 * 2**20) == "64.0 MiB"
    assert human_bytes(1.5 * 2**30) == "1.50 GiB"
    assert human_bytes(300 * 2**30) == "300 GiB"
    assert is_byte_count("bytes_loaded") and is_byte_count("chunk_bytes")
    assert not is_byte_count("kv_bytes_per_token") and not is_byte_count("h2d_bytes_per_s")
    shown = with_human_bytes({"chunk_bytes": 2**21, "cpu_chunks": 5, "bytes_stored": None})
    assert shown == {"chunk_bytes": "2,097,152 (2.00 MiB)", "cpu_chunks": 5, "bytes_stored": None}
    code, out, _ = run_main(["replay", SAMPLE, "--cpu-gib", "4", "--limit", "30"], capsys)
    assert code == 0
    assert "chunk_bytes" in out and "67,108,864 (64.0 MiB)" in out
    assert "4,294,967,296 (4.00 GiB)" in out  # cpu_bytes
    code, out, _ = run_main(["trace", "stats", SAMPLE, "--model", "llama-3.1-8b"], capsys)
    assert code == 0 and "67,108,864 (64.0 MiB)" in out


# --------------------------------------------------------------------------- trace stats


def test_trace_stats_reuse_distance_in_gib(hand_trace, capsys):
    # reuse distances: 0 x5, 1 x4, 2 x1; an LRU keeps a reuse with distance + 1 chunks
    s = kvsim.trace_stats(hand_trace, model="llama-3.1-8b").summary
    assert s["block_bytes"] == 64 * 2**20
    assert s["reuse_distance_p50_gib"] == pytest.approx(1.5 * CHUNK_GIB)  # p50 distance 0.5
    assert s["reuse_distance_p90_gib"] == pytest.approx(2.1 * CHUNK_GIB)
    assert s["reuse_distance_p99_gib"] == pytest.approx(2.91 * CHUNK_GIB)
    assert s["unique_blocks_gib"] == pytest.approx(3 * CHUNK_GIB)
    out = cli_json(["trace", "stats", hand_trace, "--model", "llama-3.1-8b"], capsys)
    assert out["summary"]["reuse_distance_p90_gib"] == pytest.approx(2.1 * CHUNK_GIB)
    rows = {r["quantity"]: r for r in out["distributions"]}
    assert rows["reuse_lru_size"]["unit"] == "GiB"
    assert rows["reuse_lru_size"]["max"] == pytest.approx(3 * CHUNK_GIB)
    fp8 = kvsim.trace_stats(hand_trace, model="llama-3.1-8b", kv_cache_dtype="fp8").summary
    assert fp8["reuse_distance_p50_gib"] == pytest.approx(s["reuse_distance_p50_gib"] / 2)
    assert "reuse_distance_p50_gib" not in kvsim.trace_stats(hand_trace).summary


# --------------------------------------------------------------------------- vLLM's names


@pytest.mark.parametrize(
    ("alias", "option", "value"),
    [
        ("--kv-offloading-size", "--cpu-gib", "6"),
        ("--tensor-parallel-size", "--tp", "2"),
    ],
)
def test_vllm_names_are_aliases_in_replay(alias, option, value, capsys):
    base = ["replay", SAMPLE, "--limit", "40", "--cpu-gib", "6"]
    base = base if option != "--cpu-gib" else base[:-2]
    assert cli_json([*base, alias, value], capsys) == cli_json([*base, option, value], capsys)


def test_tensor_parallel_size_is_an_alias_in_mrc_and_stats(capsys):
    args = ["mrc", SAMPLE, "--model", "llama-3.1-70b", "--cpu-gib", "64"]
    assert cli_json([*args, "--tensor-parallel-size", "4"], capsys) == cli_json(
        [*args, "--tp", "4"], capsys
    )
    assert cli_json(
        ["mrc", SAMPLE, "--model", "llama-3.1-8b", "--kv-offloading-size", "32"], capsys
    ) == cli_json(["mrc", SAMPLE, "--model", "llama-3.1-8b", "--cpu-gib", "32"], capsys)


def test_no_enable_prefix_caching(capsys):
    sim = ["simulate", SAMPLE, "--limit", "15", "--cpu-gib", "4"]
    assert cli_json([*sim, "--no-enable-prefix-caching"], capsys) == cli_json(
        [*sim, "--no-prefix-caching"], capsys
    )
    on = cli_json(sim, capsys)
    off = cli_json([*sim, "--no-enable-prefix-caching"], capsys)
    assert on["gpu_hit_tokens"] > 0 and off["gpu_hit_tokens"] == 0
    # replay: the GPU prefix cache is --gpu-blocks, off by default; the flag keeps it off
    rep = ["replay", SAMPLE, "--limit", "40", "--cpu-gib", "4"]
    assert cli_json([*rep, "--no-enable-prefix-caching"], capsys) == cli_json(rep, capsys)
    fails_in_one_line(
        [*rep, "--gpu-blocks", "50", "--no-enable-prefix-caching"], capsys, "--gpu-blocks 50"
    )
    # the one-pass curve has no GPU tier at all: the flag is not an option there
    fails_in_one_line(["mrc", SAMPLE, "--no-enable-prefix-caching"], capsys, "no-enable-prefix")


@expect_overload
def test_fp8_halves_bytes_and_doubles_chunks(capsys):
    bf16, fp8 = get_model("llama-3.1-8b"), resolve_model("llama-3.1-8b", "fp8")
    assert fp8.kv_bytes_per_token() * 2 == bf16.kv_bytes_per_token() == 131072
    for name in ("fp8_e4m3", "fp8_e5m2", "FP8"):
        assert resolve_model("llama-3.1-8b", name).kv_bytes_per_token() == 65536
    assert resolve_model("llama-3.1-8b", "bfloat16").kv_bytes_per_token() == 131072
    mla = resolve_model("deepseek-v3", "fp8")
    assert mla.kv_bytes_per_token(tp=8) * 2 == get_model("deepseek-v3").kv_bytes_per_token(tp=8)
    rep = ["replay", SAMPLE, "--limit", "40", "--cpu-gib", "8"]
    a, b = cli_json(rep, capsys), cli_json([*rep, "--kv-cache-dtype", "fp8"], capsys)
    assert b["kv_cache_dtype"] == "fp8" and a["kv_cache_dtype"] == "auto"
    assert b["cpu_chunks"] == 2 * a["cpu_chunks"] == 256
    assert b["chunk_bytes"] * 2 == a["chunk_bytes"]
    assert b["kv_bytes_per_token"] * 2 == a["kv_bytes_per_token"]
    assert b["cpu_gib"] == a["cpu_gib"] == 8.0
    # timed mode: the bytes each stored chunk moves halve too
    runs = [
        kvsim.simulate(SAMPLE, limit=15, cpu_gib=8, kv_cache_dtype=d).summary
        for d in ("auto", "fp8")
    ]
    per_chunk = [r["store_bytes"] / r["chunks_stored"] for r in runs]
    assert per_chunk == [64 * 2**20, 32 * 2**20]
    assert runs[1]["kv_cache_dtype"] == "fp8" and runs[1]["cpu_chunks"] == 2 * runs[0]["cpu_chunks"]
    curve = kvsim.mrc(SAMPLE, model="llama-3.1-8b", kv_cache_dtype="fp8", cpu_gib=[8])
    assert curve.row_bytes == 32 * 2**20 and int(curve.points.capacity[0]) == 256


# --------------------------------------------------------------------------- config.json


def test_config_json_geometry_equals_the_preset(tmp_path, llama_config):
    for data, preset in ((LLAMA_8B_CONFIG, "llama-3.1-8b"), (DEEPSEEK_V3_CONFIG, "deepseek-v3")):
        path = write_json(tmp_path / f"{preset}.json", data)
        got, want = get_model(path), get_model(preset)
        for field in (
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "num_attention_heads",
            "is_mla",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "default_dtype_bytes",
            "hidden_size",
            "vocab_size",
            "weight_dtype",
        ):
            assert getattr(got, field) == getattr(want, field), (preset, field)
        for tp in (1, 2, 8):
            assert got.kv_bytes_per_token(tp=tp) == want.kv_bytes_per_token(tp=tp)
            assert size_for_model(got, 64 * 2**30, tp=tp) == size_for_model(want, 64 * 2**30, tp=tp)
        assert got.num_params == pytest.approx(want.num_params, rel=0.01)
        assert got.active_params == pytest.approx(want.active_params, rel=0.02)
    moe = get_model(str(tmp_path / "deepseek-v3.json"))
    assert (moe.num_experts, moe.experts_per_token) == (256, 8)
    # a folder holding config.json works too, as vLLM's --model does
    assert get_model(str(tmp_path)).kv_bytes_per_token() == 131072


def test_config_json_runs_like_the_preset(llama_config):
    a = kvsim.replay(SAMPLE, cpu_gib=8, limit=40, model=llama_config, per_request=False).summary
    b = kvsim.replay(SAMPLE, cpu_gib=8, limit=40, model="llama-3.1-8b", per_request=False).summary
    assert a.pop("model") == llama_config and b.pop("model") == "llama-3.1-8b"
    assert a == b


def test_config_json_variants(tmp_path):
    # no head_dim: hidden / heads; no num_key_value_heads: MHA; multimodal text_config
    mha = dict(LLAMA_8B_CONFIG)
    del mha["num_key_value_heads"]
    assert get_model(write_json(tmp_path / "mha.json", mha)).num_kv_heads == 32
    wrapped = {"torch_dtype": "bfloat16", "text_config": {**LLAMA_8B_CONFIG, "torch_dtype": None}}
    got = get_model(write_json(tmp_path / "vl.json", wrapped))
    assert got.kv_bytes_per_token() == 131072
    fp32 = get_model(
        write_json(tmp_path / "f32.json", {**LLAMA_8B_CONFIG, "torch_dtype": "float32"})
    )
    assert fp32.default_dtype_bytes == 2  # vLLM's --dtype auto serves fp32 checkpoints in 16 bits


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (
            {k: v for k, v in LLAMA_8B_CONFIG.items() if k != "num_hidden_layers"},
            "'num_hidden_layers'",
        ),
        ({**LLAMA_8B_CONFIG, "num_key_value_heads": "8"}, "num_key_value_heads must be"),
        ({**LLAMA_8B_CONFIG, "num_attention_heads": 0}, "num_attention_heads must be"),
        ({**LLAMA_8B_CONFIG, "torch_dtype": "int3"}, "torch_dtype"),
        ({**DEEPSEEK_V3_CONFIG, "qk_rope_head_dim": None}, "'qk_rope_head_dim'"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_config_json_is_one_line(tmp_path, capsys, data, words):
    path = write_json(tmp_path / "config.json", data)
    with pytest.raises(InputError, match=words):
        get_model(path)
    fails_in_one_line(
        ["replay", SAMPLE, "--cpu-gib", "4", "--model", path], capsys, path, words.strip("'")
    )


def test_malformed_config_json_is_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 32,')
    fails_in_one_line(["mrc", SAMPLE, "--model", path], capsys, str(path), "not valid JSON")


# --------------------------------------------------------------------------- GPUs


def test_b200_preset():
    b200 = get_gpu("B200")
    assert b200.name == "b200" and b200.link == "pcie5"
    assert b200.peak_flops == 2.25e15 and b200.hbm_bytes_per_s == 8e12
    assert b200.memory_bytes == 183359 * 2**20
    assert vllm_batch_defaults(b200) == (16384, 1024)  # > 160 GiB, as vllm serve picks
    s = kvsim.simulate(SAMPLE, gpu="b200", limit=5).summary
    assert s["gpu"] == "b200" and s["link"] == "pcie5"


def test_links_are_the_engines_presets():
    from kvsim.engine.transfer_model import LINK_PRESETS

    assert set(LINKS) == set(LINK_PRESETS)
    assert {g.link for g in GPUS.values()} <= set(LINKS)


@expect_overload
def test_gpu_spec_file_equals_the_preset(tmp_path, capsys):
    path = write_json(tmp_path / "gpu.json", L40S_SPEC)
    spec = load_gpu_spec(path)
    assert spec == get_gpu("l40s").with_(name="my-l40s")
    sim = ["simulate", SAMPLE, "--limit", "15", "--cpu-gib", "4"]
    a = cli_json([*sim, "--gpu-spec", path], capsys)
    b = cli_json([*sim, "--gpu", "l40s"], capsys)
    assert a.pop("gpu") == "my-l40s" and b.pop("gpu") == "l40s"
    assert a == b
    assert kvsim.simulate(SAMPLE, limit=5, gpu=path).summary["gpu"] == "my-l40s"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"peak_flops": -1}, "peak_flops: Expected `float` > 0.0, got -1"),
        ({"memory_bytes": "80GB"}, "memory_bytes: Expected `int | float`, got '80GB'"),
        ({"memory_bytes": 0}, "memory_bytes: Expected `int` >= 1, got 0"),  # was accepted
        ({"memory_bytes": -4}, "memory_bytes: Expected `int` >= 1, got -4"),
        ({"hbm_bytes_per_s": math.inf}, "hbm_bytes_per_s: must be finite, got inf"),
        ({"link": "pcie7"}, "link: must be one of gh200, pcie4, pcie5, got 'pcie7'"),
        ({"name": ""}, "name: Expected `str` of length >= 1, got ''"),
        ({"nvlink": 1}, "nvlink: unknown key"),
        ({"link": None}, "link: Expected `str`, got None"),
    ],
)
def test_bad_gpu_spec_is_one_line(tmp_path, capsys, change, words):
    data = {**L40S_SPEC, **change}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data).replace("Infinity", "1e999"))
    fails_in_one_line(
        ["simulate", SAMPLE, "--limit", "5", "--gpu-spec", path], capsys, str(path), words
    )


def test_gpu_spec_missing_key(tmp_path, capsys):
    data = {k: v for k, v in L40S_SPEC.items() if k != "link"}
    path = write_json(tmp_path / "gpu.json", data)
    fails_in_one_line(
        ["simulate", SAMPLE, "--gpu", path], capsys, path, "link: missing (a required key)"
    )


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["replay", SAMPLE, "--cpu-gib", "4", "--kv-cache-dtype", "fp4"], "--kv-cache-dtype"),
        (["replay", SAMPLE, "--cpu-gib", "4", "--kv-cache-dtype", "fp8_ds_mla"], "packed"),
        (
            ["mrc", SAMPLE, "--model", "llama-3.1-8b", "--kv-cache-dtype", "int2"],
            "--kv-cache-dtype",
        ),
        (["mrc", SAMPLE, "--cpu-gib", "4"], "needs --model"),
        (["mrc", SAMPLE, "--model", "llama-3.1-8b", "--cpu-gib", "4,abc"], "'abc'"),
        (["mrc", SAMPLE, "--model", "llama-3.1-8b", "--cpu-gib", "0.01"], "too small"),
        (["mrc", SAMPLE, "--model", "llama-3.1-8b", "--cpu-gib", "-3"], "--cpu-gib"),
        (["mrc", SAMPLE, "--model", "no-such-model"], "unknown model"),
        (["trace", "stats", SAMPLE, "--model", "no-such-model"], "unknown model"),
        (["trace", "stats", SAMPLE, "--model", "llama-3.1-8b", "--tp", "0"], "--tp"),
        (["simulate", SAMPLE, "--gpu", "b300"], "unknown GPU"),
        (["replay", SAMPLE, "--kv-offloading-size", "nan"], "--cpu-gib"),
    ],
)
def test_bad_inputs_exit_2_in_one_line(args, words, capsys):
    fails_in_one_line(args, capsys, words)


def test_a_chunk_that_is_no_whole_gpu_blocks_names_where_its_size_came_from():
    trace = kvsim.generate("chat", 10, seed=1, block_tokens=100)
    with pytest.raises(kvsim.InputError, match=r"the chunk \(100 tokens: the trace's blocks"):
        kvsim.replay(trace, cpu_gib=1)  # --chunk-tokens was never given
    with pytest.raises(kvsim.InputError, match=r"--chunk-tokens 300 must be a multiple"):
        kvsim.replay(trace, cpu_gib=1, chunk_tokens=300)
