"""Re-create each experiment of a measurements file, simulate it, and set what kvsim
predicts beside what was measured: one row per (experiment, stage, metric).

What is compared (``METRICS``), per load stage (requests by the stage they were sent in)
and for the whole run (``all``):

- ``ttft_*`` and ``e2e_*``: mean, p50, p90, p99 of each request's time to first token and end
  to end latency, in ms, as the client sees them: the engine's plus the compute profile's
  ``request_overhead_s`` (HTTP, tokenizer: the client's path outside the engine);
- ``itl_mean``: ``(e2e mean - ttft mean) / (output tokens - 1)``, the file's definition,
  with the tokens the server emitted (the workload's ``output_len``: ``ignore_eos``);
- ``requests_per_s``: requests over the span from the stage's first send to its last
  finish (what inference-perf reports);
- ``output_tokens_per_s``: the same span's output tokens, counted as the client counts
  them where the file says how (its ``output_len_mean`` re-tokenises text: the server's
  tokens times ``output_len_mean / output_len``);
- ``total_tokens_per_s``: the same span's prompt and output tokens (every prompt token,
  cached or not, as inference-perf and llm-d's guides count them), the output part
  counted as above.

An experiment with ``instances`` and ``router`` runs as ``kvsim simulate --instances N
--router NAME`` runs it: N engines of the experiment's settings behind that router, the
load's clients sending to the fleet (a closed loop's N clients are N for the fleet).

The absolute percentage error is ``|predicted - measured| / measured x 100``.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.accuracy.measurements import Experiment, Measured, Stats
from kvsim.accuracy.whole_run import stage_weights, weighted_whole_run
from kvsim.core.errors import InputError, InputWarning
from kvsim.specs.context import vllm_max_model_len, vllm_step_limits
from kvsim.specs.hardware import GpuSpec
from kvsim.specs.models import ModelSpec, get_model

if TYPE_CHECKING:
    from kvsim.engine.phase_compute import PhaseProfile

__all__ = ["METRICS", "ExperimentResult", "Row", "run_experiment", "stage_metrics"]

METRICS = (
    "ttft_mean",
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "e2e_mean",
    "e2e_p50",
    "e2e_p90",
    "e2e_p99",
    "itl_mean",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "requests_per_s",
)


@dataclass(frozen=True)
class Row:
    """One predicted value beside its measurement (None: the file has none; predicted
    None: the run does not define it, as :func:`stage_metrics` says)."""

    experiment: str
    stage: str  # "0", "1", ... or "all"
    metric: str
    predicted: float | None
    measured: float | None

    @property
    def ape_pct(self) -> float | None:
        if (
            self.measured is None
            or self.measured == 0
            or self.predicted is None
            or not math.isfinite(self.predicted)
        ):
            return None
        return abs(self.predicted - self.measured) / abs(self.measured) * 100.0


@dataclass(frozen=True)
class ExperimentResult:
    """One experiment's rows, or why it could not run (``error``)."""

    experiment: str
    rows: tuple[Row, ...] = ()
    error: str | None = None
    requests: int = 0
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()  # kvsim's warnings of the run (an overload above all)


def _max_num_batched_tokens(exp: Experiment, mml: int, gpu: GpuSpec) -> int | None:
    """The step token budget vLLM ran with: the file's, or ``vllm serve``'s default on
    ``gpu`` (None with chunked prefill: the run picks it; without, raised to
    ``max_model_len``, ``mml``, which the run must be given), by the run's own
    rule (:func:`~kvsim.specs.context.vllm_step_limits`), checked before the run and named
    as the file names the keys (the run's errors would name ``kvsim simulate``'s flags).
    vLLM ran with the model's length where the file gives none, so without chunked prefill
    a budget below it is refused whether or not ``vllm.max_model_len`` is written; so is a
    ``max_num_seqs`` above the budget."""
    vllm = exp.vllm
    budget = "vllm.max_num_batched_tokens"
    if vllm.max_num_batched_tokens is None:
        budget = f"vllm serve's default max_num_batched_tokens on {gpu.name}"
    length = "vllm.max_model_len"
    if not vllm.max_model_len:
        length = "max_model_len (the model's, from its config)"
    tokens, _ = vllm_step_limits(
        gpu,
        mml,
        True,
        vllm.enable_chunked_prefill,
        (vllm.max_num_batched_tokens, vllm.max_num_seqs),
        (budget, "vllm.max_num_seqs", length),
    )
    return vllm.max_num_batched_tokens if vllm.enable_chunked_prefill else tokens


