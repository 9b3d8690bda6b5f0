"""Validation on CPU tensors: the same engine, manager and policies, simulated vs real, on
the eager device and on the deferred one (copies complete later, out of order)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvsim.cli import main
from real import validate as validate_mod
from real.device import Device
from real.host_pool import PinError
from real.machine import GIB, CpuDefaults, check_fits
from real.validate import ValidationSpec, default_trace, run_validation

KINDS = ["eager", "deferred"]


#: compressed arrivals (time scale 0.01), seconds a run. The wall-clock run's hit
#: decisions depend on the host keeping to the modelled schedule, which a busy machine
#: does not (at 0.03 / 0.1 one job in 39 came a step late on a fresh CI run, 2026-12-03;
#: at 0.1 / 0.3 once in a quick-start run), so they are not asserted here; the lockstep
#: run's (real.lockstep: real copies on the simulated schedule) are, and do not depend on
#: load. The deferred device also completes copies later and out of order by design.
SPEC = replace(ValidationSpec.small_for_tests(), time_scale=0.01)


@pytest.fixture(scope="module", params=KINDS)
def report(request):
    kind = request.param
    rep = run_validation(default_trace(), SPEC, device=Device("cpu", mode=kind, seed=3))
    return kind, rep


def test_hit_decisions_identical_and_every_loaded_byte_intact(report):
    _kind, report = report
    s = report.summary()
    assert s["requests"] == 26 and s["hit_decisions_same"] > 0  # the first requests agree
    # given the simulation's schedule the real backend makes its decisions and jobs exactly
    assert s["lockstep_hit_decisions_identical"] and s["lockstep_first_difference"] is None
    assert s["lockstep_jobs_identical"] and s["lockstep_mismatched_bytes"] == 0
    assert report.integrity["checked_blocks"] > 50  # later turns really load from the CPU tier
    assert report.integrity["mismatched_blocks"] == 0 and report.integrity["mismatched_bytes"] == 0
    assert s["failed_jobs"] == 0
    cpu_hits = report.tables["real_requests"]["cpu_hit_tokens"].sum()
    assert cpu_hits > 0


def test_comparison_covers_every_job_and_request(report):
    _kind, report = report
    t = report.transfers
    assert t["all"]["n"] == report.runs["real"]["transfer_jobs"] > 0
    assert 0 < t["matched_to_simulated_run"]["n"] <= t["all"]["n"]
    assert t["store"]["n"] > 0 and t["load"]["n"] > 0
    assert report.ttft["n"] == 26
    bw = report.bandwidth
    assert bw["store_d2h"]["achieved_gbps"] > 0 and bw["load_h2d"]["achieved_gbps"] > 0
    # the real job table adds up to what the engine asked for
    jobs = report.tables["real_jobs"]
    assert jobs["nbytes"].sum() > 0
    assert report.lockstep["real_jobs"] == len(report.tables["simulated_transfers"])
    json.dumps(report.as_dict())  # the report is plain JSON


@pytest.mark.parametrize("kind", KINDS)
def test_failed_copy_goes_through_the_engine_and_manager(kind):
    rep = run_validation(
        default_trace(),
        replace(ValidationSpec.small_for_tests(), time_scale=0.01),
        device=Device("cpu", mode=kind),
        fault=lambda job: job.job_id in (1, 2) and job.direction == "store",
    )
    assert rep.runs["real"]["failed_jobs"] == 2
    assert rep.integrity["mismatched_blocks"] == 0  # a failed store never serves a load
    real_tr = rep.tables["real_jobs"]
    assert (~real_tr["success"]).sum() == 2


class _Boom(RuntimeError):
    pass


def test_an_error_mid_run_releases_memory_only_once_the_device_is_idle(monkeypatch):
    """Fault 8: after an exception, copies may still be queued; the pool is unpinned (and
    the GPU cache freed) only once the device has run them."""
    dev = Device("cpu", mode="deferred", seed=1)
    pending_at_unpin: list[int] = []
    calls = {"n": 0}
    real_call = validate_mod.EmulatedCompute.__call__

    def call(self, batch):
        if self.enqueue:  # the real run's compute
            calls["n"] += 1
            if calls["n"] == 40:
                assert dev.pending > 0  # copies queued right now
                raise _Boom("the engine failed mid-run")
        return real_call(self, batch)

    monkeypatch.setattr(validate_mod.EmulatedCompute, "__call__", call)
    with pytest.raises(_Boom):
        run_validation(
            default_trace(),
            replace(ValidationSpec.small_for_tests(), time_scale=0.01),
            device=dev,
            pin=True,
            register=lambda p, n: None,
            unregister=lambda p: pending_at_unpin.append(dev.pending),
        )
    assert pending_at_unpin == [0]


def test_pinning_is_required_unless_allowed():
    """Fault 6: an unpinned pool would measure staged synchronous copies: refused, unless
    ``allow_unpinned`` (the CLI's --allow-unpinned)."""

    def fail(ptr, n):
        raise RuntimeError("cudaHostRegister failed (injected)")

    spec = replace(ValidationSpec.small_for_tests(), time_scale=0.01, limit=4)
    kw = dict(device=Device("cpu"), pin=True, register=fail, unregister=lambda p: None)
    with pytest.raises(PinError, match="injected"):
        run_validation(default_trace(), spec, **kw)
    rep = run_validation(default_trace(), replace(spec, allow_unpinned=True), **kw)
    assert rep.pinned is False and rep.integrity["mismatched_bytes"] == 0


def test_cpu_defaults_follow_the_machine_and_big_pools_are_refused(capsys):
    d = CpuDefaults.for_memory(22 * GIB)
    assert (d.cpu_gib, d.max_gpu_kv_gib) == (2.0, 1.5)
    assert CpuDefaults.for_memory(512 * GIB).cpu_gib == 16.0
    with pytest.raises(Exception, match=r"only 1\.00 GiB is available"):
        check_fits(3 * GIB, "the host pool", available=GIB)
    with pytest.raises(SystemExit) as exc:
        main(["validate", default_trace(), "--cpu-gib", "100000", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "GiB is available" in err and len(err.splitlines()) == 1


def test_the_cpu_stand_in_for_gpu_kv_is_counted_before_it_is_allocated(capsys, monkeypatch):
    """Issue 27 item 9: on CPU the stand-in GPU KV cache lives in host memory: with a small
    host pool and --max-gpu-kv-gib 12 against 4 GiB free, the run is refused, one line
    naming the option, before anything is allocated."""
    from real import machine

    monkeypatch.setattr(machine, "available_memory", lambda: 4 * GIB)
    allocated = []
    monkeypatch.setattr(validate_mod, "GpuKVCache", lambda *a, **k: allocated.append(a))
    args = ["validate", default_trace(), "--device", "cpu", "--cpu-chunks", "8"]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--max-gpu-kv-gib", "12", "--limit", "4"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert "--max-gpu-kv-gib" in err and "stand-in" in err and not allocated


def test_validate_command_prints_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "validate",
                default_trace(),
                "--model",
                "llama-3.2-1b",
                "--cpu-chunks",
                "300",
                "--gpu-kv-blocks",
                "60",
                "--limit",
                "6",
                "--time-scale",
                "0.01",
                "--compute-scale",
                "0.1",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "hit_decisions_identical" in text and "integrity_mismatched_blocks" in text
    data = json.loads(out.read_text())
    assert data["integrity"]["mismatched_blocks"] == 0
    assert data["hits"]["requests"] == 6 and data["spec"]["model"] == "llama-3.2-1b"


def test_validate_fails_when_the_lockstep_run_differs(capsys, monkeypatch):
    """A lockstep difference is a bug, never load: exit 1 with one line saying so, as
    real.gpu_check judges it (the report is still printed)."""
    from real import lockstep

    real_compared = lockstep.compared

    def differing(*args, **kwargs):
        return {**real_compared(*args, **kwargs), "hit_decisions_identical": False}

    monkeypatch.setattr(validate_mod, "compared", differing)
    args = ["validate", default_trace(), "--model", "llama-3.2-1b", "--cpu-chunks", "300"]
    args += ["--gpu-kv-blocks", "60", "--limit", "6", "--time-scale", "0.01"]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--compute-scale", "0.1", "--device", "cpu"])
    captured = capsys.readouterr()
    assert exc.value.code == 1, captured.err
    assert "lockstep_hit_decisions_identical" in captured.out
    assert captured.err.strip() == (
        "kvsim: validate: the lockstep run's hit decisions or jobs differ from the simulation's"
    )


def test_validate_rejects_bad_layout(capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "validate",
                default_trace(),
                "--cpu-chunks",
                "10",
                "--max-gpu-kv-gib",
                "-1",
                "--device",
                "cpu",
            ]
        )
    assert exc.value.code == 2 and "max-gpu-kv-gib" in capsys.readouterr().err


# --------------------------------------------------------------------------- issue 29


def _req(i, arrival, hashes):
    from kvsim.traces.model import Request

    return Request(i, arrival, 512 * len(hashes), 10, tuple(hashes))


def test_conversation_turns_keep_requests_sharing_two_blocks_rebased():
    from real.trace_slice import conversation_turns

    reqs = [
        _req(0, 5.0, [0, 1, 2]),
        _req(1, 6.0, [0, 3]),  # shares only the common first block
        _req(2, 7.0, [0, 1, 2, 4]),  # a later turn of request 0
        _req(3, 8.0, [0]),
        _req(4, 9.0, [0, 5, 6]),
        _req(5, 9.5, [0, 5, 7]),
    ]
    kept = conversation_turns(reqs)
    assert [r.request_id for r in kept] == [0, 2, 4, 5]
    assert [r.arrival_s for r in kept] == [0.0, 2.0, 4.0, 4.5]
    assert [r.request_id for r in conversation_turns(reqs, 2)] == [0, 2]
    assert conversation_turns(reqs[1:2]) == []


def test_the_conversation_slice_is_written_as_a_trace_that_reads_back(tmp_path):
    from kvsim.traces import as_trace
    from real.trace_slice import write_mooncake
    from real.validate import mooncake_trace, selected_trace

    spec = replace(ValidationSpec.for_cpu_check(), limit=40)
    kept = list(selected_trace(mooncake_trace(), spec))
    assert len(kept) == 40 and kept[0].arrival_s == 0.0
    window = list(as_trace(mooncake_trace(), limit=400))
    seconds = [r.block_hashes[1] for r in window if len(r.block_hashes) > 1]
    assert all(seconds.count(r.block_hashes[1]) > 1 for r in kept)
    write_mooncake(kept, tmp_path / "slice.jsonl")
    back = list(as_trace(str(tmp_path / "slice.jsonl")))
    assert [(r.arrival_s, r.prompt_tokens, r.block_hashes) for r in back] == [
        (r.arrival_s, r.prompt_tokens, r.block_hashes) for r in kept
    ]


@pytest.mark.parametrize("plan", ["for_cpu_check", "for_gpu_check"])
def test_the_check_plans_load_enough_to_matter(plan):
    """The first 200 Mooncake requests gave two load jobs; the plans' conversation turns
    give dozens (counted on the simulated run, which makes the same decisions)."""
    from real.validate import mooncake_trace, prepare, simulate
    from real.validation_report import MIN_JOBS

    _req_table, transfers, _end = simulate(
        prepare(mooncake_trace(), getattr(ValidationSpec, plan)())
    )
    loads = int((transfers.direction != "store").sum())
    assert loads >= MIN_JOBS and int((transfers.direction == "store").sum()) >= 5 * MIN_JOBS


def test_noise_is_the_spread_of_a_jobs_own_repeats():
    from real.job_noise import noise_stats

    stats = noise_stats(
        [[1.0, 1.1, 0.9, 1.0, 1.0], [2.0, 2.0, 3.0, 2.0, 1.0]],
        in_run=[2.0, 2.0],
        modelled=[1.5, 2.0],
    )
    assert stats["jobs"] == 2 and stats["repeats"] == 5
    assert stats["median_abs_dev_pct"] == pytest.approx(0.0)  # each job's median deviation
    assert stats["in_run_over_alone_median"] == pytest.approx(1.5)  # x2 and x1
    assert stats["model_err_alone_median_pct"] == pytest.approx(25.0)  # 50% and 0%
    spread = noise_stats([[1.0, 1.2, 0.8, 1.0, 1.3]])
    assert spread["median_abs_dev_pct"] == pytest.approx(20.0)
    assert noise_stats([[1.0]])["jobs"] == 0


def test_noise_samples_both_directions_across_sizes():
    from kvsim.engine.transfer_protocol import LOAD, STORE, TransferJob
    from real.job_noise import sample_jobs
    from real.transfer import JobRecord

    records, jobs = [], {}
    for i in range(20):
        d = STORE if i % 4 else LOAD
        records.append(
            JobRecord(
                i,
                d,
                nbytes=100 * (i + 1),
                blocks=1,
                descriptors=1,
                copies=1,
                submit_time=0.0,
                success=i != 7,
            )
        )
        jobs[i] = TransferJob(i, d, [i], [i], 100 * (i + 1), 1)
    picked = sample_jobs(records, jobs, 6)
    dirs = [j.direction for j in picked]
    assert dirs.count(STORE) == 3 and dirs.count(LOAD) == 3 and 7 not in {j.job_id for j in picked}
    stores = [j.nbytes for j in picked if j.direction == STORE]
    assert stores[0] == min(r.nbytes for r in records if r.direction == STORE and r.success)


def test_caveats_say_what_the_errors_cannot_show():
    from real.validation_report import caveats

    t = {"store": {"n": 400}, "load": {"n": 3}, "all": {"median_abs_pct_err": 9.0}}
    notes = caveats(t, {"median_abs_dev_pct": 6.0})
    assert any("only 3 load jobs" in n for n in notes)
    assert any("within twice the noise" in n for n in notes)
    t = {**t, "load": {"n": 90}, "all": {"median_abs_pct_err": 40.0}}
    assert caveats(t, {"median_abs_dev_pct": 6.0}) == []


def test_validate_reports_noise_and_load_jobs_beside_the_error(report):
    _kind, report = report
    s = report.summary()
    assert s["load_jobs"] > 0 and s["store_jobs"] > 0
    assert s["noise_jobs"] > 0 and s["job_noise_median_pct"] is not None
    assert s["job_err_alone_median_pct"] is not None and s["jobs_in_run_over_alone"] > 0
    assert isinstance(s["caveats"], list)
    rows = report.as_dict()["jobs"]
    matched = [r for r in rows if r["simulated_s"] is not None]
    assert matched and all(r["measured_s"] > 0 for r in rows if r["success"])


def test_the_first_batching_difference_names_where_the_runs_stepped_apart():
    """Requests share a step when their first-scheduled times are equal; the first request
    whose step-mates differ between the runs is named (None when none does)."""
    import pandas as pd

    from real.compare import first_batching_difference

    def run(times):
        return pd.DataFrame({"request": [0, 1, 2, 3], "first_scheduled_s": times})

    sim = run([0.0, 0.1, 0.2, 0.2])
    assert first_batching_difference(sim, run([5.0, 5.5, 6.0, 6.0])) is None  # other times
    assert first_batching_difference(sim, run([0.0, 0.2, 0.2, 0.3])) == 1  # 1 joined 2
    assert first_batching_difference(sim, run([0.0, 0.1, 0.2, float("nan")])) == 2
    assert first_batching_difference(run([0.0, 0.1, 0.2, float("nan")]), sim) == 2
