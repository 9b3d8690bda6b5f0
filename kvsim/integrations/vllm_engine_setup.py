"""vLLM 0.33's objects for :mod:`kvsim.integrations.vllm_engine`, built by hand on CPU (no GPU, no
model, no profiling): the run's records, a registered dummy model, the ``VllmConfig`` and
``KVCacheConfig``, prompts whose prefix hashes share what the trace shares, the
finish-order pin, and the simulated clock and copy worker. See that module's docstring for
every convention.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import shutil
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from vllm import ModelRegistry
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.kv_offload.base import (
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from kvsim.traces.model import Request

_ARCH = "KvsimDummyForCausalLM"
_VOCAB = 32_000
SAMPLED_TOKEN = 1  # prompt tokens are drawn from [2, _VOCAB)
_HOST_PAGE = 4096  # CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT (mmap.PAGESIZE)


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


# --------------------------------------------------------------------------- finish order


class _InsertionOrderedSet(set):
    """A set that iterates in insertion order (it is still a ``set`` for every other use)."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__()
        self._order: dict[Any, None] = {}
        for item in items:
            self.add(item)

    def add(self, item: Any) -> None:
        super().add(item)
        self._order[item] = None

    def discard(self, item: Any) -> None:
        super().discard(item)
        self._order.pop(item, None)

    def remove(self, item: Any) -> None:
        super().remove(item)
        del self._order[item]

    def clear(self) -> None:
        super().clear()
        self._order.clear()

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._order))


def finish_order_pinned(cls: type) -> type:
    """``cls`` with ``finished_req_ids`` iterated in the order requests finished.

    vLLM keeps the step's finished request ids in a plain ``set`` of strings, and the
    OffloadingConnector offers their final chunks in that set's iteration order, which
    depends on Python's per-process string hash seed: when two requests finish in the same
    step and the CPU tier has room for only one's chunks, which one gets it changes from run
    to run. Pinning the order to the finishing order (the step's schedule order, as kvsim
    does) makes the reference deterministic without changing any decision it can make.
    """

    def get(self: Any) -> set[str]:
        return self.__dict__["finished_req_ids"]

    def put(self: Any, value: set[str]) -> None:
        self.__dict__["finished_req_ids"] = _InsertionOrderedSet(value)

    return type(cls.__name__ + "FinishOrdered", (cls,), {"finished_req_ids": property(get, put)})


# --------------------------------------------------------------------------- vLLM objects


class KvsimDummyForCausalLM(nn.Module):
    """Registered so ModelConfig resolves an architecture without importing model code;
    never instantiated."""

    def __init__(self, *, vllm_config: Any = None, prefix: str = "") -> None:
        super().__init__()

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **_: Any) -> torch.Tensor:
        return input_ids

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states


_MODEL_DIR: str | None = None


def _model_dir() -> str:
    global _MODEL_DIR
    if _MODEL_DIR is None:
        ModelRegistry.register_model(_ARCH, KvsimDummyForCausalLM)
        d = tempfile.mkdtemp(prefix="kvsim-vllm-model-")
        cfg = {
            "architectures": [_ARCH],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "num_hidden_layers": 1,
            "vocab_size": _VOCAB,
            "max_position_embeddings": 1 << 24,
            "torch_dtype": "float16",
        }
        (Path(d) / "config.json").write_text(json.dumps(cfg))
        atexit.register(shutil.rmtree, d, True)
        _MODEL_DIR = d
    return _MODEL_DIR


@contextlib.contextmanager
def quiet_vllm() -> Iterator[None]:
    """vLLM logs every failed store ("cannot store chunks") and its config at INFO."""
    logger = logging.getLogger("vllm")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def build_vllm_config(
    *,
    max_model_len: int,
    gpu_block_tokens: int,
    chunk_tokens: int,
    cpu_chunks: int | None,
    page_bytes: int,
    policy: str,
    store_threshold: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    long_prefill_token_threshold: int,
    async_scheduling: bool,
    enable_chunked_prefill: bool = True,
) -> VllmConfig:
    d = _model_dir()
    model_config = ModelConfig(
        model=d,
        tokenizer=d,
        skip_tokenizer_init=True,
        dtype="float16",
        max_model_len=max_model_len,
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        long_prefill_token_threshold=long_prefill_token_threshold,
        enable_chunked_prefill=enable_chunked_prefill,
        async_scheduling=async_scheduling,
    )
    cache_config = CacheConfig(block_size=gpu_block_tokens, enable_prefix_caching=True)
    kv_transfer_config = None
    if cpu_chunks is not None:
        row_bytes = _round_up(page_bytes * (chunk_tokens // gpu_block_tokens), _HOST_PAGE)
        kv_transfer_config = KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={
                "cpu_bytes_to_use": cpu_chunks * row_bytes,
                "block_size": chunk_tokens,
                "eviction_policy": policy,
                "store_threshold": store_threshold,
            },
        )
    return VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=kv_transfer_config,
    )