def shortened(
    exp: Experiment, max_stage_s: float | None, warmup_s: float = 0.0
) -> tuple[Experiment, list[int | None]]:
    """``exp`` with every stage cut to at most ``max_stage_s`` seconds (or as many requests
    as that many seconds send at its rate); the rates and concurrencies stay.

    With ``warmup_s``, a timed stage longer than ``warmup_s + max_stage_s`` runs as two
    stages at its rate: ``warmup_s`` seconds whose requests are not measured, then the
    ``max_stage_s`` that are. A measured stage of ten minutes is its steady state; the first
    seconds of a stage are not (a cold prefix cache, the requests in flight still building
    up at the new rate), and a cut stage of 20 s would be mostly them.

    Returns:
        the experiment to run, and for each of its stages the measured stage it stands for
        (None: a warm-up). Invariant: every stage of ``exp`` appears exactly once.
    """
    import msgspec

    if max_stage_s is None:
        return exp, list(range(len(exp.load.stages)))
    stages: list[Any] = []
    measured: list[int | None] = []
    for i, st in enumerate(exp.load.stages):
        changes: dict[str, Any] = {}
        if st.duration is not None and st.duration > max_stage_s:
            if warmup_s > 0 and st.duration > warmup_s + max_stage_s:
                stages.append(msgspec.structs.replace(st, duration=warmup_s))
                measured.append(None)
            changes["duration"] = max_stage_s
        if st.num_requests is not None and st.concurrency is not None:
            changes["num_requests"] = max(
                1, min(st.num_requests, int(st.concurrency * max_stage_s))
            )
        stages.append(msgspec.structs.replace(st, **changes) if changes else st)
        measured.append(i)
    load = msgspec.structs.replace(exp.load, stages=stages)
    return msgspec.structs.replace(exp, load=load), measured


def run_experiment(
    exp: Experiment,
    base_dir: str,
    *,
    compute_profile: str | PhaseProfile | None = None,
    max_stage_s: float | None = None,
    seed: int = 0,
    async_scheduling: bool = True,
    warmup_s: float = 0.0,
) -> ExperimentResult:
    """Simulate ``exp`` and compare; an experiment kvsim cannot re-create is an
    :class:`ExperimentResult` with its one-line ``error``, never an exception.
    ``async_scheduling=False`` runs the synchronous engine loop (vLLM before async
    scheduling became the default) instead of 0.33's. ``warmup_s``: with ``max_stage_s``,
    each cut stage's unmeasured lead-in (:func:`shortened`)."""
    t0 = time.perf_counter()
    said: list[str] = []
    try:
        with _warnings_named(exp.id, said):
            rows, n = _run(
                exp, base_dir, compute_profile, max_stage_s, seed, async_scheduling, warmup_s
            )
    except InputError as exc:
        return ExperimentResult(
            exp.id, error=str(exc), seconds=time.perf_counter() - t0, warnings=tuple(said)
        )
    return ExperimentResult(
        exp.id, tuple(rows), requests=n, seconds=time.perf_counter() - t0, warnings=tuple(said)
    )


def module_of(filename: str) -> str | None:
    """The name of the loaded module whose file is ``filename`` (None: none is), so that a
    caught warning raised again by ``warnings.warn_explicit`` meets the filters that name
    its module (``-W ignore::Warning:kvsim.accuracy.run``) as it did the first time;
    without it the module is the file's path."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return None


@contextmanager
def _warnings_named(experiment_id: str, said: list[str]) -> Iterator[None]:
    """kvsim's warnings inside the block, each once, prefixed with the experiment's id (in
    a file of 25 runs, "overloaded" alone does not say which) and kept in ``said`` (their
    own text) for the report; others pass as they are."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for w in caught:
            if not issubclass(w.category, InputWarning):
                module = module_of(w.filename)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, module)
            elif (text := str(w.message)) not in said:
                said.append(text)
                warnings.warn(f"experiment {experiment_id}: {text}", w.category, stacklevel=3)


