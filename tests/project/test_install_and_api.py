"""Installing kvsim and using it from Python: what the wheel ships and requires, what runs
without torch, the package's public face (``__all__``, explicit signatures), progress bars,
the Result object, and one name for a request's prompt length."""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import pandas as pd
import pytest
from support import ROOT, SAMPLE, expect_overload, run_main

import kvsim
from kvsim.api import BUNDLED_TRACE
from kvsim.options.offload import OFFLOAD_FIELDS, OffloadOptions
from kvsim.report.progress import LogLines, Progress

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

#: sha256 of the conversation trace in traces/ (traces/README.md): the bundled copy is it
CONVERSATION_SHA256 = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, from a folder outside the checkout."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(ROOT).parent,
        timeout=300,
    )


#: makes ``import torch`` fail in a fresh interpreter, as on a machine without it
NO_TORCH = "import sys; sys.modules['torch'] = None\n"

# --------------------------------------------------------------------------- install


def test_torch_is_an_extra_and_the_extras_are_pinned():
    project = PYPROJECT["project"]
    names = [re.split(r"[<>=!~;\[ ]", d)[0] for d in project["dependencies"]]
    assert "torch" not in names and "tqdm" in names
    extras = project["optional-dependencies"]
    assert {"real", "vllm", "compare", "notebooks", "ray", "dev", "test"} <= set(extras)
    assert extras["real"] == ["torch>=2.1"]
    assert extras["vllm"] == ["vllm==0.33.0"]
    assert extras["compare"] == ["libcachesim==0.3.5"]
    assert any(d.startswith("ipywidgets") for d in extras["notebooks"])
    assert any(d.startswith("ray") for d in extras["ray"])
    # the tests exercise real/ on CPU: the test extra brings torch through [real]
    assert "kvsim[real]" in extras["test"]
    assert any(d.startswith("kvsim[") and "test" in d for d in extras["dev"])


def test_the_readme_quick_start_installs_without_torch_and_tests_with_it():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.strip().splitlines() if line.strip()]
    assert len(commands) == 2
    assert commands[0].startswith("pip install -e . && kvsim replay") and "torch" not in commands[0]
    assert commands[1] == "pip install torch==2.13.0 -e '.[test]' && python -m pytest"


