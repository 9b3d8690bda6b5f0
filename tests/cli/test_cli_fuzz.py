"""Fuzz: byte-level mutations of a bundled trace and random option values, fed to the real
entry point of ``replay``, ``simulate --limit``, ``mrc`` and ``trace stats``. Whatever the
input, kvsim exits 0 or 2; a 2 is one line on stderr; never a traceback; the input is never
changed; a failed run leaves no output file behind.

Issue 27's kinds of input too: output folders that hold an input (or a link to one), sweep
specs with alias trees, repeated keys and huge grids, trace-cache entries that are not
sound entries (a FIFO, a link to ``/dev/zero``, a sparse 8 GiB file, a header that lies),
and policy plugins that misbehave (an unknown or repeated key, ``SystemExit``, ``print``,
an endless loop under ``--cell-timeout``)."""

from __future__ import annotations

import hashlib
import json
import os
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


# --- issue 27: folders, specs, cache entries and plugins, as a hostile user makes them ---

HOSTILE_CASES = 48
#: names a run's or a sweep's folder receives, and one neither does
FOLDER_NAMES = [
    "requests.csv",
    "summary.json",
    "config.json",
    "metadata.json",
    "steps.parquet",
    "results.csv",
    "journal.jsonl",
    "trace.jsonl",
]
PLUGIN_SOURCE = """
import sys

from kvsim.policies.lru import LRUPolicy


class Unknown(LRUPolicy):
    def evict(self, n, protected):
        v = super().evict(n, protected)
        return None if v is None else [(987654321, v[0][1])] + v[1:]


class Twice(LRUPolicy):
    def evict(self, n, protected):
        v = super().evict(n, protected)
        return v if v is None or n < 2 else [v[0], v[0]] + v[2:]


class Exit0(LRUPolicy):
    def evict(self, n, protected):
        raise SystemExit(0)


class Exit3(LRUPolicy):
    def evict(self, n, protected):
        sys.exit(3)


class Prints(LRUPolicy):
    def evict(self, n, protected):
        print("{not json")
        return super().evict(n, protected)


class Raises(LRUPolicy):
    def evict(self, n, protected):
        raise KeyError(n)


class Forever(LRUPolicy):
    def evict(self, n, protected):
        while True:
            pass
"""


