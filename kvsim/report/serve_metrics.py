"""Timed-run latency metrics as ``vllm bench serve`` reports them, and the overload check.

The numbers follow vLLM 0.33's ``vllm/benchmarks/serve.py`` (``calculate_metrics`` and its
result JSON), so one notebook can read a simulated and a measured run alike:

- times in milliseconds; per metric ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` (numpy's
  population std) and ``pP_X_ms`` for each percentile P (numpy's linear interpolation;
  ``p99.9`` keeps its decimals, ``p99`` does not); an empty metric reports 0, as vLLM does;
- TTFT from arrival to the first token; TPOT = (E2EL - TTFT) / (output tokens - 1) over
  requests with more than one output token; ITL = every gap between two consecutive output
  tokens of a request, all requests together; E2EL from arrival to the last token;
- ``request_goodput``: completed requests meeting every SLO (``ttft``/``tpot``/``e2el`` in
  ms, ``<=`` passes; a one-token request's TPOT counts as 0) per second of the run;
- ``duration`` from the first arrival to the last finish; throughputs divide by it.

kvsim adds ``queue`` (arrival to first scheduling, vLLM's server-side ``queue_time_ms``) as a
fifth metric, and the overload check (:class:`Load`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvsim.core.errors import InputError, InputWarning

#: the metrics vLLM's ``--percentile-metrics`` takes for a generative model
VLLM_METRICS = ("ttft", "tpot", "itl", "e2el")
#: kvsim's extra: time from arrival to first scheduling (vLLM's server ``queue_time_ms``)
QUEUE = "queue"
METRICS = (*VLLM_METRICS, QUEUE)
#: the metrics a ``--goodput`` SLO may name (vLLM's)
SLO_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (99.0,)

#: the load rule's thresholds (docs/timed-mode.md, "Overload and bursts")
QUEUE_SHARE = 0.5  # queueing is at least this share of the total TTFT...
QUEUE_STEPS = 10  # ...and the mean queue time this many engine steps (median ITL) or more
BUSY_FRAC = 0.95  # the GPU computes this share of the run or more: busy nearly all the time
QUEUE_GROWTH = 2.0  # the last third of arrivals waits this many times the first third's


class LoadWarning(InputWarning):
    """The latencies of a run say as much about its arrivals as about the engine."""


class OverloadWarning(LoadWarning):
    """The offered load is more than the modelled engine sustains: latencies measure the queue."""


class BurstyLoadWarning(LoadWarning):
    """Queueing dominates mean TTFT at a moderate load: bursts of arrivals, not overload."""


#: the run a load warning names (``Load.warning(run)``): a simulation with its CPU tier, or
#: its baseline without one
RUN_WITH_OFFLOAD = "with offloading"
RUN_WITHOUT_OFFLOAD = "without offloading"


def warns_about(message: str, run: str) -> bool:
    """Whether a load warning's text names ``run`` (the messages below put it in brackets):
    how a sweep tells a shared baseline's warnings from its cell's own."""
    return f"({run})" in message


@dataclass(frozen=True)
class BenchSettings:
    """What to report: vLLM's ``--percentile-metrics``, ``--metric-percentiles``, ``--goodput``."""

    percentile_metrics: tuple[str, ...] = METRICS
    metric_percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput: tuple[tuple[str, float], ...] = field(default=())  # (metric, SLO in ms)

    @classmethod
    def make(
        cls,
        percentile_metrics: str | Iterable[str] | None = None,
        metric_percentiles: str | Iterable[float] | None = None,
        goodput: str | Iterable[str] | Mapping[str, float] | None = None,
    ) -> BenchSettings:
        """Checked settings from CLI text (``"ttft,itl"``, ``"50,99"``, ``["ttft:500"]``) or
        Python values (``("ttft",)``, ``(50, 99)``, ``{"ttft": 500}``); None is the default."""
        return cls(
            parse_metrics(percentile_metrics),
            parse_percentiles(metric_percentiles),
            parse_goodput(goodput),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "percentile_metrics": list(self.percentile_metrics),
            "metric_percentiles": list(self.metric_percentiles),
            "goodput": dict(self.goodput),
        }


