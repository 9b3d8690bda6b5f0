"""Issue 27's trace faults, each a regression test: JSON nested deeper than Python's parser
goes (#6), trace-cache entries that are not what they claim (#7), a DataFrame column made
float by one NaN (#10)."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest
from support import SAMPLE, run_main, trace_cache_entries

from kvsim.core.errors import InputError
from kvsim.core.io import parse_json, read_json
from kvsim.traces import cache, open_trace
from kvsim.traces.cache_file import MAGIC

DEPTH = 200_000
DEEP = "[" * DEPTH + "]" * DEPTH
GOOD = Path(SAMPLE).read_text().splitlines()[0]


def _deep_line() -> str:
    return GOOD[:-1] + f', "x": {DEEP}' + "}"


# --------------------------------------------------------------------------- 6: deep JSON


def test_a_deep_json_file_is_one_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(f'{{"a": {DEEP}}}')
    with pytest.raises(InputError, match=r"c\.json: not valid JSON \(nested too deeply"):
        read_json(path)
    with pytest.raises(InputError, match="nested too deeply"):
        parse_json(DEEP, "--vllm-config")


def test_the_line_reader_names_a_deep_line():
    from kvsim.traces.formats.batching import line_batches

    lines = [(2, _deep_line().encode())]
    with pytest.raises(InputError, match=r"t\.jsonl:2: JSON nested too deeply"):
        list(line_batches(lines, lambda d, p, n: d, "t.jsonl", 0))


def test_a_native_header_nested_too_deeply():
    from kvsim.traces.formats.native import read_header

    line = ('{"kvsim_trace": 1, "block_tokens": 16, "x": ' + DEEP + "}").encode()
    with pytest.raises(InputError, match=r"n\.jsonl:1: JSON nested too deeply"):
        read_header(line, "n.jsonl")


@pytest.mark.parametrize("command", ["replay", "trace stats", "simulate"])
def test_a_deep_first_line_is_one_line_exit_2(tmp_path, capsys, command):
    trace = tmp_path / "deep.jsonl"
    trace.write_text(_deep_line() + "\n" + GOOD + "\n")
    extra = {"replay": ["--cpu-chunks", "10"], "simulate": ["--no-progress"]}.get(command, [])
    code, _, err = run_main([*command.split(), trace, *extra], capsys)
    assert code == 2, err
    assert "nested too deeply" in err and err.count("\n") == 1, err


def test_a_deep_vllm_config_is_one_line_exit_2(tmp_path, capsys):
    config = tmp_path / "vllm.json"
    config.write_text(f'{{"a": {DEEP}}}')
    code, _, err = run_main(["replay", SAMPLE, "--vllm-config", config], capsys)
    assert code == 2 and "nested too deeply" in err and err.count("\n") == 1, err


# --------------------------------------------------------------------------- 7: cache entries


def _entry_replaced_by(tmp_path: Path, kind: str) -> tuple[str, list, Path]:
    """A trace read once (its entry written), then the entry replaced by ``kind``."""
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(Path(SAMPLE).read_bytes())
    first = list(open_trace(str(trace)))
    (entry,) = trace_cache_entries()
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "dev-zero":
        entry.symlink_to("/dev/zero")
    elif kind == "sparse":
        with open(entry, "wb") as f:
            f.truncate(8 << 30)  # 8 GiB of holes: nothing on disk, everything to read
    elif kind == "claims-huge":  # the magic, then a header length past the file's end
        entry.write_bytes(MAGIC + (1 << 31).to_bytes(4, "little") + b"{}")
    elif kind == "folder":
        entry.mkdir()
    cache.forget()
    return str(trace), first, entry


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "sparse", "claims-huge", "folder"])
def test_a_cache_entry_that_is_not_an_entry_is_refused_without_reading_it(tmp_path, kind):
    trace, first, entry = _entry_replaced_by(tmp_path, kind)
    tracemalloc.start()
    start = time.monotonic()
    assert list(open_trace(trace)) == first  # parsed again
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.monotonic() - start < 30
    assert peak < 200 << 20, peak
    assert cache.STATS["rejected"] == 1
    if kind != "folder":  # replaced by a sound entry, never written into
        assert entry.is_file() and not entry.is_symlink()
        cache.forget()
        assert list(open_trace(trace)) == first and cache.STATS["hits"] == 1


# --------------------------------------------------------------------------- 10: a NaN


def test_a_nan_in_an_integer_column_is_named_at_its_row():
    import numpy as np
    import pandas as pd

    import kvsim

    frame = pd.DataFrame(
        {
            "arrival_s": [0.0, 1.0, 2.0, 3.0],
            "prompt_tokens": [1194, 500, 600, np.nan],
            "output_tokens": [5, 5, 5, 5],
            "block_hashes": [[1, 2, 3], [4], [5, 6], [7]],
        }
    )
    with pytest.raises(InputError, match=r"row:3: field 'prompt_tokens' .* got nan"):
        kvsim.replay(frame, cpu_chunks=10)
    frame["prompt_tokens"] = [1194.0, 500.0, 600.0, 300.0]  # floats, all whole: read as ints
    assert kvsim.replay(frame, cpu_chunks=10).summary["requests"] == 4


# --------------------------------------------------------------------------- 11: a huge line


@pytest.mark.parametrize("gz", [False, True])
def test_a_line_over_the_documented_limit_is_refused_before_it_is_parsed(
    tmp_path, monkeypatch, capsys, gz
):
    """docs/testing.md#limits: lines up to MAX_LINE_BYTES (16 MiB); here shrunk to 64 KiB, with
    2 KiB read blocks, so a 100 KB line of block ids stands for a 79 MB one."""
    import gzip

    from kvsim.traces.formats import files, jsonl

    monkeypatch.setattr(files, "MAX_LINE_BYTES", 64 << 10, raising=False)
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 64 << 10, raising=False)
    monkeypatch.setattr(jsonl, "_BLOCK_BYTES", 2 << 10)
    n = 20_000
    ids = ",".join(map(str, range(n)))
    long_line = (
        f'{{"timestamp": 5, "input_length": {n * 512}, "output_length": 2, "hash_ids": [{ids}]}}'
    )
    text = GOOD + "\n" + long_line + "\n"
    trace = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    trace.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    code, _, err = run_main(["replay", trace, "--cpu-chunks", "10", "--no-cache"], capsys)
    assert code == 2, err
    assert f"{trace}:2: line of {len(long_line) + 1:,} bytes" in err and err.count("\n") == 1
