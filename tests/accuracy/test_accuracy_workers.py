"""``kvsim accuracy --workers``: experiments run on worker processes give the report of a
run in one process, row for row, failure for failure, warning for warning (the parallel
path against the plain one), and a worker's crash is the driver's error."""

from __future__ import annotations

import json
import warnings

import pytest
from measurements_small import EXPERIMENT, experiment, write
from support import run_main

from kvsim.accuracy import accuracy
from kvsim.core.errors import InputError
from kvsim.core.processes import check_workers
from kvsim.report.serve_metrics import OverloadWarning


def _file(tmp_path):
    hot = experiment(  # past the GPU: an overload warning from a worker
        id="hot",
        workload={**EXPERIMENT["workload"], "question_len": 1500, "num_prompts_per_group": 50},
        load={"type": "constant", "stages": [{"rate": 60, "duration": 5}]},
        measured=[{"stage": "all", "e2e_ms": {"mean": 300.0}}],
    )
    tp3 = experiment(id="tp3", tp=3)  # cannot run: a failure with its reason
    closed = experiment(
        id="closed",
        load={"type": "concurrency", "stages": [{"concurrency": 4, "num_requests": 12}]},
    )
    return write(tmp_path / "m.yaml", experiment(), hot, tp3, closed)


def _run(path, workers):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        report = accuracy(path, max_stage_s=5, seed=3, workers=workers)
    return report, [(w.category, str(w.message)) for w in said]


def test_workers_give_the_report_of_one_process(tmp_path):
    path = _file(tmp_path)
    one, said_one = _run(path, 1)
    two, said_two = _run(path, 2)
    assert [r.experiment for r in two.results] == ["small-llama-2-7b", "hot", "tp3", "closed"]
    assert two.rows == one.rows and len(one.rows) > 0
    assert [(r.experiment, r.error, r.requests, r.warnings) for r in two.results] == [
        (r.experiment, r.error, r.requests, r.warnings) for r in one.results
    ]
    assert said_two == said_one
    assert any(c is OverloadWarning and "experiment hot: overloaded" in t for c, t in said_two)
    assert two.summary() == one.summary()


def test_a_crash_in_a_worker_is_raised_by_the_driver(tmp_path, monkeypatch):
    """The workers are forked (or spawned) from here; a bug in one must not be lost or
    hang the run."""
    import multiprocessing

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("a patch reaches the workers only when they are forked")

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the run")

    monkeypatch.setattr("kvsim.accuracy.parallel.run_experiment", broken)
    path = write(tmp_path / "m.yaml", experiment(), experiment(id="second"))
    with pytest.raises(RuntimeError, match="a bug in the run"):
        accuracy(path, max_stage_s=5, workers=2)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_workers_is_a_whole_number_of_at_least_one(bad):
    with pytest.raises(InputError, match="workers must be an integer >= 1"):
        check_workers(bad)


def test_the_cli_takes_workers_and_refuses_zero(tmp_path, capsys):
    path = write(tmp_path / "m.yaml", experiment(), experiment(id="second"))
    code, _, err = run_main(["accuracy", path, "--workers", "0"], capsys)
    assert code == 2 and "--workers" in err and "Traceback" not in err
    runs = []
    for n in ("1", "2"):
        code, stdout, _ = run_main(
            ["accuracy", path, "--max-stage-s", "5", "--json", "--workers", n], capsys
        )
        assert code == 0
        runs.append(json.loads(stdout))
    assert runs[0] == runs[1]


