"""The trace cache, the one-call JSONL decoder, batched per-request output, and what sweeps
share: a cached read equals a parsed one field for field, a changed file or kvsim is parsed
again, a corrupt entry is never trusted, a malformed trace still fails naming its line, and
the fast decoder accepts exactly what the line reader accepts, with the same values."""

from __future__ import annotations

import csv
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from support import SAMPLE, TRACES, run_main

import kvsim
from kvsim.cachemode import REQUEST_COLUMNS, CacheReplay
from kvsim.core.errors import InputError
from kvsim.traces import cache, fast_jsonl, open_trace, readers
from kvsim.traces.columns import from_requests
from kvsim.traces.source import request_records

BAILIAN = TRACES / "samples" / "bailian_sample.jsonl"
NATIVE = TRACES / "samples" / "native_sample.jsonl"
AZURE = TRACES / "azure_llm_2023_code.csv"
MOON_LINE = {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [4, 5, 6]}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    """Each test starts with no trace in memory and zeroed counters (the folder is the
    test's own, see conftest)."""
    cache.forget()
    cache.STATS.clear()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files actually parsed (not loaded from the cache), in order."""
    seen: list[str] = []
    real = readers.read_batches

    def counted(path: str, fmt: str, block_tokens: int):  # type: ignore[no-untyped-def]
        seen.append(path)
        return real(path, fmt, block_tokens)

    monkeypatch.setattr(readers, "read_batches", counted)
    return seen


def _folder() -> Path:
    return Path(os.environ["KVSIM_CACHE_DIR"])


def _entries() -> list[Path]:
    return sorted(_folder().glob("*.columns")) if _folder().exists() else []


def _anything_in(folder: Path) -> bool:
    return folder.exists() and any(folder.iterdir())


def _copy(src: Path | str, tmp_path: Path, name: str | None = None) -> str:
    dst = tmp_path / (name or Path(src).name)
    shutil.copyfile(src, dst)
    return str(dst)


def _exact(requests: list) -> list[tuple]:
    """Every field with its type (so 1 and 1.0, or a list and a tuple, differ)."""
    return [
        tuple(
            (type(v).__name__, v.hex() if isinstance(v, float) else v)
            for v in (
                r.request_id,
                r.arrival_s,
                r.prompt_tokens,
                r.output_tokens,
                r.block_hashes,
                r.session_id,
            )
        )
        for r in requests
    ]


def _write_gz(src: Path | str, dst: Path) -> str:
    with open(src, "rb") as fi, gzip.open(dst, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    return str(dst)


# --------------------------------------------------------------------------- the cache


@pytest.mark.parametrize("src", [SAMPLE, BAILIAN, NATIVE, AZURE, "gz"], ids=str)
def test_second_read_equals_the_first_and_comes_from_the_cache(tmp_path, parses, src):
    path = _write_gz(SAMPLE, tmp_path / "t.jsonl.gz") if src == "gz" else _copy(src, tmp_path)
    first = list(open_trace(path))
    assert parses == [path] and cache.STATS["stores"] == 1 and len(_entries()) == 1
    cache.forget()  # not from memory: from the folder
    second = list(open_trace(path))
    assert parses == [path] and cache.STATS["hits"] == 1
    assert _exact(second) == _exact(first) and len(first) > 0
    # and a third, in memory this time, also through the records hot loops read
    records = list(request_records(open_trace(path)))
    assert cache.STATS["memory_hits"] == 1 and parses == [path]
    assert [(*r[:4], tuple(r[4]), r[5]) for r in records] == [
        (r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes, r.session_id)
        for r in first
    ]


def test_cached_read_equals_the_line_reader_exactly(tmp_path, monkeypatch):
    """The reference: the line-by-line reader alone (no fast decoder, no cache)."""
    path = _copy(TRACES / "mooncake_fast25_synthetic_trace.jsonl", tmp_path)
    with cache.settings(enabled=False):
        monkeypatch.setattr(fast_jsonl, "decode_block", lambda *a: None)
        reference = list(open_trace(path))
        monkeypatch.undo()
    cache.forget()
    list(open_trace(path))
    cache.forget()
    assert _exact(list(open_trace(path))) == _exact(reference)
    assert cache.STATS["hits"] == 1


def test_limits_and_passes_from_the_cache(tmp_path, parses):
    path = _copy(SAMPLE, tmp_path)
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
        path = _copy(src, tmp_path)
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
    path = _copy(SAMPLE, tmp_path)
    first = list(request_records(open_trace(path)))
    (entry,) = _entries()
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
    path = _copy(SAMPLE, tmp_path)
    assert len(list(open_trace(path, limit=5))) == 5
    assert _entries() == []
    list(open_trace(path))
    assert len(_entries()) == 1 and len(parses) == 2


def test_changed_file_with_same_size_and_mtime_is_parsed_again(tmp_path, parses):
    path = _copy(SAMPLE, tmp_path)
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
    path = _copy(SAMPLE, tmp_path)
    first = list(open_trace(path))
    monkeypatch.setattr(cache, "code_version", lambda: "9.9.9+other")
    cache.forget()
    assert list(open_trace(path)) == first
    assert len(parses) == 2 and len(_entries()) == 2


def test_the_key_includes_the_reading_options(tmp_path, parses):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(MOON_LINE) + "\n" for _ in range(4)))
    a = list(open_trace(str(p)))
    b = list(open_trace(str(p), block_tokens=500))  # 3 ids fit 1100 tokens either way
    assert len(parses) == 2 and len(_entries()) == 2 and a == b
    with pytest.raises(InputError, match=":1: field 'hash_ids' has 3 entries"):
        list(open_trace(str(p), block_tokens=64))  # the cache cannot hide a misfit


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
def test_a_corrupt_entry_is_ignored_and_rewritten(tmp_path, parses, damage):
    path = _copy(SAMPLE, tmp_path)
    first = list(open_trace(path))
    (entry,) = _entries()
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
    a = _copy(SAMPLE, tmp_path, "a.jsonl")
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(MOON_LINE) + "\n" for _ in range(3)))
    list(open_trace(a))
    (entry_a,) = _entries()
    expect_b = list(open_trace(str(b)))
    entry_b = next(e for e in _entries() if e != entry_a)
    shutil.copyfile(entry_a, entry_b)
    cache.forget()
    assert list(open_trace(str(b))) == expect_b
    assert cache.STATS["rejected"] == 1


def test_no_cache_reads_and_writes_nothing(tmp_path, parses, capsys):
    path = _copy(SAMPLE, tmp_path)
    with cache.settings(enabled=False):
        a = list(open_trace(path))
        cache.forget()
        assert list(open_trace(path)) == a
    assert not _anything_in(_folder()) and len(parses) == 2
    code, _, err = run_main(["replay", path, "--cpu-chunks", "10", "--no-cache"], capsys)
    assert code == 0, err
    assert not _anything_in(_folder())
    assert "KVSIM_NO_CACHE" not in os.environ  # the setting lasted the command only


def test_trace_cache_option_chooses_the_folder(tmp_path, capsys):
    path = _copy(SAMPLE, tmp_path)
    where = tmp_path / "elsewhere"
    code, _, err = run_main(["replay", path, "--cpu-chunks", "10", "--trace-cache", where], capsys)
    assert code == 0, err
    assert len(list(where.glob("*.columns"))) == 1 and not _anything_in(_folder())
    assert os.environ["KVSIM_CACHE_DIR"] == str(_folder())  # restored


def test_never_written_beside_the_trace(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    traces.mkdir()
    path = _copy(SAMPLE, traces)
    list(open_trace(path))
    assert sorted(os.listdir(traces)) == ["mooncake_small.jsonl"]
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(traces))  # even when told to
    cache.forget()
    assert len(list(open_trace(path))) == 200
    assert sorted(os.listdir(traces)) == ["mooncake_small.jsonl"]


def test_read_only_trace_folder_and_unwritable_cache(tmp_path, monkeypatch):
    traces = tmp_path / "ro"
    traces.mkdir()
    path = _copy(SAMPLE, traces)
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
        assert _entries() == []
        cache.forget()
    assert len(list(open_trace(path, limit=bad_line - 1))) == bad_line - 1


def test_concurrent_readers_write_one_sound_entry(tmp_path):
    path = _copy(TRACES / "mooncake_fast25_conversation_trace.jsonl", tmp_path)
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
    assert len(_entries()) == 1 and [p.name for p in _folder().iterdir()] == [_entries()[0].name]
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


def test_ids_beyond_64_bits_are_read_exactly_and_not_cached(tmp_path, parses):
    big = 2**70
    p = tmp_path / "big.jsonl"
    header = {"kvsim_trace": 1, "block_tokens": 16}
    rec = {"arrival_s": 0.5, "input_tokens": 40, "output_tokens": 3, "block_hashes": [big, 2]}
    p.write_text(json.dumps(header) + "\n" + json.dumps(rec) + "\n")
    (r,) = list(open_trace(str(p)))
    assert r.block_hashes == (big, 2) and _entries() == []
    cache.forget()
    assert list(open_trace(str(p))) == [r] and len(parses) == 2


# --------------------------------------------------------------------------- the fast decoder


def _line_reader(path: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list, str | None]:
    """The reference outcome: the line reader alone; (requests, error) with no cache."""
    with monkeypatch.context() as m, cache.settings(enabled=False):
        m.setattr(fast_jsonl, "decode_block", lambda *a: None)
        return _outcome(path)


def _outcome(path: str) -> tuple[list, str | None]:
    cache.forget()
    got: list = []
    try:
        for r in open_trace(path):
            got.append(r)
    except InputError as e:
        return _exact(got), str(e)
    return _exact(got), None


def _rec(ts: str = "1", n: str = "10", ids: str = "[]", extra: str = "") -> str:
    """A Mooncake line written by hand, so that any piece of it can be odd."""
    return (
        f'{{"timestamp": {ts}, "input_length": {n}, "output_length": 1, "hash_ids": {ids}{extra}}}'
    )


#: lines the fast decoder must not judge differently from the line reader
TRICKY = [
    _rec(ts="NaN"),
    _rec(ts="Infinity"),
    _rec(ts="1e400"),
    _rec(ts="-1"),
    _rec(ts="-0.0"),
    _rec(ts="0.1000000000000000055511151231257827"),
    _rec(ts="123456789012345678901"),
    _rec(ts='"5"'),
    _rec() + _rec(ts="2"),  # two objects on one line
    _rec() + "\r" + _rec(ts="2"),  # a carriage return is not a line break
    "\ufeff" + _rec(),
    _rec(n="10.0"),
    _rec(n="true"),
    _rec(n="null"),
    '{"timestamp": 1, "input_length": 10, "hash_ids": []}',
    _rec(n="600", ids="[1, null]"),
    _rec(n="600", ids="[7, 7]"),
    _rec(n="600", ids="[1]"),
    _rec(n="600", ids="[1, 2, 3]"),
    _rec(n="600", ids="[1e2, 2]"),
    _rec(n="600", ids="[9223372036854775808, 2]"),
    _rec(ids="{}"),
    _rec(extra=', "timestamp": 2'),
    _rec(extra=', "x": {"y": [1, {"z": null}]}'),
    _rec(extra=', "x": "\\ud800"'),
    _rec(extra=', "x": "\\u0000"'),
    _rec() + " // comment",
    "[1, 2]",
    '"text"',
    "{}",
    "   ",
    "\x0c",
]


def _good_line(rng: random.Random) -> dict:
    n = rng.randrange(0, 5000)
    bt = 512
    k = n // bt if rng.random() < 0.5 else -(-n // bt)
    ids = rng.sample(range(-5, 10**6), k)
    ts = rng.choice([rng.randrange(0, 10**9), rng.random() * 1e6, 0, 0.0])
    return {
        "timestamp": ts,
        "input_length": n,
        "output_length": rng.randrange(0, 900),
        "hash_ids": ids,
    }


@pytest.mark.parametrize("seed", range(12))
def test_fast_decoder_accepts_exactly_what_the_line_reader_accepts(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    lines = [
        json.dumps(_good_line(rng), separators=rng.choice([(",", ":"), (", ", ": ")]))
        for _ in range(rng.randrange(1, 60))
    ]
    if seed % 3:  # most files get a tricky line somewhere; some stay clean
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(TRICKY))
    if seed % 4 == 0:
        lines.insert(rng.randrange(len(lines) + 1), "")
    p = tmp_path / "t.jsonl"
    p.write_bytes(("\n".join(lines) + rng.choice(["\n", ""])).encode("utf-8", "surrogatepass"))
    with cache.settings(enabled=False):
        assert _outcome(str(p)) == _line_reader(str(p), monkeypatch)


@pytest.mark.parametrize("line", TRICKY, ids=range(len(TRICKY)))
def test_each_tricky_line_alone(tmp_path, monkeypatch, line):
    p = tmp_path / "t.jsonl"
    good = json.dumps(MOON_LINE)
    p.write_bytes((good + "\n" + line + "\n" + good + "\n").encode("utf-8", "surrogatepass"))
    with cache.settings(enabled=False):
        assert _outcome(str(p)) == _line_reader(str(p), monkeypatch)


def test_fast_decoder_takes_the_bundled_traces(monkeypatch):
    """Plain valid files go through the one-call decoder (not the line reader) and give the
    line reader's values."""
    for path, fmt, bt in [
        (SAMPLE, "mooncake", 512),
        (str(BAILIAN), "bailian", 16),
        (str(TRACES / "mooncake_fast25_conversation_trace.jsonl"), "mooncake", 512),
    ]:
        block = Path(path).read_bytes()
        cols = fast_jsonl.decode_block(block, fmt, bt)
        assert cols is not None, path
        assert _exact(list(cols.requests())) == _line_reader(path, monkeypatch)[0]


