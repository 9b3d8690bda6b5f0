"""The trace cache: a cached read equals a parsed one field for field, a changed file or
kvsim is parsed again, a corrupt entry is never trusted, entries are written whole through
``kvsim.core.io``, and a malformed trace still fails naming its line (caching nothing)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import (
    SAMPLE,
    TRACES,
    copy_to,
    exact_fields,
    gzip_copy,
    has_files,
    run_main,
    trace_cache_entries,
    trace_cache_folder,
)

from kvsim.core.errors import InputError
from kvsim.traces import cache, fast_jsonl, open_trace
from kvsim.traces.columns import from_requests
from kvsim.traces.source import request_records

BAILIAN = TRACES / "samples" / "bailian_sample.jsonl"
NATIVE = TRACES / "samples" / "native_sample.jsonl"
AZURE = TRACES / "azure_llm_2023_code.csv"
MOON_LINE = {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [4, 5, 6]}


@pytest.mark.parametrize("src", [SAMPLE, BAILIAN, NATIVE, AZURE, "gz"], ids=str)
def test_second_read_equals_the_first_and_comes_from_the_cache(tmp_path, parses, src):
    path = gzip_copy(SAMPLE, tmp_path / "t.jsonl.gz") if src == "gz" else copy_to(src, tmp_path)
    first = list(open_trace(path))
    assert parses == [path] and cache.STATS["stores"] == 1 and len(trace_cache_entries()) == 1
    cache.forget()  # not from memory: from the folder
    second = list(open_trace(path))
    assert parses == [path] and cache.STATS["hits"] == 1
    assert exact_fields(second) == exact_fields(first) and len(first) > 0
    # and a third, in memory this time, also through the records hot loops read
    records = list(request_records(open_trace(path)))
    assert cache.STATS["memory_hits"] == 1 and parses == [path]
    assert [(*r[:4], tuple(r[4]), r[5]) for r in records] == [
        (r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes, r.session_id)
        for r in first
    ]


def test_cached_read_equals_the_line_reader_exactly(tmp_path, monkeypatch):
    """The reference: the line-by-line reader alone (no fast decoder, no cache)."""
    path = copy_to(TRACES / "mooncake_fast25_synthetic_trace.jsonl", tmp_path)
    with cache.settings(enabled=False):
        monkeypatch.setattr(fast_jsonl, "decode_block", lambda *a: None)
        reference = list(open_trace(path))
        monkeypatch.undo()
    cache.forget()
    list(open_trace(path))
    cache.forget()
    assert exact_fields(list(open_trace(path))) == exact_fields(reference)
    assert cache.STATS["hits"] == 1


def test_limits_and_passes_from_the_cache(tmp_path, parses):
    path = copy_to(SAMPLE, tmp_path)
    full = list(open_trace(path))
    cache.forget()
    assert list(open_trace(path, limit=7)) == full[:7]
    assert list(open_trace(path, limit=0)) == []
    tr = open_trace(path)
    assert list(tr) == list(tr) == full  # two passes over one Trace
    assert parses == [path]


def _typed(records: object) -> list[tuple]:
    """Records with each value's type (a list of ids stays a list)."""
    return [tuple((type(v).__name__, v) for v in r) for r in records]  # type: ignore[attr-defined]


@pytest.mark.parametrize("limit", [None, 0, 1, 7])
@pytest.mark.parametrize("src", [SAMPLE, BAILIAN, NATIVE, AZURE, "wide", "sessions"], ids=str)
def test_records_straight_from_the_entry_equal_the_columns_records(tmp_path, parses, src, limit):
    """A replay reads a cached trace as plain lists cast from the entry's bytes (no numpy):
    the same values and types as the columns give, 32- and 64-bit ids, with and without
    sessions, and a limit."""
    if src in ("wide", "sessions"):
        header = {"kvsim_trace": 1, "block_tokens": 16}
        recs = [
            {
                "arrival_s": i / 3,
                "input_tokens": 40,
                "output_tokens": 3,
                "block_hashes": [2**40 + i, -i] if src == "wide" else [i, i + 1],
                "session_id": None if src == "wide" or i % 3 else i,
            }
            for i in range(20)
        ]
        path = str(tmp_path / f"{src}.jsonl")
        Path(path).write_text(
            json.dumps(header) + "\n" + "".join(json.dumps(r) + "\n" for r in recs)
        )
    else:
        path = copy_to(src, tmp_path)
    expected = _typed(request_records(open_trace(path, limit=limit)))  # parsed: numpy columns
    list(open_trace(path))  # read whole: stored
    cache.forget()
    hits = cache.STATS["hits"]
    got = _typed(request_records(open_trace(path, limit=limit)))
    assert got == expected and (limit == 0 or len(got) > 0)
    assert cache.STATS["hits"] == hits + (limit != 0)
    assert len(parses) == 1 + (limit not in (None, 0))  # a partial read is parsed, not stored