def _items(value: str | Iterable[Any]) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def parse_metrics(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return METRICS
    names = [str(v).strip().lower() for v in _items(value)]
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        raise InputError(
            f"--percentile-metrics: unknown metric(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(METRICS)}"
        )
    return tuple(dict.fromkeys(names))


def parse_percentiles(value: str | Iterable[float] | None) -> tuple[float, ...]:
    if value is None:
        return DEFAULT_PERCENTILES
    out = []
    for v in _items(value):
        try:
            p = float(v)
        except (TypeError, ValueError):
            raise InputError(f"--metric-percentiles: {v!r} is not a number") from None
        if not 0 <= p <= 100:
            raise InputError(f"--metric-percentiles: {v} is outside 0..100")
        out.append(p)
    if not out:
        raise InputError("--metric-percentiles: give at least one percentile")
    return tuple(dict.fromkeys(out))


def parse_goodput(
    value: str | Iterable[str] | Mapping[str, float] | None,
) -> tuple[tuple[str, float], ...]:
    """SLOs as ``(metric, ms)`` pairs from ``"ttft:500 tpot:50"``, ``["ttft:500"]`` or
    ``{"ttft": 500}``: vLLM's names and rules (non-negative milliseconds)."""
    if value is None:
        return ()
    pairs: list[tuple[str, Any]] = []
    if isinstance(value, str) and value.lstrip().startswith("{"):  # the mapping, as JSON text
        from kvsim.core.io import parse_json

        value = parse_json(value, "--goodput")
        if not isinstance(value, Mapping):
            raise InputError(f"--goodput: expected a JSON object of METRIC: MS, got {value!r}")
    if isinstance(value, Mapping):
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        texts = value.replace(",", " ").split() if isinstance(value, str) else list(value)
        for text in texts:
            name, sep, ms = str(text).partition(":")
            if not sep or not name:
                raise InputError(f"--goodput: expected METRIC:MS (e.g. ttft:500), got {text!r}")
            pairs.append((name, ms))
    out: dict[str, float] = {}
    for name, ms in pairs:
        key = name.strip().lower()
        if key not in SLO_METRICS:
            raise InputError(f"--goodput: unknown metric {name!r}; known: {', '.join(SLO_METRICS)}")
        try:
            slo = float(ms)
        except (TypeError, ValueError):
            raise InputError(f"--goodput: {name}:{ms} is not a number of milliseconds") from None
        if not 0 <= slo < math.inf:
            raise InputError(f"--goodput: {name}:{ms} must be a non-negative number of ms")
        out[key] = slo
    return tuple(out.items())


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in a field name: 99 -> ``99``, 99.9 -> ``99.9``."""
    return str(int(p)) if int(p) == p else str(p)


def metric_fields(
    name: str, values_s: np.ndarray, percentiles: Sequence[float], scratch: bool = False
) -> dict[str, float]:
    """``mean/median/std/pP_<name>_ms`` of ``values_s`` (seconds); 0 for no values, as vLLM.
    Float32 values (the ITLs) are summed in float64 and not copied to float64 whole;
    ``scratch``: ``values_s`` may be reordered in place (no copy for the percentiles)."""
    v = np.asarray(values_s)
    if len(v) == 0:
        v = np.zeros(1)
    mean, std = _mean_std(v)
    out = {
        f"mean_{name}_ms": mean * 1000,
        f"median_{name}_ms": float(np.median(v, overwrite_input=scratch)) * 1000,
        f"std_{name}_ms": std * 1000,
    }
    for p in percentiles:
        value = np.percentile(v, p, overwrite_input=scratch)
        out[f"p{percentile_word(p)}_{name}_ms"] = float(value) * 1000
    return out


def inter_token_latencies(gaps: Sequence[np.ndarray]) -> np.ndarray:
    """Every request's inter-token gaps in one array: vLLM pools its ``itls`` so."""
    return np.concatenate(gaps) if gaps else np.zeros(0, dtype=np.float32)


def _mean_std(v: np.ndarray, piece: int = 1 << 20) -> tuple[float, float]:
    """numpy's mean and (population) std in float64, a piece at a time: a float32 array is
    never copied to float64 whole."""
    total = sum(
        float(np.sum(v[at : at + piece], dtype=np.float64)) for at in range(0, len(v), piece)
    )
    mean = total / len(v)
    squares = 0.0
    for at in range(0, len(v), piece):
        d = v[at : at + piece].astype(np.float64) - mean
        squares += float(np.dot(d, d))
    return mean, math.sqrt(squares / len(v))


def peak_rates(
    starts: np.ndarray, ends: np.ndarray, token_times: Iterable[np.ndarray]
) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests``: output tokens and
    requests in flight per whole second since the first start, at their busiest second.

    A run shorter than :data:`_DENSE_SECONDS` counts into one slot per second; a longer one
    (arrivals years apart: a huge ``--time-scale``, a trace's far timestamp) only at the
    seconds where something happens, so memory follows the tokens, not the span."""
    if len(starts) == 0:
        return 0.0, 0
    first = float(starts.min())
    span = float(ends.max()) - first
    if span >= _DENSE_SECONDS:
        return _sparse_peaks(starts - first, ends - first, token_times, first)
    seconds = int(np.ceil(span)) + 1
    tokens = np.zeros(seconds, dtype=np.int64)
    for batch in _batches(token_times):  # one bincount a batch: bounded memory
        tokens += _per_second(batch, first, seconds)
    begin = (starts - first).astype(np.int64)
    end = (ends - first).astype(np.int64)
    change = np.bincount(begin, minlength=seconds + 1) - np.bincount(end + 1, minlength=seconds + 1)
    return float(tokens.max()), int(np.cumsum(change)[:seconds].max())


#: output-token times counted per bincount in :func:`peak_rates`
_PEAK_BATCH = 1 << 20
#: runs spanning this many seconds or more count sparsely (a dense count: 8 bytes a second)
_DENSE_SECONDS = 1 << 22


def _sparse_peaks(
    begin: np.ndarray, end: np.ndarray, token_times: Iterable[np.ndarray], first: float
) -> tuple[float, int]:
    """:func:`peak_rates` over the seconds something happens in: ``begin`` and ``end`` are
    the requests' times since ``first``, in float seconds (floors of huge times stay exact
    as floats, where an int64 would overflow)."""
    seconds: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    for batch in _batches(token_times):
        s, c = np.unique(np.floor(np.concatenate(batch) - first), return_counts=True)
        seconds.append(s)
        counts.append(c)
    top_tokens = 0.0
    if seconds:
        top_tokens = float(_sums_by_key(np.concatenate(seconds), np.concatenate(counts))[1].max())
    ones = np.ones(len(begin), dtype=np.int64)
    keys, changes = _sums_by_key(
        np.concatenate([np.floor(begin), np.floor(end) + 1]), np.concatenate([ones, -ones])
    )
    last = np.floor(float(end.max()))  # the dense count's last second
    running = np.cumsum(changes)[keys <= last]
    return top_tokens, int(running.max())


def _batches(token_times: Iterable[np.ndarray]) -> Iterator[list[np.ndarray]]:
    """Requests' token times, a batch of requests at a time (at least :data:`_PEAK_BATCH`
    times a batch, but the last), so that counting them holds one batch in memory."""
    batch: list[np.ndarray] = []
    held = 0
    for t in token_times:
        batch.append(t)
        held += len(t)
        if held >= _PEAK_BATCH:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def _sums_by_key(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``keys`` in ascending order and the sum of ``values`` at each."""
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.add.reduceat(values, starts)