def test_native_records_with_and_without_sessions(tmp_path, monkeypatch):
    header = {"kvsim_trace": 1, "block_tokens": 16}
    recs = [
        {"arrival_s": 0.5, "input_tokens": 40, "output_tokens": 3, "block_hashes": [1, 2]},
        {
            "arrival_s": 1,
            "input_tokens": 0,
            "output_tokens": 3,
            "block_hashes": [],
            "session_id": 4,
        },
        {
            "arrival_s": 2.5,
            "input_tokens": 40,
            "output_tokens": 3,
            "block_hashes": [],
            "session_id": None,
        },
    ]
    p = tmp_path / "n.jsonl"
    p.write_text(json.dumps(header) + "\n\n" + "".join(json.dumps(r) + "\n" for r in recs))
    with cache.settings(enabled=False):
        got = _outcome(str(p))
    assert got == _line_reader(str(p), monkeypatch) and got[1] is None
    assert [r[5][1] for r in got[0]] == [None, 4, None]


# --------------------------------------------------------------------------- output


def _old_requests_csv(requests: list, cfg: dict, path: Path) -> None:
    """How ``replay(requests_csv=...)`` wrote its CSV before: ``csv.writer``, row by row."""
    config = kvsim.api.make_options(**cfg).resolve(512)
    assert config.as_dict() == kvsim.replay(requests, per_request=False, **cfg).config
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS)
        CacheReplay(config).run(requests, writer.writerow)


