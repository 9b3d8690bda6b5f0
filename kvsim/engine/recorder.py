"""Tidy output tables of a timed run (requests, transfer jobs, steps) and the summary.

Columns are kept in compact arrays while the run goes, and become pandas tables at the end.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from kvsim.engine.connector import ConnectorJob
from kvsim.engine.request_state import REJECTED, SimRequest
from kvsim.engine.transfer_protocol import TransferResult
from kvsim.report.metric_names import (
    CPU_ALLOCATION_SIZE,
    CPU_CACHE_READ_USAGE_PERC,
    CPU_CACHE_USAGE_PERC,
    CPU_CACHE_WRITE_USAGE_PERC,
    STORES_SKIPPED,
)

REQUEST_COLUMNS = (
    "request",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
    "kv_wait_s",
    "gpu_hit_tokens",
    "cpu_hit_tokens",
    "computed_prompt_tokens",
    "recomputed_tokens",
    "preemptions",
    "deferrals",
    "rejected",
)
TRANSFER_COLUMNS = (
    "job",
    "direction",
    "request",
    "chunks",
    "bytes",
    "copies",
    "created_step",
    "submit_s",
    "start_s",
    "end_s",
    "duration_s",
    "success",
)
STEP_FLOAT = (
    "start_s",
    "end_s",
    "stall_s",
    "forward_s",
    "gpu_kv_usage",
    "cpu_cache_usage_perc",
    "cpu_cache_write_usage_perc",
    "cpu_cache_read_usage_perc",
)
STEP_INT = (
    "step",
    "num_seqs",
    "num_prefill_seqs",
    "prefill_tokens",
    "decode_tokens",
    "running",
    "waiting",
    "waiting_for_kv",
    "gpu_free_blocks",
    "finished",
    "preempted",
    "loads_submitted",
    "stores_submitted",
    "jobs_completed",
    "allocation_failures_total",
    "cpu_resident_chunks",
    "load_bytes_total",
    "store_bytes_total",
)
STEP_STATS = ("allocation_sizes_count", "allocation_sizes_sum", "stores_skipped")
_GAUGES = (CPU_CACHE_USAGE_PERC, CPU_CACHE_WRITE_USAGE_PERC, CPU_CACHE_READ_USAGE_PERC)
# a step's row as ``Recorder.step`` lays it out: the engine's values, then the CPU tier's
_FLOAT_ROW = STEP_FLOAT[:5] + tuple(name[len("vllm:kv_offload_") :] for name in _GAUGES)
_INT_ROW = STEP_INT + STEP_STATS
STEP_ROWS = 4096  # steps recorded as rows before they move into the columns
_EMPTY_FLOAT = np.zeros(0, dtype=np.float64)  # a column before its first rows (never written)
_EMPTY_INT = np.zeros(0, dtype=np.int64)


class Recorder:
    """Collects a timed run's per-request, per-job and per-step records; builds the tables."""

    def __init__(self, record_steps: bool = True) -> None:
        self.record_steps = record_steps
        self.requests: list[SimRequest] = []
        self.transfers: list[tuple[Any, ...]] = []
        self._submit: dict[int, float] = {}
        # one row a step, flat: extending an array by a row is one call, where a column each
        # would be 29. Every STEP_ROWS steps the rows move into the columns, numpy buffers
        # that double when full, so the table is held once, column by column, and becomes a
        # DataFrame of views without a copy or a join (a join's copy, and the chunks it
        # frees into the heap, cost 0.1 KB a step at the run's peak; a buffer's unused tail
        # is never written, so it takes no memory)
        self._step_floats = array("d")
        self._step_ints = array("q")
        self._float_columns: list[np.ndarray] = [_EMPTY_FLOAT for _ in _FLOAT_ROW]
        self._int_columns: list[np.ndarray] = [_EMPTY_INT for _ in _INT_ROW]
        self._steps_cut = 0  # rows moved into the columns

    def on_submit(self, job: ConnectorJob, now: float) -> None:
        self._submit[job.job_id] = now

    def on_done(self, job: ConnectorJob, r: TransferResult) -> None:
        self.transfers.append(
            (
                job.job_id,
                job.direction,
                job.req.rid,
                len(job.keys),
                r.nbytes,
                job.copies,
                job.step,
                self._submit.pop(job.job_id, r.submit_time),
                r.start_time,
                r.end_time,
                r.end_time - r.start_time,
                r.success,
            )
        )

    def step(
        self, floats: tuple[float, ...], ints: tuple[int, ...], stats: dict[str, Any] | None
    ) -> None:
        if not self.record_steps:
            return
        self._step_floats.extend(floats)
        self._step_ints.extend(ints)
        if stats is not None:
            sizes = stats[CPU_ALLOCATION_SIZE]
            self._step_floats.extend([stats[name] for name in _GAUGES])
            self._step_ints.extend((len(sizes), sum(sizes), stats[STORES_SKIPPED]))
        else:
            self._step_floats.extend((0.0, 0.0, 0.0))
            self._step_ints.extend((0, 0, 0))
        if len(self._step_ints) >= STEP_ROWS * len(_INT_ROW):
            self._cut_step_rows()

    def repeat_step(self, step: int, t0: float, t2: float, fwd: float) -> None:
        """Record step ``step`` as a copy of the last row recorded but for its index, its
        schedule and end times and its forward time: a quiet decode step after another
        (:mod:`kvsim.engine.quiet_decode`), in which no gauge, count or queue moves.

        Invariant: the caller recorded at least one row with :meth:`step`."""
        if not self.record_steps:
            return
        nf, ni = len(_FLOAT_ROW), len(_INT_ROW)
        floats, ints = self._step_floats, self._step_ints
        if ints:
            row_f, row_i = floats[-nf:], ints[-ni:]
        else:  # the rows just moved into the columns
            last = self._steps_cut - 1
            row_f = array("d", [float(c[last]) for c in self._float_columns])
            row_i = array("q", [int(c[last]) for c in self._int_columns])
        row_f[0] = t0
        row_f[1] = t2
        row_f[3] = fwd
        row_i[0] = step
        floats.extend(row_f)
        ints.extend(row_i)
        if len(ints) >= STEP_ROWS * ni:
            self._cut_step_rows()

    def _cut_step_rows(self) -> None:
        """Move the flat rows recorded so far into the columns (grown to twice their size
        when full, a column at a time: each row is copied about twice in all, and the old
        buffer goes as soon as its copy is made)."""
        start = self._steps_cut
        end = start + len(self._step_ints) // len(_INT_ROW)
        for flat, dtype, columns in (
            (self._step_floats, np.float64, self._float_columns),
            (self._step_ints, np.int64, self._int_columns),
        ):
            rows = np.frombuffer(flat, dtype=dtype).reshape(-1, len(columns))
            for i, column in enumerate(columns):
                if end > len(column):
                    grown = np.empty(max(end, 2 * len(column), STEP_ROWS), dtype=dtype)
                    grown[:start] = column[:start]
                    columns[i] = column = grown
                column[start:end] = rows[:, i]
            del rows
        self._steps_cut = end
        self._step_floats = array("d")
        self._step_ints = array("q")

    # --- tables ---

    def request_table(self) -> pd.DataFrame:
        rows = []
        for r in self.requests:
            rejected = r.status == REJECTED
            ttft = r.first_token - r.arrival if r.first_token is not None else float("nan")
            tpot = (
                (r.finish - r.first_token) / (r.output - 1)
                if r.output > 1 and r.finish is not None and r.first_token is not None
                else float("nan")
            )
            # a hit covering the whole prompt still computes its last token (vLLM reports the
            # full hit and recomputes that one token)
            computed_prompt = max(1, r.prompt - r.gpu_hit - r.cpu_hit)
            needed = computed_prompt + r.output - 1
            rows.append(
                (
                    r.rid,
                    r.arrival,
                    r.prompt,
                    r.num_output,
                    _nan(r.first_scheduled),
                    _nan(r.first_token),
                    _nan(r.finish),
                    ttft,
                    tpot,
                    (r.finish - r.arrival) if r.finish is not None else float("nan"),
                    (r.first_scheduled - r.arrival)
                    if r.first_scheduled is not None
                    else float("nan"),
                    r.kv_wait,
                    r.gpu_hit,
                    r.cpu_hit,
                    computed_prompt if not rejected else 0,
                    r.forward_tokens - needed if not rejected else 0,
                    r.preemptions,
                    r.deferrals,
                    rejected,
                )
            )
        return pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))

    def token_gaps(self) -> list[np.ndarray]:
        """Each request's inter-token latencies (s, float32 views, no copy); requests with
        more than one output token."""
        return [
            np.frombuffer(r.token_gaps, dtype=np.float32) for r in self.requests if r.token_gaps
        ]

    def token_times(self, requests: Iterable[SimRequest] | None = None) -> Iterator[np.ndarray]:
        """The output-token times (s) of the requests that got any (of ``requests``, default
        all of the run's), a batch of requests at a time, each batch one flat array in no
        particular order (what counting tokens per second needs): the requests with as many
        tokens as each other are the rows of one array, and each time is exactly what
        :func:`_times` gives for its request alone. A batch holds at most about
        :data:`TIMES_BATCH` times, so memory stays bounded however long the run."""
        by_length: dict[int, list[SimRequest]] = {}
        for r in self.requests if requests is None else requests:
            if r.first_token is not None:
                by_length.setdefault(len(r.token_gaps), []).append(r)
        for n_gaps, group in by_length.items():
            rows = max(1, TIMES_BATCH // (n_gaps + 1))
            for at in range(0, len(group), rows):
                yield _times_of_rows(group[at : at + rows], n_gaps)

    def token_table(self) -> pd.DataFrame:
        """One row per output token: ``request``, ``token`` (0 = the first) and ``time_s``, in
        request order (long; built only when asked for, e.g. vLLM's per-request ``itls``)."""
        rids: list[np.ndarray] = []
        index: list[np.ndarray] = []
        times: list[np.ndarray] = []
        for r in self.requests:
            if r.first_token is not None:
                t = _times(r.token_gaps, r.first_token)
                rids.append(np.full(len(t), r.rid, dtype=np.int64))
                index.append(np.arange(len(t), dtype=np.int64))
                times.append(t)
        if not times:
            return pd.DataFrame(
                {
                    "request": np.zeros(0, np.int64),
                    "token": np.zeros(0, np.int64),
                    "time_s": np.zeros(0),
                }
            )
        return pd.DataFrame(
            {
                "request": np.concatenate(rids),
                "token": np.concatenate(index),
                "time_s": np.concatenate(times),
            }
        )

    def transfer_table(self) -> pd.DataFrame:
        return pd.DataFrame.from_records(self.transfers, columns=list(TRANSFER_COLUMNS))

    def step_table(self) -> pd.DataFrame:
        """One row per engine step; its columns are views of the recorder's (the recorded
        rows move into them, so the table is never held twice)."""
        self._cut_step_rows()
        n = self._steps_cut
        columns = dict(zip(_FLOAT_ROW, [c[:n] for c in self._float_columns]))
        columns.update(zip(_INT_ROW, [c[:n] for c in self._int_columns]))
        order = ("step", *STEP_FLOAT, *STEP_INT[1:], *STEP_STATS)
        return pd.DataFrame({name: columns[name] for name in order}, copy=False)

    def forget_steps(self) -> None:
        """Let go of the steps recorded: the table :meth:`step_table` built keeps its
        columns, the recorder no longer does (a fleet joins its instances' tables column by
        column and frees each instance's column as it goes, so no row is held twice).
        Afterwards :meth:`step_table` has no rows."""
        self._step_floats = array("d")
        self._step_ints = array("q")
        self._float_columns = [_EMPTY_FLOAT for _ in _FLOAT_ROW]
        self._int_columns = [_EMPTY_INT for _ in _INT_ROW]
        self._steps_cut = 0


def _times(gaps: array[float], first: float) -> np.ndarray:
    """A request's output-token times: its first token's, then each gap added on."""
    t = np.empty(len(gaps) + 1)
    t[0] = 0.0
    np.cumsum(np.frombuffer(gaps, dtype=np.float32), dtype=np.float64, out=t[1:])
    return t + first


#: token times per batch of :meth:`Recorder.token_times` (about 8 MB of float64)
TIMES_BATCH = 1 << 20


def _times_of_rows(requests: list[SimRequest], n_gaps: int) -> np.ndarray:
    """:func:`_times` of ``requests`` (each with ``n_gaps`` gaps and a first token), flat:
    their gaps are the rows of one array, summed along each row in order, as
    :func:`_times` sums one request's, and each row then offset by its first token."""
    gaps = array("f")
    for r in requests:
        gaps.extend(r.token_gaps)
    t = np.empty((len(requests), n_gaps + 1))
    t[:, 0] = 0.0
    rows = np.frombuffer(gaps, dtype=np.float32).reshape(len(requests), n_gaps)
    np.cumsum(rows, axis=1, dtype=np.float64, out=t[:, 1:])
    t += np.array([r.first_token for r in requests])[:, None]
    return t.ravel()


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x
