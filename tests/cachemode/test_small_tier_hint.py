"""Issue 28 items 7 and 8: a tier smaller than one prompt says so and names vLLM's chunked
prefill; ``--baseline`` without a CPU size is refused instead of comparing two equal runs."""

from __future__ import annotations

import warnings

import pytest
from support import SAMPLE, run_main

import kvsim
from kvsim.core.errors import InputWarning


def test_a_tier_smaller_than_a_prompt_names_chunked_prefill():
    with pytest.warns(InputWarning, match=r"could not store.*--prefill-chunk-tokens 8192") as w:
        r = kvsim.replay(SAMPLE, cpu_chunks=2)
    assert r.summary["allocation_failures"] > 0
    assert f"{r.summary['allocation_failures']:,} of {r.summary['requests']:,}" in str(w[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)  # chunked prefill on: nothing to say
        kvsim.replay(SAMPLE, cpu_chunks=2, prefill_chunk_tokens=512)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)  # a big enough tier: nothing to say
        assert kvsim.replay(SAMPLE, cpu_chunks=4096).summary["allocation_failures"] == 0


def test_baseline_without_a_cpu_size_is_refused(capsys):
    code, out, err = run_main(["simulate", SAMPLE, "--baseline", "--limit", "5"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--cpu-gib" in err and "baseline" in err
    with pytest.raises(kvsim.InputError, match="no CPU tier is sized"):
        kvsim.simulate(SAMPLE, limit=5, baseline=True)


def test_cpu_tier_options_without_a_tier_are_named_as_changing_nothing():
    """A run without a CPU tier reads none of its options: a warning names those given
    (not an error: a sweep's no-offload cell keeps the grid's fixed policy)."""
    with pytest.warns(InputWarning, match=r"--policy, --offload-all-tokens: the CPU tier's"):
        a = kvsim.simulate(SAMPLE, limit=5, policy="arc", offload_prompt_only=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)  # sized: the options are read
        kvsim.simulate(SAMPLE, limit=5, cpu_chunks=1000, policy="arc", time_scale=20)
    b = kvsim.simulate(SAMPLE, limit=5)
    assert a.requests.equals(b.requests)  # and indeed they changed nothing


def test_time_scale_with_a_poisson_re_timing_is_refused(capsys):
    args = ["simulate", SAMPLE, "--limit", "5", "--poisson-rate", "3", "--time-scale", "2"]
    code, out, err = run_main(args, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--time-scale" in err and "--poisson-rate" in err
