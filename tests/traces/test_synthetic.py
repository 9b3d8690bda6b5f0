"""Synthetic generators: determinism, Mooncake format, prefix chaining, promised statistics."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from click.testing import CliRunner
from support import ROOT, SAMPLE, run_main

from kvsim.cli import cli
from kvsim.core.errors import InputError
from kvsim.traces import open_trace
from kvsim.traces.stats import trace_stats
from kvsim.traces.synthetic import KINDS, generate, to_frame, write_mooncake


def _check_prefix_chained(reqs, bt=512):
    """Every id sits at one index with one parent: an id names a whole prefix."""
    where: dict[int, tuple[int, int]] = {}
    for r in reqs:
        assert len(r.block_hashes) == math.ceil(r.input_tokens / bt)
        parent = -1
        for i, h in enumerate(r.block_hashes):
            assert where.setdefault(h, (i, parent)) == (i, parent)
            parent = h


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_and_prefix_chained(kind):
    a = generate(kind, 300, seed=7)
    assert a == generate(kind, 300, seed=7)
    assert a != generate(kind, 300, seed=8)
    assert [r.request_id for r in a] == list(range(300))
    assert all(b.arrival_s >= a_.arrival_s for a_, b in itertools.pairwise(a))
    _check_prefix_chained(a)


@pytest.mark.parametrize("kind", ["chat", "rag"])
def test_mooncake_file_round_trip(tmp_path, kind):
    reqs = generate(kind, 200, seed=1, rate=5.0)
    path = tmp_path / "t.jsonl"
    assert write_mooncake(path, reqs) == 200
    back = list(open_trace(str(path)))
    assert open_trace(str(path)).format == "mooncake"
    assert [(r.arrival_s, r.input_tokens, r.output_tokens, r.block_hashes) for r in back] == [
        (r.arrival_s, r.input_tokens, r.output_tokens, r.block_hashes) for r in reqs
    ]


def test_same_prefix_same_ids_across_requests():
    # two single-turn requests behind the same system prompt share its full blocks, and the
    # block where the prompt ends (shared with the unique user part) differs
    reqs = generate("system-prompt", 400, seed=0, n_prompts=1, system_tokens=1300, length_cv=0)
    firsts = {r.block_hashes[:2] for r in reqs}
    assert len(firsts) == 1  # 1300 tokens = 2 full blocks + 276 tokens
    assert len({r.block_hashes[2] for r in reqs}) == 400


def test_chat_sessions_reread_their_history():
    reqs = generate("chat", 600, seed=3, active_sessions=8, turns=6)
    by_session = defaultdict(list)
    for r in reqs:
        by_session[r.session_id].append(r)
    multi = [s for s in by_session.values() if len(s) > 1]
    assert len(multi) > 20
    for turns in multi:
        for prev, nxt in itertools.pairwise(turns):
            full = prev.input_tokens // 512
            assert nxt.block_hashes[:full] == prev.block_hashes[:full]
            assert nxt.input_tokens > prev.input_tokens + prev.output_tokens
    assert (
        statistics.mean(len(s) for s in by_session.values()) > 2.5
    )  # geometric, mean 6, cut at the end


def test_agent_context_grows_each_step():
    reqs = generate("agent", 400, seed=2, steps=8, active_sessions=2)
    by_session = defaultdict(list)
    for r in reqs:
        by_session[r.session_id].append(r)
    for steps in by_session.values():
        sizes = [r.input_tokens for r in steps]
        assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    hit = trace_stats(reqs).summary["infinite_cache_hit_ratio"]
    assert hit > 0.8  # each step re-reads everything before it


def test_poisson_rate():
    reqs = generate("rag", 4000, seed=5, rate=2.0, n_docs=20)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(reqs)]
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.06)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.1)


def test_bursty_is_burstier_with_the_on_off_mean_rate():
    reqs = generate("system-prompt", 4000, seed=5, arrival="bursty", rate=4.0, on_s=10, off_s=30)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(reqs)]
    assert statistics.pstdev(gaps) / statistics.mean(gaps) > 2.0
    # long-run rate: 4 req/s for 1/4 of the time
    assert len(reqs) / reqs[-1].arrival_s == pytest.approx(1.0, rel=0.3)


def test_replayed_arrivals():
    reqs = generate("chat", 50, seed=0, arrival="replay", arrival_trace=SAMPLE)
    src = [r.arrival_s for r in open_trace(SAMPLE, limit=50)]
    assert [r.arrival_s for r in reqs] == pytest.approx([t - src[0] for t in src])
    with pytest.raises(InputError, match="fewer than"):
        generate("chat", 500, arrival="replay", arrival_trace=SAMPLE)


def test_replayed_arrivals_of_a_trace_out_of_order_are_its_times_in_order(tmp_path):
    back = tmp_path / "back.jsonl"
    back.write_text(
        '{"timestamp": 10000, "input_length": 512, "output_length": 5, "hash_ids": [0]}\n'
        '{"timestamp": 0, "input_length": 512, "output_length": 5, "hash_ids": [0]}\n'
    )
    reqs = generate("chat", 2, seed=0, arrival="replay", arrival_trace=str(back))
    assert [r.arrival_s for r in reqs] == [0.0, 10.0]  # was 0 and -10: a file none reads


def test_rag_document_popularity_is_zipf():
    n_docs, s = 50, 1.0
    reqs = generate(
        "rag",
        3000,
        seed=11,
        n_docs=n_docs,
        zipf_s=s,
        docs_per_request=1,
        system_tokens=512,
        doc_tokens=1024,
        length_cv=0,
    )
    first_doc = Counter(r.block_hashes[1] for r in reqs)  # block 0 is the system prompt
    assert len(first_doc) <= n_docs
    h = sum(1 / (i + 1) ** s for i in range(n_docs))
    top = first_doc.most_common(1)[0][1] / len(reqs)
    assert top == pytest.approx(1 / h, abs=0.03)


def test_system_prompt_count_and_lengths():
    reqs = generate(
        "system-prompt",
        2000,
        seed=4,
        n_prompts=5,
        zipf_s=0,
        system_tokens=1024,
        output_tokens=100,
        length_cv=0.3,
    )
    shared = Counter(r.block_hashes[:2] for r in reqs)
    assert len(shared) == 5 and min(shared.values()) > 300  # uniform popularity
    assert statistics.mean(r.output_tokens for r in reqs) == pytest.approx(100, rel=0.05)


def test_mix_weights():
    reqs = generate(
        "mix", 2000, seed=9, weights={"chat": 3, "rag": 1}, component_knobs={"rag": {"n_docs": 10}}
    )
    share_chat = sum(r.session_id is not None for r in reqs) / len(reqs)
    assert share_chat == pytest.approx(0.75, abs=0.04)
    _check_prefix_chained(reqs)
    frame = to_frame(reqs)
    assert (
        list(frame.columns)[:3] == ["request", "arrival_s", "prompt_tokens"] and len(frame) == 2000
    )


def test_bad_knobs():
    with pytest.raises(InputError, match="unknown knob"):
        generate("chat", 10, turnz=3)
    with pytest.raises(InputError, match="unknown workload kind"):
        generate("nope", 10)
    with pytest.raises(InputError, match=r"^knob rate must be > 0"):  # its keyword, not --rate
        generate("chat", 10, rate=0)


@pytest.mark.parametrize(
    ("knobs", "phrase"),
    [
        ({"turns": "abc"}, "turns must be a number"),
        ({"turns": -3}, "turns must be >= 1"),
        ({"rate": float("inf")}, "rate must be finite"),
        ({"rate": float("nan")}, "rate must be finite"),
        ({"active_sessions": 2.5}, "whole number"),
        ({"arrival": 3}, "arrival must be text"),
        ({"system_tokens": 10**23}, "at most 100,000,000 tokens"),  # it never ended
        (
            {"system_tokens": "1e12"},
            r"got '1e12' \(a number as text: write it unquoted, such as 1000000000000\)",
        ),
    ],
)
def test_knob_values_are_checked_before_generating(knobs, phrase):
    with pytest.raises(InputError, match=phrase):
        generate("chat", 10, **knobs)


@pytest.mark.parametrize(
    ("kind", "knobs", "phrase"),
    [  # each was a ZeroDivisionError, a NaN, an OverflowError or a run that never ended
        ("chat", {"turns": 1e300}, "turns must be at most 1,000,000, got 1e[+]300"),
        ("chat", {"length_cv": 1e300}, "length_cv must be at most 100,"),
        ("chat", {"active_sessions": 10**300}, "active_sessions must be at most 10,000,000,"),
        ("agent", {"steps": 1e300}, "steps must be at most 1,000,000,"),
        ("rag", {"zipf_s": 1e300}, "zipf_s must be at most 100,"),
        ("rag", {"n_docs": 10**12}, "n_docs must be at most 10,000,000,"),
    ],
)
def test_knobs_past_what_a_generator_can_draw_are_refused(kind, knobs, phrase):
    with pytest.raises(InputError, match=phrase):
        generate(kind, 10, **knobs)
    at_most = {k: 1_000_000 if k in ("turns", "steps") else 100 for k in knobs}
    assert len(generate(kind, 3, **at_most)) == 3  # the bound itself is taken


def test_mix_weights_must_be_a_mapping_of_numbers():
    with pytest.raises(InputError, match="weights must be a mapping"):
        generate("mix", 10, weights=[1, 2])
    with pytest.raises(InputError, match=r"weights\.chat must be a number"):
        generate("mix", 10, weights={"chat": "x"})
    with pytest.raises(InputError, match="mix weights are all 0"):
        generate("mix", 10, weights={"chat": 0})
    with pytest.raises(InputError, match="mix weights name 'chta', not a kind"):
        generate("mix", 10, weights={"chta": 1})


def test_knobs_that_contradict_each_other_are_refused():
    with pytest.raises(InputError, match=r"docs_per_request \(2000\) is more than n_docs \(1000\)"):
        generate("rag", 10, docs_per_request=2000)
    assert len(generate("rag", 10, docs_per_request=5, n_docs=5)) == 10


def test_exponent_numbers_are_numbers_on_the_command_line_and_in_yaml():
    """YAML 1.1 reads 1e3 and 1.0e3 as text; kvsim reads them as YAML 1.2 and JSON do."""
    from kvsim.core.yaml_text import load_yaml

    assert load_yaml("{rate: 1e3, b: 1.0e3, c: -2E-3, d: 1.0e+3}") == {
        "rate": 1000.0,
        "b": 1000.0,
        "c": -0.002,
        "d": 1000.0,
    }
    assert load_yaml("[1, 1.5, x1e3, '1e3']") == [1, 1.5, "x1e3", "1e3"]
    res = CliRunner().invoke(
        cli, ["trace", "gen", "chat", "-n", "3", "--set", "rate=1e3", "-o", "-"]
    )
    assert res.exit_code == 0, res.output


def test_cli_gen_is_reproducible(tmp_path):
    runner = CliRunner()
    outs = []
    for name in ("a.jsonl", "b.jsonl"):
        res = runner.invoke(
            cli,
            [
                "trace",
                "gen",
                "agent",
                "-n",
                "120",
                "--seed",
                "4",
                "--rate",
                "3",
                "--set",
                "steps=6",
                "-o",
                str(tmp_path / name),
            ],
        )
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1] and outs[0].count(b"\n") == 120
    gz = []
    for _ in range(2):  # the same path twice: each write goes through a new temporary name
        args = ["trace", "gen", "chat", "-n", "5", "--seed", "3", "-o", tmp_path / "t.jsonl.gz"]
        assert runner.invoke(cli, [str(a) for a in args]).exit_code == 0
        gz.append((tmp_path / "t.jsonl.gz").read_bytes())
    assert gz[0] == gz[1]  # the gzip header held the temporary file's random name
    res = runner.invoke(cli, ["trace", "gen", "--help"])
    assert "docs_per_request" in res.output


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["-o", "t.csv"], "a .csv file is read as an Azure trace"),
        (["-o", "t.csv.gz"], "a .csv file is read as an Azure trace"),
        (["--rate", "2", "--set", "rate=5"], "--rate and --set rate: give one of them"),
        (["--arrival", "poisson", "--set", "arrival=bursty"], "--arrival and --set arrival"),
        (["--arrival-trace", SAMPLE], "--arrival-trace is read by --arrival replay only"),
        (
            ["--arrival", "replay", "--arrival-trace", SAMPLE, "--rate", "3"],
            "--rate does not apply to --arrival replay",
        ),
        (  # the knobs as --set: the rule is generate's, the words the user's
            ["--set", "arrival=replay", "--set", f"arrival_trace={SAMPLE}", "--set", "rate=2"],
            "--set rate does not apply to --set arrival=replay",
        ),
        (["--set", "rate=0"], "--set rate must be > 0, got 0"),  # not --rate, never typed
        (["--set", "arrival_trace=t.jsonl"], "--set arrival_trace is read by --arrival replay"),
        (["--set", "on_s=5"], "--set on_s is read by --arrival bursty only"),
        (["--arrival", "replay", "--set", "off_s=5"], "--set off_s is read by --arrival bursty"),
        (["--rate", "-1"], "--rate must be > 0, got -1"),  # not 'knob rate', the API's word
        (["--set", "turns=0"], "--set turns must be >= 1, got 0"),
    ],
)
def test_gen_refuses_options_it_would_ignore_or_a_name_read_back_wrong(
    args, phrase, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["trace", "gen", "chat", "-n", "3", "-o", "t.jsonl", *args], capsys)
    assert code == 2 and out == "" and phrase in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_gen_to_standard_output_pipes_into_stats(tmp_path):
    gen = [sys.executable, "-m", "kvsim", "trace", "gen", "chat", "-n", "4", "--seed", "1"]
    piped = subprocess.run([*gen, "-o", "-"], capture_output=True, check=True, cwd=ROOT)
    assert piped.stderr.startswith(b"wrote 4 chat requests")
    subprocess.run([*gen, "-o", tmp_path / "t.jsonl"], capture_output=True, check=True, cwd=ROOT)
    assert piped.stdout == (tmp_path / "t.jsonl").read_bytes()
    # -o /dev/stdout is standard output too: the report went into the trace as a last line
    named = subprocess.run([*gen, "-o", "/dev/stdout"], capture_output=True, check=True, cwd=ROOT)
    assert (named.stdout, named.stderr) == (piped.stdout, piped.stderr)
    stats = subprocess.run(
        [sys.executable, "-m", "kvsim", "trace", "stats", "-", "--json"],
        input=piped.stdout,
        capture_output=True,
        check=True,
        cwd=ROOT,
    )
    assert json.loads(stats.stdout)["summary"]["requests"] == 4


@pytest.mark.parametrize(
    ("knobs", "phrase"),
    [
        ({"arrival_trace": SAMPLE}, "knob arrival_trace is read by arrival='replay' only"),
        (
            {"arrival": "bursty", "arrival_trace": SAMPLE},
            "knob arrival_trace is read by arrival='replay' only",
        ),
        (
            {"arrival": "replay", "arrival_trace": SAMPLE, "rate": 2.0},
            "knob rate does not apply to arrival='replay': the trace's times are kept",
        ),
        ({"on_s": 5.0}, "knob on_s is read by arrival='bursty' only"),
        ({"arrival": "replay", "arrival_trace": SAMPLE, "off_s": 5.0}, "knob off_s is read by"),
    ],
)
def test_generate_refuses_a_knob_its_arrival_process_does_not_read(knobs, phrase):
    with pytest.raises(InputError) as exc:  # each was ignored without a word
        generate("chat", 3, **knobs)
    assert str(exc.value).startswith(phrase)


def test_a_mix_replays_and_refuses_whole_mix_knobs_in_one_component():
    reqs = generate("mix", 20, arrival="replay", arrival_trace=SAMPLE)  # rate's default: fine
    src = [r.arrival_s for r in open_trace(SAMPLE, limit=20)]
    assert [r.arrival_s for r in reqs] == pytest.approx([t - src[0] for t in src])
    for name, value in (("rate", 9.0), ("block_tokens", 16), ("arrival", "bursty")):
        with pytest.raises(InputError, match=rf"component_knobs\.chat\.{name}: one for the whole"):
            generate("mix", 5, component_knobs={"chat": {name: value}})
    with pytest.raises(InputError, match=r"component_knobs\.rag must be a mapping"):
        generate("mix", 5, component_knobs={"rag": 3})
    # a component's bad value is named by its path, where it was set
    with pytest.raises(InputError, match=r"^knob component_knobs\.chat\.turns must be >= 1, got 0"):
        generate("mix", 5, component_knobs={"chat": {"turns": 0}})
    # knobs for a kind the mix does not weigh were never read: a misspelt kind went unsaid
    with pytest.raises(InputError, match=r"component_knobs\.chatt: .*did you mean 'chat'"):
        generate("mix", 5, component_knobs={"chatt": {"turns": 3}})
    with pytest.raises(InputError, match=r"component_knobs\.rag: not a kind of this mix's"):
        generate("mix", 5, weights={"chat": 1}, component_knobs={"rag": {"n_docs": 3}})
    assert generate("mix", 5, weights={"chat": 1, "rag": 0}, component_knobs={"rag": {}})


def test_generate_counts_its_requests_in_batches():
    calls: list[int] = []
    reqs = generate("agent", 2500, seed=3, progress=calls.append)
    assert calls == [1024, 1024, 452] and reqs == generate("agent", 2500, seed=3)
    with pytest.raises(InputError, match="progress: True, False, None or a callable"):
        generate("chat", 3, progress="yes")


def test_gen_progress_goes_to_stderr_and_leaves_the_bytes_alone(tmp_path):
    gen = [sys.executable, "-m", "kvsim", "trace", "gen", "agent", "-n", "1500", "-o", "-"]
    runs = {
        flag: subprocess.run([*gen, flag], capture_output=True, check=True, cwd=ROOT)
        for flag in ("--progress", "--no-progress")
    }
    shown, quiet = runs["--progress"], runs["--no-progress"]
    assert shown.stdout == quiet.stdout and shown.stdout.count(b"\n") == 1500
    assert b"generating agent: 100%" in shown.stderr and b"1500/1500" in shown.stderr
    assert (
        quiet.stderr.startswith(b"wrote 1500 agent requests") and b"generating" not in quiet.stderr
    )
    default = subprocess.run(gen, capture_output=True, check=True, cwd=ROOT)  # stderr: a pipe
    assert default.stderr == quiet.stderr and default.stdout == quiet.stdout


def test_knobs_given_as_a_mapping_name_no_keyword_of_generate():
    """A sweep spec's trace keys are knobs: ``progress`` there is an unknown knob, not a
    bar turned on; and the API's ``block_tokens`` is checked before it is read."""
    import kvsim
    from kvsim.sweeps.spec import SweepSpec
    from kvsim.traces.synthetic import WorkloadSpec

    spec = WorkloadSpec.from_mapping({"kind": "chat", "n_requests": 5, "progress": True})
    with pytest.raises(InputError, match=r"unknown knob.*progress"):
        spec.requests()
    with pytest.raises(InputError, match=r"unknown knob.*progress"):
        SweepSpec.load({"traces": [{"kind": "chat", "n_requests": 5, "progress": True}]})
    with pytest.raises(InputError, match="block_tokens must be a number, got 'abc'"):
        kvsim.generate("chat", 10, block_tokens="abc")
