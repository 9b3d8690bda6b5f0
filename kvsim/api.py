"""The Python API: one call per job, returning :class:`kvsim.results.Result` values.

The command line calls these functions too, so a run from a notebook and a run from the
shell go through the same code.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kvsim.config import (
    OffloadOptions,
    engine_knobs_from_vllm_config,
    load_vllm_config,
    options_from_vllm_config,
    refuse_engine_knobs_in_cache_mode,
)
from kvsim.errors import InputError, InputWarning
from kvsim.io import atomic_write
from kvsim.replay import REQUEST_COLUMNS, CacheReplay
from kvsim.replay.object_protocol import replay_config
from kvsim.results import Result
from kvsim.traces import Request, Trace, as_trace, requests_frame

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.replay.mrc import MRC
    from kvsim.traces.coerce import TraceLike

__all__ = ["generate", "make_options", "mrc", "replay", "requests_frame", "simulate"]

#: summary keys of a ``simulate(..., baseline=True)`` run's offload-free twin start with this
BASELINE_PREFIX = "baseline_"


def generate(kind: str, n_requests: int = 1000, seed: int = 0, **knobs: Any) -> pd.DataFrame:
    """A synthetic workload as a DataFrame (see ``kvsim.traces.synthetic`` for kinds and knobs);
    pass it to ``replay`` / ``simulate`` as the trace."""
    from kvsim.traces.synthetic import generate as generate_requests

    block_tokens = int(knobs.get("block_tokens", 512))
    return requests_frame(
        generate_requests(kind, n_requests=n_requests, seed=seed, **knobs), block_tokens
    )


_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(OffloadOptions))


def vllm_extra(vllm_config: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """A ``kv_connector_extra_config`` given inline, as a dict, or as a file."""
    if vllm_config is None:
        return None
    return vllm_config if isinstance(vllm_config, dict) else load_vllm_config(vllm_config)


def make_options(vllm_config: str | dict[str, Any] | None = None, **options: Any) -> OffloadOptions:
    """Options from keywords, on top of a vLLM ``kv_connector_extra_config`` if given; an
    unknown keyword is an error, not ignored."""
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        raise InputError(
            f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OPTION_NAMES))}"
        )
    base = OffloadOptions()
    extra = vllm_extra(vllm_config)
    if extra is not None:
        base = options_from_vllm_config(extra, base)
    explicit = {k: v for k, v in options.items() if v is not None}
    if "cpu_chunks" in explicit or "cpu_gib" in explicit:
        base = base.with_(cpu_bytes=None)
    return base.with_(**explicit)


def _counted(requests: Iterable[Request], progress: Callable[[int], None]) -> Iterable[Request]:
    for req in requests:
        yield req
        progress(1)


def replay(
    trace: TraceLike,
    *,
    limit: int | None = None,
    fmt: str | None = None,
    per_request: bool = True,
    requests_csv: str | os.PathLike[str] | None = None,
    vllm_config: str | dict[str, Any] | None = None,
    protocol: str = "prefix",
    fused: bool | None = None,
    progress: Callable[[int], None] | None = None,
    **options: Any,
) -> Result:
    """Cache-mode replay (``protocol="object"``: every chunk key is a get, see
    :mod:`kvsim.replay.object_protocol`). Keywords are :class:`kvsim.config.OffloadOptions`
    fields, e.g. ``replay(path, cpu_gib=64, model="llama-3.1-8b", policy="arc", gpu_blocks=2000)``.
    ``fused=False`` runs ``lru`` and ``arc`` through the full manager protocol instead of their
    fused tiers (same decisions, slower); see :class:`kvsim.replay.CacheReplay`.

    Returns a Result whose ``summary`` holds the totals and ratios and whose ``requests``
    table has one row per request (when ``per_request``). ``requests_csv`` streams the same
    rows to a CSV file instead (written whole or not at all), so memory stays bounded by the
    cache state. ``progress(n)`` is called as requests are replayed.
    """
    tr = as_trace(trace, fmt=fmt, block_tokens=options.get("block_tokens"), limit=limit)
    extra = vllm_extra(vllm_config)
    if extra is not None:
        refuse_engine_knobs_in_cache_mode(extra)
    config = make_options(extra, **options).resolve(tr.block_tokens)
    requests: Iterable[Request] = tr if progress is None else _counted(tr, progress)
    if protocol != "prefix":
        if requests_csv is not None:
            raise InputError("--requests-csv is for --protocol prefix only")
        return Result(
            summary={"trace": str(tr.path), **replay_config(requests, config, protocol)},
            tables={},
            config=config.as_dict(),
        )
    # the trace is read for its future only by policies that need it
    run = CacheReplay(config, requests_for_future=tr, fused=fused)
    tables = {}
    if requests_csv is not None:
        with atomic_write(requests_csv, newline="") as f:
            writer = csv.writer(f)
            writer.writerow(REQUEST_COLUMNS)
            summary = run.run(requests, writer.writerow)
    elif per_request:
        import pandas as pd

        rows: list[tuple[Any, ...]] = []
        summary = run.run(requests, rows.append)
        tables["requests"] = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
    else:
        summary = run.run(requests)
    return Result(
        summary={"trace": str(tr.path), **summary}, tables=tables, config=config.as_dict()
    )


def mrc(
    trace: TraceLike,
    *,
    policy: str = "lru",
    protocol: str = "prefix",
    sample_rate: float = 1.0,
    seed: int = 0,
    limit: int | None = None,
    fmt: str | None = None,
    block_tokens: int | None = None,
    chunk_tokens: int | None = None,
    points: int = 200,
) -> MRC:
    """The hit ratio at every CPU capacity in one pass (LRU stack distances; see
    :mod:`kvsim.replay.mrc`); ``sample_rate < 1`` samples keys spatially (SHARDS)."""
    from kvsim.keys import KeyLayout
    from kvsim.replay.mrc import lru_mrc

    if policy.lower() != "lru":
        raise InputError(
            f"--policy: a one-pass curve needs a stack policy; only lru has one "
            f"(got {policy!r}); sweep capacities with kvsim replay for others"
        )
    tr = as_trace(trace, fmt=fmt, block_tokens=block_tokens, limit=limit)
    bt = block_tokens or tr.block_tokens
    layout = KeyLayout(bt, chunk_tokens or bt)
    return lru_mrc(tr, layout, protocol=protocol, sample_rate=sample_rate, seed=seed, points=points)


def in_arrival_order(tr: Trace) -> Trace:
    """``tr`` with its requests in arrival order, for the timed engine.

    The engine admits requests as it reads them; one stamped earlier than a request before
    it would be measured from a time the engine has already passed (a TTFT of hours for one
    Azure row a day early). A trace in order is streamed as it is (one extra pass reads the
    timestamps); otherwise it is sorted stably, with a warning saying how many moved.
    """
    late = 0
    latest = -math.inf
    for req in tr:
        if req.arrival_s < latest:
            late += 1
        else:
            latest = req.arrival_s
    if not late:
        return tr
    warnings.warn(
        f"{tr.path}: {late:,} request(s) arrive earlier than a request before them; "
        "the timed run sorts the trace by arrival time (stable)",
        InputWarning,
        stacklevel=3,
    )
    ordered = sorted(tr, key=lambda r: r.arrival_s)
    return Trace.from_requests(ordered, tr.block_tokens, name=str(tr.path))


def simulate(
    trace: TraceLike,
    *,
    gpu: str = "h200",
    model: str | None = None,
    cpu_gib: float | None = None,
    cpu_chunks: int | None = None,
    policy: str | None = None,
    baseline: bool = False,
    seed: int = 0,
    limit: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    long_prefill_token_threshold: int = 0,
    gpu_kv_blocks: int | None = None,
    gpu_memory_utilization: float = 0.92,
    enable_prefix_caching: bool = True,
    offload_prompt_only: bool | None = None,
    sync_load_budget_bytes: int | None = None,
    async_scheduling: bool = True,
    time_scale: float = 1.0,
    poisson_rate: float | None = None,
    link: str | os.PathLike[str] | None = None,
    compute_profile: str | os.PathLike[str] | None = None,
    tp: int | None = None,
    record_steps: bool = True,
    vllm_config: str | dict[str, Any] | None = None,
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

    ``max_num_batched_tokens`` and ``max_num_seqs`` default to what ``vllm serve`` picks on
    ``gpu`` (:func:`kvsim.hardware.vllm_batch_defaults`). ``async_scheduling`` (default
    True, as vLLM 0.33) schedules the next step while the current forward runs;
    ``False`` models vLLM's synchronous loop (``--no-async-scheduling``).

    Returns a Result with tables ``requests``, ``transfers``, ``steps`` and a flat summary.
    """
    # The timed engine loads on first use, so `import kvsim` and the CLI stay quick.
    from kvsim.engine.compute_model import ComputeParams, LinearCompute, load_compute_profile
    from kvsim.engine.engine import Engine
    from kvsim.engine.params import EngineParams
    from kvsim.engine.summary import summarize
    from kvsim.engine.transfer_model import get_link
    from kvsim.hardware import get_gpu, vllm_batch_defaults
    from kvsim.models import get_model

    model = model or "llama-3.1-8b"
    if "gpu_blocks" in options:  # the CLI's name for the GPU KV capacity, here too
        if gpu_kv_blocks is not None:
            raise InputError("give gpu_blocks or gpu_kv_blocks, not both (the same capacity)")
        gpu_kv_blocks = options.pop("gpu_blocks")
    tr = in_arrival_order(as_trace(trace, block_tokens=options.get("block_tokens"), limit=limit))
    sized = cpu_gib is not None or cpu_chunks is not None or vllm_config is not None
    extra = vllm_extra(vllm_config)
    knobs = engine_knobs_from_vllm_config(extra) if extra is not None else {}
    if offload_prompt_only is None:  # an explicit argument wins over --vllm-config
        offload_prompt_only = knobs.get("offload_prompt_only", True)
    if sync_load_budget_bytes is None:
        sync_load_budget_bytes = knobs.get("sync_load_budget_bytes", 0)
    opts = make_options(
        extra,
        model=model,
        cpu_gib=cpu_gib,
        cpu_chunks=cpu_chunks if sized else 1,
        policy=policy,
        seed=seed,
        tp=tp,
        **options,
    )
    config = opts.resolve(tr.block_tokens)
    # every name resolves here, once: the engine takes the spec objects
    model_spec = get_model(model)
    gpu_spec = get_gpu(gpu)
    default_tokens, default_seqs = vllm_batch_defaults(gpu_spec)
    params = EngineParams(
        max_num_batched_tokens=max_num_batched_tokens or default_tokens,
        max_num_seqs=max_num_seqs or default_seqs,
        long_prefill_token_threshold=long_prefill_token_threshold,
        gpu_blocks=gpu_kv_blocks,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_prefix_caching=enable_prefix_caching,
        offload_prompt_only=offload_prompt_only,
        sync_load_budget_bytes=sync_load_budget_bytes,
        gpu_block_tokens=opts.gpu_block_tokens,
        async_scheduling=async_scheduling,
        tp=opts.tp,
        time_scale=time_scale,
        poisson_rate=poisson_rate,
        seed=seed,
        record_steps=record_steps,
    )
    transfer = get_link(link) if link else get_link(gpu_spec.link)
    compute_params = ComputeParams.for_gpu(gpu_spec)
    linear: LinearCompute | None = None
    if compute_profile is not None:
        loaded = load_compute_profile(compute_profile, compute_params)
        if isinstance(loaded, LinearCompute):
            linear = loaded
        else:
            compute_params = loaded
    future = tr if sized else None  # read only by policies that need the future

    def run(offload: bool) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
        engine = Engine(
            config,
            params,
            model=model_spec,
            gpu=gpu_spec,
            compute=linear,
            compute_params=compute_params,
            transfer=transfer,
            offload=offload,
            requests_for_future=future if offload else None,
            progress=progress,
        ).run(tr)
        rec = engine.recorder
        tables = {
            "requests": rec.request_table(),
            "transfers": rec.transfer_table(),
            "steps": rec.step_table(),
        }
        return summarize(engine, tables["requests"], tables["transfers"]), tables

    summary, tables = run(offload=sized)
    summary = {
        "trace": str(tr.path),
        "gpu": gpu_spec.name,
        "model": model,
        "link": transfer.link,
        **summary,
    }
    if baseline:
        base_summary, base_tables = run(offload=False)
        summary.update({BASELINE_PREFIX + k: v for k, v in base_summary.items()})
        tables[BASELINE_PREFIX + "requests"] = base_tables["requests"]
        tables[BASELINE_PREFIX + "steps"] = base_tables["steps"]
    config_out = {
        **config.as_dict(),
        **params.as_dict(),
        "gpu": gpu_spec.name,
        "link": transfer.to_dict(),
        "compute": dataclasses.asdict(linear) if linear else compute_params.__dict__,
        "offload": sized,
    }
    return Result(summary=summary, tables=tables, config=config_out)
