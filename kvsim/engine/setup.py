"""A timed run's composition: the user's options become the objects the engine takes, here
and only here (the model, the GPU, the link, the compute model, the engine's knobs, the CPU
tier's configuration). The engine itself never looks a name up.

:func:`compose` does the resolving; :func:`run_engine` runs one pass (with or without
offloading) and returns its summary and tables, which ``kvsim.simulate`` puts side by side.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.core.errors import EngineStalled, InputError, InputWarning, named
from kvsim.engine.compute_model import (
    ComputeParams,
    ComputeProfile,
    PhaseProfile,
    StepBatch,
    default_compute_profile,
    load_compute_profile,
    make_compute,
)
from kvsim.engine.engine import Engine
from kvsim.engine.stage_report import stage_table
from kvsim.engine.summary import summarize
from kvsim.engine.tier_report import add_tier_outputs
from kvsim.engine.transfer_model import TransferModelParams, get_link
from kvsim.options.engine import EngineParams
from kvsim.options.offload import CacheConfig, OffloadOptions
from kvsim.options.runs import SimulateOptions
from kvsim.options.vllm import KVConnectorExtraConfig, engine_knobs_from_vllm_config
from kvsim.report.serve_metrics import BenchSettings
from kvsim.specs.context import (
    check_long_prefill_threshold,
    vllm_max_model_len,
    vllm_step_limits,
)
from kvsim.specs.hardware import GpuSpec, get_gpu
from kvsim.specs.models import ModelSpec
from kvsim.tiering.store import TierStore
from kvsim.traces.model import Request, Trace, late_arrivals
from kvsim.workloads import ClientSource, Workload

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "TimedSetup",
    "compose",
    "engine_outputs",
    "in_arrival_order",
    "make_engine",
    "run_engine",
    "timed_tiers",
]


@dataclass(frozen=True)
class TimedSetup:
    """Everything one timed run is made of, resolved: what :class:`Engine` takes."""

    config: CacheConfig
    params: EngineParams
    model: ModelSpec
    gpu: GpuSpec
    link: TransferModelParams
    profile: ComputeProfile
    compute: Callable[[StepBatch], float]
    offload: bool  # the run has a CPU tier (a size was given)

    def describe(self) -> dict[str, Any]:
        """What the run's ``config.json`` records of the setup."""
        from kvsim.engine.compute_model import describe_compute

        return {
            **self.config.as_dict(),
            **self.params.as_dict(),
            "gpu": self.gpu.name,
            "link": self.link.to_dict(),
            "compute": describe_compute(self.profile),
            "offload": self.offload,
        }


