"""The timed engine's knobs, described once: each knob's type, bounds and help text is one
alias below, used by :class:`EngineParams` (the resolved value the engine reads) and by
:class:`kvsim.options.runs.SimulateOptions` (what ``simulate()`` and ``kvsim simulate``
accept, where None means "vLLM's default for this GPU / ``--vllm-config``").
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from kvsim.options.schema import Schema, check_fields

__all__ = ["ENGINE_FLAGS", "EngineParams", "engine_option_name"]

MaxNumBatchedTokens = Annotated[
    int,
    Meta(
        ge=1,
        description="Token budget per step (default: vllm serve's for the GPU; H100/H200: 8192).",
    ),
]
MaxNumSeqs = Annotated[
    int,
    Meta(
        ge=1,
        description=(
            "Running requests per step (default: vllm serve's for the GPU, H100/H200: 1024, "
            "cut to --max-num-batched-tokens; not above it: vLLM would not start)."
        ),
    ),
]
LongPrefillTokenThreshold = Annotated[
    int, Meta(ge=0, description="vLLM's cap on one request's prefill chunk (default 0: off).")
]
#: more GPU blocks than any GPU holds (a billion tokens at vLLM's 16 a block), and a
#: block pool of them fills gigabytes of host memory: a larger count is a typo
MAX_GPU_BLOCKS = 1 << 26

GpuKvBlocks = Annotated[
    int,
    Meta(
        ge=2,
        le=MAX_GPU_BLOCKS,
        description=(
            "GPU KV capacity in --gpu-block-tokens blocks (vLLM num_gpu_blocks_override, "
            "its null block included: one fewer hold KV; default: from GPU memory)."
        ),
    ),
]
GpuMemoryUtilization = Annotated[
    float,
    Meta(gt=0, le=1, description="Share of GPU memory vLLM may use (default 0.92)."),
]
ActivationReserveGib = Annotated[
    float, Meta(ge=0, description="GPU memory besides weights and KV (activations, graphs).")
]
EnablePrefixCaching = Annotated[bool, Meta(description="The GPU prefix cache (default on).")]
EnableChunkedPrefill = Annotated[
    bool,
    Meta(
        description=(
            "vLLM's chunked prefill (default on). Off: a waiting request whose new tokens "
            "exceed the step's token budget waits, and one longer than "
            "--max-num-batched-tokens is refused (vLLM then requires max_num_batched_tokens "
            ">= max_model_len; its default budget is raised to max_model_len)."
        )
    ),
]
MaxModelLen = Annotated[
    int,
    Meta(
        ge=1,
        description=(
            "vLLM --max-model-len (default: the length vLLM derives from the model's config): "
            "a prompt this long or "
            "longer, or an output longer, is refused; a longer request's output is cut to "
            "what is left (vLLM 0.33's server)."
        ),
    ),
]
RefusePastMaxModelLen = Annotated[
    bool,
    Meta(
        description=(
            "The server before vLLM 0.33 (v0.15.1 too): refuse a request whose prompt + "
            "output exceeds max_model_len instead of cutting its output (default false)."
        )
    ),
]
OffloadPromptOnly = Annotated[
    bool,
    Meta(
        description=(
            "vLLM offload_prompt_only: store prompt chunks only (default: --vllm-config's, "
            "else true)."
        )
    ),
]
SyncLoadBudgetBytes = Annotated[
    int,
    Meta(
        ge=0,
        description=(
            "vLLM sync_load_budget_bytes: small CPU hits load in the same step (default: "
            "--vllm-config's, else 0)."
        ),
    ),
]
AsyncScheduling = Annotated[
    bool,
    Meta(
        description=(
            "vLLM's async scheduling (its default): schedule the next step while one runs."
        )
    ),
]
TimeScale = Annotated[
    float,
    Meta(gt=0, description="Multiply trace timestamps by this (0.5 = twice the request rate)."),
]
PoissonRate = Annotated[
    float,
    Meta(
        gt=0,
        description="Re-time arrivals as Poisson at this rate (req/s, seeded); "
        "--request-rate is vllm bench serve's name for it.",
        extra={"aliases": ["--request-rate"]},
    ),
]
RecordSteps = Annotated[bool, Meta(description="Keep the per-step table (default true).")]
Count = Annotated[int, Meta(ge=1)]
Seed = Annotated[int, Meta(ge=0, description="Seed of the Poisson arrivals (default 0).")]

#: how errors name a knob, where it is not ``--`` + its name with dashes
ENGINE_FLAGS = {"gpu_blocks": "--gpu-kv-blocks", "activation_reserve_gib": "activation_reserve_gib"}


def engine_option_name(field: str) -> str:
    """``max_num_seqs`` -> ``--max-num-seqs``, as ``vllm serve`` spells it."""
    return ENGINE_FLAGS.get(field) or "--" + field.replace("_", "-")


class EngineParams(Schema, frozen=True):
    """The engine's knobs in one frozen value, checked once when it is built (every field
    against its type and bounds, a one-line error naming the flag), so the step loop
    never re-validates."""

    max_num_batched_tokens: MaxNumBatchedTokens = 8192
    max_num_seqs: MaxNumSeqs = 256
    long_prefill_token_threshold: LongPrefillTokenThreshold = 0
    max_model_len: MaxModelLen | None = None  # None: vLLM's, from the model's config
    refuse_past_max_model_len: RefusePastMaxModelLen = False
    gpu_blocks: GpuKvBlocks | None = None  # None: from GPU memory
    gpu_memory_utilization: GpuMemoryUtilization = 0.92  # vLLM 0.33 CacheConfig default
    activation_reserve_gib: ActivationReserveGib = 2.5
    enable_prefix_caching: EnablePrefixCaching = True
    enable_chunked_prefill: EnableChunkedPrefill = True
    offload_prompt_only: OffloadPromptOnly = True
    sync_load_budget_bytes: SyncLoadBudgetBytes = 0  # per step, per worker
    gpu_block_tokens: Annotated[Count, Meta(description="vLLM --block-size (default 16).")] = 16
    async_scheduling: AsyncScheduling = True  # batch queue of depth 2 (N+1 while N runs)
    tp: Annotated[Count, Meta(description="Tensor-parallel world size (default 1).")] = 1
    time_scale: TimeScale = 1.0
    poisson_rate: PoissonRate | None = None
    seed: Seed = 0
    record_steps: RecordSteps = True

    def __post_init__(self) -> None:
        check_fields(self, names=engine_option_name)
