"""``kvsim.simulate(...)``: timed mode through the discrete-event engine, as pandas tables."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from kvsim.api import as_trace, make_options
from kvsim.engine.compute_model import ComputeParams, load_compute_profile
from kvsim.engine.engine import Engine
from kvsim.engine.params import EngineParams
from kvsim.engine.summary import summarize
from kvsim.engine.transfer_model import get_link
from kvsim.hardware import get_gpu
from kvsim.results import Result
from kvsim.traces import Request, Trace

BASELINE_PREFIX = "baseline_"


def simulate(
    trace: str | os.PathLike | Trace | Iterable[Request],
    *,
    gpu: str = "h200",
    model: str | None = None,
    cpu_gib: float | None = None,
    cpu_chunks: int | None = None,
    policy: str | None = None,
    baseline: bool = False,
    seed: int = 0,
    limit: int | None = None,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    long_prefill_token_threshold: int = 0,
    gpu_kv_blocks: int | None = None,
    gpu_memory_utilization: float = 0.9,
    enable_prefix_caching: bool = True,
    offload_prompt_only: bool = True,
    sync_load_budget_bytes: int = 0,
    time_scale: float = 1.0,
    poisson_rate: float | None = None,
    link: str | None = None,
    compute_profile: str | os.PathLike | None = None,
    tp: int | None = None,
    record_steps: bool = True,
    vllm_config: str | dict | None = None,
    progress: Callable[[int], None] | None = None,
    **options: Any,
) -> Result:
    """Timed replay of ``trace`` on one modelled GPU running a vLLM v1-like engine.

    With no CPU size (``cpu_gib`` / ``cpu_chunks`` / ``vllm_config``) the run has no
    offloading. ``baseline=True`` adds the same run without offloading: its tables are
    ``baseline_requests`` and ``baseline_steps`` and its summary keys start ``baseline_``.
    Other keywords are :class:`kvsim.config.OffloadOptions` fields (``chunk_tokens``,
    ``admission``, ``store_threshold``, ...). ``link`` is a preset (pcie5, pcie4, gh200) or a
    calibration profile path; ``compute_profile`` a JSON of roofline coefficients.

    Returns a Result with tables ``requests``, ``transfers``, ``steps`` and a flat summary.
    """
    model = model or "llama-3.1-8b"
    tr = as_trace(trace, block_tokens=options.get("block_tokens"), limit=limit)
    sized = cpu_gib is not None or cpu_chunks is not None or vllm_config is not None
    opts = make_options(vllm_config, model=model, cpu_gib=cpu_gib, cpu_chunks=cpu_chunks if sized else 1,
                        policy=policy, seed=seed, tp=tp, **options)
    config = opts.resolve(tr.block_tokens)
    params = EngineParams(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        long_prefill_token_threshold=long_prefill_token_threshold, gpu_blocks=gpu_kv_blocks,
        gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=enable_prefix_caching,
        offload_prompt_only=offload_prompt_only, sync_load_budget_bytes=sync_load_budget_bytes,
        gpu_block_tokens=opts.gpu_block_tokens, tp=opts.tp, time_scale=time_scale,
        poisson_rate=poisson_rate, seed=seed, record_steps=record_steps)
    gpu_spec = get_gpu(gpu)
    transfer = get_link(link) if link else get_link(gpu_spec.link)
    compute_params = ComputeParams.for_gpu(gpu_spec)
    if compute_profile is not None:
        compute_params = load_compute_profile(compute_profile, compute_params)
    future = tr if sized else None  # read only by policies that need the future

    def run(offload: bool) -> tuple[dict, dict]:
        engine = Engine(config, params, model=model, gpu=gpu_spec, compute_params=compute_params,
                        transfer=transfer, offload=offload, requests_for_future=future if offload else None,
                        progress=progress).run(tr)
        rec = engine.recorder
        tables = {"requests": rec.request_table(), "transfers": rec.transfer_table(), "steps": rec.step_table()}
        return summarize(engine, tables["requests"], tables["transfers"]), tables

    summary, tables = run(offload=sized)
    summary = {"trace": str(tr.path), "gpu": gpu_spec.name, "model": model, "link": transfer.link, **summary}
    if baseline:
        base_summary, base_tables = run(offload=False)
        summary.update({BASELINE_PREFIX + k: v for k, v in base_summary.items()})
        tables[BASELINE_PREFIX + "requests"] = base_tables["requests"]
        tables[BASELINE_PREFIX + "steps"] = base_tables["steps"]
    config_out = {**config.as_dict(), **params.as_dict(), "gpu": gpu_spec.name, "link": transfer.to_dict(),
                  "compute": compute_params.__dict__, "offload": sized}
    return Result(summary=summary, tables=tables, config=config_out)