def test_the_wheel_ships_the_data_and_needs_no_torch(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("kvsim", "real"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = (tmp_path / "dist").glob("kvsim-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"kvsim/data/{BUNDLED_TRACE}" in names
    assert "kvsim/data/validation_report_sample.json" in names
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    torch = [r for r in requires if r.startswith("torch")]
    assert torch == ['torch>=2.1; extra == "real"']


def test_the_bundled_trace_is_package_data_found_by_importlib_resources():
    resource = files("kvsim") / "data" / BUNDLED_TRACE
    assert resource.is_file()
    assert kvsim.bundled_trace() == str(resource)
    with gzip.open(kvsim.bundled_trace(), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == CONVERSATION_SHA256
    trace = kvsim.open_trace(kvsim.bundled_trace())
    assert trace.format == "mooncake" and sum(1 for _ in trace) == 12_031


def test_importing_the_cli_does_not_import_torch():
    done = _python("import sys, kvsim, kvsim.cli; print('torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_replay_and_simulate_run_without_torch():
    code = NO_TORCH + (
        f"from kvsim.cli import main\nmain(['replay', {SAMPLE!r}, '--cpu-gib', '8', '--json'])\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"] == 200
    simulate = f"import kvsim; print(kvsim.simulate({SAMPLE!r}, limit=5).summary['requests'])"
    done = _python(NO_TORCH + simulate)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "5"


@pytest.mark.parametrize(
    "args", [["calibrate", "--out", "p.json"], ["validate", SAMPLE, "--cpu-gib", "1"]]
)
def test_real_commands_without_torch_say_how_to_install_it(args, tmp_path):
    code = NO_TORCH + f"from kvsim.cli import main\nmain({args!r})\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(f"kvsim: error: kvsim {args[0]} ")
    assert "pip install 'kvsim[real]'" in lines[0]
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- public face


def test_all_names_are_public_importable_and_sorted():
    names = kvsim.__all__
    assert names == sorted(set(names))
    assert all(not n.startswith("_") for n in names)
    for name in names:
        value = getattr(kvsim, name)
        assert not inspect.ismodule(value), name
    assert {"replay", "simulate", "sweep", "mrc", "generate", "trace_stats"} <= set(names)
    assert {"bundled_trace", "open_trace", "Result", "Trace", "Request", "InputError"} <= set(names)
    done = _python("from kvsim import *; print(sorted(k for k in dir() if not k.startswith('_')))")
    assert done.returncode == 0, done.stderr
    assert eval(done.stdout) == sorted(names)


def _keywords(fn) -> dict[str, inspect.Parameter]:
    return {
        p.name: p
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


@pytest.mark.parametrize("fn", [kvsim.replay, kvsim.simulate], ids=["replay", "simulate"])
def test_signatures_are_explicit_and_documented(fn):
    params = inspect.signature(fn).parameters.values()
    assert not [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    keywords = _keywords(fn)
    # every offload option is a keyword of both modes (the CLI and sweeps rely on it)
    assert set(OFFLOAD_FIELDS) <= set(keywords)
    assert "progress" in keywords
    doc = inspect.getdoc(fn) or ""
    undocumented = [name for name in keywords if f"``{name}``" not in doc]
    assert not undocumented
    assert "progress" in _keywords(kvsim.sweep)
    assert "progress" in (inspect.getdoc(kvsim.sweep) or "")


@pytest.mark.parametrize("fn", [kvsim.replay, kvsim.simulate], ids=["replay", "simulate"])
def test_an_unknown_keyword_is_rejected_by_name(fn):
    with pytest.raises(kvsim.InputError, match=r"unknown option 'cpu_gb' .*'cpu_gib'"):
        fn(SAMPLE, limit=3, cpu_gb=8)
    # the explicit signature survives the check (help(), IDEs and sweeps read it)
    assert inspect.signature(fn).parameters["cpu_gib"].default is None


def test_defaults_in_the_signature_are_the_ones_used():
    assert _keywords(kvsim.simulate)["model"].default == OffloadOptions().model
    assert _keywords(kvsim.replay)["admission"].default == OffloadOptions().admission
    a = kvsim.replay(SAMPLE, limit=50, cpu_chunks=40)
    b = kvsim.replay(SAMPLE, limit=50, cpu_chunks=40, model=OffloadOptions().model, tp=1)
    assert a.summary == b.summary


# --------------------------------------------------------------------------- progress


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "req" in line and "|" in line]


def test_progress_true_draws_a_bar_of_whole_lines_when_stderr_is_a_file(capsys):
    res = kvsim.replay(SAMPLE, cpu_chunks=100, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err  # a log file gets lines, not carriage-return redraws
    lines = _lines(err)
    assert lines and lines[-1].startswith("replaying: 100%")
    assert f"{res.summary['requests']}/{res.summary['requests']}" in lines[-1]


@expect_overload
def test_progress_under_baseline_counts_requests_not_twice_as_many(capsys):
    kvsim.simulate(SAMPLE, limit=20, cpu_gib=8, baseline=True, time_scale=8, progress=True)
    lines = _lines(capsys.readouterr().err)
    finals = [line for line in lines if "100%" in line]
    assert [line.split(":")[0] for line in finals] == [
        "simulating (offload)",
        "baseline (no offload)",
    ]
    assert all("20/20" in line for line in finals)
    assert not any("/40" in line for line in lines)


def test_a_progress_callback_counts_every_request_of_every_run():
    seen: list[int] = []
    kvsim.replay(SAMPLE, limit=30, cpu_chunks=100, progress=seen.append)
    assert sum(seen) == 30
    seen.clear()
    kvsim.simulate(SAMPLE, limit=10, cpu_gib=8, baseline=True, progress=seen.append)
    assert sum(seen) == 20  # the callback hears both runs; the bar shows each on its own


def test_cli_progress_under_baseline_counts_requests(capsys):
    args = ["simulate", SAMPLE, "--limit", "15", "--cpu-gib", "8", "--baseline", "--progress"]
    code, _, err = run_main([*args, "--time-scale", "8"], capsys)
    assert code == 0, err
    finals = [line for line in _lines(err) if "100%" in line]
    assert len(finals) == 2 and all("15/15" in line for line in finals)
    code, _, err = run_main([*args[:-1], "--no-progress"], capsys)
    assert code == 0 and not _lines(err)


def test_sweep_progress_counts_cells(capsys):
    spec = {"traces": [SAMPLE], "limit": 20, "grid": {"cpu_chunks": [50, 100, 200]}}
    table = kvsim.sweep(spec, executor="serial", progress=True)
    assert len(table) == 3
    lines = [line for line in capsys.readouterr().err.splitlines() if "cell" in line]
    assert lines and lines[-1].startswith("sweep: 100%") and "3/3" in lines[-1]


def test_log_lines_turn_redraws_into_lines(tmp_path):
    path = tmp_path / "log.txt"
    with open(path, "w", encoding="utf-8") as f:
        log = LogLines(f)
        log.write("\rworking:  10%|#    | 1/10   ")
        log.write("\rworking: 100%|#####| 10/10")
        log.write("\n")
        log.write("")
    lines = ["working:  10%|#    | 1/10", "working: 100%|#####| 10/10"]
    assert path.read_text().splitlines() == lines


def test_progress_rejects_what_is_neither_a_flag_nor_a_callable():
    with pytest.raises(kvsim.InputError, match="progress"):
        Progress("yes", 10, "x")  # type: ignore[arg-type]
    with pytest.raises(kvsim.InputError, match="progress"):
        kvsim.replay(SAMPLE, limit=3, cpu_chunks=10, progress=1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Result


@pytest.fixture(scope="module")
def timed() -> kvsim.Result:
    return kvsim.simulate(SAMPLE, limit=40, cpu_gib=64, baseline=True, time_scale=8)


@expect_overload
def test_repr_shows_the_run_its_headline_and_its_tables(timed):
    text = repr(timed)
    first, *rest = text.splitlines()
    assert first == f"Result({SAMPLE} on llama-3.1-8b / h200)"
    assert any(line.split() == ["requests", "40"] for line in rest)
    assert "tables: requests (40 x" in text and "baseline_requests (40 x" in text
    assert "more in .summary" in text
    assert len(text.splitlines()) < 30  # readable, not the whole summary


def test_repr_html_escapes_and_folds_the_summary():
    res = kvsim.Result(summary={"trace": "<a&b>", "requests": 3, "x": 0.5})
    html = res._repr_html_()
    assert "&lt;a&amp;b&gt;" in html and "<a&b>" not in html
    assert "<details>" in html and "all 3 summary metrics" in html
    assert "tables: none" in html


@expect_overload
def test_compare_puts_a_run_beside_its_baseline(timed):
    table = timed.compare()
    assert list(table.columns) == ["offload", "no offload", "difference", "ratio"]
    row = table.loc["cpu_hit_tokens"]
    assert row["offload"] == timed.summary["cpu_hit_tokens"]
    assert row["no offload"] == timed.summary["baseline_cpu_hit_tokens"] == 0
    assert pd.isna(row["ratio"])  # nothing to divide by
    ttft = table.loc["median_ttft_ms"]
    assert ttft["ratio"] == pytest.approx(
        timed.summary["median_ttft_ms"] / timed.summary["baseline_median_ttft_ms"]
    )
    assert "trace" not in table.index  # text is not compared


def test_compare_two_runs_and_pick_metrics():
    big = kvsim.replay(SAMPLE, cpu_chunks=400)
    small = kvsim.replay(SAMPLE, cpu_chunks=40)
    table = big.compare(small, metrics=["cpu_hit_blocks", "chunks_evicted"])
    assert list(table.index) == ["cpu_hit_blocks", "chunks_evicted"]
    assert list(table.columns) == ["this", "other", "difference", "ratio"]
    assert table.loc["cpu_hit_blocks", "difference"] == (
        big.summary["cpu_hit_blocks"] - small.summary["cpu_hit_blocks"]
    )
    with pytest.raises(kvsim.InputError, match="no_such_metric"):
        big.compare(small, metrics=["no_such_metric"])
    with pytest.raises(kvsim.InputError, match="baseline=True"):
        big.compare()


@expect_overload
def test_save_writes_the_folder_simulate_out_writes(timed, tmp_path):
    folder = tmp_path / "run"
    written = timed.save(folder)
    tables = {f"{n}.{ext}" for n in timed.tables for ext in ("parquet", "csv")}
    assert tables | {"summary.json", "config.json"} <= set(written)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*written, ".kvsim-run.json"])
    marker = json.loads((folder / ".kvsim-run.json").read_text())
    assert marker == {"complete": True, "files": written}
    back = pd.read_parquet(folder / "requests.parquet")
    pd.testing.assert_frame_equal(back, timed.requests.reset_index(drop=True))
    assert json.loads((folder / "summary.json").read_text())["requests"] == 40
    # saving a run with fewer tables into the same folder removes the stale ones
    second = kvsim.Result(summary={"requests": 1}, tables={"requests": timed.requests}).save(folder)
    assert not (folder / "steps.parquet").exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted([*second, ".kvsim-run.json"])


# --------------------------------------------------------------------------- prompt tokens


def test_one_name_for_the_prompt_length_everywhere():
    frames = {
        "generate": kvsim.generate("chat", 20, seed=1),
        "requests_frame": kvsim.requests_frame(kvsim.open_trace(SAMPLE, limit=5), 512),
        "trace_stats": kvsim.trace_stats(SAMPLE, limit=20).requests,
        "replay": kvsim.replay(SAMPLE, limit=20, cpu_chunks=50).requests,
        "simulate": kvsim.simulate(SAMPLE, limit=5).requests,
    }
    for where, frame in frames.items():
        assert "prompt_tokens" in frame.columns, where
        assert "input_tokens" not in frame.columns, where
    req = next(iter(kvsim.open_trace(SAMPLE)))
    assert req.prompt_tokens == req.input_tokens == 6758  # the earlier name still reads


def test_a_frame_with_the_earlier_column_name_still_replays():
    frame = kvsim.requests_frame(kvsim.open_trace(SAMPLE, limit=30), 512)
    old = frame.rename(columns={"prompt_tokens": "input_tokens"})
    assert kvsim.replay(old, cpu_chunks=50).summary == kvsim.replay(frame, cpu_chunks=50).summary
    bad = frame.assign(prompt_tokens=-1)
    with pytest.raises(kvsim.InputError, match="field 'prompt_tokens'"):
        kvsim.replay(bad, cpu_chunks=50)


def test_notebooks_read_no_file_of_the_checkout():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        text = path.read_text()
        assert "traces/" not in text, path.name
        assert ".parents" not in text and "sys.path" not in text, path.name


def test_a_generated_frame_with_some_sessions_goes_back_in_as_a_trace():
    frame = kvsim.generate("mix", 60, seed=2)
    assert frame["session_id"].isna().any() and frame["session_id"].notna().any()
    res = kvsim.replay(frame, cpu_chunks=100)
    assert res.summary["requests"] == 60
    assert kvsim.trace_stats(frame).summary["requests"] == 60


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("chat", 2.5, 1), "n_requests must be an integer >= 0, got 2.5"),
        (("chat", -1), "n_requests must be an integer >= 0"),
        (("chat", 10, "x"), "seed must be an integer, got 'x'"),
        (("chat", 10, 1.7), "seed must be an integer, got 1.7"),
    ],
)
def test_generate_names_a_bad_count_or_seed(args, named):
    """Once a TypeError deep in the generator (2.5) or silently a seed of text (``'x'``)."""
    with pytest.raises(kvsim.InputError, match=re.escape(named)):
        kvsim.generate(*args)


def test_numpy_numbers_count_as_the_numbers_they_hold_in_limits_and_sweeps():
    """As python-api.md says: ``limit=np.int64(20)`` was refused by simulate, mrc and
    trace_stats (replay took it), and a grid of ``np.geomspace`` by the sweep spec."""
    import numpy as np

    trace = kvsim.bundled_trace()
    assert len(kvsim.simulate(trace, cpu_gib=64, limit=np.int64(8)).requests) == 8
    assert kvsim.trace_stats(trace, limit=np.int64(8)).summary["requests"] == 8
    spec = {
        "traces": [trace],
        "limit": np.int64(10),
        "options": {"model": "llama-3.1-8b"},
        "grid": {"cpu_gib": np.geomspace(16, 64, 2)},
    }
    table = kvsim.sweep(spec, executor="serial")
    assert table["status"].tolist() == ["ok", "ok"] and table["cpu_gib"].tolist() == [16, 64]


def test_the_documented_subpackages_are_reached_from_a_plain_import():
    code = (
        "import kvsim; kvsim.plots.fleet_balance; kvsim.sweeps.read_requests; "
        "kvsim.traces.as_trace; kvsim.workloads.build_workload"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_compare_takes_one_metric_by_name_and_refuses_a_non_result():
    run = kvsim.replay(SAMPLE, cpu_chunks=100)
    one = run.compare(run, metrics="cpu_hit_ratio")
    assert list(one.index) == ["cpu_hit_ratio"]  # was each character a metric
    with pytest.raises(kvsim.InputError, match="other is a Result, got str"):
        run.compare("x")  # type: ignore[arg-type]
