"""What the timed-mode speed and memory work changed, checked against the plain path: the
steps table cut into column chunks equals one built row by row (and is written to the same
bytes), a finished request lets go of its GPU block list, its keys and its context, and
``kvsim bench --timed`` runs (its comparison with vLLM is in
tests/vllm/test_vllm_engine_bench.py)."""

from __future__ import annotations

import filecmp
from typing import Any

import numpy as np
import pandas as pd
import pytest
from support import SAMPLE, run_main

from kvsim.engine import recorder as recorder_module
from kvsim.engine.bench import TwinKnobs, bench_timed, twin_engine
from kvsim.engine.recorder import STEP_FLOAT, STEP_INT, STEP_STATS, Recorder
from kvsim.engine.request_state import REJECTED, SimRequest
from kvsim.report.metric_names import CPU_ALLOCATION_SIZE, STORES_SKIPPED
from kvsim.report.tables import write_table
from kvsim.traces import Trace, as_trace


def _run(limit: int, **knobs: object):  # type: ignore[no-untyped-def]
    tr = as_trace(SAMPLE, limit=limit)
    engine = twin_engine(
        TwinKnobs(block_tokens=tr.block_tokens, gpu_blocks=2000, **{"cpu_chunks": 200, **knobs})  # type: ignore[arg-type]
    )
    return engine.run(Trace.from_requests(list(tr), tr.block_tokens))


def test_step_table_in_column_chunks_equals_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows move into the columns every STEP_ROWS steps; with cuts of 7 rows (many cuts, the
    columns grown several times, a partial last cut) the table equals the one a single cut
    gives, column for column, and its columns are the recorder's own (no copy)."""
    whole = _run(40).recorder.step_table()
    monkeypatch.setattr(recorder_module, "STEP_ROWS", 7)
    cut = _run(40).recorder
    table = cut.step_table()
    assert len(whole) > 7 * 3 and cut._steps_cut == len(whole)
    assert np.shares_memory(table["end_s"].to_numpy(), cut._float_columns[1])
    assert list(table.columns) == list(whole.columns)
    for name in whole.columns:
        np.testing.assert_array_equal(table[name].to_numpy(), whole[name].to_numpy(), name)
        assert table[name].dtype == whole[name].dtype
    assert table.equals(cut.step_table())  # asked again: the same table


