"""The one-call JSONL decoder (``kvsim.traces.fast_jsonl``) accepts exactly what the line
reader accepts, with the same values, on random and mutated lines; a read error inside a
file is reported as the line reader reports it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from support import SAMPLE, TRACES, exact_fields, gzip_copy

from kvsim.core.errors import InputError
from kvsim.traces import cache, fast_jsonl, open_trace
from kvsim.traces.formats import bailian, mooncake

BAILIAN = TRACES / "samples" / "bailian_sample.jsonl"
MOON_LINE = {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [4, 5, 6]}


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
        return exact_fields(got), str(e)
    return exact_fields(got), None


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
    for path, layout, bt in [
        (SAMPLE, mooncake.LAYOUT, 512),
        (str(BAILIAN), bailian.LAYOUT, 16),
        (str(TRACES / "mooncake_fast25_conversation_trace.jsonl"), mooncake.LAYOUT, 512),
    ]:
        block = Path(path).read_bytes()
        cols = fast_jsonl.decode_block(block, layout, bt)
        assert cols is not None, path
        assert exact_fields(list(cols.requests())) == _line_reader(path, monkeypatch)[0]


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


def test_reading_a_gz_trace_mid_corruption_names_the_line(tmp_path):
    """A read error inside the file (a cut .gz) is reported as the line reader reports it."""
    full = Path(gzip_copy(TRACES / "mooncake_fast25_conversation_trace.jsonl", tmp_path / "c.gz"))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(InputError, match=r"cut\.jsonl\.gz:\d+: cannot read file"):
        list(open_trace(str(cut)))