@pytest.mark.parametrize(
    "cfg",
    [
        {"cpu_chunks": 60},
        {"cpu_chunks": 3, "gpu_blocks": 40, "store_threshold": 2, "policy": "arc"},
    ],
)
def test_requests_csv_is_byte_for_byte_the_csv_modules(tmp_path, cfg):
    requests = list(open_trace(SAMPLE))
    old = tmp_path / "old.csv"
    _old_requests_csv(requests, cfg, old)
    new = tmp_path / "new.csv"
    kvsim.replay(SAMPLE, requests_csv=new, **cfg)
    assert new.read_bytes() == old.read_bytes()
    assert old.read_bytes().startswith(
        b"request,arrival_s,prompt_tokens,prompt_blocks,gpu_hit_blocks,cpu_hit_blocks,"
        b"stored_blocks,evicted_blocks,skipped_blocks,store_failed\r\n0,0.0,"
    )


def test_requests_csv_from_a_list_trace_matches_too(tmp_path):
    """Requests in memory (ints where floats are expected too) format as csv would."""
    reqs = [kvsim.Request(0, 0, 1100, 7, (4, 5, 6)), kvsim.Request(1, 2.5, 1100, 7, (4, 5, 6))]
    old = tmp_path / "old.csv"
    _old_requests_csv(reqs, {"cpu_chunks": 4}, old)
    new = tmp_path / "new.csv"
    kvsim.replay(reqs, requests_csv=new, cpu_chunks=4, block_tokens=512)
    assert new.read_bytes() == old.read_bytes()