def test_step_table_equals_a_table_of_plain_rows(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The compact steps table is the table of one dict a step (the plain representation),
    value for value and dtype for dtype, and is written to the same Parquet and CSV bytes;
    it costs at most 0.3 KB a step in memory (8 bytes a cell)."""
    rows: list[dict[str, Any]] = []
    record = Recorder.step

    def step(self: Recorder, floats: Any, ints: Any, stats: Any) -> None:
        gauges = [stats[f"vllm:kv_offload_{n}"] for n in STEP_FLOAT[5:]] if stats else [0.0] * 3
        sizes = stats[CPU_ALLOCATION_SIZE] if stats else []
        extra = (len(sizes), sum(sizes), stats[STORES_SKIPPED] if stats else 0)
        rows.append(
            {
                **dict(zip(STEP_FLOAT, [*floats, *gauges])),
                **dict(zip(STEP_INT + STEP_STATS, [*ints, *extra])),
            }
        )
        record(self, floats, ints, stats)

    monkeypatch.setattr(Recorder, "step", step)
    monkeypatch.setattr(recorder_module, "STEP_ROWS", 16)  # several column chunks
    table = _run(40).recorder.step_table()
    order = ["step", *STEP_FLOAT, *STEP_INT[1:], *STEP_STATS]
    plain = pd.DataFrame.from_records(rows, columns=order)
    assert len(table) == len(rows) > 16 * 3 and table["stores_submitted"].sum() > 0
    assert table["cpu_cache_usage_perc"].max() > 0  # the CPU tier's gauges are in it
    assert list(table.columns) == order and list(table.dtypes) == list(plain.dtypes)
    assert table.equals(plain)
    write_table(table, tmp_path, "compact")
    write_table(plain, tmp_path, "plain")
    for ext in ("parquet", "csv"):
        assert filecmp.cmp(tmp_path / f"compact.{ext}", tmp_path / f"plain.{ext}", shallow=False)
    assert table.memory_usage(index=False).sum() / len(table) <= 300


def test_step_table_of_a_run_without_steps() -> None:
    engine = twin_engine(TwinKnobs(block_tokens=16, gpu_blocks=100))
    table = engine.run(Trace.from_requests([], 16)).recorder.step_table()
    assert len(table) == 0 and table["step"].dtype == np.int64
    assert table["start_s"].dtype == np.float64


@pytest.mark.parametrize("cpu_chunks", [None, 200])
def test_a_finished_request_lets_go_of_its_blocks(cpu_chunks: int | None) -> None:
    """A finished request keeps no GPU block list (the pool holds the blocks; with a
    connector, once its last offer is made), so memory does not grow with finished
    requests; every block is free at the end."""
    tr = as_trace(SAMPLE, limit=30)
    knobs = TwinKnobs(block_tokens=tr.block_tokens, gpu_blocks=2000, cpu_chunks=cpu_chunks)
    engine = twin_engine(knobs).run(Trace.from_requests(list(tr), tr.block_tokens))
    finished = [r for r in engine.recorder.requests if r.status != REJECTED]
    assert len(finished) > 20 and all(r.finish is not None for r in finished)
    assert all(r.blocks == [] and r.block_keys == [] for r in finished)
    assert engine.pool.num_free == engine.pool.num_blocks


@pytest.mark.parametrize(
    "knobs", [{}, {"cpu_chunks": None}, {"async_scheduling": True}], ids=["sync", "none", "async"]
)
def test_a_finished_request_keeps_only_its_numbers(
    monkeypatch: pytest.MonkeyPatch, knobs: dict[str, Any]
) -> None:
    """Once a request finished, made its last store offer and its last job ended, its keys
    and its context (the manager's state for it) go: every finished request of a run is so
    at its end, and the run's tables equal those of a run that keeps them all."""
    engine = _run(40, **knobs)
    finished = [r for r in engine.recorder.requests if r.status != REJECTED]
    assert len(finished) > 30
    for name in ("ctx", "chunk_keys", "unit_keys"):
        assert not any(hasattr(r, name) for r in finished), name
    monkeypatch.setattr(SimRequest, "retire", lambda self: None)
    kept = _run(40, **knobs)
    assert all(hasattr(r, "ctx") for r in kept.recorder.requests)
    for ours, theirs in zip(_tables(engine), _tables(kept)):
        assert ours.equals(theirs)


def _tables(engine: Any) -> list[pd.DataFrame]:
    rec = engine.recorder
    return [rec.request_table(), rec.transfer_table(), rec.step_table()]


def test_bench_timed_without_vllm() -> None:
    tr = as_trace(SAMPLE, limit=20)
    knobs = TwinKnobs(block_tokens=tr.block_tokens, gpu_blocks=2000, cpu_chunks=200)
    table = bench_timed(list(tr), knobs, repeat=1, with_vllm=False)
    assert list(table["engine"]) == ["kvsim"]
    engine = twin_engine(knobs).run(Trace.from_requests(list(tr), tr.block_tokens))
    assert table["steps"].iloc[0] == engine.steps
    assert 0 < engine.computing_steps <= engine.steps
    assert engine.computing_steps == int((engine.recorder.step_table()["num_seqs"] > 0).sum())


def test_bench_timed_command(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "bench.csv"
    code, stdout, _ = run_main(
        ["bench", SAMPLE, "--timed", "--limit", "10", "--repeat", "1", "--no-vllm", "--csv", out],
        capsys,
    )
    assert code == 0, stdout
    assert "10 requests" in stdout and "kvsim" in stdout
    assert out.read_text().splitlines()[0].startswith("engine,seconds,steps")


@pytest.mark.parametrize(("flag", "bar"), [("--progress", True), ("--no-progress", False)])
def test_bench_timed_counts_its_runs_on_request(flag: str, bar: bool, capsys) -> None:  # type: ignore[no-untyped-def]
    """Both engines run --repeat times, so a long bench says how far it is (on stderr: the
    table on stdout stays the only output there)."""
    args = ["bench", SAMPLE, "--timed", "--limit", "5", "--repeat", "3", "--no-vllm", flag]
    code, stdout, err = run_main(args, capsys)
    assert code == 0, err
    assert ("bench --timed" in err and "3/3" in err) == bar, err
    assert "bench --timed" not in stdout
