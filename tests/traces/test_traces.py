"""Trace model and readers: bundled files, samples, round trips, and one test per input error."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from kvsim.core.errors import InputError
from kvsim.traces import (
    TRACE_FORMATS,
    Request,
    Trace,
    TraceInfo,
    open_trace,
    write_native,
)

ROOT = Path(__file__).resolve().parents[2]
TR = ROOT / "traces"
MOON_CONV = TR / "mooncake_fast25_conversation_trace.jsonl"
MOON_SYN = TR / "mooncake_fast25_synthetic_trace.jsonl"
AZ_CODE = TR / "azure_llm_2023_code.csv"
AZ_CONV = TR / "azure_llm_2023_conv.csv"
SAMPLES = TR / "samples"

MOON_LINE = {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [4, 5, 6]}
BAIL_LINE = {
    "chat_id": 7,
    "parent_chat_id": -1,
    "timestamp": 2.5,
    "input_length": 40,
    "output_length": 3,
    "type": "text",
    "turn": 1,
    "hash_ids": [1, 2, 3],
}
NATIVE_HEADER = {"kvsim_trace": 1, "block_tokens": 16}
NATIVE_LINE = {"arrival_s": 0.5, "input_tokens": 40, "output_tokens": 3, "block_hashes": [1, 2]}
AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _write(path: Path, lines: list) -> str:
    text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
    path.write_text(text)
    return str(path)


def _err(path: str, line: int | None, fmt: str | None = None, **kw) -> str:
    with pytest.raises(InputError) as ei:
        list(open_trace(path, fmt=fmt, **kw))
    msg = str(ei.value)
    prefix = f"{path}:{line}: " if line is not None else f"{path}: "
    assert msg.startswith(prefix), msg
    assert "\n" not in msg
    assert ei.value.source == path and ei.value.line == line
    return msg


# --------------------------------------------------------------------------- bundled files


@pytest.mark.parametrize(
    "path,fmt,count",
    [
        (MOON_CONV, "mooncake", 12031),
        (MOON_SYN, "mooncake", 3993),
        (AZ_CODE, "azure", 8819),
        (AZ_CONV, "azure", 19366),
        (SAMPLES / "mooncake_small.jsonl", "mooncake", 200),
        (SAMPLES / "bailian_sample.jsonl", "bailian", 26),
        (SAMPLES / "native_sample.jsonl", "native", 10),
    ],
)
def test_bundled_counts_and_sniffing(path, fmt, count):
    t = open_trace(path)
    assert t.info.format == fmt and t.format == fmt
    assert t.info.has_reuse_info == (fmt != "azure")
    n = 0
    for i, r in enumerate(t):
        assert r.request_id == i
        n += 1
    assert n == count


def test_mooncake_first_request_exact():
    t = open_trace(MOON_CONV)
    assert t.block_tokens == 512
    assert t.info == TraceInfo(str(MOON_CONV), "mooncake", 512, True)
    r = next(iter(t))
    assert r == Request(0, 0.0, 6758, 500, tuple(range(14)), None)
    assert r.complete_blocks(512) == 13  # 6758 // 512; the 14th id is the partial block
    *_, last = t
    assert last.arrival_s == pytest.approx(3536.999)  # ms -> s
    assert isinstance(last.arrival_s, float)


def test_mooncake_all_lines_have_ceil_hash_count():
    for r in open_trace(MOON_SYN):
        assert len(r.block_hashes) == -(-r.input_tokens // 512)


def test_azure_first_rows_exact():
    t = open_trace(AZ_CODE)
    assert t.info.has_reuse_info is False and t.block_tokens == 512
    it = iter(t)
    r0, r1 = next(it), next(it)
    assert r0 == Request(0, 0.0, 4808, 10, (), None)
    # 2023-11-16 18:17:04.0319600 - 18:17:03.9799600 (7 fractional digits)
    assert r1.arrival_s == pytest.approx(0.052, abs=1e-9)
    assert r1.input_tokens == 3180 and r1.output_tokens == 8
    assert r0.complete_blocks(512) == 0
    assert open_trace(AZ_CODE, block_tokens=16).block_tokens == 16


def test_azure_day_rollover(tmp_path):
    p = _write(
        tmp_path / "a.csv",
        [AZ_HEADER, "2023-12-31 23:59:59.5000000,1,2", "2024-01-01 00:00:00.2500000,3,4"],
    )
    rs = list(open_trace(p))
    assert rs[1].arrival_s == pytest.approx(0.75, abs=1e-9)


def test_bailian_sample():
    t = open_trace(SAMPLES / "bailian_sample.jsonl")
    assert t.block_tokens == 16
    rs = list(t)
    r = rs[0]
    assert r == Request(0, 1.779, 144, 76, (0, 1, 2, 3, 4, 5, 6, 7, 8), 1000)
    assert all(r.session_id is not None for r in rs)
    # every chat shares the two-block system prompt
    assert all(r.block_hashes[:2] == (0, 1) for r in rs)


def test_native_sample_and_header_block_tokens():
    t = open_trace(SAMPLES / "native_sample.jsonl")
    assert t.block_tokens == 16
    r = next(iter(t))
    assert r == Request(0, 0.0, 69, 20, (1, 2, 3, 4, 101), 0)
    assert open_trace(SAMPLES / "native_sample.jsonl", block_tokens=32).block_tokens == 32


def test_block_tokens_override_changes_validation(tmp_path):
    # 1100 tokens are 3 blocks of 512, but 69 blocks of 16
    p = _write(tmp_path / "m.jsonl", [MOON_LINE])
    assert len(list(open_trace(p))) == 1
    msg = _err(p, 1, block_tokens=16)
    assert "has 3 entries" in msg and "input_length=1100" in msg and "68 or 69" in msg


# --------------------------------------------------------------------------- iteration behaviour


def test_gz_round_trip(tmp_path):
    src = SAMPLES / "mooncake_small.jsonl"
    gz = tmp_path / "small.jsonl.gz"
    with open(src, "rb") as fi, gzip.open(gz, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    t = open_trace(gz)
    assert t.format == "mooncake"
    assert list(t) == list(open_trace(src))
    # Azure csv.gz too
    gzc = tmp_path / "code.csv.gz"
    with open(AZ_CODE, "rb") as fi, gzip.open(gzc, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    assert list(open_trace(gzc, limit=50)) == list(open_trace(AZ_CODE, limit=50))


def test_limit():
    t = open_trace(MOON_CONV, limit=5)
    rs = list(t)
    assert [r.request_id for r in rs] == [0, 1, 2, 3, 4]
    assert list(open_trace(MOON_CONV, limit=0)) == []
    assert len(list(open_trace(AZ_CONV, limit=7))) == 7
    assert len(list(open_trace(SAMPLES / "native_sample.jsonl", limit=100))) == 10
    with pytest.raises(InputError, match="limit"):
        open_trace(MOON_CONV, limit=-1)


def test_limit_stops_before_broken_line(tmp_path):
    p = _write(tmp_path / "m.jsonl", [MOON_LINE, MOON_LINE, "{broken"])
    assert len(list(open_trace(p, limit=2))) == 2
    _err(p, 3)


def test_reiteration_gives_same_requests():
    t = open_trace(SAMPLES / "mooncake_small.jsonl")
    a = list(t)
    b = list(t)
    assert a == b and len(a) == 200
    # two live iterators are independent
    i1, i2 = iter(t), iter(t)
    assert next(i1) == next(i2) == a[0]
    assert next(i1) == a[1]


def test_streams_without_materialising(tmp_path):
    lines = [MOON_LINE] * 3 + ['{"timestamp": oops'] + [MOON_LINE] * 1000
    p = _write(tmp_path / "big.jsonl", lines)
    t = open_trace(p)  # opening reads only the first line
    it = iter(t)
    assert next(it).input_tokens == 1100  # later broken line not yet seen
    assert next(it).request_id == 1
    assert next(it).request_id == 2
    with pytest.raises(InputError) as ei:
        next(it)
    assert str(ei.value).startswith(f"{p}:4: malformed JSON")


def test_native_write_read_round_trip(tmp_path):
    reqs = list(open_trace(SAMPLES / "bailian_sample.jsonl"))
    out = tmp_path / "sub.jsonl"
    assert write_native(out, reqs, 16) == len(reqs)
    t = open_trace(out)
    assert t.format == "native" and t.block_tokens == 16
    assert list(t) == reqs
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []  # no temp file left
    # .gz, session_id None, empty block_hashes, overwrite in place
    reqs2 = [Request(0, 0.0, 10, 1, ()), Request(1, 1.25, 33, 2, (9, 8, 7), None)]
    gz = tmp_path / "n.jsonl.gz"
    write_native(gz, reqs2, 16)
    assert list(open_trace(gz)) == reqs2
    write_native(gz, reqs2[:1], 16)
    assert list(open_trace(gz)) == reqs2[:1]
    with gzip.open(gz, "rt") as fh:
        first = json.loads(fh.readline())
    assert first == {"kvsim_trace": 1, "block_tokens": 16}


def test_write_native_failure_keeps_old_file(tmp_path):
    out = tmp_path / "n.jsonl"
    write_native(out, [Request(0, 0.0, 10, 1, ())], 16)
    before = out.read_bytes()

    def boom():
        yield Request(0, 0.0, 10, 1, ())
        raise RuntimeError("generator failed")

    with pytest.raises(RuntimeError):
        write_native(out, boom(), 16)
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["n.jsonl"]


def test_from_requests():
    reqs = [Request(i, float(i), 32, 1, (1, i + 10)) for i in range(5)]
    t = Trace.from_requests(reqs, block_tokens=16, name="mem")
    assert t.block_tokens == 16 and t.info.path == "mem"
    assert list(t) == reqs and list(t) == reqs
    t2 = Trace.from_requests(reqs, 16)
    t2.limit = 2
    assert list(t2) == reqs[:2]


def test_complete_blocks():
    r = Request(0, 0.0, 1100, 1, (1, 2, 3))
    assert r.complete_blocks(512) == 2
    assert Request(0, 0.0, 1024, 1, (1, 2)).complete_blocks(512) == 2
    assert Request(0, 0.0, 5000, 1, (1,)).complete_blocks(512) == 1


def test_backwards_timestamps_kept(tmp_path):
    a = dict(MOON_LINE, timestamp=2000)
    b = dict(MOON_LINE, timestamp=1000)
    p = _write(tmp_path / "m.jsonl", [a, "", "   ", b])
    assert [r.arrival_s for r in open_trace(p)] == [2.0, 1.0]


def test_formats_constant():
    assert TRACE_FORMATS == ("mooncake", "bailian", "azure", "native")


# --------------------------------------------------------------------------- errors: files


def test_missing_file(tmp_path):
    p = str(tmp_path / "nope.jsonl")
    with pytest.raises(InputError) as ei:
        open_trace(p)
    assert str(ei.value) == f"{p}: trace file not found"
    with pytest.raises(InputError, match="not found"):
        open_trace(p, fmt="mooncake")


@pytest.mark.parametrize("name,fmt", [("e.jsonl", None), ("e.jsonl", "mooncake"), ("e.csv", None)])
def test_empty_file(tmp_path, name, fmt):
    p = tmp_path / name
    p.write_text("\n\n")
    with pytest.raises(InputError) as ei:
        list(open_trace(p, fmt=fmt))
    assert str(ei.value).startswith(f"{p}: no requests")


def test_header_only_files_have_no_requests(tmp_path):
    p = _write(tmp_path / "n.jsonl", [NATIVE_HEADER])
    assert _err(p, None).endswith("no requests in trace file")
    p = _write(tmp_path / "a.csv", [AZ_HEADER])
    assert _err(p, None).endswith("no requests in trace file")


def test_unknown_format(tmp_path):
    p = _write(tmp_path / "m.jsonl", [MOON_LINE])
    with pytest.raises(InputError, match="unknown trace format 'parquet'"):
        open_trace(p, fmt="parquet")
    q = _write(tmp_path / "x.jsonl", [{"foo": 1}])
    with pytest.raises(InputError) as ei:
        open_trace(q)
    assert str(ei.value).startswith(f"{q}:1: cannot determine trace format")
    r = _write(tmp_path / "y.txt", ["", "hello"])
    with pytest.raises(InputError) as ei:
        open_trace(r)
    assert str(ei.value).startswith(f"{r}:2: cannot determine trace format")


# --------------------------------------------------------------------------- errors: JSONL lines


def test_malformed_json(tmp_path):
    p = _write(tmp_path / "m.jsonl", [MOON_LINE, "", '{"timestamp": 1,'])
    assert "malformed JSON" in _err(p, 3)


@pytest.mark.parametrize(
    "bad,kind", [([1, 2], "array"), ('"x"', "string"), (3, "integer"), ("null", "null")]
)
def test_line_not_object(tmp_path, bad, kind):
    p = _write(tmp_path / "m.jsonl", [MOON_LINE, bad])
    assert f"expected a JSON object, got {kind}" in _err(p, 2)


@pytest.mark.parametrize("field", ["timestamp", "input_length", "output_length", "hash_ids"])
def test_mooncake_missing_field(tmp_path, field):
    d = dict(MOON_LINE)
    del d[field]
    p = _write(tmp_path / "m.jsonl", [MOON_LINE, MOON_LINE, d])
    assert _err(p, 3, fmt="mooncake").endswith(f"missing field '{field}'")


@pytest.mark.parametrize(
    "field,value,phrase",
    [
        ("input_length", -5, "field 'input_length' must be a non-negative integer, got -5"),
        ("input_length", True, "field 'input_length' must be a non-negative integer, got true"),
        ("input_length", 1100.0, "field 'input_length' must be a non-negative integer, got 1100.0"),
        ("output_length", "7", "field 'output_length' must be a non-negative integer, got '7'"),
        ("timestamp", -1, "field 'timestamp' must be a non-negative finite number, got -1"),
        ("timestamp", "0", "field 'timestamp' must be a non-negative finite number, got '0'"),
        ("timestamp", False, "field 'timestamp' must be a non-negative finite number, got false"),
        ("hash_ids", {"a": 1}, "field 'hash_ids' must be a list of integers, got object"),
        ("hash_ids", [1, 2.0, 3], "field 'hash_ids' must be a list of integers, element 1 is 2.0"),
        ("hash_ids", [1, True, 3], "element 1 is true"),
        ("hash_ids", [1, "2", 3], "element 1 is '2'"),
    ],
)
def test_mooncake_wrong_types(tmp_path, field, value, phrase):
    p = _write(tmp_path / "m.jsonl", [MOON_LINE, dict(MOON_LINE, **{field: value})])
    assert _err(p, 2).endswith(phrase)


def test_mooncake_wrong_type_exact_message(tmp_path):
    p = _write(tmp_path / "x.jsonl", [MOON_LINE] * 16 + [dict(MOON_LINE, input_length=-5)])
    with pytest.raises(InputError) as ei:
        list(open_trace(p))
    assert str(ei.value) == f"{p}:17: field 'input_length' must be a non-negative integer, got -5"


@pytest.mark.parametrize(
    "ids,ok", [([1, 2], True), ([1, 2, 3], True), ([1], False), ([1, 2, 3, 4], False)]
)
def test_hash_ids_length_consistency(tmp_path, ids, ok):
    # 1100 tokens / 512 -> 2 complete blocks, 3 with the partial one
    p = _write(tmp_path / "m.jsonl", [dict(MOON_LINE, hash_ids=ids)])
    if ok:
        assert len(next(iter(open_trace(p))).block_hashes) == len(ids)
    else:
        msg = _err(p, 1)
        assert f"field 'hash_ids' has {len(ids)} entries" in msg
        assert "input_length=1100" in msg and "2 or 3" in msg


def test_repeated_block_id_is_rejected(tmp_path):
    # prefix-chained ids never repeat within a prompt; a repeat would alias two blocks
    p = _write(tmp_path / "m.jsonl", [MOON_LINE, dict(MOON_LINE, hash_ids=[4, 5, 4])])
    assert _err(p, 2) == (
        f"{p}:2: field 'hash_ids': id 4 repeats (elements 0 and 2); block ids are "
        "prefix-chained and never repeat within a request"
    )
    with pytest.raises(
        InputError, match=r"^mem: request 3: block_hashes: id 9 repeats \(elements 1 and 2\)"
    ):
        Trace.from_requests([Request(3, 0.0, 48, 1, (8, 9, 9))], 16, name="mem")


@pytest.mark.parametrize(
    "field",
    [
        "chat_id",
        "parent_chat_id",
        "timestamp",
        "input_length",
        "output_length",
        "type",
        "turn",
        "hash_ids",
    ],
)
def test_bailian_missing_field(tmp_path, field):
    d = dict(BAIL_LINE)
    del d[field]
    p = _write(tmp_path / "b.jsonl", [BAIL_LINE, d])
    assert _err(p, 2, fmt="bailian").endswith(f"missing field '{field}'")


@pytest.mark.parametrize(
    "field,value,phrase",
    [
        ("chat_id", "7", "field 'chat_id' must be an integer"),
        ("turn", 1.5, "field 'turn' must be an integer"),
        ("type", 3, "field 'type' must be a string"),
        ("timestamp", -0.5, "field 'timestamp' must be a non-negative finite number"),
        ("output_length", -1, "field 'output_length' must be a non-negative integer"),
        ("hash_ids", [1, 2, 3, 4], "field 'hash_ids' has 4 entries but input_length=40"),
        ("hash_ids", None, "must be a list of integers, got null"),
    ],
)
def test_bailian_wrong_types(tmp_path, field, value, phrase):
    p = _write(tmp_path / "b.jsonl", [BAIL_LINE, dict(BAIL_LINE, **{field: value})])
    assert phrase in _err(p, 2)


def test_native_errors(tmp_path):
    # header problems
    p = _write(tmp_path / "h1.jsonl", [{"kvsim_trace": 2, "block_tokens": 16}, NATIVE_LINE])
    assert "unsupported kvsim_trace version 2" in _err(p, 1, fmt=None)
    p = _write(tmp_path / "h2.jsonl", [{"kvsim_trace": 1}, NATIVE_LINE])
    assert "missing field 'block_tokens'" in _err(p, 1)
    p = _write(tmp_path / "h3.jsonl", [{"kvsim_trace": 1, "block_tokens": 0}, NATIVE_LINE])
    assert "'block_tokens' must be a positive integer" in _err(p, 1)
    p = _write(tmp_path / "h4.jsonl", [NATIVE_LINE, NATIVE_LINE])
    assert "first line must be the header" in _err(p, 1, fmt="native")
    # record problems
    good = [NATIVE_HEADER, NATIVE_LINE]
    cases = [
        (
            {k: v for k, v in NATIVE_LINE.items() if k != "output_tokens"},
            "missing field 'output_tokens'",
        ),
        (
            dict(NATIVE_LINE, arrival_s="now"),
            "field 'arrival_s' must be a non-negative finite number",
        ),
        (dict(NATIVE_LINE, input_tokens=-1), "field 'input_tokens' must be a non-negative integer"),
        (dict(NATIVE_LINE, session_id="s1"), "field 'session_id' must be an integer or null"),
        (dict(NATIVE_LINE, block_hashes=[1, 2, 3, 4]), "field 'block_hashes' has 4 entries"),
        (dict(NATIVE_LINE, block_hashes=[1, None]), "element 1 is null"),
        ([NATIVE_LINE], "expected a JSON object, got array"),
        ("{nope}", "malformed JSON"),
    ]
    for i, (bad, phrase) in enumerate(cases):
        p = _write(tmp_path / f"r{i}.jsonl", [*good, bad])
        assert phrase in _err(p, 3), phrase
    # empty block_hashes = no reuse info for that request; session_id null ok
    p = _write(
        tmp_path / "ok.jsonl", [NATIVE_HEADER, dict(NATIVE_LINE, block_hashes=[], session_id=None)]
    )
    assert next(iter(open_trace(p))) == Request(0, 0.5, 40, 3, (), None)


# --------------------------------------------------------------------------- errors: Azure CSV


@pytest.mark.parametrize(
    "lines,line,phrase",
    [
        (
            ["TIMESTAMP,Context,Generated", "2023-11-16 18:17:03.9799600,1,2"],
            1,
            "expected CSV header",
        ),
        (
            [AZ_HEADER, "2023-11-16 18:17:03.9799600,1,2", "2023-11-16 18:17:04.0,1"],
            3,
            "expected 3 columns",
        ),
        ([AZ_HEADER, "2023-11-16 18:17:03.9799600,1,2,3"], 2, "got 4"),
        ([AZ_HEADER, "16/11/2023 18:17:03,1,2"], 2, "column 'TIMESTAMP' must look like"),
        ([AZ_HEADER, "2023-02-30 18:17:03.1,1,2"], 2, "column 'TIMESTAMP'"),
        ([AZ_HEADER, "2023-11-16 25:17:03.1,1,2"], 2, "column 'TIMESTAMP'"),
        (
            [AZ_HEADER, "2023-11-16 18:17:03.1,abc,2"],
            2,
            "column 'ContextTokens' must be a non-negative integer, got 'abc'",
        ),
        (
            [AZ_HEADER, "2023-11-16 18:17:03.1,5,-2"],
            2,
            "column 'GeneratedTokens' must be a non-negative integer, got '-2'",
        ),
        ([AZ_HEADER, "2023-11-16 18:17:03.1,5,2.0"], 2, "column 'GeneratedTokens'"),
    ],
)
def test_azure_errors(tmp_path, lines, line, phrase):
    p = _write(tmp_path / "a.csv", lines)
    assert phrase in _err(p, line)


def test_azure_7_fraction_digits_not_truncated(tmp_path):
    p = _write(
        tmp_path / "a.csv",
        [
            AZ_HEADER,
            "2023-11-16 18:17:03.0000000,1,2",
            "2023-11-16 18:17:03.0000001,1,2",
            "2023-11-16 18:17:04,1,2",
        ],
    )
    rs = list(open_trace(p))
    assert rs[1].arrival_s == pytest.approx(1e-7, abs=1e-12)
    assert rs[2].arrival_s == 1.0


def test_bad_utf8_and_bad_gzip(tmp_path):
    p = tmp_path / "u.jsonl"
    p.write_bytes(json.dumps(MOON_LINE).encode() + b"\n" + b'{"x": "\xff\xfe"}\n')
    assert "not valid UTF-8" in _err(str(p), 2)
    c = tmp_path / "u.csv"
    c.write_bytes(AZ_HEADER.encode() + b"\n2023-11-16 18:17:03.1,5,2\n\xff,1,2\n")
    assert "not valid UTF-8" in _err(str(c), 3)
    g = tmp_path / "notgz.jsonl.gz"
    g.write_bytes(b"plain text\n")
    with pytest.raises(InputError, match=r"notgz\.jsonl\.gz:1: cannot read file"):
        list(open_trace(g))


def test_utf8_bom_csv(tmp_path):
    c = tmp_path / "bom.csv"
    c.write_bytes(b"\xef\xbb\xbf" + AZ_HEADER.encode() + b"\r\n2023-11-16 18:17:03.1,5,2\r\n")
    assert list(open_trace(c)) == [Request(0, 0.0, 5, 2, ())]