def _run(
    exp: Experiment,
    base_dir: str,
    compute_profile: str | PhaseProfile | None,
    max_stage_s: float | None,
    seed: int,
    async_scheduling: bool,
    warmup_s: float = 0.0,
) -> tuple[list[Row], int]:
    import tempfile

    from kvsim.api import simulate
    from kvsim.engine.compute_model import (
        ComputeParams,
        default_compute_profile,
        load_compute_profile,
    )
    from kvsim.engine.phase_compute import PhaseProfile
    from kvsim.specs.hardware import get_gpu

    if exp.vllm.dtype in ("float", "float32"):
        raise InputError(
            f"vllm.dtype {exp.vllm.dtype} is not modelled (kvsim's step time is for 16-bit "
            "weights and activations, or the model's own quantization)"
        )
    connector = exp.vllm.connector()  # another connector than vLLM's offloading one: said
    model_arg = exp.model_arg(base_dir)
    model = _kv_stored_as(get_model(model_arg), exp.vllm.kv_cache_dtype)
    model.kv_heads_per_worker(exp.tp, "tp")  # a tp vLLM refuses, named as the file names it
    run, measured = shortened(exp, max_stage_s, warmup_s)
    _cut_to_nothing(exp, run, max_stage_s, warmup_s if None in measured else 0.0, seed)
    spec = run.workload_spec()
    gpu_arg = exp.gpu_arg(base_dir)  # a spec file is read here once, not per use
    gpu = get_gpu(gpu_arg)
    _check_override(exp, model, gpu)
    mml = vllm_max_model_len(model, exp.vllm.max_model_len, "vllm.max_model_len")
    batched_tokens = _max_num_batched_tokens(exp, mml, gpu)
    if isinstance(compute_profile, PhaseProfile):
        profile: Any = compute_profile
    elif compute_profile is not None:
        profile = load_compute_profile(compute_profile, ComputeParams.for_gpu(gpu))
    else:
        profile = default_compute_profile(gpu)
    overhead_s = float(getattr(profile, "request_overhead_s", 0.0))
    with tempfile.TemporaryDirectory() as tmp:
        profile_arg: str | None = compute_profile if isinstance(compute_profile, str) else None
        if isinstance(profile, PhaseProfile):
            profile_arg = os.path.join(tmp, "profile.json")
            with open(profile_arg, "w", encoding="utf-8") as f:
                f.write(profile.to_json())
        vllm = exp.vllm
        kv = connector.as_dict() if connector is not None else None
        result = simulate(
            workload=spec,
            load=run.load,
            gpu=gpu_arg,
            model=model_arg,
            tp=exp.tp,
            kv_cache_dtype=vllm.kv_cache_dtype,
            gpu_block_tokens=vllm.block_size,
            vllm_config=kv,
            max_num_seqs=vllm.max_num_seqs,
            max_num_batched_tokens=batched_tokens,
            max_model_len=vllm.max_model_len,
            refuse_past_max_model_len=True,  # v0.15.1's server: the measurements'
            gpu_kv_blocks=vllm.num_gpu_blocks_override,
            gpu_memory_utilization=vllm.gpu_memory_utilization,
            enable_prefix_caching=vllm.enable_prefix_caching,
            enable_chunked_prefill=vllm.enable_chunked_prefill,
            compute_profile=profile_arg,
            record_steps=False,
            seed=seed,
            async_scheduling=async_scheduling,
            **_fleet(exp),
        )
    _refusals(result.tables["requests"], mml)
    weights = stage_weights(exp, run, measured)
    stages = weighted_whole_run(result.tables["stages"], result.tables["requests"], run, weights)
    simulated = stage_metrics(stages, spec.output_len, overhead_s)
    predicted = {  # the warm-ups' rows go; the others stand for the stages they measure
        ("all" if key == "all" else str(measured[int(key)])): value
        for key, value in simulated.items()
        if key == "all" or measured[int(key)] is not None
    }
    _unsent(exp, run, measured, predicted)
    _uncompared(exp)
    _requests_unlike(exp)
    rows = _compare(exp, predicted, spec.output_len)
    _measured_zero(rows)
    return rows, len(result.tables["requests"])


