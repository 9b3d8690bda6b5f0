"""The Python API: one call per job, returning :class:`kvsim.report.result.Result` values.

The command line calls these functions too, so a run from a notebook and a run from the
shell go through the same code.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import inspect
import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from kvsim.cachemode.run import replay_trace, request_total
from kvsim.core.errors import EngineStalled, InputError, InputWarning, did_you_mean
from kvsim.core.numeric import is_whole
from kvsim.options.fleet import FLEET_FIELDS, FleetOptions
from kvsim.options.offload import DEFAULT_MODEL, OFFLOAD_FIELDS, OffloadOptions
from kvsim.options.runs import (
    REPLAY_FIELDS,
    SIMULATE_FIELDS,
    ReplayOptions,
    SimulateOptions,
    check_simulate_together,
)
from kvsim.options.vllm import (
    KVConnectorExtraConfig,
    extra_config,
    load_vllm_config,
    options_from_vllm_config,
    refuse_engine_knobs_in_cache_mode,
)
from kvsim.policies.registry import eviction_policy_class
from kvsim.report.progress import Progress, ProgressArg
from kvsim.report.result import Result
from kvsim.traces import Trace, as_trace, requests_frame

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.cachemode.mrc import MRC
    from kvsim.traces.coerce import TraceLike
    from kvsim.workloads import Workload

__all__ = [
    "bundled_trace",
    "generate",
    "make_options",
    "mrc",
    "replay",
    "requests_frame",
    "simulate",
]

#: summary keys of a ``simulate(..., baseline=True)`` run's offload-free twin start with this
BASELINE_PREFIX = Result.BASELINE_PREFIX


#: the trace shipped inside the package (``kvsim/data``): Mooncake's FAST'25 conversation trace
BUNDLED_TRACE = "mooncake_fast25_conversation_trace.jsonl.gz"


def bundled_trace() -> str:
    """The path of the trace shipped inside the package, Mooncake's FAST'25 conversation
    trace (12,031 requests, the file ``traces/`` holds, gzipped), found through
    :mod:`importlib.resources`: examples and notebooks run after ``pip install``, without a
    checkout."""
    from importlib.resources import files

    return str(files("kvsim") / "data" / BUNDLED_TRACE)


def generate(kind: str, n_requests: int = 1000, seed: int = 0, **knobs: Any) -> pd.DataFrame:
    """A synthetic workload as a DataFrame (see ``kvsim.traces.synthetic`` for kinds and knobs;
    ``progress=True`` shows a bar); pass it to ``replay`` / ``simulate`` as the trace."""
    from kvsim.traces.synthetic import generate as generate_requests

    requests = generate_requests(kind, n_requests=n_requests, seed=seed, **knobs)
    return requests_frame(requests, int(knobs.get("block_tokens", 512)))  # checked by now


VllmConfig = str | dict[str, Any] | KVConnectorExtraConfig


def vllm_extra(vllm_config: VllmConfig | None) -> KVConnectorExtraConfig | None:
    """A ``kv_connector_extra_config`` given inline, as a dict (or a whole
    ``kv_transfer_config``), as a file, or already checked."""
    if vllm_config is None:
        return None
    if isinstance(vllm_config, str):
        return load_vllm_config(vllm_config)
    return extra_config(vllm_config, "vllm_config")


def make_options(vllm_config: VllmConfig | None = None, **options: Any) -> OffloadOptions:
    """Options from keywords, on top of a vLLM ``kv_connector_extra_config`` if given; an
    unknown keyword is an error, not ignored."""
    for name in options:
        if name not in OFFLOAD_FIELDS:
            raise InputError(f"unknown option {name!r}" + did_you_mean(name, OFFLOAD_FIELDS))
    block = options.get("gpu_block_tokens")  # the vLLM config's chunk is counted in these
    base = OffloadOptions() if block is None else OffloadOptions(gpu_block_tokens=block)
    extra = vllm_extra(vllm_config)
    explicit = {k: v for k, v in options.items() if v is not None}
    if extra is not None:
        base = options_from_vllm_config(extra, base)
        if "policy" not in explicit and base.policy_module is None and ":" not in base.policy:
            # a bare name resolves without importing anything: checked here, an unknown one
            # names the key it came from, not --policy (a module's class is checked at use)
            eviction_policy_class(base.policy, option="--vllm-config: eviction_policy")
    if "cpu_chunks" in explicit or "cpu_gib" in explicit:
        base = base.with_(cpu_bytes=None)
    return base.with_(**explicit)


P = ParamSpec("P")
R = TypeVar("R")


def named_options(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with its explicit signature (``help()`` and IDEs show it) and an unknown keyword
    reported as bad input, an :class:`InputError` naming it and the closest option, not
    Python's bare ``TypeError``."""
    params = inspect.signature(fn).parameters.values()
    by_name = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    known = sorted(p.name for p in params if p.kind in by_name)
    positional = sum(
        p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in params
    )

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        if len(args) > positional:
            raise InputError(
                f"{fn.__name__}(): options are given by name ({fn.__name__}(trace, "
                f"cpu_gib=64), not {fn.__name__}(trace, 64)); got {len(args)} positional "
                f"arguments, {positional} expected"
            )
        for name in kwargs:
            if name not in known:
                raise InputError(
                    f"{fn.__name__}(): unknown option {name!r}{did_you_mean(name, known)}; "
                    f"see help(kvsim.{fn.__name__})"
                )
        return fn(*args, **kwargs)

    return checked


