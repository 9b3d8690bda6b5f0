"""Engine parameters (vLLM v1 scheduler knobs and run options), validated once."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvsim.core.errors import InputError


@dataclass(frozen=True)
class EngineParams:
    """The engine's knobs in one frozen value, checked once so the step loop never re-validates."""

    max_num_batched_tokens: int = 8192  # vLLM token budget per step
    max_num_seqs: int = 256  # running requests per step
    long_prefill_token_threshold: int = 0  # cap on one request's prefill chunk (0: none)
    gpu_blocks: int | None = None  # GPU KV blocks of the key unit; None: from memory
    gpu_memory_utilization: float = 0.92  # vLLM 0.33 CacheConfig default
    activation_reserve_gib: float = 2.5  # non-KV memory besides weights (activations, graphs)
    enable_prefix_caching: bool = True
    offload_prompt_only: bool = True  # vLLM offload_prompt_only
    sync_load_budget_bytes: int = 0  # vLLM sync_load_budget_bytes (per step, per worker)
    gpu_block_tokens: int = 16  # vLLM GPU block (--block-size): KV allocation and copies
    async_scheduling: bool = True  # vLLM 0.33 default: batch queue of depth 2 (N+1 while N runs)
    tp: int = 1
    time_scale: float = 1.0  # arrival = trace timestamp * time_scale
    poisson_rate: float | None = None  # re-time arrivals as Poisson at this rate (req/s)
    seed: int = 0
    record_steps: bool = True

    def __post_init__(self) -> None:
        checks = (
            (self.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be >= 1"),
            (self.max_num_seqs >= 1, "--max-num-seqs must be >= 1"),
            (self.long_prefill_token_threshold >= 0, "--long-prefill-token-threshold must be >= 0"),
            (self.gpu_blocks is None or self.gpu_blocks >= 1, "--gpu-kv-blocks must be >= 1"),
            (0 < self.gpu_memory_utilization <= 1, "--gpu-memory-utilization must be in (0, 1]"),
            (self.activation_reserve_gib >= 0, "activation_reserve_gib must be >= 0"),
            (self.sync_load_budget_bytes >= 0, "sync_load_budget_bytes must be >= 0"),
            (self.gpu_block_tokens >= 1, "--gpu-block-tokens must be >= 1"),
            (self.tp >= 1, "--tp must be >= 1"),
            (0 < self.time_scale < math.inf, "--time-scale must be a finite number > 0"),
            (
                self.poisson_rate is None or 0 < self.poisson_rate < math.inf,
                "--poisson-rate must be a finite number > 0",
            ),
        )
        for ok, msg in checks:
            if not ok:
                raise InputError(msg)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
