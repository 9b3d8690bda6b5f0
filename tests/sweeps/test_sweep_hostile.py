"""Issue 27's sweep faults, each a regression test: resume keyed on every file a cell reads
(#2), an output folder that holds an input (#1), a grid too large to build (#4), a cell that
never ends (#14, ``--cell-timeout``), a spec whose YAML is a bomb or repeats a key (#3, #15).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from support import LLAMA_CONFIG, ROOT, SAMPLE, run_main

from kvsim.core.errors import InputError
from kvsim.sweeps import SweepSpec, sweep

PLUGIN_FIFO = '''
from kvsim.policies.fifo import FIFOPolicy


class Mine(FIFOPolicy):
    """Switched between FIFO and LRU by editing this file."""
'''


def _ran(spec, out) -> list[int]:
    ran: list[int] = []
    sweep(spec, executor="serial", out=out, on_row=lambda r, d, t: ran.append(r["cell"]))
    return ran


def _keep_times_edit(path: Path, text: str) -> None:
    """Rewrite ``path`` and put its modification time back (as ``cp -p`` would)."""
    st = path.stat()
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


# --------------------------------------------------------------------------- 2: resume keys


def test_resume_reruns_a_cell_whose_plugin_module_changed(tmp_path, monkeypatch):
    module = tmp_path / "plugins"
    module.mkdir()
    (module / "resume_plugin_mod.py").write_text(PLUGIN_FIFO)
    monkeypatch.syspath_prepend(str(module))
    monkeypatch.chdir(tmp_path)
    spec = {
        "traces": [SAMPLE],
        "limit": 40,
        "options": {"policy": "resume_plugin_mod:Mine"},
        "grid": {"cpu_chunks": [10, 30]},
    }
    out = tmp_path / "out"
    assert _ran(spec, out) == [0, 1]
    assert _ran(spec, out) == []  # nothing changed: nothing runs
    _keep_times_edit(
        module / "resume_plugin_mod.py",
        PLUGIN_FIFO.replace("fifo import FIFOPolicy", "lru import LRUPolicy as FIFOPolicy"),
    )
    assert _ran(spec, out) == [0, 1]


@pytest.mark.parametrize("which", ["model", "device"])
def test_resume_reruns_a_cell_whose_config_file_changed(tmp_path, which):
    """A model config.json, and a tier device file named inside a tier shorthand."""
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(LLAMA_CONFIG))
    device = tmp_path / "dev.json"
    device.write_text(json.dumps({"name": "mine", "read_bytes_per_s": 1e9}))
    options = {"model": str(config.parent), "cpu_gib": 1}
    if which == "device":
        options = {"cpu_chunks": 20, "tiers": f"fs:capacity=1TiB,device={device}"}
    spec = {"traces": [SAMPLE], "limit": 30, "options": options, "grid": {"seed": [0]}}
    out = tmp_path / "out"
    assert _ran(spec, out) == [0]
    assert _ran(spec, out) == []
    if which == "model":
        _keep_times_edit(config, json.dumps({**LLAMA_CONFIG, "num_hidden_layers": 16}))
    else:
        _keep_times_edit(device, json.dumps({"name": "mine", "read_bytes_per_s": 2e9}))
    assert _ran(spec, out) == [0]


def test_resume_reruns_a_large_trace_edited_in_the_middle(tmp_path):
    """A trace over 2 MiB, one value in its middle changed, size and mtime kept."""
    lines = Path(SAMPLE).read_text().splitlines(keepends=True)
    text = "".join(lines * (1 + (3 << 20) // sum(map(len, lines))))
    trace = tmp_path / "big.jsonl"
    trace.write_text(text)
    assert trace.stat().st_size > 2 << 20
    spec = {"traces": [str(trace)], "limit": 5000, "grid": {"cpu_chunks": [50]}}
    out = tmp_path / "out"
    assert _ran(spec, out) == [0]
    middle = len(text) // 2
    at = text.index('"output_length": ', middle) + len('"output_length": ')
    digit = "1" if text[at] != "1" else "2"
    _keep_times_edit(trace, text[:at] + digit + text[at + 1 :])
    assert _ran(spec, out) == [0]


# --------------------------------------------------------------------------- 1: output folder


@pytest.mark.parametrize("name", ["results.csv", "journal.jsonl", "metadata.json"])
def test_sweep_refuses_an_out_folder_holding_its_trace(tmp_path, capsys, name):
    out = tmp_path / "d"
    out.mkdir()
    trace = out / name
    trace.write_bytes(Path(SAMPLE).read_bytes())
    before = trace.read_bytes()
    code, _, err = run_main(
        ["sweep", "--trace", trace, "--cpu-chunks", "10", "--out", out, "--executor", "serial"],
        capsys,
    )
    assert code == 2, err
    assert err.count("\n") == 1 and name in err and "input" in err, err
    assert trace.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == [name]
    with pytest.raises(InputError, match="would overwrite"):
        sweep({"traces": [str(trace)], "options": {"cpu_chunks": 10}}, out=out, executor="serial")


def test_sweep_refuses_an_out_folder_holding_its_spec(tmp_path, capsys):
    out = tmp_path / "d"
    out.mkdir()
    spec = out / "results.csv"  # a YAML spec under an odd name
    spec.write_text(f"traces: [{SAMPLE}]\noptions: {{cpu_chunks: 10}}\n")
    code, _, err = run_main(["sweep", spec, "--out", out, "--executor", "serial"], capsys)
    assert code == 2 and "results.csv" in err, err
    assert spec.read_text().startswith("traces:")


# --------------------------------------------------------------------------- 4: huge grids


def _grid_spec(path: Path, axes: int, values: int) -> str:
    names = ["seed", "store_threshold", "gpu_blocks", "max_tracker_size", "chunk_tokens"]
    grid = {n: list(range(1, values + 1)) for n in names[:axes]}
    path.write_text(json.dumps({"traces": [SAMPLE], "options": {"cpu_chunks": 10}, "grid": grid}))
    return str(path)


def test_a_huge_grid_is_refused_before_any_cell_is_built(tmp_path, capsys):
    """10^10 cells: counted, refused in one line, in little memory and time."""
    spec = _grid_spec(tmp_path / "huge.yaml", 5, 100)
    tracemalloc.start()
    start = time.perf_counter()
    code, _, err = run_main(["sweep", spec, "--out", tmp_path / "o"], capsys)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert code == 2, err
    assert "10,000,000,000 cells" in err and "--max-cells" in err and err.count("\n") == 1
    assert peak < 50 << 20, peak
    assert time.perf_counter() - start < 30
    assert not (tmp_path / "o").exists()


def test_max_cells_raises_the_limit_and_cells_are_built_lazily(tmp_path, capsys):
    spec = _grid_spec(tmp_path / "s.yaml", 2, 2)  # 4 cells
    args = ["sweep", spec, "--executor", "serial", "--no-progress", "--out", tmp_path / "o"]
    code, _, err = run_main([*args, "--max-cells", "3"], capsys)
    assert code == 2 and "4 cells" in err, err
    code, _, err = run_main([*args, "--max-cells", "4"], capsys)
    assert code == 0, err
    s = SweepSpec.load(spec)
    cells = s.iter_cells()
    assert not isinstance(cells, list) and len(list(cells)) == s.n_cells == 4


def test_a_repeated_grid_value_is_named(tmp_path):
    spec = {"traces": [SAMPLE], "grid": {"cpu_chunks": [10, 20, 10]}}
    with pytest.raises(InputError, match=r"duplicate cells: grid.cpu_chunks repeats 10"):
        sweep(spec, executor="serial")


def test_a_whole_float_repeats_its_integer(tmp_path):
    spec = {"traces": [SAMPLE], "options": {"model": "llama-3.1-8b"}, "grid": {"cpu_gib": [1, 1.0]}}
    with pytest.raises(InputError, match=r"grid.cpu_gib repeats 1"):
        sweep(spec, executor="serial")


def test_a_repeated_value_names_the_spec_file(tmp_path, capsys):
    """As every other bad spec: one line naming the file, the key and the value (the
    command hands the sweep a spec it read, so the file was lost and the line began with
    the key), and from Python the mapping (``sweep spec``)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(f"traces: [{SAMPLE}]\ngrid: {{cpu_chunks: [1e3, 1000.0]}}\n")
    code, _, err = run_main(["sweep", spec, "--out", tmp_path / "o"], capsys)
    assert code == 2, err
    assert err.strip() == (
        f"kvsim: error: {spec}: the sweep has duplicate cells: grid.cpu_chunks repeats 1000"
    )
    assert not (tmp_path / "o").exists()
    with pytest.raises(InputError, match=r"^sweep spec: the sweep has duplicate cells: traces"):
        sweep({"traces": [SAMPLE, SAMPLE], "options": {"cpu_chunks": 10}}, executor="serial")