@pytest.mark.parametrize("damage", ["flip", "truncate", "lengths"])
def test_records_read_refuses_a_damaged_entry_and_parses_again(tmp_path, parses, damage):
    path = copy_to(SAMPLE, tmp_path)
    first = list(request_records(open_trace(path)))
    (entry,) = trace_cache_entries()
    raw = bytearray(entry.read_bytes())
    if damage == "flip":
        raw[len(raw) * 2 // 3] ^= 0x40
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:  # a negative length, with the checksum made to match: the arrays must still fit
        raw = _with_a_negative_length(raw)
    entry.write_bytes(bytes(raw))
    cache.forget()
    assert list(request_records(open_trace(path))) == first
    assert cache.STATS["rejected"] == 1 and len(parses) == 2


def _with_a_negative_length(raw: bytearray) -> bytearray:
    """The entry with request 0's id count negated and its CRC recomputed."""
    import zlib

    from kvsim.traces import cache_file

    start = len(cache_file.MAGIC) + 4
    size = int.from_bytes(raw[len(cache_file.MAGIC) : start], "little")
    header = json.loads(raw[start : start + size])
    at = start + size + (-(start + size) % 8)
    for name, dtype, count in header["arrays"]:
        if name == "lengths":
            value = int.from_bytes(raw[at : at + 8], "little", signed=True)
            raw[at : at + 8] = (-value).to_bytes(8, "little", signed=True)
            break
        nbytes = count * {"<f8": 8, "<i8": 8, "<i4": 4, "|b1": 1}[dtype]
        at += nbytes + (-nbytes % 8)
    end = len(raw) - 4 - len(cache_file.TRAILER)
    raw[end : end + 4] = zlib.crc32(bytes(raw[:end])).to_bytes(4, "little")
    return raw


def test_a_read_with_a_limit_stores_nothing_until_the_file_is_read_whole(tmp_path, parses):
    path = copy_to(SAMPLE, tmp_path)
    assert len(list(open_trace(path, limit=5))) == 5
    assert trace_cache_entries() == []
    list(open_trace(path))
    assert len(trace_cache_entries()) == 1 and len(parses) == 2


def test_changed_file_with_same_size_and_mtime_is_parsed_again(tmp_path, parses):
    path = copy_to(SAMPLE, tmp_path)
    before = list(open_trace(path))
    st = os.stat(path)
    data = Path(path).read_bytes()
    i = data.index(b'"output_length": ') + len(b'"output_length": ')
    digit = data[i : i + 1]
    changed = data[:i] + (b"1" if digit != b"1" else b"2") + data[i + 1 :]
    Path(path).write_bytes(changed)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    cache.forget()
    after = list(open_trace(path))
    assert len(parses) == 2
    assert after[0].output_tokens != before[0].output_tokens and after[1:] == before[1:]


def test_another_kvsim_version_reads_afresh(tmp_path, parses, monkeypatch):
    path = copy_to(SAMPLE, tmp_path)
    first = list(open_trace(path))
    monkeypatch.setattr(cache, "code_version", lambda: "9.9.9+other")
    cache.forget()
    assert list(open_trace(path)) == first
    assert len(parses) == 2 and len(trace_cache_entries()) == 2


def test_the_key_includes_the_reading_options(tmp_path, parses):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(MOON_LINE) + "\n" for _ in range(4)))
    a = list(open_trace(str(p)))
    b = list(open_trace(str(p), block_tokens=500))  # 3 ids fit 1100 tokens either way
    assert len(parses) == 2 and len(trace_cache_entries()) == 2 and a == b
    with pytest.raises(InputError, match=":1: field 'hash_ids' has 3 entries"):
        list(open_trace(str(p), block_tokens=64))  # the cache cannot hide a misfit


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
def test_a_corrupt_entry_is_ignored_and_rewritten(tmp_path, parses, damage):
    path = copy_to(SAMPLE, tmp_path)
    first = list(open_trace(path))
    (entry,) = trace_cache_entries()
    raw = bytearray(entry.read_bytes())
    if damage == "flip":
        raw[len(raw) * 2 // 3] ^= 0x40  # a byte of the block ids
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "garbage":
        raw = bytearray(b"not an npz file at all" * 10)
    else:
        raw = bytearray()
    entry.write_bytes(bytes(raw))
    cache.forget()
    assert list(open_trace(path)) == first  # parsed again, not the damaged values
    assert cache.STATS["rejected"] == 1 and len(parses) == 2
    cache.forget()
    assert list(open_trace(path)) == first and cache.STATS["hits"] == 1  # rewritten


def test_an_entry_for_another_key_is_never_used(tmp_path, parses):
    """An entry renamed to another trace's name restates its own key inside: rejected."""
    a = copy_to(SAMPLE, tmp_path, "a.jsonl")
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(MOON_LINE) + "\n" for _ in range(3)))
    list(open_trace(a))
    (entry_a,) = trace_cache_entries()
    expect_b = list(open_trace(str(b)))
    entry_b = next(e for e in trace_cache_entries() if e != entry_a)
    shutil.copyfile(entry_a, entry_b)
    cache.forget()
    assert list(open_trace(str(b))) == expect_b
    assert cache.STATS["rejected"] == 1