def compose(
    offload: OffloadOptions,
    timed: SimulateOptions,
    extra: KVConnectorExtraConfig | None,
    trace_block_tokens: int,
    sized: bool,
) -> TimedSetup:
    """Resolve a run's options, once: names (model, GPU, link, compute profile) become
    spec objects, the engine's knobs take the GPU's and ``--vllm-config``'s defaults where
    the user gave none.

    Args:
        offload: the CPU tier's options (with ``vllm_config``'s already applied).
        timed: ``simulate()``'s own options.
        extra: ``vllm_config``'s checked ``kv_connector_extra_config``, if any.
        trace_block_tokens: the trace's hash-block size.
        sized: whether the user sized a CPU tier (else the run has no offloading).
    """
    config = timed_tiers(offload.resolve(trace_block_tokens), timed.tier_load_rule, sized)
    model = config.model_spec
    if model is None:
        raise InputError("simulate needs --model: the engine sizes KV blocks and compute by it")
    gpu = named("--gpu", get_gpu, timed.gpu)
    knobs = engine_knobs_from_vllm_config(extra) if extra is not None else {}
    max_model_len = vllm_max_model_len(model, timed.max_model_len, "--max-model-len")
    budget, max_num_seqs = vllm_step_limits(
        gpu,
        max_model_len,
        bool(timed.max_model_len),
        timed.enable_chunked_prefill,
        (timed.max_num_batched_tokens, timed.max_num_seqs),
        (
            _or_default("--max-num-batched-tokens", timed.max_num_batched_tokens),
            "--max-num-seqs",
            "--max-model-len",
        ),
    )
    check_long_prefill_threshold(
        timed.long_prefill_token_threshold,
        max_model_len,
        ("--long-prefill-token-threshold", _or_default("--max-model-len", timed.max_model_len)),
    )
    params = EngineParams(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        long_prefill_token_threshold=timed.long_prefill_token_threshold,
        max_model_len=timed.max_model_len,
        refuse_past_max_model_len=timed.refuse_past_max_model_len,
        gpu_blocks=timed.gpu_kv_blocks,
        gpu_memory_utilization=timed.gpu_memory_utilization,
        enable_prefix_caching=timed.enable_prefix_caching,
        enable_chunked_prefill=timed.enable_chunked_prefill,
        offload_prompt_only=_given_or(timed.offload_prompt_only, knobs, "offload_prompt_only"),
        sync_load_budget_bytes=_given_or(
            timed.sync_load_budget_bytes, knobs, "sync_load_budget_bytes"
        ),
        gpu_block_tokens=offload.gpu_block_tokens,
        async_scheduling=timed.async_scheduling,
        tp=offload.tp,
        time_scale=timed.time_scale,
        poisson_rate=timed.poisson_rate,
        seed=offload.seed,
        record_steps=timed.record_steps,
    )
    link = get_link(timed.link or gpu.link)
    profile = _compute_profile(timed.compute_profile, gpu)
    compute = make_compute(model, profile, offload.tp)
    return TimedSetup(config, params, model, gpu, link, profile, compute, sized)


def _given_or(value: Any, knobs: dict[str, Any], key: str) -> Any:
    """An explicit argument, else ``--vllm-config``'s knob, else the engine's default."""
    if value is not None:
        return value
    return knobs.get(key, getattr(_ENGINE_DEFAULTS, key))


_ENGINE_DEFAULTS = EngineParams()


def _compute_profile(path: str | None, gpu: GpuSpec) -> ComputeProfile:
    """The step-time model: a profile file, else the per-phase one shipped for H100/H200,
    else the GPU's roofline."""
    if path is None:
        return default_compute_profile(gpu)
    profile = load_compute_profile(path, ComputeParams.for_gpu(gpu))
    if isinstance(profile, PhaseProfile) and profile.gpu != gpu.name:
        warnings.warn(
            f"{path}: a profile for {profile.gpu} on --gpu {gpu.name}: its numbers are used "
            "as they are",
            InputWarning,
            stacklevel=4,
        )
    return profile