def _per_second(times: list[np.ndarray], first: float, seconds: int) -> np.ndarray:
    """How many of ``times`` fall in each whole second since ``first`` (``seconds`` of them;
    times outside are not counted)."""
    buckets = (np.concatenate(times) - first).astype(np.int64)
    return np.bincount(buckets[(buckets >= 0) & (buckets < seconds)], minlength=seconds)


def bench_fields(
    requests: pd.DataFrame,
    itls: np.ndarray,
    token_times: Iterable[np.ndarray],
    duration: float,
    settings: BenchSettings,
) -> dict[str, Any]:
    """vLLM ``bench serve``'s result fields of one run from kvsim's requests table (seconds),
    every inter-token gap (``itls``, reordered in place) and each request's token times.
    Rejected requests are vLLM's failed ones."""
    done = requests[~requests["rejected"]]
    completed = len(done)
    ttft = done["ttft_s"].to_numpy(dtype=np.float64)
    e2el = done["e2e_s"].to_numpy(dtype=np.float64)
    multi = done["output_tokens"].to_numpy() > 1
    tpot = done["tpot_s"].to_numpy(dtype=np.float64)[multi]
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(done["output_tokens"].sum())
    peak_tokens, peak_requests = peak_rates(
        done["arrival_s"].to_numpy(dtype=np.float64),
        done["finish_s"].to_numpy(dtype=np.float64),
        token_times,
    )
    out: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "failed": len(requests) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / duration,
        "request_goodput": (
            good_requests(done, settings.goodput) / duration if settings.goodput else None
        ),
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    values = {
        "ttft": ttft,
        "tpot": tpot,
        "itl": itls,
        "e2el": e2el,
        QUEUE: done["queue_s"].to_numpy(dtype=np.float64),
    }
    for name in settings.percentile_metrics:
        scratch = name == "itl"  # the pooled ITLs are reordered in place, not copied
        out.update(metric_fields(name, values[name], settings.metric_percentiles, scratch))
    return out