def _kv_stored_as(model: ModelSpec, kv_cache_dtype: str) -> ModelSpec:
    """``model`` with its KV stored as the file's ``kv_cache_dtype`` (fp8: half the bytes
    of 16-bit KV, so twice the blocks a GPU holds); a packed layout vLLM has but kvsim
    does not size fails the experiment, named as the file names it."""
    from kvsim.specs.models import packed_kv_dtype

    if packed_kv_dtype(kv_cache_dtype):
        raise InputError(
            f"vllm.kv_cache_dtype {kv_cache_dtype!r} is not modelled (a packed vLLM layout "
            "whose bytes per token kvsim does not size)"
        )
    return model.with_kv_cache_dtype(kv_cache_dtype)


def _check_override(exp: Experiment, model: ModelSpec, gpu: GpuSpec) -> None:
    """A ``num_gpu_blocks_override`` whose KV and the weights do not fit in the GPU's whole
    memory is a run vLLM could not have started (it allocates the blocks given at start-up),
    most likely the KV cache's size in tokens, which vLLM's log states, written as blocks."""
    from kvsim.core.units import GIB

    blocks = exp.vllm.num_gpu_blocks_override
    if blocks is None:
        return
    if blocks < 2:  # as the file names it, not as simulate's --gpu-blocks refuses it
        raise InputError(
            f"vllm.num_gpu_blocks_override {blocks}: vLLM keeps one GPU block as its null "
            "block, so none is left for a request"
        )
    kv = blocks * exp.vllm.block_size * model.gpu_kv_bytes_per_token(tp=exp.tp)
    weights = model.weight_bytes() / exp.tp
    if kv + weights > gpu.memory_bytes:
        raise InputError(
            f"vllm.num_gpu_blocks_override {blocks}: {blocks:,} blocks of "
            f"{exp.vllm.block_size} tokens are {kv / GIB:,.1f} GiB of KV per GPU at "
            f"tp={exp.tp}, more than {gpu.name}'s {gpu.memory_bytes / GIB:,.1f} GiB less "
            f"{model.name}'s weights ({weights / GIB:,.1f} GiB): vLLM could not have "
            "allocated them (the KV cache's size in tokens, not blocks?)"
        )


def _cut_to_nothing(
    exp: Experiment, run: Experiment, cut_s: float | None, lead_s: float, seed: int
) -> None:
    """A load that sends requests whole but none once ``--max-stage-s`` cut its stages (a
    low rate: 0.01/s for 5 s) fails naming the cut, not as a load that sends nothing."""
    from kvsim.workloads.timing import plan_stages

    def sends(e: Experiment) -> bool:  # a closed loop by duration (count None) sends
        return any(plan.count != 0 for plan in plan_stages(e.load, seed))

    if cut_s is None or sends(run) or not sends(exp):
        return
    n = len(exp.load.stages)
    what = "its stage" if n == 1 else f"its {n} stages"
    lead = f" (after {lead_s:g} s unmeasured)" if lead_s else ""
    raise InputError(
        f"the {exp.load.type} load sends no request with {what} cut to {cut_s:g} s by "
        f"--max-stage-s{lead}: give a longer --max-stage-s"
    )


def _unsent(
    exp: Experiment, run: Experiment, measured: list[int | None], predicted: dict[str, Any]
) -> None:
    """A measured stage that sent no request in the run (a low rate in a stage cut short by
    ``--max-stage-s``) has nothing to compare: said, not left out silently."""
    for index, stage in zip(measured, run.load.stages, strict=True):
        if index is None or str(index) in predicted or exp.measured_at(index) is None:
            continue
        sent = f"{stage.rate:g}/s for {stage.duration:g} s" if stage.rate else "its load"
        warnings.warn(
            f"stage {index} sent no request in the run ({sent}), so it is not compared",
            InputWarning,
            stacklevel=3,
        )