def run_engine(
    setup: TimedSetup,
    tr: Trace | Workload,
    offload: bool,
    bench: BenchSettings,
    record_tokens: bool = False,
    progress: Callable[[int], None] | None = None,
    stages: Sequence[int] | None = None,
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """One pass of ``tr`` (a trace, or a benchmark workload whose client runs in the loop)
    through a new engine, with (``offload``) or without the CPU tier; returns its summary
    and its tables (requests, transfers, steps, tokens; ``stages``, every metric per load
    stage, for a workload or when ``stages`` gives each trace request's stage).

    Raises :class:`EngineStalled` when the engine stalls, with ``partial`` set to the summary
    (its ``stalled`` field the message) and tables of what was simulated until then."""
    future: Trace | None = None  # read only by policies that need it
    if offload:
        future = tr if isinstance(tr, Trace) else None if tr.closed else tr.trace()
    source: ClientSource | None = None
    arrivals: Trace | ClientSource
    if isinstance(tr, Workload):
        arrivals = source = tr.source()
    else:
        arrivals = tr
    engine = make_engine(setup, offload, future, progress)
    stalled: EngineStalled | None = None
    try:
        engine.run(arrivals)
    except EngineStalled as exc:
        stalled = exc
    if source is not None:
        stages = source.stage_of
    closed = isinstance(tr, Workload) and tr.load.type == "concurrency"
    return engine_outputs(engine, bench, record_tokens, stages, closed, stalled)


def make_engine(
    setup: TimedSetup,
    offload: bool,
    future: Iterable[Request] | None,
    progress: Callable[[int], None] | None = None,
    config: CacheConfig | None = None,
    tier_stores: Mapping[int, TierStore] | None = None,
) -> Engine:
    """A new engine of ``setup`` (``config``: another CPU tier configuration, a fleet's
    with its shared tier; ``tier_stores``: that tier's shared store); ``future``: the
    requests whose future a policy may read."""
    return Engine(
        config or setup.config,
        setup.params,
        model=setup.model,
        gpu=setup.gpu,
        compute=setup.compute,
        transfer=setup.link,
        offload=offload,
        requests_for_future=future,
        progress=progress,
        tier_stores=tier_stores,
    )


def engine_outputs(
    engine: Engine,
    bench: BenchSettings,
    record_tokens: bool = False,
    stages: Sequence[int] | None = None,
    closed: bool = False,
    stalled: EngineStalled | None = None,
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """A finished (or ``stalled``) engine's summary and tables (requests, transfers, steps,
    tokens, every metric per load stage when ``stages`` gives each request's, and the
    secondary tiers' columns, table and keys); ``closed``: the load was a closed loop of
    clients. A stall is raised again, after its ``partial`` is set to what ran."""
    rec = engine.recorder
    tables = {
        "requests": rec.request_table(),
        "transfers": rec.transfer_table(),
        "steps": rec.step_table(),
    }
    if record_tokens:
        tables["tokens"] = rec.token_table()
    if stages is not None:
        requests = tables["requests"]
        requests["stage"] = np.asarray(stages, dtype=np.int64)[requests["request"].to_numpy()]
        tables["stages"] = stage_table(requests, rec, requests["stage"].to_numpy(), bench)
    reqs = tables["requests"]
    if stalled is not None:  # the summary covers the requests that ended (finished or rejected)
        reqs = reqs[reqs["rejected"] | reqs["finish_s"].notna()]
    summary = summarize(engine, reqs, tables["transfers"], bench, closed)
    if engine.tiers is not None:
        add_tier_outputs(engine.tiers, tables, summary, engine.config.chunk_tokens)
    if stalled is not None:
        summary["stalled"] = str(stalled)
        summary["unfinished_requests"] = len(tables["requests"]) - len(reqs)
        stalled.partial = (summary, tables)
        raise stalled
    return summary, tables


def in_arrival_order(tr: Trace) -> tuple[Trace, int]:
    """``tr`` with its requests in arrival order, for the timed engine, and their number.

    The engine admits requests as it reads them; one stamped earlier than a request before
    it would be measured from a time the engine has already passed (a TTFT of hours for one
    Azure row a day early). A trace in order is streamed as it is (one extra pass reads the
    timestamps); otherwise it is sorted stably, with a warning saying how many moved.
    """
    late, count = late_arrivals(req.arrival_s for req in tr)
    if not late:
        return tr, count
    warnings.warn(
        f"{tr.path}: {late:,} request(s) arrive earlier than a request before them; "
        "the timed run sorts the trace by arrival time (stable)",
        InputWarning,
        stacklevel=3,
    )
    ordered = sorted(tr, key=lambda r: r.arrival_s)
    return Trace.from_requests(ordered, tr.block_tokens, name=str(tr.path)), count


def timed_tiers(config: CacheConfig, rule: str | None, sized: bool) -> CacheConfig:
    """``config`` with every secondary tier under load rule ``rule`` (None: as given);
    tiers need a CPU tier (``sized``) in front of them."""
    if config.secondary_tiers and not sized:
        raise InputError("secondary tiers sit behind the CPU tier: give it a size (--cpu-gib)")
    if rule is None:
        return config
    if not config.secondary_tiers:
        raise InputError("--tier-load-rule needs secondary tiers (--tier or secondary_tiers)")
    value = None if rule == "off" else rule
    tiers = tuple(dataclasses.replace(t, load_rule=value) for t in config.secondary_tiers)
    return dataclasses.replace(config, secondary_tiers=tiers)


def _or_default(option: str, given: object) -> str:
    """``option`` as an error names it: itself where the user gave it, else its default."""
    return option if given is not None else f"the default {option}"
