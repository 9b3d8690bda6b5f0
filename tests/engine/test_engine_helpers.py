"""Shared fixtures for the engine tests: a tiny exact world (16-token blocks and chunks,
1 s per forward step with tokens, a link that moves one 2 MiB chunk in a set time)."""

from __future__ import annotations

from kvsim.engine.engine import Engine
from kvsim.engine.params import EngineParams
from kvsim.engine.transfer_model import DirectionParams, TransferModelParams
from kvsim.options.offload import CacheConfig
from kvsim.specs.hardware import get_gpu
from kvsim.specs.models import get_model
from kvsim.specs.sizing import NULL_GPU_BLOCKS
from kvsim.traces import Request, Trace

CHUNK_BYTES = 16 * 131072  # llama-3.1-8b: 128 KiB per token, 16-token chunk = 2 MiB


def link(seconds_per_chunk: float) -> TransferModelParams:
    d = DirectionParams(0.0, 0.0, ((1.0, CHUNK_BYTES / seconds_per_chunk / 1e9),))
    return TransferModelParams("test", d, d, duplex_factor=1.0)


def one_second_steps(batch) -> float:
    return 1.0 if batch.tokens else 0.0


def req(i: int, t: float, prompt: int, out: int, hashes) -> Request:
    return Request(i, float(t), prompt, out, tuple(hashes))


def make_engine(
    *,
    cpu_chunks: int = 100,
    gpu_blocks: int = 64,  # usable ones
    per_chunk: float = 0.25,
    prefix: bool = False,
    budget: int = 8192,
    store_threshold: int = 0,
    offload: bool = True,
    **params,
) -> Engine:
    config = CacheConfig(
        num_chunks=cpu_chunks,
        block_tokens=16,
        chunk_tokens=16,
        model="llama-3.1-8b",
        store_threshold=store_threshold,
    )
    params.setdefault("async_scheduling", False)  # the scenarios pin vLLM's synchronous loop
    # the scenarios count the blocks requests can use; vLLM's count has its null block too
    ep = EngineParams(
        gpu_blocks=gpu_blocks + NULL_GPU_BLOCKS,
        enable_prefix_caching=prefix,
        max_num_batched_tokens=budget,
        **params,
    )
    return Engine(
        config,
        ep,
        model=get_model("llama-3.1-8b"),
        gpu=get_gpu("h200"),
        compute=one_second_steps,
        transfer=link(per_chunk),
        offload=offload,
    )


def run(reqs, **kw) -> Engine:
    return make_engine(**kw).run(Trace.from_requests(reqs, 16))


def tables(engine: Engine):
    rec = engine.recorder
    return rec.request_table().set_index("request"), rec.transfer_table(), rec.step_table()
