"""`kvsim bench --stages`: every stage a user waits for, timed (not asserted on: speed is
measured by benchmarks, never by tests)."""

from __future__ import annotations

import pandas as pd
import pytest
from support import SAMPLE, need_vllm, run_main

from kvsim.cachemode.miniature import MIN_CHUNKS


def test_stages_table_names_every_stage(tmp_path, capsys):
    out = tmp_path / "stages.csv"
    code, _, err = run_main(
        [
            "bench",
            SAMPLE,
            "--stages",
            "--policies",
            "s3fifo",
            "--repeat",
            "1",
            "--no-vllm",
            "--cpu-chunks",
            "50",
            "--csv",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    table = pd.read_csv(out)
    assert table["stage"].tolist() == [
        "python",
        "start-up",
        "read (parse)",
        "read (cached)",
        "replay",
        "write",
        "kvsim replay",
    ]
    assert (table["seconds"] >= 0).all()
    assert "s3fifo at 50 chunks" in table.set_index("stage").loc["replay", "note"]


def test_stages_refuse_what_they_cannot_time(capsys):
    code, _, err = run_main(["bench", SAMPLE, "--stages", "--policies", "lru,arc"], capsys)
    assert code == 2 and "one policy" in err
    code, _, err = run_main(["bench", SAMPLE, "--stages", "--limit", "10"], capsys)
    assert code == 2 and "--limit" in err


def test_miniature_error_table_covers_each_policy_and_protocol(tmp_path, capsys):
    out = tmp_path / "err.csv"
    code, printed, err = run_main(
        ["bench", SAMPLE, "--miniature-error", "0.5", "--policies", "lru,fifo", "--csv", str(out)],
        capsys,
    )
    assert code == 0, err
    table = pd.read_csv(out)
    assert sorted(zip(table["policy"], table["protocol"])) == [
        ("fifo", "object"),
        ("fifo", "prefix"),
        ("lru", "object"),
        ("lru", "prefix"),
    ]
    # LRU is its own control variate: corrected, its miniature is exact
    assert (table.loc[table["policy"] == "lru", "max_abs_error"] < 1e-12).all()
    # each capacity's rate is reported: the small trace's miniatures are under the minimum
    # size, so its smallest capacity is replayed in full (rate 1)
    rates = [float(r) for r in table["rates"][0].split("/")]
    assert rates[0] == 1.0 and min(rates) >= 0.5
    assert (table["rate_at_max"] >= 0.5).all()
    assert "at 1 (" in printed and f"min {MIN_CHUNKS} chunks per miniature" in printed


@pytest.mark.vllm
def test_stages_time_vllms_loop_in_turns_with_the_command(tmp_path, capsys):
    need_vllm("vllm.v1.kv_offload.cpu.manager")
    out = tmp_path / "stages.csv"
    argv = ["bench", SAMPLE, "--stages", "--repeat", "2", "--vllm"]  # lru: --policies' default
    code, _, err = run_main([*argv, "--cpu-chunks", "50", "--csv", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out).set_index("stage")
    assert table.index[-2:].tolist() == ["kvsim replay", "vllm manager loop"]
    note = table.loc["vllm manager loop", "note"]
    ratio = table.loc["vllm manager loop", "seconds"] / table.loc["kvsim replay", "seconds"]
    said = f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"
    assert note == f"best of 2; kvsim replay is {said}"  # the small sample: often slower
    code, _, err = run_main([*argv[:3], "--policies", "lru,arc"], capsys)
    assert code == 2 and "--stages times one policy" in err, err


@pytest.mark.vllm
def test_the_policy_table_times_vllm_best_of_n_as_it_times_kvsim(monkeypatch):
    """Timing vLLM's manager once against kvsim's best of N favoured kvsim."""
    need_vllm("vllm.v1.kv_offload.cpu.manager")
    from kvsim.cachemode import bench
    from kvsim.traces import open_trace

    made: list[str] = []
    real = bench.vllm_replay

    def counted(config, policy):
        made.append(policy)
        return real(config, policy)

    monkeypatch.setattr(bench, "vllm_replay", counted)
    trace = open_trace(SAMPLE, limit=30)
    table = bench.bench_replay(
        list(trace), trace.block_tokens, cpu_chunks=50, repeat=3, with_vllm=True
    )
    assert made == ["lru"] * 3 + ["arc"] * 3
    vllm = table[table["engine"] == "vllm-0.33"]
    assert len(vllm) == 2 and vllm["same_decisions"].eq(True).all()


def test_bench_without_a_trace_runs_anywhere(tmp_path, capsys, monkeypatch):
    """Its default is the bundled trace: the checkout's file, else the package's copy (a
    pip install has no traces/ folder; the command once worked only from the checkout)."""
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--limit", "30", "--repeat", "1", "--policies", "lru", "--no-vllm"]
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    assert "mooncake_fast25_conversation_trace.jsonl.gz: 30 requests" in out


@pytest.mark.parametrize(
    ("policies", "said"),
    [("lru,nope", "--policies: unknown eviction policy 'nope'"), (",", "--policies: give")],
)
def test_bench_names_its_own_option_for_a_bad_policy(capsys, policies, said):
    code, _, err = run_main(["bench", SAMPLE, "--policies", policies, "--no-vllm"], capsys)
    assert code == 2 and said in err, err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--stages", "--timed"], "--stages and --timed are different modes"),
        (["--timed", "--miniature-error", "0.1"], "--timed and --miniature-error are different"),
        (["--gpu-blocks", "100"], "--gpu-blocks is read by --timed only"),
        (["--stages", "--seeds", "2"], "--seeds is read by --miniature-error only"),
        (["--timed", "--min-keys", "5"], "--min-keys is read by --miniature-error only"),
    ],
)
def test_bench_refuses_a_second_mode_or_another_modes_option(capsys, args, said):
    code, out, err = run_main(["bench", SAMPLE, "--limit", "5", "--no-vllm", *args], capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and said in err, err
