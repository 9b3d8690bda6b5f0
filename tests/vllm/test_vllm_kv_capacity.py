"""kvsim's start-up capacity rule (:func:`kvsim.specs.context.kv_shortfall`, which
``kvsim simulate`` and ``kvsim accuracy`` warn with) against vLLM 0.33's own check, driven
on CPU: ``get_kv_cache_configs`` with ``num_gpu_blocks_override`` (so the KV holds exactly
that many blocks, the null block among them) refuses a ``max_model_len`` whose blocks do
not fit, and names the longest it would take. Skipped without vLLM (failed under
``KVSIM_REQUIRE_VLLM=1``)."""

from __future__ import annotations

import re

import pytest
from support import need_vllm

need_vllm("vllm.v1.core.kv_cache_planning")

import torch  # noqa: E402
from vllm.v1.core.kv_cache_planning import get_kv_cache_configs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

from kvsim.integrations.vllm_engine_setup import build_vllm_config, quiet_vllm  # noqa: E402
from kvsim.specs.context import kv_shortfall  # noqa: E402
from kvsim.specs.sizing import usable_gpu_blocks  # noqa: E402

pytestmark = pytest.mark.vllm

BLOCK = 16
PAGE = 64  # bytes of one block of the one layer: any size, the check counts blocks


def vllm_refusal(
    max_model_len: int,
    num_gpu_blocks: int,
    sliding_window: int | None = None,
    budget: int | None = None,
) -> int | None:
    """None where vLLM 0.33 starts with this KV (of one full-attention layer, or one sliding
    over ``sliding_window`` tokens); else the longest ``max_model_len`` its error names."""
    with quiet_vllm():
        config = build_vllm_config(
            max_model_len=max_model_len,
            gpu_block_tokens=BLOCK,
            chunk_tokens=BLOCK,
            cpu_chunks=None,
            page_bytes=PAGE,
            policy="lru",
            store_threshold=0,
            max_num_batched_tokens=budget or max(2048, max_model_len),
            max_num_seqs=8,
            long_prefill_token_threshold=0,
            async_scheduling=False,
        )
    config.cache_config.num_gpu_blocks_override = num_gpu_blocks
    config.cache_config.kv_cache_layout = "LBNHC"  # the engine core's choice, made here
    spec: FullAttentionSpec | SlidingWindowSpec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.int8, page_size_padded=PAGE
    )
    if sliding_window is not None:
        spec = SlidingWindowSpec(
            block_size=BLOCK,
            num_kv_heads=1,
            head_size=1,
            dtype=torch.int8,
            page_size_padded=PAGE,
            sliding_window=sliding_window,
        )
    groups = [KVCacheGroupSpec(["layer.0"], spec)]
    try:
        get_kv_cache_configs(config, [{"layer.0": spec}], [1 << 40], groups)
    except ValueError as e:
        found = re.search(r"estimated maximum model length is (\d+)", str(e))
        assert found, str(e)
        return int(found.group(1))
    return None


def kvsims_refusal(max_model_len: int, num_gpu_blocks: int) -> int | None:
    said = kv_shortfall(max_model_len, BLOCK, usable_gpu_blocks(num_gpu_blocks))
    if said is None:
        return None
    found = re.search(r"the longest it takes is ([\d,]+)", said)
    assert found, said
    return int(found.group(1).replace(",", ""))


# around the edge: the usable blocks' tokens, a block either side
EDGES = [
    (blocks, (blocks - 1) * BLOCK + offset)
    for blocks in (2, 3, 17, 257)
    for offset in (-17, -16, -1, 0, 1, 15, 16, 17)
    if (blocks - 1) * BLOCK + offset >= 1
]


@pytest.mark.parametrize(("num_gpu_blocks", "max_model_len"), EDGES)
def test_kvsims_capacity_rule_is_vllms(num_gpu_blocks, max_model_len):
    assert kvsims_refusal(max_model_len, num_gpu_blocks) == vllm_refusal(
        max_model_len, num_gpu_blocks
    )


@pytest.mark.parametrize("sliding_window", [64, 1024])
@pytest.mark.parametrize("num_gpu_blocks", [3, 17, 130, 257, 1100])
@pytest.mark.parametrize("max_model_len", [100, 4096, 16384])
def test_a_model_whose_every_layer_slides_needs_only_its_windows_blocks(
    sliding_window, num_gpu_blocks, max_model_len
):
    """Every layer sliding (Mistral-7B's config.json), a request keeps at most its window
    less one plus the step's tokens in flight (one step of 512 here, no async scheduling):
    kvsim warned by max_model_len's blocks (16,384 tokens: 1,024), where vLLM starts."""
    budget = 512
    said = kv_shortfall(
        max_model_len, BLOCK, usable_gpu_blocks(num_gpu_blocks), sliding_window - 1 + budget
    )
    refused = vllm_refusal(max_model_len, num_gpu_blocks, sliding_window, budget)
    assert (said is None) == (refused is None), (said, refused)
