"""Issue 28 item 10: vLLM's vocabulary: ``--request-rate`` as ``vllm bench serve`` names the
Poisson rate; ``kvsim policies`` says which policies run in vLLM unchanged and why not."""

from __future__ import annotations

import json

from support import SAMPLE, run_main

from kvsim.cli.cmd_policies import deployment
from kvsim.policies.registry import VLLM_EXPORTS, describe_policies


def test_request_rate_is_the_poisson_rate(capsys):
    args = ["simulate", SAMPLE, "--limit", "12", "--json", "--no-progress"]
    code, a, _ = run_main([*args, "--request-rate", "0.5"], capsys)
    code2, b, _ = run_main([*args, "--poisson-rate", "0.5"], capsys)
    code3, c, _ = run_main(args, capsys)
    assert code == code2 == code3 == 0
    assert json.loads(a)["duration"] == json.loads(b)["duration"] != json.loads(c)["duration"]


def test_policies_listing_marks_what_deploys_into_vllm(capsys):
    code, out, _ = run_main(["policies"], capsys)
    assert code == 0
    for kind, name, _ in describe_policies():
        assert deployment(kind, name) in out
    exported = set(VLLM_EXPORTS.values())
    evictions = [n for k, n, _ in describe_policies() if k == "eviction"]
    assert [n for n in evictions if n not in exported] == ["belady"]
    assert deployment("eviction", "arc") == "vLLM: eviction_policy=KvsimARC"
    assert deployment("admission", "threshold").startswith("vLLM: ")
    assert "no admission hook" in deployment("admission", "tinylfu")