def test_no_cache_reads_and_writes_nothing(tmp_path, parses, capsys):
    path = copy_to(SAMPLE, tmp_path)
    with cache.settings(enabled=False):
        a = list(open_trace(path))
        cache.forget()
        assert list(open_trace(path)) == a
    assert not has_files(trace_cache_folder()) and len(parses) == 2
    code, _, err = run_main(["replay", path, "--cpu-chunks", "10", "--no-cache"], capsys)
    assert code == 0, err
    assert not has_files(trace_cache_folder())
    assert "KVSIM_NO_CACHE" not in os.environ  # the setting lasted the command only


def test_trace_cache_option_chooses_the_folder(tmp_path, capsys):
    path = copy_to(SAMPLE, tmp_path)
    where = tmp_path / "elsewhere"
    code, _, err = run_main(["replay", path, "--cpu-chunks", "10", "--trace-cache", where], capsys)
    assert code == 0, err
    assert len(list(where.glob("*.columns"))) == 1 and not has_files(trace_cache_folder())
    assert os.environ["KVSIM_CACHE_DIR"] == str(trace_cache_folder())  # restored


def test_never_written_beside_the_trace(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    traces.mkdir()
    path = copy_to(SAMPLE, traces)
    list(open_trace(path))
    assert sorted(os.listdir(traces)) == ["mooncake_small.jsonl"]
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(traces))  # even when told to
    cache.forget()
    assert len(list(open_trace(path))) == 200
    assert sorted(os.listdir(traces)) == ["mooncake_small.jsonl"]


def test_read_only_trace_folder_and_unwritable_cache(tmp_path, monkeypatch):
    traces = tmp_path / "ro"
    traces.mkdir()
    path = copy_to(SAMPLE, traces)
    traces.chmod(0o555)
    try:
        assert len(list(open_trace(path))) == 200
        assert os.listdir(traces) == ["mooncake_small.jsonl"]
        blocked = tmp_path / "a-file"
        blocked.write_text("x")
        monkeypatch.setenv("KVSIM_CACHE_DIR", str(blocked / "cache"))  # cannot be made
        cache.forget()
        assert len(list(open_trace(path))) == 200  # read all the same
    finally:
        traces.chmod(0o755)