def _alias_yaml(rng: random.Random) -> str:
    """A spec with an alias tree (up to 9 levels of 9) under a random key."""
    depth, width = rng.randint(1, 9), rng.randint(2, 9)
    lines = ['a0: &a0 ["xxxxxxxxxxxxxxxxxxxx"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth + 1)]
    body = "\n".join("    " + line for line in lines)
    where = rng.choice(["options.vllm_config", "options.policy", "name", "traces"])
    if where == "name":
        return f"traces: [{SAMPLE}]\noptions: {{cpu_chunks: 10}}\nname:\n{body[2:]}\n"
    if where == "traces":
        return f"options: {{cpu_chunks: 10}}\ntraces:\n  - kind: chat\n{body}\n"
    return f"traces: [{SAMPLE}]\noptions:\n  cpu_chunks: 10\n  {where.split('.')[1]}:\n{body}\n"


def _grid_yaml(rng: random.Random) -> str:
    """A spec of a random grid: a few cells, or far more than any run would take."""
    axes = rng.sample(["seed", "store_threshold", "max_tracker_size", "gpu_blocks"], 3)
    grid = {a: list(range(1, rng.choice([1, 2, 50, 1000]) + 1)) for a in axes}
    text = json.dumps({"traces": [SAMPLE], "limit": 5, "options": {"cpu_chunks": 10}})
    text = text[:-1] + f', "grid": {json.dumps(grid)}}}'
    if rng.random() < 0.3:  # a key given twice
        text = text[:-1] + ', "limit": 7}'
    return text


def _hostile_case(rng: random.Random, kind: str, tmp: Path) -> tuple[list[str], list[Path]]:
    """The command line of one case and the input files it must leave as they were."""
    if kind == "folder":
        out = tmp / "d"
        out.mkdir()
        name = rng.choice(FOLDER_NAMES)
        trace = out / name
        if rng.random() < 0.3:  # a link in the folder to the trace elsewhere
            trace = tmp / "t.jsonl"
            trace.write_bytes(b"".join(LINES))
            (out / name).symlink_to(trace)
        else:
            trace.write_bytes(b"".join(LINES))
        command = rng.choice(["replay", "simulate", "sweep", "trace stats"])
        if command == "sweep":
            args = ["sweep", "--trace", str(trace), "--cpu-chunks", "10", "--executor", "serial"]
            return [*args, "--out", str(out), "--no-progress"], [trace]
        if command == "trace stats":
            return ["trace", "stats", str(trace), "--plot", str(out)], [trace]
        extra = ["--cpu-chunks", "10"] if command == "replay" else ["--limit", "5"]
        if command == "replay":
            extra += ["--format", "mooncake"]
        return [command, str(trace), *extra, "--out", str(out)], [trace]
    if kind == "spec":
        spec = tmp / "spec.yaml"
        spec.write_text(_alias_yaml(rng) if rng.random() < 0.5 else _grid_yaml(rng))
        args = ["sweep", str(spec), "--out", str(tmp / "o"), "--executor", "serial"]
        return [*args, "--no-progress", "--max-cells", rng.choice(["4", "100000"])], [spec]
    if kind == "cache":
        trace = tmp / "t.jsonl"
        trace.write_bytes(b"".join(LINES))
        return ["replay", str(trace), "--cpu-chunks", "10", "--json"], [trace]
    (tmp / "fuzz_plugins.py").write_text(PLUGIN_SOURCE)
    cls = rng.choice(["Unknown", "Twice", "Exit0", "Exit3", "Prints", "Raises"])
    args = ["replay", SAMPLE, "--cpu-chunks", rng.choice(["5", "20"]), "--json"]
    return [*args, "--policy", f"fuzz_plugins:{cls}"], []


def _spoil_cache_entry(rng: random.Random, capsys) -> str:
    """Replace the trace cache's one entry with something that is not a sound entry."""
    from support import trace_cache_entries

    from kvsim.traces import cache
    from kvsim.traces.cache_file import MAGIC

    (entry,) = trace_cache_entries()
    raw = entry.read_bytes()
    entry.unlink()
    how = rng.choice(["fifo", "dev-zero", "sparse", "truncated", "flipped", "huge-header", "dir"])
    if how == "fifo":
        os.mkfifo(entry)
    elif how == "dev-zero":
        entry.symlink_to("/dev/zero")
    elif how == "sparse":
        with open(entry, "wb") as f:
            f.write(raw[:64])
            f.truncate(8 << 30)
    elif how == "truncated":
        entry.write_bytes(raw[: rng.randrange(len(raw))])
    elif how == "flipped":
        spoilt = bytearray(raw)
        spoilt[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        entry.write_bytes(bytes(spoilt))
    elif how == "huge-header":
        entry.write_bytes(MAGIC + rng.randrange(1 << 32).to_bytes(4, "little") + raw[24:200])
    else:
        entry.mkdir()
    cache.forget()
    return how


@pytest.mark.parametrize("seed", range(HOSTILE_CASES))
def test_hostile_folders_specs_cache_entries_and_plugins_exit_cleanly(
    seed, tmp_path, capsys, monkeypatch
):
    """Whatever the case: exit 0, 1 (a sweep with failed cells) or 2; a 2 is one line; no
    traceback; no input changed; ``--json`` output stays JSON; a spoilt cache entry gives
    the same answer as a sound one."""
    rng = random.Random(10_000 + seed)
    kind = ["folder", "spec", "cache", "plugin"][seed % 4]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args, inputs = _hostile_case(rng, kind, tmp_path)
    before = {p: p.read_bytes() for p in inputs}
    if kind == "cache":
        from kvsim.traces import cache

        cache.forget()  # the same lines may be in memory from an earlier case
        code, first, err = run_main(args, capsys)
        assert code == 0, err
        how = _spoil_cache_entry(rng, capsys)
    code, out, err = run_main(args, capsys)
    assert code in (0, 1, 2), (args, err)
    assert "Traceback" not in err, (args, err)
    if code == 2:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, (args, err)
    if "--json" in args and code == 0:
        json.loads(out)
    if kind == "cache":
        assert code == 0 and out == first, (how, err)
    for path, data in before.items():
        assert path.read_bytes() == data, (args, path)


def test_a_plugin_in_an_endless_loop_is_stopped_by_the_cell_timeout(tmp_path):
    """The one case the fuzz cannot run in process: the sweep's pool kills the cell."""
    import subprocess
    import sys

    from support import ROOT

    (tmp_path / "fuzz_plugins.py").write_text(PLUGIN_SOURCE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    args = ["--trace", SAMPLE, "--limit", "40", "--cpu-chunks", "5", "--no-progress"]
    args += ["--policy", "fuzz_plugins:Forever", "--out", str(tmp_path / "o")]
    done = subprocess.run(
        [sys.executable, "-m", "kvsim", "sweep", *args, "--cell-timeout", "4", "--workers", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "timeout of 4 s" in done.stderr