def _uncompared(exp: Experiment) -> None:
    """Measured values that no metric compares, ITL's percentiles (kvsim predicts the mean
    ITL, as the file defines it), are said once, not dropped silently."""
    unread = [
        f"itl_ms.{stat} of stage {m.stage}"
        for m in exp.measured
        if m.itl_ms is not None
        for stat in ("p50", "p90", "p99")
        if getattr(m.itl_ms, stat) is not None
    ]
    if unread:
        warnings.warn(
            f"measured {', '.join(unread)} not compared (kvsim predicts the mean ITL only)",
            InputWarning,
            stacklevel=3,
        )


def _requests_unlike(exp: Experiment) -> None:
    """A measured ``requests`` far from what the load as written sends (a duration in
    minutes, a rate per minute, a stage's count for the run's) says the load is not the one
    that ran, and every metric is compared against another run: said, not compared
    silently. The count is the load's expected one (``rate x duration``, ``num_requests``),
    not planned: Poisson counts vary, so only a gap past three standard deviations counts."""
    counts: list[float | None] = [
        st.num_requests
        if st.num_requests is not None
        else (st.rate * st.duration if st.rate is not None and st.duration is not None else None)
        for st in exp.load.stages
    ]
    whole = None if None in counts else sum(c for c in counts if c is not None)
    unlike = []
    for m in exp.measured:
        sent = whole if m.stage == "all" else counts[int(m.stage)]
        if m.requests is None or sent is None:
            continue
        counted = {m.requests, m.requests + (m.failed or 0)}  # failed ones counted or not
        if all(abs(sent - n) > max(2.0, 3.0 * math.sqrt(sent)) for n in counted):
            unlike.append(
                f"stage {m.stage} measured {m.requests} requests, the load sends {sent:,.0f}"
            )
    if unlike:
        warnings.warn(
            f"{'; '.join(unlike)}: is the load as written the one that ran? (its rates, "
            "durations, num_requests)",
            InputWarning,
            stacklevel=3,
        )


def _measured_zero(rows: list[Row]) -> None:
    """A metric measured as 0 (a placeholder, or a slip of the transcription) has no
    relative error, so no APE and no place in the summary: said once, not left out
    silently."""

    def key(metric: str) -> str:  # as the file writes it: ttft_ms.mean
        kind, _, stat = metric.partition("_")
        return f"{kind}_ms.{stat}" if kind in ("ttft", "e2e", "itl") else metric

    zero = [f"{key(r.metric)} of stage {r.stage}" for r in rows if r.measured == 0]
    if zero:
        warnings.warn(
            f"measured {', '.join(zero)} is 0, not compared (no relative error to 0)",
            InputWarning,
            stacklevel=3,
        )


def _refusals(requests: Any, max_model_len: int) -> None:
    """Requests the modelled vLLM refused (longer than its KV, or prompt + output past
    ``max_model_len``: v0.15.1's server refused those) are not in the metrics: all refused
    is an experiment that cannot be re-created, some a warning (the measurement counted
    them as failed, or never had them)."""
    refused = int(requests["rejected"].sum())
    why = f"longer than the GPU KV holds or than vllm.max_model_len ({max_model_len})"
    if refused and refused == len(requests):
        raise InputError(f"every request ({refused}) is refused: {why}")
    if refused:
        warnings.warn(
            f"{refused} of {len(requests)} requests refused ({why}): the metrics are the others'",
            InputWarning,
            stacklevel=2,
        )


def _fleet(exp: Experiment) -> dict[str, Any]:
    """``simulate``'s fleet keywords for ``instances`` engines behind ``router``, as
    ``kvsim simulate --instances N --router NAME`` takes them (none: the single engine)."""
    if exp.instances == 1 and exp.router is None:
        return {}
    return {
        "instances": exp.instances,
        **({"router": exp.router.name} if exp.router is not None else {}),
    }


