"""CPU-tier sizing: vLLM 0.33 arithmetic (docs/vllm-offload-semantics.md sections 1.2-1.4)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.core.errors import InputError
from kvsim.specs.models import MODELS, get_model
from kvsim.specs.sizing import (
    PAGE_ALIGNMENT,
    KVGroup,
    capacity_tokens,
    gib,
    size_cpu_tier,
    size_for_model,
    sliding_window_size_in_chunks,
)

MiB = 2**20

# Upstream tests/v1/kv_offload/cpu/test_capacity.py uses MAX_MODEL_LEN = 36864 with
# GPU blocks of 16 tokens and bpc 16, so tokens_per_chunk = 256 and a full-attention
# request of max_model_len spans cdiv(36864, 256) = 144 chunks.
UPSTREAM_MAX_MODEL_LEN = 36864
FULL = KVGroup()
SWA_1024 = KVGroup("sliding", 1024)  # cdiv(1024, 256) = 4 chunks


# --------------------------------------------------------------- capacity in tokens


def test_single_full_group_bpc16_4500_chunks():
    # 4500 * 36864 // 144 = 4500 * 256 = 1,152,000
    assert capacity_tokens(4500, UPSTREAM_MAX_MODEL_LEN, 256, (FULL,)) == 1_152_000


def test_full_plus_six_swa_1024_groups():
    # Upstream's "full-plus-6-swa-1024" case uses 4000 chunks (not 4500):
    # 4000 * 36864 // (144 + 6 * min(144, 4)) = 147,456,000 // 168 = 877,714
    assert sliding_window_size_in_chunks(SWA_1024, 256) == 4
    groups = (FULL,) + (SWA_1024,) * 6
    assert capacity_tokens(4000, UPSTREAM_MAX_MODEL_LEN, 256, groups) == 877_714
    # The same shape with 4500 chunks, for the record: 4500 * 36864 // 168.
    assert capacity_tokens(4500, UPSTREAM_MAX_MODEL_LEN, 256, groups) == 987_428


@pytest.mark.parametrize(
    ("groups", "num_chunks", "expected"),
    [
        ((KVGroup("sliding", 4096),), 4000, 9_216_000),  # 4000 * 36864 // min(144, 16)
        ((SWA_1024,), 4000, 36_864_000),  # 4000 * 36864 // min(144, 4)
        ((FULL, SWA_1024, KVGroup("mamba")), 4000, 989_637),  # // (144 + 4 + 1)
    ],
)
def test_other_upstream_shapes(groups, num_chunks, expected):
    assert capacity_tokens(num_chunks, UPSTREAM_MAX_MODEL_LEN, 256, groups) == expected


def test_sliding_window_chunks():
    tpc = 256
    assert sliding_window_size_in_chunks(FULL, tpc) is None
    assert sliding_window_size_in_chunks(KVGroup("mamba"), tpc) == 1
    assert sliding_window_size_in_chunks(KVGroup("chunked_local", 8192), tpc) == 32
    assert sliding_window_size_in_chunks(KVGroup("sliding", 1000), tpc) == 4
    # max(cdiv(W, tpc), cdiv(W - 1 + extra, tpc)): extra tokens can add a chunk.
    assert sliding_window_size_in_chunks(SWA_1024, tpc, extra_retained_tokens=1) == 4
    assert sliding_window_size_in_chunks(SWA_1024, tpc, extra_retained_tokens=2) == 5
    assert sliding_window_size_in_chunks(KVGroup("sliding", 1024, 2), tpc) == 5
    with pytest.raises(InputError, match="window"):
        sliding_window_size_in_chunks(KVGroup("sliding"), tpc)
    with pytest.raises(InputError, match="kind"):
        sliding_window_size_in_chunks(KVGroup("bogus"), tpc)


def test_capacity_none_and_second_group_halves():
    assert capacity_tokens(100, 0, 16) is None
    assert capacity_tokens(100, 4096, 16, ()) is None
    one = capacity_tokens(100, 4096, 16, (FULL,))
    two = capacity_tokens(100, 4096, 16, (FULL, FULL))
    assert one == 1600 and two == 800
    assert capacity_tokens(0, 4096, 16) == 0


# --------------------------------------------------------------- Llama-3.1-8B worked example


def test_llama_8b_tp1():
    m = get_model("llama-3.1-8b")
    assert m.kv_bytes_per_token_per_layer() == 2 * 8 * 128 * 2  # 4 KiB; 64 KiB per 16-token page
    s = size_for_model(m, gib(100), gpu_block_tokens=16, blocks_per_chunk=1, tp=1)
    assert s.worker_kv_bytes_per_block == 2 * MiB
    assert s.row_bytes == 2 * MiB == s.raw_chunk_bytes == s.slot_bytes_per_worker
    assert s.num_chunks == 51_200
    assert s.num_chunks * s.tokens_per_chunk == 819_200
    assert s.cpu_kv_cache_size_bytes == gib(100)
    assert s.cpu_kv_cache_size_tokens is None  # max_model_len unknown
    s2 = size_for_model(m, gib(100), max_model_len=8192)
    assert s2.cpu_kv_cache_size_tokens == 819_200


def test_llama_8b_tp2_same_chunk_count():
    s = size_for_model(get_model("LLaMA-3.1-8B"), gib(100), tp=2)
    assert s.worker_kv_bytes_per_block == 1 * MiB
    assert s.num_copies == 2
    assert s.slot_bytes_per_worker == 1 * MiB
    assert s.row_bytes == 2 * MiB
    assert s.num_chunks == 51_200


# --------------------------------------------------------------- upstream spec tests


def test_cpu_spec_sizes_normalized_worker_layout():
    s = size_cpu_tier(
        PAGE_ALIGNMENT * 3, worker_kv_bytes_per_block=16, blocks_per_chunk=2, world_size=6
    )
    assert s.raw_chunk_bytes == 16 * 6 * 2
    assert s.slot_bytes_per_worker == 32
    assert s.row_bytes == PAGE_ALIGNMENT
    assert s.num_chunks == 3


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 12])
def test_capacity_divides_by_tp_copies_but_not_when_replicated(world_size):
    # One page per worker per chunk; 12 pages of host memory in total.
    kw = dict(worker_kv_bytes_per_block=PAGE_ALIGNMENT, world_size=world_size)
    assert size_cpu_tier(PAGE_ALIGNMENT * 12, **kw).num_chunks == 12 // world_size
    rep = size_cpu_tier(PAGE_ALIGNMENT * 12, replicated_layout=True, **kw)
    assert rep.num_copies == 1 and rep.num_chunks == 12


def test_second_full_group_halves_token_capacity():
    kw = dict(worker_kv_bytes_per_block=PAGE_ALIGNMENT, max_model_len=1024)
    one = size_cpu_tier(PAGE_ALIGNMENT * 12, **kw)
    two = size_cpu_tier(PAGE_ALIGNMENT * 12, groups=(FULL, FULL), **kw)
    assert one.cpu_kv_cache_size_tokens == 12 * 16
    assert two.cpu_kv_cache_size_tokens == one.cpu_kv_cache_size_tokens // 2
    assert size_cpu_tier(PAGE_ALIGNMENT * 12, **kw, groups=()).cpu_kv_cache_size_tokens is None
    kw["max_model_len"] = 0
    assert size_cpu_tier(PAGE_ALIGNMENT * 12, **kw).cpu_kv_cache_size_tokens is None


def test_page_rounding():
    s = size_cpu_tier(8192 * 5 + 100, worker_kv_bytes_per_block=4097)
    assert s.raw_chunk_bytes == 4097
    assert s.row_bytes == 8192
    assert s.num_chunks == 5
    assert s.cpu_kv_cache_size_bytes == 8192 * 5
    assert s.as_dict()["row_bytes"] == 8192


# --------------------------------------------------------------- MLA


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_deepseek_v3_mla_bytes_not_split_by_tp(tp):
    m = get_model("deepseek-v3")
    assert m.is_mla
    assert m.kv_bytes_per_token(tp=tp) == (512 + 64) * 2 * 61
    s = size_for_model(m, gib(10), tp=tp)
    assert s.worker_kv_bytes_per_block == (512 + 64) * 2 * 61 * 16
    assert s.num_copies == 1  # replicated layout (auto at tp > 1) or single worker
    forced = size_for_model(m, gib(10), tp=tp, replicated_layout=False)
    assert forced.num_copies == tp


def test_dense_tp_split_and_replication_floor():
    m = get_model("qwen2.5-7b")  # 4 KV heads, 28 query heads
    assert m.kv_bytes_per_token(tp=2) == 28 * 2 * 2 * 128 * 2
    m = get_model("llama-3.1-8b")  # 8 KV heads, 32 query heads
    assert m.kv_bytes_per_token(tp=16) == 32 * 2 * 1 * 128 * 2  # max(1, 8 // 16): replicated
    s = size_for_model(m, gib(1), tp=16)
    assert s.num_copies == 16  # dense models never use the replicated layout by default


@pytest.mark.parametrize(
    ("model", "tp", "needle"),
    [
        ("llama-3.1-8b", 3, "32 attention heads"),
        ("llama-3.1-8b", 6, "32 attention heads"),
        ("qwen2.5-7b", 8, "28 attention heads"),  # vLLM cannot run Qwen2.5-7B at TP 8
        ("qwen3-14b", 16, "40 attention heads"),
    ],
)
def test_a_tp_vllm_refuses_is_an_input_error(model, tp, needle):
    """vLLM splits the query heads evenly over the workers, and the KV heads evenly (or
    replicates each on the same number of workers); another tp does not start."""
    with pytest.raises(InputError, match=f"--tp {tp}: .*{needle}"):
        get_model(model).kv_bytes_per_token(tp=tp)


def test_kv_heads_must_split_or_replicate_evenly():
    from dataclasses import replace

    m = replace(get_model("llama-3.1-8b"), num_attention_heads=48)  # 48 heads, 8 KV heads
    assert m.kv_heads_per_worker(8) == 1 and m.kv_heads_per_worker(4) == 2
    for tp in (3, 6, 12):  # 48 splits over each; 8 KV heads over none, nor replicate evenly
        with pytest.raises(InputError, match=f"--tp {tp}: .*8 KV heads"):
            m.kv_heads_per_worker(tp)
    assert m.kv_heads_per_worker(16) == 1  # two workers share each KV head


def test_presets():
    assert {
        "llama-3.1-8b",
        "llama-3.1-70b",
        "qwen2.5-7b",
        "qwen3-8b",
        "deepseek-v3",
        "llama-3.2-1b",
    } <= set(MODELS)
    assert get_model("llama-3.1-70b").kv_bytes_per_token() == 80 * 2 * 8 * 128 * 2
    assert get_model("qwen3-8b").kv_bytes_per_token() == 36 * 2 * 8 * 128 * 2
    assert get_model("Llama-3.2-1B").kv_bytes_per_token() == 16 * 2 * 8 * 64 * 2
    assert get_model("llama-3.1-8b").kv_bytes_per_token(dtype_bytes=1) == 32 * 2 * 8 * 128


# --------------------------------------------------------------- errors


def test_unknown_model():
    with pytest.raises(InputError, match=r"unknown model 'gpt-5'; known: .*llama-3.1-8b"):
        get_model("gpt-5")


def test_a_presets_hugging_face_ids_name_it(tmp_path, monkeypatch):
    """What ``vllm serve`` is given (``meta-llama/Llama-3.1-8B-Instruct``) names the preset,
    case-insensitively; each preset built from a published config.json answers to that
    file's repository; a local folder of that name wins, as vLLM reads it first."""
    from kvsim.specs.model_configs import SOURCES
    from kvsim.specs.models import HF_IDS, MODELS

    assert set(HF_IDS) == set(MODELS)
    for name, ids in HF_IDS.items():
        for hf in ids:
            assert get_model(hf) is MODELS[name] is get_model(hf.upper())
    for name, url in SOURCES.items():
        repo = url.removeprefix("huggingface.co/").removesuffix("/blob/main/config.json")
        assert repo in HF_IDS[name]
    with pytest.raises(InputError, match=r"did you mean 'meta-llama/Llama-3.1-8B-Instruct'"):
        get_model("meta-llama/Llama-3.1-8B-Instruc")
    local = tmp_path / "Qwen" / "Qwen3-14B"
    local.mkdir(parents=True)
    config = {
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "intermediate_size": 1024,
    }
    (local / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    assert get_model("Qwen/Qwen3-14B").num_layers == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_attention_heads": 8192}, "num_attention_heads 8192 gives head_dim 0"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide"),
        ({"num_key_value_heads": 8}, "num_key_value_heads 8 does not divide"),  # more than heads
    ],
)
def test_a_config_with_impossible_heads_is_refused(tmp_path, change, words):
    """A derived head_dim of 0 and KV heads that do not group the query heads were taken
    (the run then failed naming --cpu-gib, or ran silently)."""
    config = {
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "intermediate_size": 1024,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert get_model(str(path)).num_kv_heads == 2
    path.write_text(json.dumps({**config, **change}))
    with pytest.raises(InputError, match=words):
        get_model(str(path))


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        (dict(blocks_per_chunk=0), "--blocks-per-chunk"),
        (dict(gpu_block_tokens=0), "--block-size"),
        (dict(world_size=0), "--tp"),
        (dict(worker_kv_bytes_per_block=0), "worker_kv_bytes_per_block"),
    ],
)
def test_bad_options(kwargs, option):
    args = dict(worker_kv_bytes_per_block=16) | kwargs
    with pytest.raises(InputError, match=option):
        size_cpu_tier(gib(1), **args)


