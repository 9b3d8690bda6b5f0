"""``max_model_len`` as vLLM's server applies it: ``kvsim simulate --max-model-len N`` /
``simulate(max_model_len=N)`` refuses a prompt of N tokens or more and cuts a longer
request's output to what is left (0.33); ``refuse_past_max_model_len`` refuses it instead
(v0.15.1's server, which ``kvsim accuracy`` re-creates)."""

from __future__ import annotations

import pandas as pd
import pytest
from support import run_main

from kvsim.api import simulate
from kvsim.core.errors import InputError
from kvsim.specs.context import served_output

#: prompts of 50 to 150 tokens, outputs of 25 to 75: with max_model_len 140 some prompts
#: are past it, some requests cut, the rest whole
WORKLOAD = {"type": "random", "input_len": 100, "output_len": 50, "range_ratio": 0.5}
LOAD = {"type": "concurrency", "stages": [{"concurrency": 2, "num_requests": 40}]}
MML = 140


def _requests(**kwargs: object) -> pd.DataFrame:
    res = simulate(workload=WORKLOAD, load=LOAD, gpu="h100", seed=3, **kwargs)
    return res.requests.sort_values("request").reset_index(drop=True)


def test_a_small_max_model_len_refuses_long_prompts_and_cuts_long_outputs():
    whole = _requests()
    cut = _requests(max_model_len=MML)
    prompt, asked = whole.prompt_tokens, whole.output_tokens
    assert not whole.rejected.any()  # the model's 131,072 positions hold every request
    assert (cut.prompt_tokens == prompt).all()  # the same requests, drawn by the seed
    past = prompt >= MML
    cut_short = ~past & (prompt + asked > MML)
    assert past.any() and cut_short.any() and (~past & ~cut_short).any()
    assert list(cut.rejected) == list(past)
    assert (cut.output_tokens[cut_short] == MML - prompt[cut_short]).all()
    kept = ~past & ~cut_short
    assert (cut.output_tokens[kept] == asked[kept]).all()
    # the server before 0.33: every request past max_model_len refused, none cut
    old = _requests(max_model_len=MML, refuse_past_max_model_len=True)
    assert list(old.rejected) == list(prompt + asked > MML)
    assert (old.output_tokens[kept] == asked[kept]).all()


def test_max_model_len_at_the_models_positions_is_the_run_without_it():
    without = _requests()
    given = _requests(max_model_len=131072)  # Llama-3.1-8B's positions: vLLM's default
    pd.testing.assert_frame_equal(without, given)


@pytest.mark.parametrize(
    ("prompt", "output", "refuse_past", "expected"),
    [
        (0, 10, False, None),  # an empty prompt: refused
        (100, 100, False, None),  # fills max_model_len: max_tokens 0, below vLLM's least 1
        (99, 100, False, 1),
        (101, 5, False, None),
        (10, 101, False, None),  # max_tokens alone past max_model_len: refused
        (10, 100, False, 90),
        (60, 100, False, 40),  # cut to what is left
        (60, 100, True, None),  # v0.15.1: refused
        (60, 40, True, 40),  # exactly max_model_len: served whole by both
        (60, 40, False, 40),
    ],
)
def test_what_the_server_serves_at_the_boundaries(prompt, output, refuse_past, expected):
    assert served_output(prompt, output, 100, refuse_past) == expected


def test_a_max_model_len_past_the_positions_or_a_budget_below_it_is_refused():
    with pytest.raises(InputError, match=r"--max-model-len 131073 exceeds llama-3.1-8b's"):
        simulate(workload=WORKLOAD, load=LOAD, gpu="h100", max_model_len=131073)
    with pytest.raises(InputError, match=r"--max-num-batched-tokens 100 is below --max-model"):
        simulate(
            workload=WORKLOAD,
            load=LOAD,
            gpu="h100",
            max_model_len=MML,
            max_num_batched_tokens=100,
            enable_chunked_prefill=False,
        )


def test_the_cli_takes_max_model_len_and_names_a_bad_one(tmp_path, capsys):
    base = ["simulate", "--gpu", "h100", "--workload", str(WORKLOAD), "--load", str(LOAD)]
    out = tmp_path / "run"
    code, _, err = run_main(
        [*base, "--seed", "3", "--max-model-len", str(MML), "--out", out], capsys
    )
    assert code == 0, err
    table = pd.read_csv(out / "requests.csv")
    served = table[~table.rejected]
    assert table.rejected.any() and (table.prompt_tokens[table.rejected] >= MML).all()
    assert (served.prompt_tokens + served.output_tokens <= MML).all()
    for bad in ("0", "-1", "x", "131073"):
        code, _, err = run_main([*base, "--max-model-len", bad], capsys)
        assert code == 2 and "--max-model-len" in err and err.count("\n") == 1, (bad, err)
