"""What a reference run of vLLM's engine records (``tests/vllm_engine_harness.py``): per
transfer job, per step, per request, and the run; plain values, compared with kvsim's
engine by ``tests/vllm/test_vllm_engine_differential.py``."""

from __future__ import annotations

import math
from dataclasses import dataclass

# --------------------------------------------------------------------------- records


@dataclass
class TransferRecord:
    """One offloading job. Times in seconds on the simulated clock; ``-1`` until known."""

    job_id: int
    kind: str  # "load" | "store"
    request_id: int
    blocks: int  # GPU blocks in its GPULoadStoreSpec
    nbytes: int
    created_step: int  # step whose connector metadata carries the job
    submit_step: int = -1  # step whose worker calls submitted it
    submit_s: float = -1.0
    start_s: float = -1.0
    end_s: float = -1.0
    reported_step: int = -1  # step whose get_finished poll returned it
    expedited: bool = False


@dataclass
class StepRecord:
    """One ``schedule()`` call and the worker calls of its batch."""

    index: int
    schedule_s: float  # host time of schedule()
    start_s: float  # forward start on the GPU (host time after the flush stall when empty)
    end_s: float  # forward end (== start_s when the step scheduled nothing)
    scheduled: dict[int, int]  # request_id -> num_scheduled_tokens
    preempted: tuple[int, ...]  # preempted_req_ids of this SchedulerOutput
    load_jobs: tuple[tuple[int, int], ...]  # (job_id, GPU blocks) submitted in this step
    store_jobs: tuple[tuple[int, int], ...]  # (job_id, GPU blocks) offered in this step
    flushed_jobs: tuple[int, ...]  # jobs_to_flush waited on before the forward
    stall_s: float  # host time spent waiting before the forward (flushed jobs, sync loads)
    finished_jobs: tuple[int, ...] = ()  # job ids returned by this step's poll
    finished_recving: tuple[int, ...] = ()  # requests whose async load was reported
    sampled: tuple[int, ...] = ()  # requests given a sampled token by this batch
    processed_s: float = -1.0  # host time of this batch's update_from_output

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())


@dataclass
class RequestRecord:
    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int  # max_tokens given to vLLM (>= 1)
    rejected: bool = False
    admitted_step: int = -1  # first admission (scheduled, or async load started)
    gpu_hit_tokens: int = 0  # vLLM PrefillStats.num_local_cached_tokens at first admission
    cpu_hit_tokens: int = 0  # vLLM PrefillStats.num_external_cached_tokens
    first_token_step: int = -1
    first_token_s: float = math.nan
    finish_step: int = -1
    finish_s: float = math.nan
    preemptions: int = 0
    generated_tokens: int = 0


@dataclass
class VllmRun:
    steps: list[StepRecord]
    requests: dict[int, RequestRecord]
    transfers: dict[int, TransferRecord]
    max_model_len: int
    num_cpu_chunks: int  # 0 without offloading
    async_scheduling: bool
    batch_queue_size: int
    scheduler_class: str
    end_s: float  # host time when the run ended
    complete: bool  # False when max_steps stopped it

    def executed_steps(self) -> list[StepRecord]:
        return [s for s in self.steps if s.num_tokens > 0]