def test_a_compute_profile_path_object_is_a_path(tmp_path):
    """``compute_profile=pathlib.Path(...)``: read as the path it names (the report names
    it), as the text path is; it ran every experiment and then failed on ``.gpu``."""
    import pathlib

    import kvsim

    shipped = pathlib.Path(kvsim.__file__).parent / "data" / "compute_phases_h100.json"
    path = write(tmp_path / "m.yaml", experiment())
    as_text = accuracy(path, compute_profile=str(shipped), max_stage_s=5, workers=1)
    as_path = accuracy(path, compute_profile=shipped, max_stage_s=5, workers=1)
    assert as_path.rows == as_text.rows and not as_path.failures
    assert as_path.config["compute_profile"] == str(shipped)
    with pytest.raises(InputError):
        accuracy(path, compute_profile=tmp_path / "none.json", workers=1)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_filter_naming_the_module_meets_a_workers_warnings(tmp_path, workers):
    """``-W ignore::Warning:kvsim.accuracy.run`` (a filter by module) silences the
    experiments' warnings with any number of workers: the driver raises a worker's warning
    again under its module's name, not under its file's path, which no such filter names."""
    path = _file(tmp_path)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=r"kvsim\.accuracy\.run")
        accuracy(path, max_stage_s=5, seed=3, workers=workers)
    assert not [w for w in said if w.category is OverloadWarning]
    _, unfiltered = _run(path, workers)
    assert any(c is OverloadWarning for c, _ in unfiltered)


def test_the_workers_parent_is_the_driver_only_where_it_starts_them():
    """Under forkserver (Python 3.14's default on Linux) a worker is the server's child:
    told the driver's pid, it saw another parent and exited at once, and the pool started
    it again forever (``accuracy(workers=2)`` never returned)."""
    import multiprocessing
    import os

    from kvsim.core.processes import driver_pid

    assert driver_pid(multiprocessing.get_context("spawn")) == os.getpid()
    if "forkserver" in multiprocessing.get_all_start_methods():
        assert driver_pid(multiprocessing.get_context("forkserver")) is None


def test_workers_run_under_forkserver(tmp_path):
    import multiprocessing
    import os
    import subprocess
    import sys

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver on this platform")
    path = write(tmp_path / "m.yaml", experiment(), experiment(id="second"))
    script = tmp_path / "run.py"
    script.write_text(
        "import multiprocessing, sys\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.set_start_method('forkserver')\n"
        "    from kvsim.accuracy import accuracy\n"
        "    report = accuracy(sys.argv[1], max_stage_s=5, workers=2)\n"
        "    print(len(report.results), len(report.failures))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script), path], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", "0"]


def test_a_worker_killed_fails_its_experiment_alone(tmp_path, monkeypatch):
    """A worker killed by a signal (the OOM killer) fails the experiment it ran, with how it
    died, and the others run: multiprocessing.Pool lost its task and waited for it forever
    (or wedged on the queue lock a killed idle worker held)."""
    import multiprocessing
    import os
    import signal

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("a patch reaches the workers only when they are forked")
    from kvsim.accuracy import parallel

    run = parallel.run_experiment

    def killed(exp, *args, **kwargs):
        if exp.id == "second":
            os.kill(os.getpid(), signal.SIGKILL)
        return run(exp, *args, **kwargs)

    monkeypatch.setattr(parallel, "run_experiment", killed)
    path = write(tmp_path / "m.yaml", experiment(), experiment(id="second"), experiment(id="x"))
    report = accuracy(path, max_stage_s=5, workers=2)
    assert [(r.experiment, r.error) for r in report.results] == [
        ("small-llama-2-7b", None),
        ("second", "the process running it died (killed by SIGKILL)"),
        ("x", None),
    ]
    assert (
        report.rows
        == accuracy(path, max_stage_s=5, workers=1, experiments=["small-llama-2-7b", "x"]).rows
    )


def test_the_bar_counts_an_experiment_named_twice_once(tmp_path, capsys):
    path = write(tmp_path / "m.yaml", experiment(), experiment(id="second"))
    args = ["accuracy", path, "--max-stage-s", "5", "--experiment", "second"]
    code, _, err = run_main([*args, "--experiment", "second", "--progress"], capsys)
    assert code == 0 and "1/1" in err and "/2" not in err, err