def good_requests(done: pd.DataFrame, slos: Sequence[tuple[str, float]]) -> int:
    """Completed requests within every SLO (ms); a one-token request's TPOT is 0 (vLLM)."""
    per_metric = {
        "ttft": done["ttft_s"].to_numpy(dtype=np.float64),
        "tpot": np.where(done["output_tokens"].to_numpy() > 1, done["tpot_s"].to_numpy(), 0.0),
        "e2el": done["e2e_s"].to_numpy(dtype=np.float64),
    }
    good = np.ones(len(done), dtype=bool)
    for name, ms in slos:
        good &= per_metric[name] <= ms / 1000
    return int(good.sum())


# --------------------------------------------------------------------------- overload


@dataclass(frozen=True)
class Load:
    """How hard a run pushed the engine (docs/timed-mode.md, "Overload and bursts").

    ``offered``: prompt tokens of the completed requests per second of their arrival span;
    ``sustainable``: the same prompt tokens per second the GPU spent computing, i.e. what the
    engine gets through at this workload's mix of cache hits and decode when never idle (their
    ratio is busy time over arrival span). ``step_s`` is one engine step, the median ITL
    (``itls`` is reordered in place)."""

    busy_frac: float
    offered: float | None
    sustainable: float | None
    queue_share: float  # total queue time / total TTFT
    mean_queue_s: float
    step_s: float
    median_queue_s: float = 0.0
    p99_queue_s: float = 0.0
    queue_growth: float | None = None  # mean queue, last third of arrivals / first third
    late_queue_s: float = 0.0  # the last third's mean queue

    @classmethod
    def of(
        cls, requests: pd.DataFrame, itls: np.ndarray, busy_s: float, steps: int, duration: float
    ) -> Load:
        done = requests[~requests["rejected"]]
        prompt = float(done["prompt_tokens"].sum())
        arrivals = done["arrival_s"]
        span = float(arrivals.max() - arrivals.min()) if len(done) else 0.0
        ttft_total = float(done["ttft_s"].sum())
        queue = done["queue_s"].to_numpy(dtype=np.float64)
        by_arrival = done.sort_values("arrival_s", kind="stable")["queue_s"].to_numpy(np.float64)
        third = len(by_arrival) // 3
        growth = None
        last = 0.0
        if third:
            first = float(by_arrival[:third].mean())
            last = float(by_arrival[-third:].mean())
            growth = last / first if first > 0 else (math.inf if last > 0 else 1.0)
        return cls(
            late_queue_s=last,
            median_queue_s=float(np.median(queue)) if len(queue) else 0.0,
            p99_queue_s=float(np.percentile(queue, 99)) if len(queue) else 0.0,
            queue_growth=growth,
            busy_frac=busy_s / duration,
            offered=prompt / span if span > 0 else None,
            sustainable=prompt / busy_s if busy_s > 0 else None,
            queue_share=float(queue.sum()) / ttft_total if ttft_total > 0 else 0.0,
            mean_queue_s=float(queue.mean()) if len(queue) else 0.0,
            step_s=(
                float(np.median(itls, overwrite_input=True))
                if len(itls)
                else busy_s / max(steps, 1)
            ),
        )

    def queue_dominates(self) -> bool:
        """Queueing is at least QUEUE_SHARE of the total TTFT and the mean queue at least
        QUEUE_STEPS engine steps: requests wait for other requests, not for the next step."""
        waits = self.mean_queue_s > 0 and self.mean_queue_s >= QUEUE_STEPS * self.step_s
        return waits and self.queue_share >= QUEUE_SHARE

    def reasons(self) -> list[str]:
        """Why the run is overloaded (empty: it is not). Overload is a lasting excess, told
        apart from a burst: the arrivals outpace the GPU (more prompt tokens offered per
        second than it sustains, while it computes BUSY_FRAC of the run or more and the
        queue builds up: it grows through the run or is QUEUE_SHARE of TTFT; a GPU kept
        busy by decoding, each request admitted at the next step, only looks outpaced, its
        busy time running past the last arrival), or queueing dominates TTFT while the GPU
        is busy BUSY_FRAC of the run, or the queue grows through the run (the last third of
        arrivals waits QUEUE_GROWTH times the first third's)."""
        reasons = []
        outpaced = (
            self.offered is not None
            and self.sustainable is not None
            and self.offered > self.sustainable
        )
        growth = self.queue_growth if self.queue_growth is not None else 0.0
        # a queue that grows to something: from 0 to 1 ms is infinitely more, yet no backlog
        # (a short run's few requests, a cold pass)
        grows = growth >= QUEUE_GROWTH and self.late_queue_s >= QUEUE_STEPS * self.step_s
        builds_up = grows or self.queue_share >= QUEUE_SHARE
        if outpaced and self.busy_frac >= BUSY_FRAC and builds_up:
            reasons.append(f"arrivals outpace the GPU, busy {self.busy_frac:.0%} of the run")
        if self.queue_dominates():
            queueing = (
                f"queueing is {self.queue_share:.0%} of TTFT "
                f"(mean queue {self.mean_queue_s * 1000:,.0f} ms)"
            )
            if self.busy_frac >= BUSY_FRAC and not reasons:
                reasons.append(f"{queueing} with the GPU busy {self.busy_frac:.0%} of the run")
            elif reasons:
                reasons.insert(0, queueing)
            elif grows:
                reasons.append(
                    f"{queueing}, growing through the run (the last third of arrivals waits "
                    f"{_times(growth)} the first third's)"
                )
        return reasons

    def bursty(self) -> bool:
        """Queueing dominates TTFT but the run is not overloaded: a tail of waits from bursts
        of arrivals at a moderate load."""
        return self.queue_dominates() and not self.reasons()

    def kind(self) -> str:
        """``overloaded``, ``bursty`` or ``steady``."""
        return "overloaded" if self.reasons() else ("bursty" if self.bursty() else "steady")

    def fields(self) -> dict[str, Any]:
        """The summary's keys for this load."""
        return {
            "gpu_busy_frac": self.busy_frac,
            "offered_prompt_tok_s": self.offered,
            "sustainable_prompt_tok_s": self.sustainable,
            "queue_share_of_ttft": self.queue_share,
            "overloaded": bool(self.reasons()),
            "load": self.kind(),
        }

    def warning(self, run: str) -> tuple[str, type[LoadWarning]] | None:
        """The one-line warning for this run and its category (None: a steady run)."""
        if self.reasons():
            return self.message(run), OverloadWarning
        if self.bursty():
            return self.bursty_message(run), BurstyLoadWarning
        return None

    def message(self, run: str) -> str:
        """The one-line warning for an overloaded run."""
        return (
            f"overloaded ({run}): {'; '.join(self.reasons())}; offered "
            f"{_rate(self.offered)} vs sustainable ~{_rate(self.sustainable)} prompt tokens/s "
            "(prompt tokens per second of arrivals / of GPU compute); the latencies measure "
            "the backlog more than the engine: slow the arrivals (--time-scale above 1) or add "
            "capacity"
        )

    def bursty_message(self, run: str) -> str:
        """The one-line warning for a bursty run at a moderate load."""
        return (
            f"bursty arrivals ({run}): queueing is {self.queue_share:.0%} of TTFT but the "
            f"median queue is {self.median_queue_s * 1000:,.0f} ms (p99 "
            f"{self.p99_queue_s * 1000:,.0f} ms) with the GPU busy {self.busy_frac:.0%} of the "
            "run: bursts, not overload; means are dominated by the bursts' tail, so compare "
            "median and p99 TTFT (a bigger GPU KV cache or more instances shortens the tail; "
            "slowing the arrivals does not change their shape)"
        )


