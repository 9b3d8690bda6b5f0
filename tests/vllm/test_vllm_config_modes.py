"""No input silently ignored: the connector knobs of ``--vllm-config`` act in the timed
engine, are refused in cache mode when they would change anything, and unknown keywords or
the CLI's name for the GPU capacity are not dropped by the API."""

from __future__ import annotations

import pytest
from support import SAMPLE, expect_overload

import kvsim
from kvsim.core.errors import InputError


@pytest.mark.parametrize(
    ("extra", "phrase"),
    [
        ({"sync_load_budget_bytes": 1000}, "about timing"),
        ({"offload_prompt_only": False}, "decode"),
    ],
)
def test_cache_mode_refuses_what_it_cannot_model(extra, phrase):
    with pytest.raises(InputError, match=phrase):
        kvsim.replay(SAMPLE, cpu_chunks=20, vllm_config=extra)


def test_cache_mode_accepts_the_defaults_of_those_knobs():
    extra = {"offload_prompt_only": True, "sync_load_budget_bytes": 0, "block_size": 512}
    assert kvsim.replay(SAMPLE, cpu_chunks=20, vllm_config=extra).summary["requests"] == 200


@pytest.mark.parametrize(
    ("extra", "explicit"),
    [
        ({"offload_prompt_only": False}, {"offload_prompt_only": False}),
        ({"sync_load_budget_bytes": 64 * 2**20}, {"sync_load_budget_bytes": 64 * 2**20}),
    ],
)
@expect_overload
def test_simulate_acts_on_the_vllm_config_knobs(extra, explicit):
    kw = {"limit": 20, "cpu_chunks": 50, "record_steps": False}
    from_config = kvsim.simulate(SAMPLE, vllm_config={**extra, "block_size": 512}, **kw)
    from_args = kvsim.simulate(SAMPLE, chunk_tokens=512, **explicit, **kw)
    default = kvsim.simulate(SAMPLE, chunk_tokens=512, **kw)
    assert from_config.summary == from_args.summary
    ((knob, value),) = extra.items()
    assert from_config.config[knob] == value != default.config[knob]


@expect_overload
def test_an_explicit_argument_wins_over_the_vllm_config():
    kw = {"limit": 20, "cpu_chunks": 50, "record_steps": False, "chunk_tokens": None}
    both = kvsim.simulate(
        SAMPLE,
        vllm_config={"offload_prompt_only": False, "block_size": 512},
        offload_prompt_only=True,
        **kw,
    )
    plain = kvsim.simulate(SAMPLE, vllm_config={"block_size": 512}, **kw)
    assert both.summary == plain.summary


@pytest.mark.parametrize("api", [kvsim.replay, kvsim.simulate])
def test_unknown_keywords_are_errors(api):
    with pytest.raises(InputError, match="unknown option"):
        api(SAMPLE, limit=3, cpu_chunks=5, polcy="arc")


@expect_overload
def test_simulate_takes_the_clis_name_for_the_gpu_capacity():
    kw = {"limit": 20, "cpu_chunks": 50, "record_steps": False}
    a = kvsim.simulate(SAMPLE, gpu_blocks=3000, **kw)
    b = kvsim.simulate(SAMPLE, gpu_kv_blocks=3000, **kw)
    assert a.summary == b.summary
    assert a.config["gpu_blocks"] == 3000 != kvsim.simulate(SAMPLE, **kw).config["gpu_blocks"]
    with pytest.raises(InputError, match="not both"):
        kvsim.simulate(SAMPLE, gpu_blocks=3000, gpu_kv_blocks=3000, **kw)