def _malformed(tmp_path: Path, bad_line: int, n: int) -> str:
    lines = [json.dumps({**MOON_LINE, "timestamp": i}) for i in range(n)]
    lines[bad_line - 1] = '{"timestamp": oops'
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@pytest.mark.parametrize("bad_line", [3, 40_000])  # in the first block, in a later one
def test_malformed_trace_still_fails_at_its_line_and_caches_nothing(tmp_path, bad_line):
    path = _malformed(tmp_path, bad_line, 50_000)
    for _ in range(2):
        it = iter(open_trace(path))
        got = 0
        with pytest.raises(InputError) as ei:
            for _r in it:
                got += 1
        assert str(ei.value).startswith(f"{path}:{bad_line}: malformed JSON")
        assert got == bad_line - 1  # the requests before the bad line came first
        assert trace_cache_entries() == []
        cache.forget()
    assert len(list(open_trace(path, limit=bad_line - 1))) == bad_line - 1


def test_concurrent_readers_write_one_sound_entry(tmp_path):
    path = copy_to(TRACES / "mooncake_fast25_conversation_trace.jsonl", tmp_path)
    code = (
        "import sys\n"
        "from kvsim.traces import open_trace\n"
        "print(sum(len(r.block_hashes) for r in open_trace(sys.argv[1])))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(set(outs)) == 1
    assert len(trace_cache_entries()) == 1 and [p.name for p in trace_cache_folder().iterdir()] == [
        trace_cache_entries()[0].name
    ]
    expected = sum(len(r.block_hashes) for r in open_trace(path))
    assert cache.STATS["hits"] == 1 and str(expected) == outs[0]


def test_standard_input_is_cached_by_content(tmp_path):
    code = (
        "from kvsim.traces import cache, open_trace\n"
        "n = len(list(open_trace('-')))\n"
        "print(n, cache.STATS['hits'], cache.STATS['stores'])\n"
    )
    runs = []
    for _ in range(2):
        with open(SAMPLE, "rb") as stdin:
            runs.append(
                subprocess.run(
                    [sys.executable, "-c", code],
                    stdin=stdin,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
            )
    assert runs == [["200", "0", "1"], ["200", "1", "0"]]


def test_a_gzipped_trace_on_standard_input_is_read_by_its_bytes(tmp_path):
    gz = tmp_path / "t.jsonl.gz"
    with open(SAMPLE, "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    code = "from kvsim.traces import open_trace\nprint(len(list(open_trace('-'))))\n"
    with open(gz, "rb") as stdin:
        out = subprocess.run(
            [sys.executable, "-c", code], stdin=stdin, capture_output=True, text=True
        )
    assert out.returncode == 0 and out.stdout.split() == ["200"], out.stderr


def test_ids_beyond_64_bits_are_read_exactly_and_not_cached(tmp_path, parses):
    big = 2**70
    p = tmp_path / "big.jsonl"
    header = {"kvsim_trace": 1, "block_tokens": 16}
    rec = {"arrival_s": 0.5, "input_tokens": 40, "output_tokens": 3, "block_hashes": [big, 2]}
    p.write_text(json.dumps(header) + "\n" + json.dumps(rec) + "\n")
    (r,) = list(open_trace(str(p)))
    assert r.block_hashes == (big, 2) and trace_cache_entries() == []
    cache.forget()
    assert list(open_trace(str(p))) == [r] and len(parses) == 2


def test_records_of_a_list_trace_are_its_requests():
    reqs = list(open_trace(SAMPLE, limit=5))
    records = list(request_records(reqs))
    assert [r[0] for r in records] == [0, 1, 2, 3, 4] and records[0][4] == reqs[0].block_hashes
    cols = from_requests(reqs)
    assert list(cols.requests()) == reqs and cols.check()


def test_entries_are_written_through_core_io(tmp_path, monkeypatch):
    """An entry is written as every kvsim output is (``kvsim.core.io``): a temporary file
    renamed into place, with the permissions a plain ``open()`` gives (``mkstemp``'s 0600
    would keep a shared cache folder's entries from the other users)."""
    from kvsim.core import io as kvsim_io

    written: list[str] = []
    real = kvsim_io.atomic_path

    def recorded(path):  # type: ignore[no-untyped-def]
        written.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(kvsim_io, "atomic_path", recorded)
    list(open_trace(copy_to(SAMPLE, tmp_path)))
    (entry,) = trace_cache_entries()
    assert written == [str(entry)]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o666 & ~umask
