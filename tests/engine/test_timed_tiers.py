"""Secondary tiers in timed mode: promotions cost device time, which reaches the TTFT."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner
from support import ROOT, expect_overload

import kvsim
from kvsim import Request, Trace
from kvsim.cli import cli
from kvsim.core.errors import InputError
from kvsim.engine.compute_model import LinearCompute
from kvsim.engine.load_rule import prefill_seconds

TRACE = os.path.join(ROOT, "traces", "samples", "mooncake_small.jsonl")


def device(tmp_path, name, read_latency_s, lookup_latency_s=0.0, threads=4, write_latency_s=0.0):
    """A device whose reads cost ``read_latency_s`` an operation (and writes
    ``write_latency_s``) and nothing else."""
    path = tmp_path / f"{name}.json"
    path.write_text(
        json.dumps(
            {
                "name": name,
                "read_bytes_per_s": None,
                "write_bytes_per_s": None,
                "stream_read_bytes_per_s": None,
                "stream_write_bytes_per_s": None,
                "read_latency_s": read_latency_s,
                "write_latency_s": write_latency_s,
                "lookup_latency_s": lookup_latency_s,
                "n_read_threads": threads,
                "n_write_threads": threads,
            }
        )
    )
    return str(path)


def linear_profile(tmp_path):
    path = tmp_path / "linear.json"
    path.write_text(json.dumps({"kind": "linear", "step_s": 0.01, "per_token_s": 1e-4}))
    return str(path)


def shared_prefix_trace():
    """Request 0 stores chunks 1, 2, 3; request 1 stores 7, 8, 9 and evicts them from the
    3-chunk CPU tier; request 2 shares chunks 1, 2 with request 0: only the fs tier has
    them. Arrivals 10 s apart: nothing overlaps."""
    reqs = [
        Request(0, 0.0, 50, 2, (1, 2, 3)),
        Request(1, 10.0, 50, 2, (7, 8, 9)),
        Request(2, 20.0, 50, 2, (1, 2, 4)),
    ]
    return Trace.from_requests(reqs, 16)


def run(tmp_path, dev, requests=None, cpu_chunks=3, **kw):
    """A timed LRU run of ``requests`` (default :func:`shared_prefix_trace`'s, 16-token
    blocks) with one fs tier on device ``dev`` and the linear compute profile."""
    trace = shared_prefix_trace() if requests is None else Trace.from_requests(requests, 16)
    return kvsim.simulate(
        trace,
        model="llama-3.1-8b",
        gpu="h200",
        cpu_chunks=cpu_chunks,
        policy="lru",
        enable_prefix_caching=False,
        compute_profile=linear_profile(tmp_path),
        secondary_tiers=[{"type": "fs", "kvsim_device": dev}],
        **kw,
    )


def ttft(result, request):
    df = result.tables["requests"]
    return float(df.loc[df["request"] == request, "ttft_s"].iloc[0])


@expect_overload
def test_promotion_time_adds_to_ttft(tmp_path):
    fast = run(tmp_path, device(tmp_path, "fast", 0.0))
    slow = run(tmp_path, device(tmp_path, "slow", 0.5))
    for r in (fast, slow):
        req = r.tables["requests"].set_index("request")
        assert req.loc[2, "tier_hit_tokens"] == 32  # chunks 1 and 2 came from the fs tier
        assert req.loc[2, "hit_tier"] == "1:fs"
        assert r.summary["tier1_fs_promoted_chunks"] == 2
    # one promotion job of 2 chunks on 4 threads: one operation's time, 0.5 s
    assert slow.summary["tier1_fs_promotion_p50_ms"] == pytest.approx(500.0)
    assert ttft(slow, 2) - ttft(fast, 2) == pytest.approx(0.5, abs=1e-9)
    assert ttft(slow, 0) == ttft(fast, 0) and ttft(slow, 1) == ttft(fast, 1)
    assert slow.tables["requests"].set_index("request").loc[2, "promotion_wait_s"] == (
        pytest.approx(0.5)
    )
    jobs = slow.tables["tier_jobs"]
    assert set(jobs["kind"]) == {"promotion", "cascade"}


@expect_overload
def test_lookup_latency_adds_to_ttft(tmp_path):
    base = run(tmp_path, device(tmp_path, "a", 0.0, lookup_latency_s=0.0))
    late = run(tmp_path, device(tmp_path, "b", 0.0, lookup_latency_s=0.25))
    # request 2 waits for one existence check before it can promote
    assert ttft(late, 2) - ttft(base, 2) == pytest.approx(0.25, abs=1e-9)


def test_deterministic(tmp_path):
    dev = device(tmp_path, "slow", 0.3)
    a, b = run(tmp_path, dev), run(tmp_path, dev)
    assert a.summary == b.summary
    for name in ("requests", "tier_jobs", "transfers", "steps"):
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name])


@expect_overload
def test_load_rule_turns_a_slow_promotion_into_a_miss(tmp_path):
    dev = device(tmp_path, "glacial", 30.0)  # far slower than computing 32 tokens
    plain = run(tmp_path, dev)
    ruled = run(tmp_path, dev, tier_load_rule="pays-off")
    assert plain.tables["requests"].set_index("request").loc[2, "tier_hit_tokens"] == 32
    assert plain.summary["tier_loads_lost"] == 1
    assert plain.summary["tier_load_rule"] == "off (vLLM)"
    req = ruled.tables["requests"].set_index("request")
    assert req.loc[2, "tier_hit_tokens"] == 0 and req.loc[2, "cpu_hit_tokens"] == 0
    assert ruled.summary["tier1_fs_promoted_chunks"] == 0
    assert ruled.summary["tier1_fs_load_rule_skipped_chunks"] >= 1
    assert ruled.summary["tier_load_rule"] == "pays-off (beyond vLLM)"
    assert ttft(ruled, 2) < ttft(plain, 2) - 29


def test_load_rule_keeps_a_fast_promotion(tmp_path):
    dev = device(tmp_path, "quick", 0.0)
    ruled = run(tmp_path, dev, tier_load_rule="pays-off")
    assert ruled.tables["requests"].set_index("request").loc[2, "tier_hit_tokens"] == 32
    assert ruled.summary["tier1_fs_load_rule_skipped_chunks"] == 0


def test_prefill_seconds_by_hand():
    compute = LinearCompute(0.01, 1e-4)
    # 20,000 tokens in steps of 8,192: 3 steps, 0.03 s + 2 s
    assert prefill_seconds(compute, 20_000, 0, 8192) == pytest.approx(2.03)
    assert prefill_seconds(compute, 0, 100, 8192) == 0.0


def test_load_rule_without_tiers_or_unknown_is_an_error():
    with pytest.raises(InputError, match="needs secondary tiers"):
        kvsim.simulate(TRACE, cpu_chunks=50, limit=2, tier_load_rule="pays-off")
    with pytest.raises(InputError, match="--tier-load-rule: must be one of off, pays-off"):
        kvsim.simulate(
            TRACE, cpu_chunks=50, limit=2, secondary_tiers=[{"type": "fs"}], tier_load_rule="x"
        )


def test_cache_mode_refuses_the_load_rule():
    with pytest.raises(InputError, match="cache mode does not model"):
        kvsim.replay(
            TRACE,
            cpu_chunks=50,
            limit=2,
            secondary_tiers=[{"type": "fs", "kvsim_load_rule": "pays-off"}],
        )


@expect_overload
def test_vllm_config_secondary_tiers_run_timed():
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "num_cpu_blocks": 20,
        "block_size": 512,
        "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv", "kvsim_device": "nvme-gen5"}],
    }
    r = kvsim.simulate(TRACE, vllm_config=extra, limit=20)
    assert r.summary["tier1_fs_device"] == "nvme-gen5"
    assert r.summary["tier1_fs_cascaded_chunks"] > 0


@expect_overload
def test_cli_simulate_with_a_tier(tmp_path):
    trace_out = tmp_path / "trace.json"
    res = CliRunner().invoke(
        cli,
        [
            "simulate",
            TRACE,
            "--cpu-chunks",
            "20",
            "--limit",
            "20",
            "--tier",
            "fs:device=nvme-gen4,capacity=1TiB",
            "--chrome-trace",
            str(trace_out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "tier 1:fs device" in res.output and "nvme-gen4" in res.output
    events = json.loads(trace_out.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e.get("pid", 0) >= 3}
    assert {"tier 1:fs", "promotions", "cascades"} <= names
    assert any(e["ph"] == "X" and e["pid"] == 3 for e in events)


def test_cli_bad_device_is_one_line_exit_2():
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "kvsim", "simulate", TRACE),
            *("--cpu-chunks", "20", "--limit", "2", "--tier", "fs:device=floppy"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown device 'floppy'" in lines[0], proc.stderr


@expect_overload
def test_steps_table_has_each_tiers_gauges(tmp_path):
    """Per step, each tier's jobs in flight and resident chunks: an unbounded fs tier only
    gains chunks, those of the cascades that ended before the step (they are collected as
    it starts), and was busy at times."""
    result = run(tmp_path, device(tmp_path, "slow", read_latency_s=0.5))
    steps = result.tables["steps"]
    jobs = result.tables["tier_jobs"]
    resident = steps["tier1_fs_resident_chunks"]
    assert resident.is_monotonic_increasing
    cascades = jobs[(jobs["kind"] == "cascade") & jobs["success"]]
    for _, step in steps.iterrows():
        before = cascades[cascades["end_s"] < step["start_s"]]["chunks"].sum()
        by_end = cascades[cascades["end_s"] <= step["end_s"]]["chunks"].sum()
        assert before <= step["tier1_fs_resident_chunks"] <= by_end
    assert resident.iloc[-1] == 6 < cascades["chunks"].sum()  # the last cascade ends after
    assert (steps["tier1_fs_jobs_in_flight"] >= 0).all()
    assert steps["tier1_fs_jobs_in_flight"].max() >= 1


def test_load_rule_weighs_the_whole_run_over_the_tiers_threads(tmp_path):
    """One 16-token chunk read on one thread (15 ms) is slower than computing it (11.6 ms
    under the linear profile), but the 8-chunk run the tier holds reads on 8 threads at
    once (15 ms) while computing 128 tokens takes 22.8 ms: the rule loads it."""
    eight = device(tmp_path, "eight", read_latency_s=0.015, threads=8)
    head = tuple(range(1, 9))
    reqs = [
        Request(0, 0.0, 130, 2, head),
        Request(1, 10.0, 130, 2, tuple(range(11, 19))),  # evicts the head from the CPU tier
        Request(2, 20.0, 146, 2, (*head, 9)),
    ]
    compute = LinearCompute(0.01, 1e-4)
    assert prefill_seconds(compute, 16, 0, 8192) < 0.015 < prefill_seconds(compute, 128, 0, 8192)
    ruled = run(tmp_path, eight, reqs, cpu_chunks=8, tier_load_rule="pays-off")
    assert ruled.tables["requests"].set_index("request").loc[2, "tier_hit_tokens"] == 128
    assert ruled.summary["tier1_fs_load_rule_skipped_chunks"] == 0


@expect_overload
def test_kv_wait_ends_when_the_lookup_answers_not_when_blocks_free_up(tmp_path):
    """Request 3 waits 0.25 s for the fs tier's existence check, then for GPU blocks that
    request 2 (150 output tokens, 13 usable GPU blocks: 14 with vLLM's null block) holds
    until 21.27 s: the second wait is queueing, so its KV wait is the check (and promotion),
    not the whole wait."""
    reqs = [
        Request(0, 0.0, 50, 2, (1, 2, 3)),
        Request(1, 10.0, 50, 2, (7, 8, 9)),
        Request(2, 19.5, 50, 150, (11, 12, 13)),
        Request(3, 20.5, 50, 2, (1, 2, 4)),
    ]
    result = run(tmp_path, device(tmp_path, "c", 0.0, 0.25), reqs, gpu_kv_blocks=14)
    req = result.tables["requests"].set_index("request")
    assert req.loc[3, "first_scheduled_s"] >= req.loc[2, "finish_s"]  # it waited for blocks
    assert req.loc[3, "queue_s"] > 0.7
    assert 0.25 <= req.loc[3, "kv_wait_s"] < 0.3


@expect_overload
def test_back_pressure_drops_cascades_to_a_slow_device_only(tmp_path):
    """vLLM's EMA detector on the device's store latencies: with 1 s writes (0.5 s/MiB, far
    above the 50 ms/MiB high-water mark) a DropStorePolicy tier drops cascades; with instant
    writes, or with no back-pressure configured (vLLM's default), it drops none."""

    def dropped(write_latency_s, backpressure):
        dev = device(tmp_path, f"w{write_latency_s}", 0.0, write_latency_s=write_latency_s)
        tier: dict[str, object] = {"type": "fs", "kvsim_device": dev}
        if backpressure:
            tier["backpressure"] = {
                "backpressure_cls": "EMABackpressureDetector",
                "policy_cls": "DropStorePolicy",
            }
        result = kvsim.simulate(TRACE, cpu_chunks=50, limit=60, secondary_tiers=[tier])
        return result.summary["tier1_fs_dropped_chunks"], result.summary["tier1_fs_cascaded_chunks"]

    slow_dropped, _ = dropped(1.0, True)
    fast_dropped, fast_cascaded = dropped(0.0, True)
    assert slow_dropped > 0
    assert fast_dropped == 0 and fast_cascaded > 0
    assert dropped(1.0, False)[0] == 0


def test_a_tier_run_without_promotions_writes_strict_json(tmp_path):
    """With nothing promoted, the promotion percentiles are 0 (vLLM's value for a metric
    without values), and ``summary.json`` and ``--json`` parse as strict JSON: they once
    held a bare NaN, which ``kvsim plot`` then refused to read from kvsim's own folder."""
    from kvsim.core.io import parse_json

    out = tmp_path / "run"
    args = ["simulate", TRACE, "--limit", "5", "--cpu-gib", "1", "--tier", "fs"]
    res = CliRunner().invoke(cli, [*args, "--save-steps", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    summary = parse_json((out / "summary.json").read_text(), "summary.json")
    assert summary["tier1_fs_promotion_jobs"] == 0
    assert summary["tier1_fs_promotion_p50_ms"] == summary["tier1_fs_promotion_p99_ms"] == 0
    res = CliRunner().invoke(
        cli, ["plot", str(out), "--kind", "usage-timeline", "--out", str(tmp_path / "u.png")]
    )
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, [*args, "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    parse_json(res.stdout, "--json")


def test_json_text_writes_a_statistic_of_no_values_as_null():
    from kvsim.core.io import json_text, parse_json

    text = json_text({"p50": float("nan"), "rows": [1.5, float("inf"), (2, -float("inf"))]})
    assert parse_json(text, "t") == {"p50": None, "rows": [1.5, None, [2, None]]}