def test_batches_reach_the_sink_in_order(tmp_path):
    config = kvsim.api.make_options(cpu_chunks=60).resolve(512)
    rows: list = []
    batches: list = []
    CacheReplay(config).run(open_trace(SAMPLE), rows.append, batch_sink=batches.append)
    assert [r for b in batches for r in b] == rows and len(rows) == 200


def test_replay_out_writes_parquet_with_the_csv_rows(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_main(["replay", SAMPLE, "--cpu-chunks", "40", "--out", out], capsys)
    assert code == 0, err
    code, _, err = run_main(
        ["replay", SAMPLE, "--cpu-chunks", "40", "--requests-csv", tmp_path / "r.csv"], capsys
    )
    assert code == 0, err
    table = pd.read_parquet(out / "requests.parquet")
    from_csv = pd.read_csv(tmp_path / "r.csv")
    assert list(table.columns) == list(REQUEST_COLUMNS) and len(table) == 200
    pd.testing.assert_frame_equal(table, from_csv, check_dtype=False)
    assert (out / "summary.json").exists() and (out / ".kvsim-run.json").exists()
    code, _, err = run_main(
        [
            "replay",
            SAMPLE,
            "--cpu-chunks",
            "40",
            "--out",
            out,
            "--requests-csv",
            tmp_path / "x.csv",
        ],
        capsys,
    )
    assert code == 2 and "--out" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- sweeps


def test_sweep_cells_share_one_parse_of_their_trace(tmp_path, parses, monkeypatch):
    from kvsim.sweeps import sweep
    from kvsim.traces import synthetic

    path = _copy(SAMPLE, tmp_path)
    generated: list[int] = []
    real = synthetic.WorkloadSpec.requests

    def counted(self):  # type: ignore[no-untyped-def]
        generated.append(1)
        return real(self)

    monkeypatch.setattr(synthetic.WorkloadSpec, "requests", counted)
    spec = {
        "traces": [path, {"kind": "chat", "n_requests": 60, "seed": 3}],
        "grid": {"policy": ["lru", "arc"], "cpu_chunks": [20, 80]},
    }
    df = sweep(spec, executor="serial")
    assert (df["status"] == "ok").all() and len(df) == 8
    assert parses == [path] and len(generated) == 1


def test_sweep_workers_follow_the_cache_options(tmp_path, capsys):
    path = _copy(SAMPLE, tmp_path)
    args = ["sweep", "--trace", path, "--cpu-chunks", "10,20", "--executor", "local"]
    args += ["--workers", "2", "--no-progress"]
    code, _, err = run_main([*args, "--out", tmp_path / "a", "--no-cache"], capsys)
    assert code == 0, err
    assert not _anything_in(_folder())
    where = tmp_path / "tc"
    code, _, err = run_main([*args, "--out", tmp_path / "b", "--trace-cache", where], capsys)
    assert code == 0, err
    assert len(list(where.glob("*.columns"))) == 1 and not _anything_in(_folder())


def _timed_spec(trace: str) -> dict:
    return {
        "mode": "timed",
        "traces": [trace],
        "limit": 16,
        "options": {"baseline": True, "time_scale": 20.0, "record_steps": False},
        "grid": {"max_num_seqs": [8, 16], "policy": ["lru", "arc"], "cpu_chunks": [20, 80]},
    }


def test_sweep_runs_a_timed_baseline_once_per_engine_configuration(tmp_path, monkeypatch):
    from kvsim.engine import setup as engine_module  # where simulate builds its engines
    from kvsim.sweeps import SweepSpec, run_cell, sweep

    path = _copy(SAMPLE, tmp_path)
    runs: list[bool] = []
    real = engine_module.Engine

    class Counted(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            runs.append(kwargs.get("offload", True))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(engine_module, "Engine", Counted)
    spec = _timed_spec(path)
    df = sweep(spec, executor="serial")
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert len(df) == 8 and runs.count(False) == 2  # one per max_num_seqs, not one per cell
    assert runs.count(True) == 8
    # each row is what the cell alone gives (its own baseline)
    runs.clear()
    cells = SweepSpec.from_mapping(spec).cells()
    alone = pd.DataFrame([{"cell": i, **run_cell(c)} for i, c in enumerate(cells)])
    assert runs.count(False) == 8
    assert sum(c.startswith("baseline_") for c in df.columns) > 10
    pd.testing.assert_frame_equal(
        df.drop(columns=["elapsed_s"]), alone[df.columns].drop(columns=["elapsed_s"])
    )


def test_timed_sweep_with_shared_baselines_agrees_across_executors(tmp_path):
    from kvsim.sweeps import sweep

    spec = _timed_spec(_copy(SAMPLE, tmp_path))
    spec["grid"] = {"max_num_seqs": [8], "policy": ["lru", "arc"], "cpu_chunks": [20, 80]}
    serial = sweep(spec, executor="serial").drop(columns=["elapsed_s"])
    pool = sweep(spec, executor="local", workers=2).drop(columns=["elapsed_s"])
    pd.testing.assert_frame_equal(serial, pool)
    assert "KVSIM_SWEEP_BASELINES" not in os.environ


def test_records_of_a_list_trace_are_its_requests():
    reqs = list(open_trace(SAMPLE, limit=5))
    records = list(request_records(reqs))
    assert [r[0] for r in records] == [0, 1, 2, 3, 4] and records[0][4] == reqs[0].block_hashes
    cols = from_requests(reqs)
    assert list(cols.requests()) == reqs and cols.check()


def test_reading_a_gz_trace_mid_corruption_names_the_line(tmp_path):
    """A read error inside the file (a cut .gz) is reported as the line reader reports it."""
    full = Path(_write_gz(TRACES / "mooncake_fast25_conversation_trace.jsonl", tmp_path / "c.gz"))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(InputError, match=r"cut\.jsonl\.gz:\d+: cannot read file"):
        list(open_trace(str(cut)))
    assert _entries() == []
