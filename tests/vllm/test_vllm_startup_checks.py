"""vLLM 0.33's start-up checks on the engine options ``kvsim simulate`` takes, against kvsim's
own, by driving vLLM's config classes on CPU across both sides of each boundary: a value
kvsim refuses is one vLLM will not start with, and one it takes vLLM takes; each default is
vLLM's. The rules: the option schema's bounds (``kvsim.options.engine``),
``kvsim.specs.context`` and the tensor-parallel split (``ModelSpec.kv_heads_per_worker``).
Skipped without vLLM (failed under ``KVSIM_REQUIRE_VLLM=1``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support import SAMPLE, need_vllm
from support import run_main as support_run_main

need_vllm("vllm.engine.arg_utils")

from vllm.config import CacheConfig, ModelConfig, SchedulerConfig  # noqa: E402
from vllm.distributed.utils import divide  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402

import kvsim  # noqa: E402
from kvsim.core.errors import InputError  # noqa: E402
from kvsim.options.offload import OffloadOptions  # noqa: E402
from kvsim.options.runs import SimulateOptions  # noqa: E402
from kvsim.specs.context import batch_max_num_seqs, check_long_prefill_threshold  # noqa: E402
from kvsim.specs.hardware import GPUS, vllm_batch_defaults, vllm_default_batched_tokens  # noqa: E402
from kvsim.specs.models import KV_CACHE_DTYPES, MODELS, get_model, kv_dtype_bytes  # noqa: E402

pytestmark = pytest.mark.vllm

NAMES = ("--long-prefill-token-threshold", "--max-model-len")
SERVE = UsageContext.OPENAI_API_SERVER


def scheduler_starts(**given: Any) -> bool:
    """Whether vLLM 0.33's ``SchedulerConfig`` takes ``given`` (a 4096-token model, chunked
    prefill on, 8192 tokens and 128 requests a step unless given)."""
    kwargs: dict[str, Any] = {
        "max_num_seqs": 128,
        "max_num_batched_tokens": 8192,
        "max_model_len": 4096,
        "is_encoder_decoder": False,
        "enable_chunked_prefill": True,
        **given,
    }
    try:
        SchedulerConfig(**kwargs)
    except ValueError:  # pydantic's ValidationError is one
        return False
    return True


def cache_starts(**given: Any) -> bool:
    """Whether vLLM 0.33's ``CacheConfig`` takes ``given``."""
    try:
        CacheConfig(**given)
    except ValueError:
        return False
    return True


def kvsim_takes(options: type, **given: Any) -> bool:
    """Whether kvsim's option schema takes ``given`` (its one-line error otherwise)."""
    try:
        options(**given)
    except InputError:
        return False
    return True


@pytest.mark.parametrize("threshold", [0, 1, 4095, 4096, 4097, 131072, 131073])
@pytest.mark.parametrize("max_model_len", [1, 4096, 131072])
def test_a_threshold_past_max_model_len_is_refused_as_vllm_refuses_it(threshold, max_model_len):
    budget = max(8192, max_model_len)  # chunked prefill on: the budget is not the question
    try:
        check_long_prefill_threshold(threshold, max_model_len, NAMES)
        ours = True
    except InputError as e:
        assert str(e) == (
            f"--long-prefill-token-threshold {threshold} exceeds --max-model-len "
            f"{max_model_len}: vLLM refuses to start"
        )
        ours = False
    theirs = scheduler_starts(
        long_prefill_token_threshold=threshold,
        max_model_len=max_model_len,
        max_num_batched_tokens=budget,
        max_num_seqs=1,
    )
    assert ours == theirs


def test_simulate_refuses_it_before_it_runs_naming_the_default_length():
    with pytest.raises(InputError) as e:
        kvsim.simulate(SAMPLE, model="llama-3.1-8b", long_prefill_token_threshold=131073)
    assert str(e.value) == (
        "--long-prefill-token-threshold 131073 exceeds the default --max-model-len 131072: "
        "vLLM refuses to start"
    )
    assert not scheduler_starts(long_prefill_token_threshold=131073, max_model_len=131072)


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("max_num_seqs", [-1, 0, 1, 2]),
        ("max_num_batched_tokens", [-1, 0, 128, 129]),
        ("long_prefill_token_threshold", [-1, 0, 1]),
    ],
)
def test_the_schedulers_bounds_are_vllms(field, values):
    for value in values:
        assert kvsim_takes(SimulateOptions, **{field: value}) == scheduler_starts(**{field: value})


@pytest.mark.parametrize("value", [-0.5, 0.0, 1e-9, 0.5, 0.92, 1.0, 1.0000001, 2.0])
def test_gpu_memory_utilization_bounds_are_vllms(value):
    ours = kvsim_takes(SimulateOptions, gpu_memory_utilization=value)
    assert ours == cache_starts(gpu_memory_utilization=value)


@pytest.mark.parametrize("value", [-16, 0, 1, 16, 32])
def test_block_size_bounds_are_vllms(value):
    ours = kvsim_takes(OffloadOptions, gpu_block_tokens=value)
    assert ours == cache_starts(block_size=value)


