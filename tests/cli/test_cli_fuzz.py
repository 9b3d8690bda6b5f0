"""Fuzz: byte-level mutations of a bundled trace and random option values, fed to the real
entry point of ``replay``, ``simulate --limit``, ``mrc`` and ``trace stats``. Whatever the
input, kvsim exits 0 or 2; a 2 is one line on stderr; never a traceback; the input is never
changed; a failed run leaves no output file behind."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from support import SAMPLE, run_main

CASES = 160
LINES = Path(SAMPLE).read_bytes().splitlines(keepends=True)[:25]

JUNK = [b"", b"{", b"}", b"null", b"NaN", b"-1", b"1e309", b'"x"', b"[]", b"\xff\xfe", b"\x00"]


def mutate(rng: random.Random) -> bytes:
    """A few random edits of the first lines of a valid Mooncake trace."""
    data = bytearray(b"".join(LINES))
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["flip", "delete", "insert", "junk", "truncate", "dup", "value"])
        pos = rng.randrange(len(data)) if data else 0
        if kind == "flip" and data:
            data[pos] = rng.randrange(256)
        elif kind == "delete" and data:
            del data[pos : pos + rng.randint(1, 20)]
        elif kind == "insert":
            data[pos:pos] = bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 8)))
        elif kind == "junk":
            data[pos:pos] = rng.choice(JUNK)
        elif kind == "truncate":
            del data[pos:]
        elif kind == "dup" and data:
            lines = bytes(data).splitlines(keepends=True)
            line = rng.choice(lines)
            data += line
        elif kind == "value":
            text = bytes(data)
            for field in (b'"input_length": ', b'"output_length": ', b'"timestamp": '):
                at = text.find(field, pos)
                if at >= 0:
                    start = at + len(field)
                    end = start
                    while end < len(text) and text[end : end + 1] not in (b",", b"}"):
                        end += 1
                    data[start:end] = rng.choice([*JUNK[1:], b"-512", b"1.5", b"99999999999"])
                    break
    return bytes(data)


def options(rng: random.Random, command: str) -> list[str]:
    """Random, sometimes invalid, option values for ``command``."""
    pick = rng.choice
    if command == "replay":
        size = pick(
            [
                ["--cpu-chunks", pick(["1", "50", "0", "-3", "abc", "1e3"])],
                ["--cpu-gib", pick(["1", "nan", "inf", "-1", "x"]), "--model", "llama-3.1-8b"],
            ]
        )
        extra = pick(
            [
                [],
                ["--policy", pick(["arc", "s3fifo", "nope", "x:Y"])],
                ["--chunk-tokens", pick(["512", "0", "100"])],
                ["--store-threshold", pick(["2", "-1"])],
                ["--gpu-blocks", pick(["10", "-1"])],
            ]
        )
        return [*size, *extra]
    if command == "simulate":
        return [
            "--limit",
            pick(["3", "8"]),
            "--cpu-chunks",
            pick(["20", "0"]),
            *pick(
                [
                    [],
                    ["--time-scale", pick(["0.5", "0", "nan"])],
                    ["--max-num-seqs", pick(["2", "0"])],
                ]
            ),
        ]
    if command == "mrc":
        return pick(
            [
                [],
                ["--sample-rate", pick(["0.5", "0", "2", "nan"])],
                ["--points", pick(["5", "0", "-1"])],
            ]
        )
    return pick([[], ["--bin-s", pick(["1", "0", "nan", "1e-9"])], ["--limit", pick(["5", "0"])]])


OUTPUT = {"replay": "--requests-csv", "mrc": "--csv"}


@pytest.mark.parametrize("seed", range(CASES))
def test_mutated_traces_and_options_exit_cleanly(seed, tmp_path, capsys):
    rng = random.Random(seed)
    command = ["replay", "simulate", "mrc", "trace stats"][seed % 4]
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(mutate(rng) if rng.random() < 0.7 else b"".join(LINES))
    before = hashlib.sha256(trace.read_bytes()).hexdigest()
    out = tmp_path / "out.csv"
    args = [*command.split(), str(trace), *options(rng, command)]
    if command in OUTPUT:
        args += [OUTPUT[command], str(out)]
    if command == "simulate":
        args += ["--no-progress"]
    code, _, err = run_main(args, capsys)
    assert code in (0, 2), (args, err)
    assert "Traceback" not in err, (args, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 or (len(lines) == 2 and lines[0].startswith("kvsim: note:")), err
        assert not out.exists(), args
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) in (["t.jsonl"], ["out.csv", "t.jsonl"])