def test_negative_bytes_and_too_small():
    with pytest.raises(InputError, match="--cpu-gib"):
        size_cpu_tier(-1, worker_kv_bytes_per_block=16)
    with pytest.raises(
        InputError, match=r"^1048576 bytes: capacity too small for one chunk \(needs 2097152"
    ):
        size_for_model(get_model("llama-3.1-8b"), MiB)
    s = size_for_model(get_model("llama-3.1-8b"), MiB, require_one_chunk=False)
    assert s.num_chunks == 0 and s.cpu_kv_cache_size_bytes == 0
    with pytest.raises(InputError, match="--tp"):
        size_for_model(get_model("llama-3.1-8b"), gib(1), tp=0)


# --------------------------------------------------------------- property


@given(
    cpu_bytes=st.integers(min_value=0, max_value=2**42),
    worker_bytes=st.integers(min_value=1, max_value=2**24),
    bpc=st.integers(min_value=1, max_value=64),
    world=st.integers(min_value=1, max_value=16),
    replicated=st.booleans(),
)
def test_row_and_chunk_invariants(cpu_bytes, worker_bytes, bpc, world, replicated):
    s = size_cpu_tier(
        cpu_bytes,
        worker_kv_bytes_per_block=worker_bytes,
        blocks_per_chunk=bpc,
        world_size=world,
        replicated_layout=replicated,
        require_one_chunk=False,
    )
    assert s.num_chunks * s.row_bytes <= cpu_bytes < (s.num_chunks + 1) * s.row_bytes
    assert s.row_bytes % PAGE_ALIGNMENT == 0
    assert s.raw_chunk_bytes <= s.row_bytes < s.raw_chunk_bytes + PAGE_ALIGNMENT
    assert s.slot_bytes_per_worker * s.num_copies == s.raw_chunk_bytes
    assert s.cpu_kv_cache_size_bytes == s.num_chunks * s.row_bytes