def _times(ratio: float) -> str:
    return "infinitely more than" if math.isinf(ratio) else f"{ratio:,.1f}x"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


# --------------------------------------------------------------------------- tables


def numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_summaries(summary: Mapping[str, Any], baseline_prefix: str) -> dict[str, dict[str, Any]]:
    """A (possibly ``--baseline``) summary split into its runs: run label -> its own keys."""
    main = {k: v for k, v in summary.items() if not k.startswith(baseline_prefix)}
    runs = {"offload" if main.get("offload") else "no offload": main}
    base = {
        k[len(baseline_prefix) :]: v for k, v in summary.items() if k.startswith(baseline_prefix)
    }
    if base:
        runs["baseline"] = base
    return runs


def long_table(summary: Mapping[str, Any], baseline_prefix: str) -> pd.DataFrame:
    """Every numeric metric of every run as rows ``run, metric, value`` (tidy: concatenate
    several runs' tables, simulated or measured, and plot by ``run``)."""
    rows = [
        (run, k, float(v))
        for run, values in run_summaries(summary, baseline_prefix).items()
        for k, v in values.items()
        if numeric(v)
    ]
    return pd.DataFrame.from_records(rows, columns=["run", "metric", "value"])


# --------------------------------------------------------------------------- vLLM's result JSON