def test_a_spec_name_is_a_name_not_a_path(tmp_path, capsys, monkeypatch):
    """The default folder is sweep-NAME, here: ``../../escape`` would write elsewhere."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: ../../escape\ntraces: [{SAMPLE}]\noptions: {{cpu_chunks: 10}}\n")
    code, _, err = run_main(["sweep", spec], capsys)
    assert code == 2 and "name: a name, not a path" in err, err
    assert list(tmp_path.iterdir()) == [spec]


def test_an_empty_value_between_commas_is_refused(tmp_path, capsys):
    args = ["sweep", "--trace", SAMPLE, "--cpu-chunks", "100,,200", "--out", tmp_path / "o"]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "--cpu-chunks: an empty value in '100,,200'" in err, err
    assert not (tmp_path / "o").exists()


def test_the_name_check_takes_every_name_a_run_takes(tmp_path):
    """Admission rules with their argument, a model's config.json: what runs, checks."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_CONFIG))
    spec = {
        "traces": [SAMPLE],
        "options": {"cpu_gib": 8},
        "grid": {
            "admission": ["always", "probabilistic:0.5", "tinylfu:3", "threshold:3", "length:64"],
            "policy": ["lru", "S3FIFO"],
            "model": ["llama-3.1-8b", str(config)],
        },
    }
    assert SweepSpec.load(spec).n_cells == 20


