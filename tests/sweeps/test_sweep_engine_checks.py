"""A timed sweep's engines checked before any cell runs, as a run checks its own
(:func:`kvsim.specs.context.vllm_step_limits`, via ``engine.setup.compose``): a step budget
below a ``max_num_seqs``, or without chunked prefill below a given ``max_model_len``, is one
exit-2 line naming the spec file and its keys, where each such cell ran and failed alone
(exit 1, a results folder of failures); a spec whose every cell a run accepts still runs.
"""

from __future__ import annotations

import itertools
import json

import pandas as pd
import pytest
from support import SAMPLE, run_main

from kvsim.core.errors import InputError
from kvsim.engine.setup import compose
from kvsim.options.offload import OffloadOptions
from kvsim.options.runs import SimulateOptions
from kvsim.sweeps import SweepSpec

TIMED = {"traces": [SAMPLE], "mode": "timed", "limit": 5}


def _spec(tmp_path, options, grid):
    spec = tmp_path / "spec.json"
    data = {**TIMED, "options": {"cpu_chunks": 10, **options}, "grid": grid}
    spec.write_text(json.dumps(data))
    return spec


@pytest.mark.parametrize(
    ("options", "grid", "named"),
    [
        (
            {"max_num_batched_tokens": 512},
            {"max_num_seqs": [256, 600]},
            "options.max_num_batched_tokens 512 is below grid.max_num_seqs[1] 600",
        ),
        (  # vLLM's default budget on the GPU the cell names
            {},
            {"gpu": ["h200", "l40s"], "max_num_seqs": [4096]},
            "the default max_num_batched_tokens (grid.gpu[1] l40s) 2048 is below "
            "grid.max_num_seqs[0] 4096",
        ),
        (
            {"enable_chunked_prefill": False, "max_model_len": 4096},
            {"max_num_batched_tokens": [8192, 2048]},
            "options.enable_chunked_prefill false: grid.max_num_batched_tokens[1] 2048 is "
            "below options.max_model_len 4096 without chunked prefill",
        ),
        (
            {"max_model_len": 4096, "max_num_batched_tokens": 2048},
            {"enable_chunked_prefill": [True, False]},
            "grid.enable_chunked_prefill[1] false: options.max_num_batched_tokens 2048",
        ),
    ],
)
def test_an_engine_vllm_would_not_start_is_refused_up_front(tmp_path, capsys, options, grid, named):
    spec = _spec(tmp_path, options, grid)
    out = tmp_path / "o"
    code, _, err = run_main(["sweep", spec, "--executor", "serial", "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{spec}: " in err and named in err and "vLLM refuses to start" in err, err
    assert not out.exists()


def test_a_spec_whose_cells_a_run_accepts_still_runs(tmp_path, capsys):
    """The exceptions a run makes are the sweep's too: without chunked prefill, a budget
    given alone below the model's positions stands for both; a short ``max_model_len``
    caps vLLM's default budget at ``max_num_seqs x max_model_len`` (64 x 16 = 1,024),
    which still holds the 16."""
    grid = {"max_num_batched_tokens": [None, 2048], "max_model_len": [None, 64]}
    spec = _spec(tmp_path, {"enable_chunked_prefill": False, "max_num_seqs": 16}, grid)
    out = tmp_path / "o"
    code, _, err = run_main(["sweep", spec, "--executor", "serial", "--out", out], capsys)
    # the cell of 2048 and 64 is fine too: a budget above the length
    assert code == 0, err
    results = pd.read_parquet(out / "results.parquet")
    assert len(results) == 4 and (results["status"] == "ok").all(), results["error"]


GPUS = ["h200", "l40s"]
LENGTHS = [None, 64, 4096, 8192]
BUDGETS = [None, 512, 2048, 8192]
COUNTS = [None, 16, 600, 4096, 8193]


def _run_accepts(gpu, length, chunked, budget, count) -> bool:
    timed = SimulateOptions(
        gpu=gpu,
        max_model_len=length,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=budget,
        max_num_seqs=count,
    )
    try:
        compose(OffloadOptions(cpu_chunks=10), timed, None, 16, True)
    except InputError:
        return False
    return True


def _sweep_accepts(options) -> bool:
    try:
        SweepSpec.load({**TIMED, "options": {"cpu_chunks": 10, **options}})
    except InputError:
        return False
    return True


@pytest.mark.parametrize("chunked", [True, False])
def test_the_sweep_refuses_exactly_the_engines_a_run_refuses(chunked):
    """No more (a cell a run would start still passes), no less."""
    differ = []
    for gpu, length, budget, count in itertools.product(GPUS, LENGTHS, BUDGETS, COUNTS):
        given = {"max_model_len": length, "max_num_batched_tokens": budget, "max_num_seqs": count}
        options = {"gpu": gpu, "enable_chunked_prefill": chunked, **given}
        options = {k: v for k, v in options.items() if v is not None}
        if _run_accepts(gpu, length, chunked, budget, count) != _sweep_accepts(options):
            differ.append(options)
    assert not differ


def test_the_check_takes_the_grid_by_distinct_values_not_by_cells():
    """Five axes of 40 values are 1e8 cells; the check never builds them, and reads each
    engine axis by its values."""
    grid = {
        "max_num_seqs": list(range(1, 41)),
        "max_num_batched_tokens": list(range(1000, 1040)),
        "tp": [1],
        "seed": list(range(40)),
        "store_threshold": list(range(40)),
        "gpu_memory_utilization": [0.5 + i / 100 for i in range(40)],
    }
    SweepSpec.load({**TIMED, "options": {"cpu_chunks": 10}, "grid": grid})
    grid["max_num_seqs"][-1] = 1040
    with pytest.raises(InputError, match=r"grid.max_num_batched_tokens\[0\] 1000 is below"):
        SweepSpec.load({**TIMED, "options": {"cpu_chunks": 10}, "grid": grid})