#: ``vllm bench serve``'s run-level fields, in its order (before the per-metric ones)
RESULT_FIELDS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
)
PEAK_FIELDS = ("max_output_tokens_per_s", "max_concurrent_requests")
_METRIC_FIELD = re.compile(r"^(mean|median|std|p[0-9.]+)_([a-z0-9]+)_ms$")
REJECTED_ERROR = "rejected: prompt + output longer than the GPU KV cache can hold"


def metric_keys(summary: Mapping[str, Any]) -> list[str]:
    """The summary's per-metric fields (``mean_ttft_ms``, ``p99_itl_ms``, ...), in order."""
    return [
        k for k in summary if (m := _METRIC_FIELD.match(k)) is not None and m.group(2) in METRICS
    ]


def vllm_result(
    summary: Mapping[str, Any],
    *,
    label: str,
    model: str,
    request_rate: float | None = None,
    requests: pd.DataFrame | None = None,
    tokens: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """One run as ``vllm bench serve --save-result`` writes it, under its field names: the
    header, the run-level fields, ``latencies`` (with ``requests``; with ``tokens`` too, the
    per-request lists of ``--save-detailed``, ``server_queue_times`` being kvsim's queue
    time) and the per-metric fields. No ``date``: a run's files follow from its inputs."""
    out: dict[str, Any] = {
        "backend": "kvsim",
        "label": label,
        "model_id": model,
        "num_prompts": summary["requests"],
        "request_rate": request_rate if request_rate is not None else "inf",
        "burstiness": 1.0,
        "max_concurrency": None,
    }
    out.update({k: summary[k] for k in RESULT_FIELDS})
    if requests is not None:
        out.update(_per_request(requests, tokens))
    out.update({k: summary[k] for k in PEAK_FIELDS})
    out.update({k: summary[k] for k in metric_keys(summary)})
    return out


def _per_request(requests: pd.DataFrame, tokens: pd.DataFrame | None) -> dict[str, Any]:
    """vLLM's per-request lists (a failed request: 0 s, no tokens, its error)."""
    ok = ~requests["rejected"].to_numpy(dtype=bool)

    def seconds(column: str) -> list[float]:
        return np.where(ok, requests[column].to_numpy(dtype=np.float64), 0.0).tolist()

    if tokens is None:
        return {"latencies": seconds("e2e_s")}
    itls: dict[int, list[float]] = {
        int(rid): np.diff(g["time_s"].to_numpy(dtype=np.float64)).tolist()
        for rid, g in tokens.groupby("request", sort=False)
    }
    return {
        "input_lens": requests["prompt_tokens"].astype(int).tolist(),
        "output_lens": np.where(ok, requests["output_tokens"], 0).astype(int).tolist(),
        "ttfts": seconds("ttft_s"),
        "itls": [itls.get(int(r), []) for r in requests["request"]],
        "latencies": seconds("e2e_s"),
        "start_times": requests["arrival_s"].astype(float).tolist(),
        "errors": ["" if good else REJECTED_ERROR for good in ok],
        "server_queue_times": [
            float(q) if good else None for q, good in zip(requests["queue_s"], ok)
        ],
    }


def bench_documents(
    summary: Mapping[str, Any],
    config: Mapping[str, Any],
    tables: Mapping[str, pd.DataFrame],
    baseline_prefix: str,
) -> dict[str, dict[str, Any]]:
    """A timed run's ``vllm bench serve`` JSON per run (``bench``, ``baseline_bench``), per-
    request lists included when the run kept its ``tokens`` table; none for other runs."""
    if "completed" not in summary:
        return {}
    docs = {}
    for n, (label, run) in enumerate(run_summaries(summary, baseline_prefix).items()):
        prefix = baseline_prefix if n else ""
        docs[prefix + "bench"] = vllm_result(
            run,
            label=label,
            model=str(summary.get("model")),
            request_rate=config.get("poisson_rate"),
            requests=tables.get(prefix + "requests"),
            tokens=tables.get(prefix + "tokens"),
        )
    return docs
