"""Bad input to the real backend's commands (``kvsim validate``, ``kvsim calibrate-compute``,
``python -m real.gpu_check``): one line naming the option and the value, exit 2, before any
run, allocation or output file."""

from __future__ import annotations

import math

import pytest

from kvsim.cli import main
from kvsim.core.errors import InputError
from real import calibrate_compute as cc
from real import gpu_check, machine
from real import validate as validate_mod
from real.validate import ValidationSpec, default_trace

GIB = 1 << 30


def _refused(capsys, argv: list[str]) -> str:
    """Run ``kvsim ARGV``; it must exit 2 with one ``kvsim: error:`` line and no output."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert exc.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("kvsim: error: "), err
    assert "Traceback" not in err and captured.out == ""
    return err


def _fail_if_started(monkeypatch, what: str, targets: list[tuple[object, str]]) -> None:
    """Each of ``targets`` (module, function name), once called, fails the test: the
    refusal must come before ``what`` starts."""

    def started(*_a, **_k):
        raise AssertionError(f"{what} started before its arguments were checked")

    for module, name in targets:
        monkeypatch.setattr(module, name, started)


@pytest.fixture
def no_run(monkeypatch):
    """A validation or a calibration that starts fails the test: the refusal comes first."""
    _fail_if_started(monkeypatch, "the run", [(validate_mod, "run_validation"), (cc, "measure")])


VALIDATE = ["validate", default_trace(), "--model", "llama-3.2-1b", "--cpu-chunks", "50"]
VALIDATE += ["--gpu-kv-blocks", "40", "--limit", "5", "--noise-jobs", "0", "--device", "cpu"]


@pytest.mark.parametrize("value", ["inf", "1e12", "1001", "nan", "0", "-1"])
def test_validate_compute_scale_is_finite_and_bounded(capsys, no_run, tmp_path, value):
    """``inf`` and ``1e12`` aborted the process (an OverflowError in a copy thread's sleep,
    exit 134); ``nan`` ran, with null TTFTs."""
    out = tmp_path / "report.json"
    err = _refused(capsys, [*VALIDATE, "--compute-scale", value, "--out", str(out)])
    assert "--compute-scale" in err and "at most 1000" in err and not out.exists()
    shown = f"{float(value):g}"
    assert f"got {shown}" in err


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "0", "-1", "2000"])
def test_validate_max_gpu_kv_gib_is_finite_positive_and_0_is_not_the_default(capsys, no_run, value):
    """``nan`` / ``inf`` / ``1e308`` were a traceback (``int(nan)``); ``0`` silently ran
    with the default cap (``0 or default``)."""
    args = [a for a in VALIDATE if a not in ("--gpu-kv-blocks", "40")]
    err = _refused(capsys, [*args, "--max-gpu-kv-gib", value])
    assert "--max-gpu-kv-gib" in err and f"got {float(value):g}" in err


@pytest.mark.parametrize(
    "field,value",
    [("compute_scale", math.nan), ("compute_scale", math.inf), ("max_gpu_kv_gib", math.nan)],
)
def test_the_spec_refuses_what_the_cli_refuses(field, value):
    """One home for the rule: the API (and gpu_check's plans) get the same check."""
    with pytest.raises(InputError, match=field.replace("_", "-")):
        ValidationSpec(**{field: value})


@pytest.mark.parametrize(
    "argv",
    [
        VALIDATE,
        ["calibrate-compute", "--out", "OUT", "--tokens", "1", "--trials", "1"],
    ],
    ids=["validate", "calibrate-compute"],
)
@pytest.mark.parametrize(
    "option,value,said",
    [
        ("--model", "nosuch", "--model: unknown model 'nosuch'; known: "),
        ("--model", "lama-3.2-1b", "--model: unknown model 'lama-3.2-1b' (did you mean "),
        ("--gpu", "h2000", "--gpu: unknown GPU 'h2000' (did you mean 'h200'?)"),
    ],
)
def test_unknown_model_and_gpu_name_the_option(capsys, no_run, tmp_path, argv, option, value, said):
    argv = [str(tmp_path / "c.json") if a == "OUT" else a for a in argv]
    err = _refused(capsys, [*argv, option, value])
    assert said in err
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize(
    "extra,option",
    [
        (["--contexts", "100000000"], "--contexts"),
        (["--tokens", "1,100000000"], "--tokens"),
        (["--decode-batch", "100000000"], "--decode-batch"),
        (["--tokens", "1," + "9" * 400], "--tokens"),  # too large for a float: no OverflowError
    ],
)
def test_calibrate_compute_refuses_shapes_bigger_than_memory(
    capsys, no_run, tmp_path, extra, option
):
    """``--contexts 100000000`` was a torch out-of-memory traceback, mid-run."""
    out = tmp_path / "c.json"
    argv = ["calibrate-compute", "--out", str(out), "--model", "llama-3.2-1b", "--device", "cpu"]
    err = _refused(capsys, [*argv, "--tokens", "1,16", "--trials", "1", *extra])
    assert "needs" in err and "GiB of host memory" in err and f"use a smaller {option}" in err
    assert not out.exists()


def test_calibrate_compute_memory_check_counts_the_largest_point(monkeypatch):
    """The default CPU plan fits a small machine; a decode batch over long contexts does
    not, and is named by both its options."""
    from kvsim.specs.models import get_model

    model = get_model("llama-3.1-8b")
    cpu = cc.torch.device("cpu")
    plan = cc.ComputeCalibration.for_device(cpu)
    monkeypatch.setattr(machine, "available_memory", lambda: 4 * GIB)
    cc.check_plan_fits(model, cpu, plan)
    big = cc.ComputeCalibration(plan.tokens, (1 << 16,), 64, 1, plan.max_weight_bytes)
    with pytest.raises(InputError, match="--contexts / --decode-batch"):
        cc.check_plan_fits(model, cpu, big)


# --------------------------------------------------------------------------- gpu_check


@pytest.fixture
def no_check(monkeypatch):
    sections = [(gpu_check, "run_check"), (gpu_check, "cpu_stand_in")]
    _fail_if_started(monkeypatch, "a section", sections)


def _gpu_check_refuses(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert exc.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("gpu_check: error: "), err
    return err


def test_gpu_check_refuses_an_out_that_is_a_file(capsys, no_check, tmp_path):
    """Was an InputError traceback after the first section ('cannot write (File exists)')."""
    existing = tmp_path / "results"
    existing.write_text("keep me\n")
    err = _gpu_check_refuses(capsys, ["--small", "--out", str(existing)])
    assert "--out" in err and str(existing) in err and "not a directory" in err
    assert existing.read_text() == "keep me\n"
    err = _gpu_check_refuses(capsys, ["--small", "--out", str(existing / "below")])
    assert "--out" in err


@pytest.mark.parametrize(
    "argv,said",
    [
        (["--trace", "nonexist.jsonl"], "--trace: nonexist.jsonl does not exist"),
        (["--budget-s", "-5"], "--budget-s"),
        (["--budget-s", "nan"], "--budget-s"),
        (["--budget-s", "inf"], "--budget-s"),
        (["--budget-s", "0"], "--budget-s"),
        (["--budget-s", "abc"], "--budget-s"),
    ],
)
def test_gpu_check_checks_every_argument_before_any_section(capsys, no_check, tmp_path, argv, said):
    """A missing trace was reported after every other section had run; a negative or NaN
    budget was accepted. Nothing is made under --out either."""
    out = tmp_path / "out"
    err = _gpu_check_refuses(capsys, ["--small", "--out", str(out), *argv])
    assert said in err and not out.exists()


@pytest.mark.parametrize(
    "text,said",
    [
        ("not json\n", "cannot determine trace format"),
        ("", "no requests in trace file"),
    ],
    ids=["not-json", "empty"],
)
def test_gpu_check_reads_the_trace_before_any_section(capsys, no_check, tmp_path, text, said):
    """A trace the validation section could not read was reported by that section, the
    last but one, minutes into a GPU run; now it is refused before the first."""
    trace, out = tmp_path / "t.jsonl", tmp_path / "out"
    trace.write_text(text)
    err = _gpu_check_refuses(capsys, ["--small", "--out", str(out), "--trace", str(trace)])
    assert "--trace: " in err and said in err and not out.exists()


def test_a_trace_without_conversation_turns_is_refused_for_the_conversation_plans(tmp_path):
    """The cpu and gpu plans validate on conversation turns: a trace with none would have
    failed their validation section; the tiny plan runs any request."""
    trace = tmp_path / "t.jsonl"
    line = '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}\n'
    trace.write_text(line)
    gpu_check.check_trace(str(trace), gpu_check.PLANS["tiny"])
    for plan in ("cpu", "gpu"):
        with pytest.raises(InputError, match="conversations selection kept none"):
            gpu_check.check_trace(str(trace), gpu_check.PLANS[plan])