@named_options
def replay(
    trace: TraceLike,
    *,
    cpu_gib: float | None = None,
    cpu_chunks: int | None = None,
    cpu_bytes: int | None = None,
    model: str = DEFAULT_MODEL,
    policy: str | None = None,
    policy_module: str | None = None,
    admission: str = "always",
    store_threshold: int | None = None,
    max_tracker_size: int | None = None,
    block_tokens: int | None = None,
    chunk_tokens: int | None = None,
    gpu_block_tokens: int = 16,
    gpu_blocks: int = 0,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    seed: int = 0,
    prefill_chunk_tokens: int | None = None,
    vllm_config: VllmConfig | None = None,
    secondary_tiers: list[dict[str, Any]] | None = None,
    protocol: str = "prefix",
    fused: bool | None = None,
    limit: int | None = None,
    fmt: str | None = None,
    per_request: bool = True,
    requests_csv: str | os.PathLike[str] | None = None,
    instances: int | None = None,
    router: str | None = None,
    router_staleness_ms: float | None = None,
    router_prefix_weight: float | None = None,
    router_queue_weight: float | None = None,
    router_kv_weight: float | None = None,
    router_window_s: float | None = None,
    shared_tier: str | None = None,
    shared_tier_capacity: str | None = None,
    shared_tier_eviction: str | None = None,
    shared_tier_link: str | None = None,
    progress: ProgressArg = None,
) -> Result:
    """Cache-mode replay of ``trace``: requests one at a time in trace order, no timing.

    ``trace`` is a file path (Mooncake, Bailian, Azure or native JSONL/CSV, ``.gz`` too), a
    :class:`kvsim.Trace`, a list of :class:`kvsim.Request` or a requests DataFrame (as
    :func:`kvsim.generate` returns). For example
    ``replay(path, cpu_gib=64, model="llama-3.1-8b", policy="arc", gpu_blocks=2000)``.

    The CPU tier (give one size; ``vllm_config`` can give it too):

    - ``cpu_gib``: size in GiB (vLLM ``cpu_bytes_to_use / 2**30``), sized for ``model``;
    - ``cpu_chunks``: size in chunks; ``cpu_bytes``: size in bytes;
    - ``model``: model preset for KV bytes per token (``kvsim models``), default llama-3.1-8b,
      or the path of a Hugging Face ``config.json`` (or its folder);
    - ``tp``: tensor-parallel world size for sizing (default 1);
    - ``kv_cache_dtype``: vLLM's ``--kv-cache-dtype`` (default ``auto``: the model's dtype;
      ``fp8`` halves the KV bytes per token, so the same GiB hold twice the chunks);
    - ``policy``: eviction policy, ``lru`` (default), ``arc``, ... (``kvsim policies``) or
      ``module:Class``; ``policy_module``: the module vLLM loads a policy from;
    - ``admission``: admission policy (default ``always``); ``store_threshold``: offers
      before a chunk is stored (vLLM's, default 0: every chunk; >= 2 enables);
      ``max_tracker_size``: entries of the threshold's counter table (default 64000);
    - ``block_tokens``: tokens per trace hash block (default: the trace format's, 512 for
      Mooncake); ``chunk_tokens``: tokens per CPU chunk (default one trace block);
      ``gpu_block_tokens``: vLLM's GPU block size (default 16), which sizes CPU chunks;
    - ``gpu_blocks``: GPU prefix-cache size in key-unit blocks (default 0: none);
    - ``seed``: for randomised policies (default 0);
    - ``prefill_chunk_tokens``: chunked prefill, tokens per step (default: the whole prompt);
    - ``vllm_config``: vLLM's ``kv_connector_extra_config`` as a dict, inline JSON or a file;
      the keywords above that are given win over it;
    - ``secondary_tiers``: tiers behind the CPU tier, as vLLM's ``TieringOffloadingSpec``
      ``secondary_tiers`` (e.g. ``[{"type": "fs"}]``, see :mod:`kvsim.options.tiers`); wins over
      those of ``vllm_config``.

    The run:

    - ``protocol``: ``prefix`` (vLLM's connector, default) or ``object`` (every chunk key is a
      get, see :mod:`kvsim.cachemode.object_protocol`);
    - ``fused``: ``False`` runs ``lru`` and ``arc`` through the full manager protocol instead
      of their fused tiers (same decisions, slower; see :class:`kvsim.cachemode.CacheReplay`);
    - ``limit``: replay only the first N requests; ``fmt``: the trace format (default:
      detected from the file);
    - ``per_request``: keep the ``requests`` table (one row per request; default True);
      ``requests_csv``: stream those rows to a CSV file instead (written whole or not at
      all), so memory stays bounded by the cache state;
    - ``progress``: ``True`` shows a bar counting requests (a widget in a notebook, lines
      in a log file); a callable is called as ``progress(n)`` as requests are replayed.

    A fleet (any of these given; docs/fleets.md): ``instances`` replays behind ``router``
    (``round-robin``, ``random``, ``least-loaded``, ``session``, ``prefix-aware`` or a
    ``module:Class`` plugin; ``router_staleness_ms``, ``router_prefix_weight``,
    ``router_queue_weight``, ``router_kv_weight``, ``router_window_s``), each with the CPU
    tier above, and optionally ``shared_tier`` (``pool`` or ``fs``; ``shared_tier_capacity``,
    ``shared_tier_eviction``, ``shared_tier_link``) behind them all. The summary keeps every
    key above for the fleet as a whole; tables ``requests`` (with ``instance``) and
    ``instances``.

    An unknown keyword or a bad value is an :class:`kvsim.InputError` naming it. Returns a
    :class:`kvsim.Result` whose ``summary`` holds the totals and ratios and whose
    ``requests`` table has one row per request.
    """
    given = dict(locals())  # the keywords as called: nothing else is local yet
    run = ReplayOptions(**_pick(given, REPLAY_FIELDS))
    tr = as_trace(trace, fmt=run.fmt, block_tokens=block_tokens, limit=run.limit)
    extra = vllm_extra(run.vllm_config)
    if extra is not None:
        refuse_engine_knobs_in_cache_mode(extra)
    config = make_options(extra, **_pick(given, OFFLOAD_FIELDS)).resolve(tr.block_tokens)
    fleet = fleet_options(given, timed=False)
    with Progress(progress, request_total(tr) if progress is True else None, "replaying") as bar:
        if fleet is not None:
            from kvsim.fleet.cache_fleet import replay_fleet

            if run.protocol != "prefix" or run.requests_csv is not None:
                raise InputError("a fleet replays with --protocol prefix, without --requests-csv")
            return replay_fleet(
                tr,
                config,
                fleet,
                fused=run.fused,
                per_request=run.per_request,
                progress=bar.callback,
            )
        return replay_trace(tr, config, run, bar.callback)