def stage_metrics(
    stages: Any, output_len: int, overhead_s: float
) -> dict[str, dict[str, float | None]]:
    """``{stage: {metric: value}}`` from a run's stages table (one row per stage and
    ``all``), as the client sees them: ``overhead_s`` added to every request's TTFT and
    E2E (so to their means and percentiles) and to each span's end; throughputs in the
    server's tokens. ``itl_mean`` is None with one output token (no gap between tokens),
    the throughputs with fewer than 2 requests (no span between them)."""
    oh_ms = overhead_s * 1000.0
    out: dict[str, dict[str, float | None]] = {}
    for row in stages.to_dict("records"):
        if not row["completed"]:
            continue
        span = float(row["duration"]) + overhead_s
        ttft_ms = float(row["mean_ttft_ms"]) + oh_ms
        e2e_ms = float(row["mean_e2el_ms"]) + oh_ms
        m: dict[str, float | None] = {
            "ttft_mean": ttft_ms,
            "ttft_p50": float(row["p50_ttft_ms"]) + oh_ms,
            "ttft_p90": float(row["p90_ttft_ms"]) + oh_ms,
            "ttft_p99": float(row["p99_ttft_ms"]) + oh_ms,
            "e2e_mean": e2e_ms,
            "e2e_p50": float(row["p50_e2el_ms"]) + oh_ms,
            "e2e_p90": float(row["p90_e2el_ms"]) + oh_ms,
            "e2e_p99": float(row["p99_e2el_ms"]) + oh_ms,
        }
        out_tokens = float(row["total_output_tokens"])
        counts = {
            "output_tokens_per_s": out_tokens,
            "total_tokens_per_s": float(row["total_input_tokens"]) + out_tokens,
            "requests_per_s": float(row["completed"]),
        }
        alone = row["completed"] < 2  # its span is its own E2E: 1/E2E is no throughput
        m.update({name: None if alone else n / span for name, n in counts.items()})
        m["itl_mean"] = _itl_ms(e2e_ms, ttft_ms, output_len)
        out[str(row["stage"])] = m
    return out


def _itl_ms(e2e_ms: float, ttft_ms: float, output_len: int) -> float | None:
    """Mean ITL as the measurements format defines it, predicted or measured alike:
    (E2E mean - TTFT mean) / (output tokens - 1); None with one output token (no gap)."""
    return (e2e_ms - ttft_ms) / (output_len - 1) if output_len > 1 else None


def _measured_value(m: Measured | None, metric: str, output_len: int) -> float | None:
    if m is None:
        return None
    kind, _, stat = metric.partition("_")
    if kind in ("ttft", "e2e") and stat in ("mean", "p50", "p90", "p99"):
        stats: Stats | None = getattr(m, f"{kind}_ms")
        return None if stats is None else getattr(stats, stat)
    if metric == "itl_mean":
        if m.itl_ms is not None and m.itl_ms.mean is not None:
            return m.itl_ms.mean
        if m.e2e_ms and m.ttft_ms and m.e2e_ms.mean is not None and m.ttft_ms.mean is not None:
            return _itl_ms(m.e2e_ms.mean, m.ttft_ms.mean, output_len)
        return None
    value: float | None = getattr(m, metric)
    return value


def _compare(
    exp: Experiment, predicted: dict[str, dict[str, float | None]], output_len: int
) -> list[Row]:
    rows = []
    for stage, metrics in predicted.items():
        m = exp.measured_at("all" if stage == "all" else int(stage))
        # the client's re-tokenised output count, against the server's tokens
        recount = m.output_len_mean / output_len if m is not None and m.output_len_mean else None
        out = metrics["output_tokens_per_s"]  # None with its siblings (under 2 requests)
        for metric in METRICS:
            value = metrics[metric]
            if recount is not None and value is not None and out is not None:
                if metric == "output_tokens_per_s":
                    value *= recount
                elif metric == "total_tokens_per_s":  # its output part, re-counted likewise
                    value += out * (recount - 1)
            rows.append(Row(exp.id, stage, metric, value, _measured_value(m, metric, output_len)))
    return rows