def kv_cache_config(gpu_blocks: int, gpu_block_tokens: int, page_bytes: int) -> KVCacheConfig:
    num_blocks = gpu_blocks  # as num_gpu_blocks_override: block 0 becomes the null block
    spec = FullAttentionSpec(
        block_size=gpu_block_tokens,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.int8,
        page_size_padded=page_bytes,
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(
                size=page_bytes * num_blocks,
                layers=["layer.0"],
                layer_stride=page_bytes * num_blocks,
                block_stride=page_bytes,
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )


def _draw(seed: list[int], n: int) -> np.ndarray:
    rng = np.random.default_rng([s % (1 << 64) for s in seed])
    return rng.integers(2, _VOCAB, size=n, dtype=np.int32)


def prompt_tokens(
    req: Request, block_tokens: int, cache: dict[int, np.ndarray] | None = None
) -> list[int]:
    """Token ids whose vLLM prefix hashes share exactly what ``req.block_hashes`` shares:
    block ``i`` (with an id) is a draw seeded by its id; blocks without an id and the
    partial tail are seeded by the request id. ``cache`` memoizes blocks by id."""
    cache = {} if cache is None else cache
    parts: list[np.ndarray] = []
    complete = req.complete_blocks(block_tokens)
    for i in range(complete):
        h = req.block_hashes[i]
        block = cache.get(h)
        if block is None:
            block = cache[h] = _draw([0, h], block_tokens)
        parts.append(block)
    for i in range(complete, req.input_tokens // block_tokens):  # blocks without an id
        parts.append(_draw([1, req.request_id, i], block_tokens))
    tail = req.input_tokens - len(parts) * block_tokens
    if tail:
        parts.append(_draw([2, req.request_id], tail))
    return np.concatenate(parts).tolist() if parts else []


# --------------------------------------------------------------------------- clock + worker


@dataclass
class SimClock:
    now: float = 0.0
    compute_tail: float = -math.inf  # end of the last forward launched
    step: int = -1  # index of the step whose worker calls are running


class SimTransferWorker(OffloadingWorker):
    """vLLM's ``OffloadingWorker`` interface on the simulated clock (see the module docstring
    for the timing rules). Three FIFOs: ``store`` (GPU->CPU), ``load`` and ``expedited``
    (CPU->GPU)."""

    def __init__(
        self,
        clock: SimClock,
        transfers: dict[int, TransferRecord],
        h2d_bytes_per_s: float,
        d2h_bytes_per_s: float,
    ) -> None:
        self.clock = clock
        self.transfers = transfers
        self.rates = {
            "store": d2h_bytes_per_s,
            "load": h2d_bytes_per_s,
            "expedited": h2d_bytes_per_s,
        }
        self.fifo_free = dict.fromkeys(self.rates, -math.inf)
        self.in_flight: dict[str, deque[TransferRecord]] = {q: deque() for q in self.rates}

    def _submit(self, job_id: int, queue: str, blocks: int) -> bool:
        clock = self.clock
        rec = self.transfers[job_id]
        assert rec.blocks == blocks, (job_id, rec.blocks, blocks)
        start = max(clock.now, clock.compute_tail, self.fifo_free[queue])
        rec.submit_step = clock.step
        rec.submit_s = clock.now
        rec.start_s = start
        rec.end_s = start + rec.nbytes / self.rates[queue]
        rec.expedited = queue == "expedited"
        self.fifo_free[queue] = rec.end_s
        self.in_flight[queue].append(rec)
        return True

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._submit(job_id, "store", len(src_spec.block_ids))

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        return self._submit(job_id, "expedited" if expedited else "load", len(dst_spec.block_ids))

    def get_finished(self) -> list[TransferResult]:
        now = self.clock.now
        out: list[TransferResult] = []
        for q in ("store", "load", "expedited"):
            jobs = self.in_flight[q]
            while jobs and jobs[0].end_s <= now:
                rec = jobs.popleft()
                rec.reported_step = self.clock.step
                out.append(TransferResult(rec.job_id, True, rec.nbytes, rec.end_s - rec.start_s))
        return out

    def wait(self, job_ids: set[int]) -> None:
        ends = [self.transfers[j].end_s for j in job_ids if j in self.transfers]
        assert all(e >= 0 for e in ends), "waiting for a job that was never submitted"
        if ends:
            self.clock.now = max(self.clock.now, *ends)

    def next_completion(self) -> float:
        now = self.clock.now
        ends = [q[0].end_s for q in self.in_flight.values() if q and q[0].end_s > now]
        return min(ends, default=math.inf)