def fleet_options(given: Mapping[str, Any], *, timed: bool) -> FleetOptions | None:
    """The fleet a job's keywords ask for, or None (no fleet keyword given: one engine);
    options the run in this mode never reads are named in one warning."""
    picked = {k: v for k, v in _pick(given, FLEET_FIELDS).items() if v is not None}
    if not picked:
        return None
    fleet = FleetOptions(**picked)
    unread = fleet.unread(timed)
    if unread:
        warnings.warn(
            "given, but the run never reads them, so they change nothing: " + "; ".join(unread),
            InputWarning,
            stacklevel=3,
        )
    return fleet


def _pick(given: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The keywords of ``given`` that ``names`` lists (one structure's fields), paths as
    text."""
    return {
        name: os.fspath(given[name]) if isinstance(given[name], os.PathLike) else given[name]
        for name in names
        if name in given
    }


def mrc(
    trace: TraceLike,
    *,
    policy: str = "lru",
    protocol: str = "prefix",
    sample_rate: float | None = None,
    seed: int = 0,
    seeds: int = 1,
    limit: int | None = None,
    fmt: str | None = None,
    block_tokens: int | None = None,
    chunk_tokens: int | None = None,
    points: int = 200,
    model: str | None = None,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    gpu_block_tokens: int = 16,
    cpu_gib: Iterable[float] | float | None = None,
    progress: ProgressArg = None,
) -> MRC:
    """The hit ratio at every CPU capacity: for ``lru`` in one pass (stack distances, exact
    at ``sample_rate`` 1, the default; see :mod:`kvsim.cachemode.mrc`), for any other policy by
    miniature simulation (replays of a trace sampled at ``sample_rate``, default 0.1, on
    caches scaled alike, corrected by LRU's error on the same sample; at most 24
    capacities; see :mod:`kvsim.cachemode.miniature`). ``seeds`` > 1 averages that many
    miniatures sampled from ``seed`` on (the sampling error falls as their square root; the
    time grows with them): worth it on a small trace, whose sample is a large share of it.
    ``progress`` (True: a bar; a callable: ``progress(n)``) counts a miniature's replays.

    The table's capacities are in chunks (``capacity``) and tokens (``capacity_tokens``);
    with a ``model`` (a preset or a ``config.json`` path, sized at ``tp`` with
    ``kv_cache_dtype`` and ``gpu_block_tokens`` as :func:`replay` sizes it) also in GiB
    (``cpu_gib``: what ``--cpu-gib`` must be for that many chunks). ``curve.ceiling`` is the
    infinite cache's hit ratio and ``curve.reach()`` the capacity that reaches 50 / 90 / 99 %
    of it. ``cpu_gib`` (needs ``model``) evaluates the curve at those sizes into
    ``curve.points``: each is ``replay(..., cpu_gib=x, policy="lru")``'s CPU hit ratio.
    """
    from kvsim.cachemode.miniature import miniature_mrc
    from kvsim.cachemode.mrc import at_sizes, in_capacity_units, labelled, lru_mrc
    from kvsim.specs.sizing import refuse_sizing_without_model, row_bytes

    ReplayOptions(limit=limit)  # the one rule for --limit (at least one request)
    tr = as_trace(trace, fmt=fmt, block_tokens=block_tokens, limit=limit)
    sizing = OffloadOptions(
        cpu_chunks=1,
        model=model,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        block_tokens=block_tokens,
        chunk_tokens=chunk_tokens,
        gpu_block_tokens=gpu_block_tokens,
    )
    config = sizing.resolve(tr.block_tokens)  # the replay's chunk, and its bytes
    asked = _sizes_gib(cpu_gib)
    if asked and model is None:
        raise InputError("--cpu-gib needs --model to know the bytes per chunk")
    refuse_sizing_without_model(model, tp, kv_cache_dtype, gpu_block_tokens)

    def chunks_at(gib: float) -> int:  # the model resolved once, above
        again = sizing.with_(cpu_chunks=None, cpu_gib=gib)
        return again.resolve(tr.block_tokens, config.model_spec).num_chunks

    asked_chunks = [chunks_at(x) for x in asked or ()]
    if not is_whole(points) or points < 2:
        raise InputError(f"--points must be a whole number >= 2, got {points!r}")
    if seeds < 1:
        raise InputError(f"--seeds must be at least 1, got {seeds}")
    if policy.lower() == "lru":
        if seeds != 1:
            raise InputError("--seeds averages miniatures; lru's curve is one exact pass")
        rate = 1.0 if sample_rate is None else sample_rate
        curve = lru_mrc(
            tr, config.layout, protocol=protocol, sample_rate=rate, seed=seed, points=points
        )
    else:  # no stack: replay miniatures of the sampled trace (kvsim.cachemode.miniature)
        with Progress(progress, None, f"mrc {policy}", unit="replay") as bar:
            curve = miniature_mrc(
                tr,
                dataclasses.replace(config, policy=policy),
                sample_rate=0.1 if sample_rate is None else sample_rate,
                seed=seed,
                seeds=seeds,
                protocol=protocol,
                points=min(points, 24),
                # a tier larger than any trace's distinct chunks holds them all: replayed
                # at that size (--cpu-gib 1e19 is 1.6e20 chunks, past the table's int64)
                extra=[min(c, 2**40) for c in asked_chunks],
                progress=bar.callback,
            )
    row = None if config.chunk_bytes is None else row_bytes(config.chunk_bytes)
    curve = in_capacity_units(
        curve, config.chunk_tokens, row, model=model, kv_cache_dtype=config.kv_cache_dtype
    )
    curve = labelled(curve, str(curve.info.get("policy", "lru")))
    if asked:
        curve.points = at_sizes(curve, asked, chunks_at)
    return curve


def _sizes_gib(cpu_gib: Iterable[float] | float | None) -> list[float] | None:
    """``mrc``'s ``cpu_gib``: one size or several, each a number (a string is not a list
    of sizes, though it iterates)."""
    if cpu_gib is None:
        return None
    values: Any = [cpu_gib] if isinstance(cpu_gib, numbers.Real) else cpu_gib
    try:
        if isinstance(values, (str, bytes)):
            raise TypeError
        sizes = list(values)
        if any(isinstance(x, (str, bytes, bool)) for x in sizes):
            raise TypeError
        return [float(x) for x in sizes]
    except (TypeError, ValueError):
        raise InputError(
            f"cpu_gib takes a size in GiB or a list of them, got {cpu_gib!r}"
        ) from None


@named_options
def simulate(
    trace: TraceLike | None = None,
    *,
    workload: Any = None,
    load: Any = None,
    gpu: str = "h200",
    model: str = DEFAULT_MODEL,
    cpu_gib: float | None = None,
    cpu_chunks: int | None = None,
    cpu_bytes: int | None = None,
    policy: str | None = None,
    policy_module: str | None = None,
    admission: str = "always",
    store_threshold: int | None = None,
    max_tracker_size: int | None = None,
    block_tokens: int | None = None,
    chunk_tokens: int | None = None,
    gpu_block_tokens: int = 16,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    seed: int = 0,
    prefill_chunk_tokens: int | None = None,
    vllm_config: VllmConfig | None = None,
    secondary_tiers: list[dict[str, Any]] | None = None,
    tier_load_rule: str | None = None,
    baseline: bool = False,
    limit: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    long_prefill_token_threshold: int = 0,
    max_model_len: int | None = None,
    refuse_past_max_model_len: bool = False,
    gpu_kv_blocks: int | None = None,
    gpu_blocks: int | None = None,
    gpu_memory_utilization: float = 0.92,
    enable_prefix_caching: bool = True,
    enable_chunked_prefill: bool = True,
    offload_prompt_only: bool | None = None,
    sync_load_budget_bytes: int | None = None,
    async_scheduling: bool = True,
    time_scale: float = 1.0,
    poisson_rate: float | None = None,
    link: str | os.PathLike[str] | None = None,
    compute_profile: str | os.PathLike[str] | None = None,
    record_steps: bool = True,
    record_tokens: bool = False,
    percentile_metrics: str | Iterable[str] | None = None,
    metric_percentiles: str | Iterable[float] | None = None,
    goodput: str | Iterable[str] | Mapping[str, float] | None = None,
    instances: int | None = None,
    router: str | None = None,
    router_staleness_ms: float | None = None,
    router_prefix_weight: float | None = None,
    router_queue_weight: float | None = None,
    router_kv_weight: float | None = None,
    router_window_s: float | None = None,
    shared_tier: str | None = None,
    shared_tier_capacity: str | None = None,
    shared_tier_eviction: str | None = None,
    shared_tier_link: str | None = None,
    progress: ProgressArg = None,
) -> Result:
    """Timed replay of ``trace`` on one modelled GPU running a vLLM v1-like engine.

    ``trace`` is what :func:`replay` takes. For example
    ``simulate(path, gpu="h100", cpu_gib=64, policy="arc", baseline=True)``.

    Instead of a trace, ``workload`` and ``load`` run a benchmark client in the loop
    (:func:`kvsim.workloads.build_workload`, seeded by ``seed``, in ``gpu_block_tokens``
    blocks; see docs/experiments.md): e.g. ``workload={"type": "shared_prefix",
    "num_groups": 10, ...}``, ``load={"type": "concurrency", "stages": [{"concurrency": 32,
    "num_requests": 2000}]}``. The requests table then has a ``stage`` column (the stage a
    request was sent in) and the result a ``stages`` table: every metric per stage and for
    the whole run. A kvsim trace written by ``kvsim trace gen shared-prefix`` / ``random``
    says its stages, and gets the same table.

    The CPU tier: with no size (``cpu_gib``, ``cpu_chunks``, ``cpu_bytes`` or
    ``vllm_config``) the run has no offloading. ``model`` (default llama-3.1-8b), ``tp``,
    ``policy``, ``policy_module``, ``admission``, ``store_threshold``,
    ``max_tracker_size``, ``block_tokens``, ``chunk_tokens``, ``gpu_block_tokens``
    (vLLM's ``--block-size``, default 16: the GPU KV blocks too), ``kv_cache_dtype`` (the
    GPU KV blocks and the transfer bytes too), ``seed``,
    ``prefill_chunk_tokens``, ``vllm_config`` and ``secondary_tiers`` mean what they mean in
    :func:`replay`. In timed mode each secondary tier runs on a device model (a tier's
    ``kvsim_device``: ``nvme-gen4``, the ``fs`` default, ``nvme-gen5``, ``shared-fs``,
    ``object-store``, the ``obj`` default, ``instant``, or a device JSON file; see
    :mod:`kvsim.tiering.devices`), so promotions add to the time to first token;
    ``tier_load_rule`` ``"pays-off"`` (beyond vLLM; default ``off``) sets every tier's
    ``kvsim_load_rule``: a secondary hit that would load slower than it computes is a MISS.
    ``baseline=True`` adds the same run without offloading: its tables are
    ``baseline_requests`` and ``baseline_steps`` and its summary keys start ``baseline_``.

    The engine (vLLM's flags):

    - ``gpu``: GPU preset, h100, h200 (default), a100, l40s, gh200, b200, or the path of a
      GPU spec JSON (:func:`kvsim.specs.hardware.load_gpu_spec`);
    - ``max_num_batched_tokens`` and ``max_num_seqs``: default to what ``vllm serve`` picks
      on ``gpu`` (:func:`kvsim.specs.hardware.vllm_batch_defaults`), the count cut to the
      budget; a count above the budget is refused, as vLLM refuses to start;
    - ``long_prefill_token_threshold``: vLLM's (default 0: off; not above ``max_model_len``);
    - ``max_model_len``: vLLM's ``--max-model-len`` (default: the length vLLM derives from
      the model's config; not above it): as vLLM 0.33's server, an empty prompt, one of
      ``max_model_len`` tokens or more and an output longer than it are refused, and a
      longer request's output is cut to what is left; ``refuse_past_max_model_len``
      (default False): refuse it instead, as servers before 0.33 (v0.15.1) did;
    - ``gpu_kv_blocks``: GPU KV capacity in ``gpu_block_tokens`` blocks (vLLM
      ``num_gpu_blocks_override``; default from GPU memory); ``gpu_blocks`` is the command
      line's name for it; ``gpu_memory_utilization``: default 0.92;
    - ``enable_prefix_caching``: the GPU prefix cache (default True);
    - ``enable_chunked_prefill``: vLLM's chunked prefill (default True; off, a prompt waits
      for a step whose token budget holds it whole, and one longer than
      ``max_num_batched_tokens`` is refused);
    - ``offload_prompt_only``: store prompt chunks only (vLLM's default, True);
      ``sync_load_budget_bytes``: small CPU hits load in the same step (default 0); both
      default to ``vllm_config``'s values when it has them;
    - ``async_scheduling``: schedule the next step while the current forward runs (default
      True, as vLLM 0.33); ``False`` models ``--no-async-scheduling``.

    The workload and the hardware model:

    - ``limit``: the first N requests; ``time_scale``: multiply the trace's timestamps (0.5 =
      twice the request rate); ``poisson_rate``: re-time arrivals as Poisson at this many
      requests per second (seeded);
    - ``link``: a preset (pcie5, pcie4, gh200) or a calibration profile path (default: the
      GPU's); ``compute_profile``: a JSON of per-phase or roofline coefficients or a
      linear step time (default: the per-phase model on H100/H200, a roofline elsewhere);
    - ``record_steps``: keep the per-step table (default True); ``record_tokens``: add a
      ``tokens`` table, one row per output token (``request``, ``token``, ``time_s``);
    - ``percentile_metrics``, ``metric_percentiles``, ``goodput``: what the summary reports,
      as ``vllm bench serve``'s flags (:mod:`kvsim.report.serve_metrics`): metrics among ttft, tpot,
      itl, e2el, queue (default all), percentiles (default 99) and SLOs in ms for
      ``request_goodput`` (e.g. ``{"ttft": 2000, "tpot": 50}``);
    - ``progress``: ``True`` shows a bar counting requests (with ``baseline``, a second bar
      for the run without offloading); a callable is called as ``progress(n)`` as requests
      finish, in both runs.

    A fleet (any of these given; docs/fleets.md): ``instances`` engines in one event loop
    behind ``router`` (``router_staleness_ms``, ``router_prefix_weight``,
    ``router_queue_weight``, ``router_kv_weight``, ``router_window_s`` as in
    :func:`replay`), optionally sharing ``shared_tier`` (``shared_tier_capacity``,
    ``shared_tier_eviction``); each instance reaches it over its ``shared_tier_link``,
    where its copies queue. The summary keeps every key for the fleet as a whole; each table gains
    ``instance``; an ``instances`` table has one row per instance.

    An unknown keyword or a bad value is an :class:`kvsim.InputError` naming it. Returns a
    :class:`kvsim.Result` with tables ``requests``, ``transfers``, ``steps``, ``metrics``
    (every numeric summary value as ``run, metric, value`` rows) and a flat summary.
    """
    given = dict(locals())  # the keywords as called: nothing else is local yet
    # The timed engine loads on first use, so `import kvsim` and the CLI stay quick.
    from kvsim.engine.setup import compose, run_engine
    from kvsim.report.serve_metrics import BenchSettings, long_table
    from kvsim.workloads import Workload

    if gpu_blocks is not None:  # the CLI's name for the GPU KV capacity, here too
        if gpu_kv_blocks is not None:
            raise InputError("give gpu_blocks or gpu_kv_blocks, not both (the same capacity)")
        given["gpu_kv_blocks"] = gpu_blocks
    timed = SimulateOptions(**_pick(given, SIMULATE_FIELDS))
    bench = BenchSettings.make(percentile_metrics, metric_percentiles, goodput)
    tr, n_requests, stages = _arrivals(trace, workload, load, given)
    sized = any(v is not None for v in (cpu_gib, cpu_chunks, cpu_bytes, vllm_config))
    check_simulate_together(given, sized)
    extra = vllm_extra(vllm_config)
    offload = _pick(given, [n for n in OFFLOAD_FIELDS if n != "gpu_blocks"])
    offload.update(model=model or DEFAULT_MODEL, cpu_chunks=cpu_chunks if sized else 1)
    setup = compose(make_options(extra, **offload), timed, extra, tr.block_tokens, sized)

    fleet = fleet_options(given, timed=True)
    run: Callable[..., tuple[dict[str, Any], dict[str, Any]]] = run_engine
    if fleet is not None:
        from kvsim.fleet.timed_fleet import fleet_runner

        run = fleet_runner(fleet, sized)

    label = "simulating (offload)" if baseline and sized else "simulating"
    stalled: EngineStalled | None = None  # raised after the Result of what ran is built
    with Progress(progress, n_requests, label) as bar:
        try:
            summary, tables = run(
                setup, tr, sized, bench, record_tokens, bar.callback, stages=stages
            )
        except EngineStalled as exc:
            stalled = exc
            summary, tables = exc.partial
        summary = {
            "trace": tr.name if isinstance(tr, Workload) else str(tr.path),
            "gpu": setup.gpu.name,
            "model": offload["model"],
            "link": setup.link.link,
            **setup.config.capacity_summary(offload=sized),
            **summary,
        }
        if baseline and stalled is None:
            bar.next_pass("baseline (no offload)")
            try:
                base_summary, base_tables = run(
                    setup, tr, False, bench, record_tokens, bar.callback, stages=stages
                )
            except EngineStalled as exc:
                stalled = exc
                base_summary, base_tables = exc.partial
            summary.update({BASELINE_PREFIX + k: v for k, v in base_summary.items()})
            for name in ("requests", "steps", "tokens", "stages", "instances"):
                if name in base_tables:
                    tables[BASELINE_PREFIX + name] = base_tables[name]
    tables["metrics"] = long_table(summary, BASELINE_PREFIX)  # run, metric, value
    config_out = {
        **setup.describe(),
        **(tr.describe() if isinstance(tr, Workload) else {}),
        "limit": limit,
        "baseline": baseline,
        "bench": bench.as_dict(),
        **(fleet.as_dict() if fleet is not None else {}),
    }
    result = Result(summary=summary, tables=tables, config=config_out)
    if stalled is not None:
        stalled.result = result
        raise stalled
    return result


def _arrivals(
    trace: TraceLike | None, workload: Any, load: Any, given: dict[str, Any]
) -> tuple[Trace | Workload, int | None, list[int] | None]:
    """What ``simulate`` runs: a trace in arrival order, or a workload and load whose
    client runs in the loop; the number of requests (None: the run decides) and each trace
    request's stage where its file states them."""
    from kvsim.engine.setup import in_arrival_order
    from kvsim.traces.formats.native import stated_stages
    from kvsim.workloads import build_workload

    if workload is None and load is None:
        if trace is None:
            raise InputError("simulate needs a trace, or a workload and a load")
        tr, n = in_arrival_order(
            as_trace(trace, block_tokens=given["block_tokens"], limit=given["limit"])
        )
        on_file = tr.format == "native" and os.path.isfile(tr.path)  # not one in memory
        starts = stated_stages(str(tr.path)) if on_file else None
        if starts is None:
            return tr, n, None
        return tr, n, [max(0, bisect.bisect_right(starts, i) - 1) for i in range(n)]
    if trace is not None:
        raise InputError("give a trace, or a workload and a load, not both")
    if workload is None or load is None:
        raise InputError("a workload needs a load and a load a workload (both or neither)")
    for name, default in (("limit", None), ("time_scale", 1.0), ("poisson_rate", None)):
        if given[name] != default:
            raise InputError(f"{name} re-times a trace; a workload's load says when it sends")
    block = given["block_tokens"] or given["gpu_block_tokens"]
    w = build_workload(workload, load, seed=given["seed"], block_size=block)
    return w, w.num_requests, None
