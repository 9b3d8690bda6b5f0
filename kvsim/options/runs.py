"""The jobs' own keywords, described once: :class:`ReplayOptions` (what ``replay()`` takes
beyond the :class:`~kvsim.options.offload.OffloadOptions`) and :class:`SimulateOptions`
(what ``simulate()`` takes beyond them: the GPU, the link, the compute model and the
engine's knobs, whose types are :mod:`kvsim.options.engine`'s). A sweep's cell, the command
line and the API read the same descriptions.

None means a default that depends on something else: the GPU (``max_num_seqs``), vLLM's
``--vllm-config`` (``offload_prompt_only``), the trace's format (``fmt``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from msgspec import Meta

from kvsim.core.errors import InputError, InputWarning
from kvsim.options.engine import (
    AsyncScheduling,
    EnableChunkedPrefill,
    EnablePrefixCaching,
    GpuKvBlocks,
    GpuMemoryUtilization,
    LongPrefillTokenThreshold,
    MaxModelLen,
    MaxNumBatchedTokens,
    MaxNumSeqs,
    OffloadPromptOnly,
    PoissonRate,
    RecordSteps,
    RefusePastMaxModelLen,
    SyncLoadBudgetBytes,
    TimeScale,
    engine_option_name,
)
from kvsim.options.offload import Count, Text, option_name
from kvsim.options.schema import Schema, check_fields

__all__ = [
    "REPLAY_FIELDS",
    "SIMULATE_FIELDS",
    "ReplayOptions",
    "SimulateOptions",
    "check_simulate_together",
]

VllmConfigField = Annotated[
    Any,
    Meta(
        description=(
            "vLLM kv_connector_extra_config (inline JSON, a JSON file, or a whole "
            "kv_transfer_config); explicit options win."
        ),
        extra={"metavar": "JSON|FILE"},
    ),
]
Limit = Annotated[Count, Meta(description="Only the first N requests.")]


class ReplayOptions(Schema, frozen=True):
    """``replay()``'s own keywords (the trace and the progress callback aside)."""

    vllm_config: VllmConfigField | None = None
    protocol: Annotated[
        Literal["prefix", "object"],
        Meta(
            description="prefix: vLLM's connector; object: every chunk is a get, a miss inserts it."
        ),
    ] = "prefix"
    fused: (
        Annotated[
            bool,
            Meta(
                description=(
                    "lru, arc: the fused one-request-at-a-time tier, or (false) the full "
                    "manager protocol (the same decisions, several times slower)."
                )
            ),
        ]
        | None
    ) = None
    limit: Limit | None = None
    fmt: Annotated[Text, Meta(description="Trace format (default: detected from the file).")] | (
        None
    ) = None
    per_request: Annotated[
        bool, Meta(description="Keep the requests table, one row per request (default true).")
    ] = True
    requests_csv: (
        Annotated[
            Text,
            Meta(
                description=(
                    "Stream one row per request (trace order) to this CSV (gzipped if it "
                    "ends in .gz)."
                )
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        check_fields(self, names=engine_option_name)


class SimulateOptions(Schema, frozen=True):
    """``simulate()``'s own keywords (the trace and the progress callback aside)."""

    gpu: Annotated[
        Text,
        Meta(
            description=(
                "GPU preset (h100, h200, a100, l40s, gh200, b200) or a GPU spec JSON file."
            ),
            extra={"aliases": ["--gpu-spec"]},
        ),
    ] = "h200"
    vllm_config: VllmConfigField | None = None
    tier_load_rule: (
        Annotated[
            Literal["off", "pays-off"],
            Meta(
                description=(
                    "pays-off (beyond vLLM): a secondary-tier hit that would promote and load "
                    "slower than it recomputes is a miss. Default: off, vLLM's."
                )
            ),
        ]
        | None
    ) = None
    baseline: Annotated[
        bool, Meta(description="Also run without offloading and report both side by side.")
    ] = False
    limit: Limit | None = None
    max_num_batched_tokens: MaxNumBatchedTokens | None = None
    max_num_seqs: MaxNumSeqs | None = None
    long_prefill_token_threshold: LongPrefillTokenThreshold = 0
    max_model_len: MaxModelLen | None = None
    refuse_past_max_model_len: RefusePastMaxModelLen = False
    gpu_kv_blocks: GpuKvBlocks | None = None
    gpu_memory_utilization: GpuMemoryUtilization = 0.92
    enable_prefix_caching: EnablePrefixCaching = True
    enable_chunked_prefill: EnableChunkedPrefill = True
    offload_prompt_only: OffloadPromptOnly | None = None
    sync_load_budget_bytes: SyncLoadBudgetBytes | None = None
    async_scheduling: AsyncScheduling = True
    time_scale: TimeScale = 1.0
    poisson_rate: PoissonRate | None = None
    link: (
        Annotated[
            Text,
            Meta(
                description=(
                    "Link preset (pcie5, pcie4, gh200), a calibration profile JSON, or a "
                    'constant link {"kind": "constant", "h2d_bytes_per_s": X, '
                    '"d2h_bytes_per_s": Y} in a JSON file (default: the GPU\'s).'
                )
            ),
        ]
        | None
    ) = None
    compute_profile: (
        Annotated[
            Text,
            Meta(
                description=(
                    'Step-time model: a {"kind": "phases"} profile (`kvsim calibrate-compute`; '
                    "default: the shipped one on h100/h200), roofline coefficients replacing "
                    'the GPU preset\'s, or a linear step time {"kind": "linear", "step_s": A, '
                    '"per_token_s": B}.'
                )
            ),
        ]
        | None
    ) = None
    record_steps: RecordSteps = True
    record_tokens: Annotated[
        bool, Meta(description="Add a tokens table, one row per output token.")
    ] = False
    percentile_metrics: (
        Annotated[
            str | list[str],
            Meta(
                description=(
                    "Metrics to report mean/median/std/percentiles of (ms): ttft, tpot, itl, "
                    "e2el, queue (default: all)."
                ),
                extra={"metavar": "M1,M2,..."},
            ),
        ]
        | None
    ) = None
    metric_percentiles: (
        Annotated[
            str | list[float],
            Meta(
                description="Percentiles of each metric, as vllm bench serve's (default 99).",
                extra={"metavar": "P1,P2,..."},
            ),
        ]
        | None
    ) = None
    goodput: (
        Annotated[
            str | list[str] | dict[str, float],
            Meta(
                description=(
                    'SLOs in ms for request goodput, e.g. "ttft:2000 tpot:50" or '
                    '{"ttft": 2000} (ttft, tpot, e2el).'
                ),
                extra={"metavar": "METRIC:MS"},
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        check_fields(self, names=_simulate_flag)


def _simulate_flag(field: str) -> str:
    """How ``kvsim simulate`` spells a field: the GPU KV capacity is its ``--gpu-blocks``."""
    return "--gpu-blocks" if field == "gpu_kv_blocks" else engine_option_name(field)


#: ``simulate``'s options that only the CPU tier reads, with their defaults
_TIER_ONLY = {
    "policy": None,
    "policy_module": None,
    "admission": "always",
    "store_threshold": None,
    "max_tracker_size": None,
    "chunk_tokens": None,
    "offload_prompt_only": None,
    "sync_load_budget_bytes": None,
}


def check_simulate_together(given: Mapping[str, Any], sized: bool) -> None:
    """``kvsim.simulate``'s rules between its keywords (``given``; ``sized``: whether a CPU
    tier is sized): a baseline needs a CPU tier to compare with, and a Poisson re-timing
    leaves no arrivals to scale; a run without a CPU tier reads none of its options, so
    those given are named (a warning, not an error: a sweep's no-offload cell keeps the
    grid's fixed policy, and is right to)."""
    if given["baseline"] and not sized:
        raise InputError(
            "baseline compares the run with and without offloading, but no CPU tier is "
            "sized, so both runs would be the same: give --cpu-gib (cpu_gib), --cpu-chunks, "
            "cpu_bytes or --vllm-config"
        )
    if given["poisson_rate"] is not None and given["time_scale"] != 1.0:
        raise InputError(
            "--poisson-rate re-times the arrivals, so --time-scale would change nothing: "
            "give one of them"
        )
    if sized:
        return
    unread = [name for name, default in _TIER_ONLY.items() if given.get(name) != default]
    if unread:
        names = ", ".join(
            "--offload-all-tokens" if n == "offload_prompt_only" else option_name(n) for n in unread
        )
        warnings.warn(
            f"{names}: the CPU tier's options, but no CPU tier is sized (the run has no "
            "offloading), so they change nothing",
            InputWarning,
            stacklevel=3,
        )


#: each job's own keywords, in declaration order
REPLAY_FIELDS: tuple[str, ...] = ReplayOptions.__struct_fields__
SIMULATE_FIELDS: tuple[str, ...] = SimulateOptions.__struct_fields__
