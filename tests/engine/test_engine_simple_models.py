"""The trivial time models runs are compared under, and vLLM's per-GPU batch defaults."""

from __future__ import annotations

import json

import pytest
from support import SAMPLE, expect_overload

import kvsim
from kvsim.core.errors import InputError
from kvsim.engine.compute_model import LinearCompute, StepBatch, load_compute_profile
from kvsim.engine.transfer_model import get_link
from kvsim.specs.hardware import GPUS, vllm_batch_defaults, vllm_default_batched_tokens


def write(tmp_path, name: str, data: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_linear_profile_is_step_plus_per_token(tmp_path) -> None:
    path = write(tmp_path, "c.json", {"kind": "linear", "step_s": 0.01, "per_token_s": 1e-4})
    model = load_compute_profile(path, base=None)  # type: ignore[arg-type]
    assert model == LinearCompute(0.01, 1e-4)
    assert model(StepBatch(3, 1, 100, 2, 0, 0.0)) == pytest.approx(0.01 + 102e-4)
    assert model(StepBatch(0, 0, 0, 0, 0, 0.0)) == 0.0  # an empty step takes no time


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        ({"kind": "linear", "step_s": -1, "per_token_s": 0}, "step_s: .*>= 0.*got -1"),
        ({"kind": "linear", "step_s": 0.1}, r"per_token_s: missing \(a required key\)"),
        ({"kind": "linear", "step_s": 0.1, "per_token_s": 0, "x": 1}, "x: unknown key"),
        ({"kind": "cubic"}, "kind: must be one of linear, phases, roofline, got 'cubic'"),
    ],
)
def test_bad_linear_profiles_name_the_problem(tmp_path, data, phrase) -> None:
    with pytest.raises(InputError, match=phrase):
        load_compute_profile(write(tmp_path, "c.json", data), base=None)  # type: ignore[arg-type]


def test_constant_link_is_bytes_over_rate_both_ways_independent(tmp_path) -> None:
    link = get_link(
        write(
            tmp_path, "l.json", {"kind": "constant", "h2d_bytes_per_s": 1e9, "d2h_bytes_per_s": 5e8}
        )
    )
    assert link.h2d.job_time(2_000_000, 64) == pytest.approx(2e-3)
    assert link.d2h.job_time(2_000_000, 1) == pytest.approx(4e-3)
    assert link.duplex_factor == 1.0
    with pytest.raises(InputError, match="d2h_bytes_per_s"):
        get_link(write(tmp_path, "m.json", {"kind": "constant", "h2d_bytes_per_s": 1e9}))


@expect_overload
def test_simulate_runs_under_the_trivial_models(tmp_path) -> None:
    compute = write(tmp_path, "c.json", {"kind": "linear", "step_s": 0.02, "per_token_s": 0.0})
    link = write(
        tmp_path, "l.json", {"kind": "constant", "h2d_bytes_per_s": 1e10, "d2h_bytes_per_s": 1e10}
    )
    res = kvsim.simulate(SAMPLE, cpu_chunks=200, limit=30, compute_profile=compute, link=link)
    steps = res.tables["steps"]
    busy = steps[steps.prefill_tokens + steps.decode_tokens > 0]
    assert len(busy) > 0 and list(busy.forward_s) == pytest.approx([0.02] * len(busy))
    assert res.config["compute"] == {"step_s": 0.02, "per_token_s": 0.0}
    assert res.summary["link"] == "constant"


@expect_overload
def test_batch_defaults_follow_vllm_serve_per_gpu() -> None:
    got = {name: vllm_batch_defaults(gpu) for name, gpu in GPUS.items()}
    assert got["h100"] == got["h200"] == got["gh200"] == (8192, 1024)
    assert got["a100"] == got["l40s"] == (2048, 256)  # A100 80 GB is held back by name
    res = kvsim.simulate(SAMPLE, limit=5, gpu="a100")
    assert (res.config["max_num_batched_tokens"], res.config["max_num_seqs"]) == (2048, 256)


@expect_overload
def test_max_num_seqs_is_cut_to_the_budget_or_refused_above_it(capsys) -> None:
    """With no ``--max-num-seqs``, a budget below the GPU's default count cuts it, as vLLM's
    ``EngineArgs`` does; a count given above the budget is refused before the run, as vLLM
    refuses to start (tests/vllm/test_vllm_batch_limits.py drives both)."""
    from support import run_main

    res = kvsim.simulate(SAMPLE, limit=5, gpu="h100", max_num_batched_tokens=512)
    assert res.config["max_num_seqs"] == 512
    res = kvsim.simulate(SAMPLE, limit=5, gpu="h100", max_num_batched_tokens=512, max_num_seqs=64)
    assert res.config["max_num_seqs"] == 64
    argv = ["simulate", SAMPLE, "--limit", "5", "--gpu", "h100", "--max-num-seqs", "600"]
    code, stdout, err = run_main([*argv, "--max-num-batched-tokens", "512"], capsys)
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1
    assert "--max-num-batched-tokens 512 is below --max-num-seqs 600: vLLM refuses" in err
    code, _, err = run_main([*argv[:-1], "9000"], capsys)
    assert code == 2 and "the default --max-num-batched-tokens 8192 is below" in err


@pytest.mark.parametrize(
    ("gpu", "max_model_len", "chunked", "max_num_seqs", "expected"),
    [
        ("h100", 131072, True, None, 8192),  # chunked: the GPU's default, whatever the length
        ("h100", 131072, False, None, 131072),  # raised: a whole prompt fits one step
        ("h100", 4096, False, None, 8192),  # already above max_model_len
        ("h100", None, False, None, 8192),  # length unknown: the GPU's default
        ("a100", 4096, False, 1, 4096),  # capped at max_num_seqs x max_model_len
        ("a100", 4096, False, None, 4096),
        ("h100", 64, True, 16, 1024),  # chunked too: capped at max_num_seqs x max_model_len
        ("h100", 4, True, None, 4096),
    ],
)
def test_the_default_budget_without_chunked_prefill_holds_a_whole_prompt(
    gpu, max_model_len, chunked, max_num_seqs, expected
) -> None:
    """vLLM's ``EngineArgs`` default for ``max_num_batched_tokens``."""
    got = vllm_default_batched_tokens(GPUS[gpu], max_model_len, chunked, max_num_seqs)
    assert got == expected


@expect_overload
def test_simulate_without_chunked_prefill_takes_vllms_budget_and_refuses_longer_requests():
    """``simulate(enable_chunked_prefill=False)``: with no budget given, vLLM's (the model's
    131,072 positions for Llama-3.1-8B), so every sample request runs; with a budget given,
    requests longer than it are refused, as vLLM (whose max_model_len must then fit the
    budget) refuses them."""
    res = kvsim.simulate(SAMPLE, limit=20, gpu="h100", enable_chunked_prefill=False)
    assert res.config["max_num_batched_tokens"] == 131072
    assert res.summary["failed"] == 0
    lengths = res.requests.prompt_tokens + res.requests.output_tokens
    budget = int(lengths.median())
    res = kvsim.simulate(
        SAMPLE, limit=20, gpu="h100", enable_chunked_prefill=False, max_num_batched_tokens=budget
    )
    assert res.summary["failed"] == int((lengths > budget).sum()) > 0
    chunked = kvsim.simulate(SAMPLE, limit=20, gpu="h100", max_num_batched_tokens=budget)
    assert chunked.summary["failed"] == 0