def test_the_defaults_are_vllms():
    timed, offload = SimulateOptions(), OffloadOptions()
    assert timed.gpu_memory_utilization == CacheConfig.gpu_memory_utilization
    assert timed.gpu_memory_utilization == EngineArgs.gpu_memory_utilization
    assert offload.gpu_block_tokens == CacheConfig.DEFAULT_BLOCK_SIZE
    assert timed.long_prefill_token_threshold == EngineArgs.long_prefill_token_threshold
    assert timed.gpu_kv_blocks is EngineArgs.num_gpu_blocks_override is None
    assert offload.tp == EngineArgs.tensor_parallel_size
    assert timed.enable_prefix_caching and timed.enable_chunked_prefill


def test_sweep_refuses_it_before_any_cell_runs(tmp_path: Path, capsys):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        f"traces: [{SAMPLE}]\nmode: timed\nlimit: 5\n"
        "options: {model: llama-3.1-8b, long_prefill_token_threshold: 5000}\n"
        "grid: {cpu_chunks: [100], max_model_len: [8192, 4096]}\n"
    )
    code, out, err = support_run_main(["sweep", str(spec), "--out", tmp_path / "out"], capsys)
    assert code == 2 and not out
    assert err.strip().splitlines() == [
        f"kvsim: error: {spec}: options.long_prefill_token_threshold 5000 exceeds "
        "grid.max_model_len[1] 4096: vLLM refuses to start"
    ]
    assert not (tmp_path / "out" / "results.csv").exists()


def vllm_kv_heads_per_worker(heads: int, kv_heads: int, tp: int) -> int | None:
    """The KV heads one of ``tp`` workers holds as vLLM 0.33 starts, or None where it will
    not: ``ModelConfig.verify_with_parallel_config`` (query heads over ``tp``), then
    ``QKVParallelLinear``'s split (its ``divide`` asserts an even one; KV heads fewer than
    the workers are replicated, evenly)."""
    par = SimpleNamespace(
        enable_hc_sp=False,
        tensor_parallel_size=tp,
        enable_expert_parallel=False,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
        world_size_across_dp=tp,
    )
    model = SimpleNamespace(
        model_arch_config=SimpleNamespace(total_num_attention_heads=heads),
        multimodal_config=None,
    )
    try:
        ModelConfig.verify_with_parallel_config(model, par)  # type: ignore[arg-type]
        divide(heads, tp)
        if tp >= kv_heads:
            divide(tp, kv_heads)
            return 1
        return divide(kv_heads, tp)
    except (ValueError, AssertionError):
        return None


@pytest.mark.parametrize("name", [n for n in MODELS if not get_model(n).is_mla])
def test_a_tp_is_refused_as_vllm_refuses_it(name):
    model = get_model(name)
    for tp in [*range(1, 17), 20, 24, 32, 48, 64, 96]:
        try:
            ours: int | None = model.kv_heads_per_worker(tp)
        except InputError as e:
            assert str(e).startswith(f"--tp {tp}: ") and "vLLM refuses to start" in str(e)
            ours = None
        assert ours == vllm_kv_heads_per_worker(
            model.num_attention_heads, model.num_kv_heads, tp
        ), tp


@pytest.mark.parametrize("dtype", [*KV_CACHE_DTYPES, "float32", "int8", "fp4", "fp16"])
def test_a_kv_cache_dtype_kvsim_models_is_one_vllm_starts_with(dtype):
    """kvsim models a subset of vLLM's KV cache dtypes (a packed layout it reads but does
    not size is its own refusal); one neither knows is refused by both."""
    try:
        kv_dtype_bytes(dtype)
        ours = True
    except InputError as e:
        assert str(e).startswith(f"--kv-cache-dtype: unknown value {dtype!r}")
        ours = False
    assert ours == cache_starts(cache_dtype=dtype)


def vllm_defaults(max_model_len: int, chunked: bool, seqs: int | None) -> tuple[int, int]:
    """The step budget and request count ``vllm serve`` starts with on an H100 given no
    budget: ``EngineArgs``' own defaulting, its GPU lookup replaced by the H100's."""
    tokens, default_seqs = vllm_batch_defaults(GPUS["h100"])
    args = EngineArgs(max_num_seqs=seqs, enable_chunked_prefill=chunked)
    args.get_batch_defaults = lambda world_size: ({SERVE: tokens}, {SERVE: default_seqs})
    model = SimpleNamespace(
        max_model_len=max_model_len, is_multimodal_model=False, is_mm_prefix_lm=False
    )
    parallel = SimpleNamespace(use_batched_dp_moe=False)
    args._set_default_max_num_seqs_and_batched_tokens_args(SERVE, model, parallel)
    assert args.max_num_batched_tokens is not None and args.max_num_seqs is not None
    return args.max_num_batched_tokens, args.max_num_seqs


@pytest.mark.parametrize("max_model_len", [1, 4, 7, 8, 9, 64, 4096, 8192, 131072])
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("seqs", [None, 1, 16, 2048])
def test_the_default_budget_is_vllms(max_model_len, chunked, seqs):
    gpu = GPUS["h100"]
    budget = vllm_default_batched_tokens(gpu, max_model_len, chunked, seqs)
    count = batch_max_num_seqs(budget, seqs, vllm_batch_defaults(gpu)[1], ("b", "s"))
    assert (budget, count) == vllm_defaults(max_model_len, chunked, seqs)