def _bad_trace(tmp_path: Path, kind: str) -> str:
    path = tmp_path / f"{kind}.jsonl"
    if kind == "bad-line":
        lines = Path(SAMPLE).read_text().splitlines()
        path.write_text("\n".join([*lines[:3], '{"timestamp": 1, "input_length":', *lines[3:]]))
    elif kind == "empty":
        path.write_text("")
    return str(path)  # "missing": never written


@pytest.mark.parametrize(
    ("entry", "grid", "named"),
    [
        ("missing", {}, "traces[0]: "),
        ("bad-line", {}, "bad-line.jsonl:4"),
        ("empty", {}, "no requests"),
        (None, {"policy": ["lru", "nope"]}, "grid.policy[1]: unknown eviction policy 'nope'"),
        (None, {"admission": ["nope"]}, "grid.admission[0]: unknown admission policy"),
        (None, {"model": ["llama-3.1-8b", "nope"]}, "grid.model[1]: unknown model 'nope'"),
        (None, {"cpu_chunks": [10, None]}, "grid.cpu_chunks: cache mode needs a CPU tier"),
        (None, {"executor": "ray"}, "needs Ray"),
    ],
)
def test_what_no_cell_could_run_is_refused_before_any_runs(
    tmp_path, capsys, monkeypatch, entry, grid, named
):
    """A missing or bad trace, an unknown name, a cell without a CPU tier, an executor not
    installed: one line, exit 2, no folder, where each used to fail cell by cell (exit 1,
    a results folder of failures)."""
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray absent, installed here or not
    trace = _bad_trace(tmp_path, entry) if entry else SAMPLE
    axes = {k: v for k, v in grid.items() if k != "executor"}
    options = {} if "cpu_chunks" in axes else {"cpu_chunks": 10}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"traces": [trace], "options": options, "grid": axes}))
    executor = grid.get("executor", "serial")
    out = tmp_path / "o"
    code, _, err = run_main(["sweep", spec, "--executor", executor, "--out", out], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and named in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "grid", "named"),
    [
        (
            {"model": "llama-2-7b"},
            {"max_model_len": [2048, 100000]},
            "grid.max_model_len[1] 100000",
        ),
        ({"max_model_len": 8192}, {"model": ["llama-3.1-8b", "llama-2-7b"]}, "llama-2-7b's max"),
        ({"max_model_len": 200000}, {"tp": [1]}, "llama-3.1-8b's"),  # the default model's
    ],
)
def test_a_timed_max_model_len_past_a_models_positions_is_refused_up_front(
    tmp_path, capsys, options, grid, named
):
    """vLLM does not start with it: it was a failed cell (exit 1, a results folder)."""
    spec = tmp_path / "spec.json"
    data = {"traces": [SAMPLE], "mode": "timed", "limit": 5}
    spec.write_text(json.dumps({**data, "options": {"cpu_chunks": 10, **options}, "grid": grid}))
    out = tmp_path / "o"
    code, _, err = run_main(["sweep", spec, "--executor", "serial", "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{spec}: " in err and named in err and "vLLM refuses to start" in err
    assert not out.exists()


# --------------------------------------------------------------------------- 14: cell timeout

HANGS = """
from kvsim.policies.lru import LRUPolicy


class Hangs(LRUPolicy):
    def evict(self, n, protected):
        while True:
            pass
"""


def test_cell_timeout_stops_a_plugin_in_an_endless_loop(tmp_path):
    (tmp_path / "hang_plugin.py").write_text(HANGS)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    args = ["--trace", SAMPLE, "--limit", "60", "--cpu-chunks", "5", "--out", str(out)]
    args += ["--policy", "lru,hang_plugin:Hangs", "--workers", "2", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "kvsim", "sweep", *args, "--cell-timeout", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    table = pd.read_csv(out / "results.csv").set_index("policy")
    assert table.loc["lru", "status"] == "ok"
    assert table.loc["hang_plugin:Hangs", "status"] == "error"
    assert "timeout of 5 s" in table.loc["hang_plugin:Hangs", "error"]


def test_cell_timeout_needs_the_local_executor():
    with pytest.raises(InputError, match="local executor"):
        sweep({"traces": [SAMPLE], "options": {"cpu_chunks": 5}}, executor="serial", cell_timeout=1)


# --------------------------------------------------------------------------- 3, 15: YAML


def _bomb(where: str) -> str:
    """Nine levels of nine aliases (9^9 leaves once expanded) as the mapping under
    ``where``."""
    lines = ['a0: &a0 ["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")

    def body(indent: int) -> str:
        return "\n".join(" " * indent + line for line in lines)

    if where == "name":
        return f"traces: [{SAMPLE}]\noptions: {{cpu_chunks: 10}}\nname:\n{body(2)}\n"
    if where == "traces":
        return f"options: {{cpu_chunks: 10}}\ntraces:\n  - kind: chat\n{body(4)}\n"
    return f"traces: [{SAMPLE}]\noptions:\n  cpu_chunks: 10\n  {where}:\n{body(4)}\n"


@pytest.mark.parametrize("where", ["policy", "vllm_config", "name", "traces"])
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys, where):
    spec = tmp_path / "bomb.yaml"
    spec.write_text(_bomb(where))
    assert spec.stat().st_size < 4096
    tracemalloc.start()
    code, _, err = run_main(["sweep", spec, "--out", tmp_path / "o"], capsys)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert code == 2, err
    assert err.count("\n") == 1 and "alias" in err and str(spec) in err, err
    assert peak < 50 << 20, peak


def test_an_alias_in_a_grid_option_value_is_refused(capsys):
    code, _, err = run_main(["sweep", "--trace", SAMPLE, "--cpu-chunks", "&a [1, *a]"], capsys)
    assert code == 2 and "alias" in err and err.count("\n") == 1, err


def test_a_key_given_twice_is_refused(tmp_path, capsys):
    spec = tmp_path / "twice.yaml"
    spec.write_text(f"traces: [{SAMPLE}]\noptions: {{cpu_chunks: 10}}\ntraces: [other.jsonl]\n")
    code, _, err = run_main(["sweep", spec, "--out", tmp_path / "o"], capsys)
    assert code == 2, err
    assert f"{spec}:3:" in err and "'traces' is given twice" in err, err
