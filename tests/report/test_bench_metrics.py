"""Timed results as ``vllm bench serve`` reports them (kvsim.report.serve_metrics), the overload
warning, ``--baseline``'s delta columns and long table, and metadata.json in every folder.

The hand-computed run: the synchronous loop, a linear step time (10 ms + 1 ms a token), one
running request at a time (``--max-num-seqs 1``), three requests that share nothing:

    request  arrives  prompt  output  scheduled  tokens at (s)
    0        0.0      100     4       0.0        0.110 0.121 0.132 0.143
    1        1.5      200     2       1.5        1.710 1.721
    2        1.5      50      1       1.721      1.781   (waits for request 1: queue 221 ms)

so TTFT = 110, 210, 281 ms; E2EL = 143, 221, 281 ms; TPOT = 11, 11 ms (request 2 has one
token); ITL = 11 ms four times; queue = 0, 0, 221 ms; the run lasts 1.781 s.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import itertools
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import REQUIRE_VLLM, SAMPLE, run_main

import kvsim
from kvsim.core.errors import InputError
from kvsim.report import serve_metrics
from kvsim.report.serve_metrics import (
    BenchSettings,
    OverloadWarning,
    inter_token_latencies,
    metric_fields,
    peak_rates,
    percentile_word,
)

DURATION = 1.781
TTFT = [110.0, 210.0, 281.0]
E2EL = [143.0, 221.0, 281.0]
TPOT = [11.0, 11.0]
ITL = [11.0] * 4
QUEUE = [0.0, 0.0, 221.0]


def pct(values: list[float], p: float) -> float:
    """The p-th percentile by linear interpolation between closest ranks, by hand."""
    s = sorted(values)
    rank = p / 100 * (len(s) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (rank - lo) * (s[hi] - s[lo])


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def hand(tmp_path: Path) -> dict[str, str]:
    trace = write_jsonl(
        tmp_path / "hand.jsonl",
        [
            {"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [1]},
            {"timestamp": 1500, "input_length": 200, "output_length": 2, "hash_ids": [2]},
            {"timestamp": 1500, "input_length": 50, "output_length": 1, "hash_ids": [3]},
        ],
    )
    compute = tmp_path / "compute.json"
    compute.write_text(json.dumps({"kind": "linear", "step_s": 0.01, "per_token_s": 0.001}))
    link = tmp_path / "link.json"
    link.write_text(
        json.dumps({"kind": "constant", "h2d_bytes_per_s": 1e10, "d2h_bytes_per_s": 1e10})
    )
    return {"trace": trace, "compute_profile": str(compute), "link": str(link)}


def run_hand(hand: dict[str, str], **kw: object) -> kvsim.Result:
    return kvsim.simulate(
        hand["trace"],
        compute_profile=hand["compute_profile"],
        link=hand["link"],
        async_scheduling=False,
        max_num_seqs=1,
        **kw,  # type: ignore[arg-type]
    )


def hand_args(hand: dict[str, str]) -> list[str]:
    return [
        "simulate",
        hand["trace"],
        "--compute-profile",
        hand["compute_profile"],
        "--link",
        hand["link"],
        "--no-async-scheduling",
        "--max-num-seqs",
        "1",
        "--no-progress",
    ]


# --- 1. the numbers, by hand ---


def test_hand_run_tables_are_what_the_docstring_says(hand) -> None:
    r = run_hand(hand, record_tokens=True)
    req = r.requests
    assert list(req.ttft_s * 1000) == pytest.approx(TTFT)
    assert list(req.e2e_s * 1000) == pytest.approx(E2EL)
    assert list(req.queue_s * 1000) == pytest.approx(QUEUE)
    tokens = r.tokens
    assert list(tokens.groupby("request").size()) == [4, 2, 1]
    assert list(tokens.time_s) == pytest.approx([0.11, 0.121, 0.132, 0.143, 1.71, 1.721, 1.781])
    assert list(tokens.token) == [0, 1, 2, 3, 0, 1, 0]


def test_latency_metrics_in_ms_as_vllm_computes_them(hand) -> None:
    s = run_hand(hand).summary
    for name, values in (("ttft", TTFT), ("tpot", TPOT), ("itl", ITL), ("e2el", E2EL)):
        assert s[f"mean_{name}_ms"] == pytest.approx(statistics.fmean(values)), name
        assert s[f"median_{name}_ms"] == pytest.approx(statistics.median(values)), name
        assert s[f"std_{name}_ms"] == pytest.approx(statistics.pstdev(values), abs=1e-9), name
        assert s[f"p99_{name}_ms"] == pytest.approx(pct(values, 99)), name
    assert s["p99_ttft_ms"] == pytest.approx(210 + 0.98 * 71)  # between the 2nd and 3rd
    assert s["mean_queue_ms"] == pytest.approx(221 / 3)
    assert s["p99_queue_ms"] == pytest.approx(0.98 * 221)


def test_counts_throughput_and_peaks(hand) -> None:
    s = run_hand(hand).summary
    assert (s["completed"], s["failed"]) == (3, 0)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (350, 7)
    assert s["duration"] == pytest.approx(DURATION)
    assert s["request_throughput"] == pytest.approx(3 / DURATION)
    assert s["output_throughput"] == pytest.approx(7 / DURATION)
    assert s["total_token_throughput"] == pytest.approx(357 / DURATION)
    assert s["request_goodput"] is None  # no SLO given: vLLM writes null
    # 4 tokens in second 0, 3 in second 1; 2 requests in flight in second 1
    assert (s["max_output_tokens_per_s"], s["max_concurrent_requests"]) == (4.0, 2)
    # load: 350 prompt tokens over 1.5 s of arrivals, over 0.424 s of compute
    busy = 0.11 + 0.033 + 0.21 + 0.011 + 0.06
    assert s["offered_prompt_tok_s"] == pytest.approx(350 / 1.5)
    assert s["sustainable_prompt_tok_s"] == pytest.approx(350 / busy)
    assert s["gpu_busy_frac"] == pytest.approx(busy / DURATION)
    assert s["queue_share_of_ttft"] == pytest.approx(221 / 601)
    assert s["overloaded"] is False


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        ({"ttft": 250}, 2),  # request 2 (281 ms) misses
        ({"ttft": 300}, 3),
        ({"ttft": 300, "tpot": 10}, 1),  # only request 2: one token, its TPOT counts as 0
        ({"e2el": 200}, 1),
        ({"ttft": 100}, 0),
    ],
)
def test_goodput_counts_requests_meeting_every_slo(hand, slos, good) -> None:
    s = run_hand(hand, goodput=slos).summary
    assert s["request_goodput"] == pytest.approx(good / DURATION)


def test_percentiles_and_metrics_are_configurable(hand) -> None:
    s = run_hand(hand, percentile_metrics="ttft,itl", metric_percentiles="25,50,99.9").summary
    assert s["p25_ttft_ms"] == pytest.approx(pct(TTFT, 25))
    assert s["p50_ttft_ms"] == pytest.approx(210.0)
    assert s["p99.9_ttft_ms"] == pytest.approx(pct(TTFT, 99.9))
    assert "p99.9_itl_ms" in s and "p99_ttft_ms" not in s
    assert not any(k.endswith(("_tpot_ms", "_e2el_ms", "_queue_ms")) for k in s)


def test_settings_check_their_input() -> None:
    assert BenchSettings.make(None, "50, 99", "ttft:500 tpot:50").goodput == (
        ("ttft", 500.0),
        ("tpot", 50.0),
    )
    assert BenchSettings.make(goodput=["e2el:1e3"]).goodput == (("e2el", 1000.0),)
    # the JSON form --help shows, as the command line passes it: one string
    assert BenchSettings.make(goodput='{"ttft": 2000, "tpot": 50}').goodput == (
        ("ttft", 2000.0),
        ("tpot", 50.0),
    )
    for kwargs, phrase in (
        ({"goodput": '{"ttft": 2000'}, "not valid JSON"),
        ({"goodput": '{"ttft": [1]}'}, "not a number"),
        ({"percentile_metrics": "ttft,latency"}, "latency"),
        ({"metric_percentiles": "50,101"}, "outside 0..100"),
        ({"metric_percentiles": "p99"}, "not a number"),
        ({"goodput": "itl:5"}, "unknown metric 'itl'"),
        ({"goodput": "ttft=5"}, "METRIC:MS"),
        ({"goodput": {"ttft": -1}}, "non-negative"),
    ):
        with pytest.raises(InputError, match=phrase):
            BenchSettings.make(**kwargs)  # type: ignore[arg-type]


def test_empty_metrics_report_zero_and_percentile_names_follow_vllm() -> None:
    assert metric_fields("tpot", [], [99.0]) == {  # type: ignore[arg-type]
        "mean_tpot_ms": 0.0,
        "median_tpot_ms": 0.0,
        "std_tpot_ms": 0.0,
        "p99_tpot_ms": 0.0,
    }
    assert [percentile_word(p) for p in (99.0, 99.9, 50)] == ["99", "99.9", "50"]


# --- 2. the CLI: table, JSON, errors ---


def test_cli_prints_ms_metrics_and_goodput(hand, capsys) -> None:
    args = [*hand_args(hand), "--goodput", "ttft:250", "--metric-percentiles", "50,99"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    rows = dict(re.findall(r"^(\S.*?)\s{2,}(\S+)$", out, flags=re.M))
    assert rows["mean TTFT (ms)"] == "200.33"
    assert rows["P50 TTFT (ms)"] == "210.00"
    assert rows["P99 queue (ms)"] == f"{0.98 * 221:.2f}"
    assert rows["request goodput (req/s)"] == f"{2 / DURATION:.2f}"
    assert "overloaded" not in err


def test_bad_bench_options_are_one_line_errors(hand, capsys) -> None:
    for extra in (["--goodput", "ttft"], ["--metric-percentiles", "x"], ["--save-detailed"]):
        code, _, err = run_main([*hand_args(hand), *extra], capsys)
        assert code == 2 and err.startswith("kvsim: error:") and len(err.splitlines()) == 1, err


#: ``vllm bench serve``'s result fields kvsim writes (vLLM 0.33's serve.py, read by hand)
FIXED_VLLM_FIELDS = (
    "backend",
    "label",
    "model_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "errors",
    "server_queue_times",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    *(
        f"{stat}_{metric}_ms"
        for metric in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p99")
    ),
)
#: kvsim's own: the queue time, named as vLLM names a metric
KVSIM_EXTRA = re.compile(r"^(mean|median|std|p[\d.]+)_queue_ms$")


def detailed_bench(hand, tmp_path, capsys) -> dict[str, object]:
    out = tmp_path / "run"
    args = [*hand_args(hand), "--goodput", "ttft:250", "--save-detailed", "--out", out]
    code, _, err = run_main(args, capsys)
    assert code == 0, err
    return json.loads((out / "bench.json").read_text())


def test_bench_json_has_vllms_fields_and_per_request_lists(hand, tmp_path, capsys) -> None:
    bench = detailed_bench(hand, tmp_path, capsys)
    assert set(FIXED_VLLM_FIELDS) <= set(bench)
    assert [k for k in bench if k not in FIXED_VLLM_FIELDS and not KVSIM_EXTRA.match(k)] == []
    assert bench["completed"] == 3 and bench["request_goodput"] == pytest.approx(2 / DURATION)
    assert bench["ttfts"] == pytest.approx([t / 1000 for t in TTFT])
    assert [len(i) for i in bench["itls"]] == [3, 1, 0]  # type: ignore[union-attr]
    assert list(itertools.chain(*bench["itls"])) == pytest.approx([0.011] * 4)  # type: ignore[arg-type]
    assert bench["server_queue_times"] == pytest.approx([q / 1000 for q in QUEUE])
    assert bench["input_lens"] == [100, 200, 50] and bench["output_lens"] == [4, 2, 1]
    assert bench["errors"] == ["", "", ""]


def _dict_keys(d: ast.Dict) -> set[str]:
    return {k.value for k in d.keys if isinstance(k, ast.Constant)}


def _returned_keys(tree: ast.AST) -> dict[str, set[str]]:
    """Function name -> keys of the dict literals it returns."""
    out: dict[str, set[str]] = {}
    for f in ast.walk(tree):
        if isinstance(f, ast.FunctionDef):
            returns = [r.value for r in ast.walk(f) if isinstance(r, ast.Return)]
            out[f.name] = set().union(*(_dict_keys(v) for v in returns if isinstance(v, ast.Dict)))
    return out


def _result_store(node: ast.AST) -> ast.expr | None:
    """The key of a ``result[...] = ...`` / ``result_json[...] = ...`` store."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)):
        return None
    name = getattr(node.value, "id", "")
    return node.slice if name in ("result", "result_json") else None


def _updated_from(node: ast.AST) -> str | None:
    """``f`` of a ``result.update(f(...))`` call."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
        return None
    func, arg = node.func, node.args[0]
    updates_result = func.attr == "update" and getattr(func.value, "id", "") == "result"
    return getattr(arg.func, "id", None) if updates_result and isinstance(arg, ast.Call) else None


def vllm_result_names() -> tuple[set[str], list[re.Pattern[str]]] | None:
    """The names ``vllm bench serve`` writes, read from its source (without importing it):
    keys of the dicts it assigns to ``result``, of the dicts returned by the functions whose
    result it ``result.update``s, of its ``result[...]`` / ``result_json[...]`` stores, and
    the f-string templates of its per-metric fields over the metrics it reports."""
    spec = importlib.util.find_spec("vllm")
    # an installed vLLM is a regular package; from a checkout without it, the tests' own
    # tests/vllm folder is found as a namespace package (no origin), which is not vLLM
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / "benchmarks" / "serve.py"
    tree = ast.parse(source.read_text())
    returned = _returned_keys(tree)
    names: set[str] = set()
    templates: list[ast.JoinedStr] = []
    metrics: set[str] = set()
    for node in ast.walk(tree):
        key = _result_store(node)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(getattr(t, "id", "") == "result" for t in node.targets):
                names |= _dict_keys(node.value)
        elif isinstance(key, ast.Constant):
            names.add(key.value)
        elif isinstance(key, ast.JoinedStr):
            templates.append(key)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "process_one_metric":
            metrics.add(node.args[0].value)  # type: ignore[attr-defined]
        elif (function := _updated_from(node)) is not None:
            names |= returned.get(function, set())
    return names, [_template(t, metrics) for t in templates]


def _template(t: ast.JoinedStr, metrics: set[str]) -> re.Pattern[str]:
    """An f-string field name as a pattern: ``metric_attribute_name`` is one of ``metrics``."""
    parts = []
    for v in t.values:
        if isinstance(v, ast.Constant):
            parts.append(re.escape(v.value))
        elif getattr(v.value, "id", "") == "metric_attribute_name":  # type: ignore[attr-defined]
            parts.append(f"(?:{'|'.join(sorted(metrics))})")
        else:
            parts.append(r"[\d.]+")
    return re.compile("^" + "".join(parts) + "$")


@pytest.mark.vllm
def test_bench_json_names_are_the_ones_in_vllms_source(hand, tmp_path, capsys) -> None:
    found = vllm_result_names()
    if found is None:
        if REQUIRE_VLLM:
            pytest.fail("KVSIM_REQUIRE_VLLM=1 but vllm's source is not installed")
        pytest.skip("vllm is not installed: its source cannot be read")
    names, templates = found
    assert len(templates) >= 4  # mean, median, std and the percentiles

    def vllm_has(key: str) -> bool:
        return key in names or any(t.match(key) for t in templates)

    assert [k for k in FIXED_VLLM_FIELDS if not vllm_has(k)] == []
    bench = detailed_bench(hand, tmp_path, capsys)
    assert [k for k in bench if not vllm_has(k) and not KVSIM_EXTRA.match(k)] == []
    assert vllm_has("p99.9_itl_ms") and not vllm_has("p99_queue_ms")


# --- 3. --baseline: delta columns and the long table ---


def test_baseline_prints_deltas_and_writes_a_long_table(tmp_path, capsys) -> None:
    trace = write_jsonl(
        tmp_path / "reuse.jsonl",
        [
            {"timestamp": t, "input_length": 2048, "output_length": 2, "hash_ids": [1, 2, 3, 4]}
            for t in (0, 5000)
        ],
    )
    out = tmp_path / "run"
    args = ["simulate", trace, "--no-prefix-caching", "--cpu-chunks", "16", "--baseline"]
    code, text, err = run_main([*args, "--no-progress", "--out", out], capsys)
    assert code == 0, err
    header = next(line for line in text.splitlines() if "delta %" in line)
    assert header.split() == ["offload", "no", "offload", "delta", "delta", "%"]
    row = next(line for line in text.splitlines() if line.startswith("mean TTFT (ms)"))
    a, b, d, p = (float(v.rstrip("%").replace(",", "")) for v in row.split()[3:])
    assert a < b and d == pytest.approx(a - b, abs=0.011)
    assert p == pytest.approx(100 * (a - b) / b, abs=0.06)
    long = pd.read_csv(out / "metrics.csv")
    assert list(long.columns) == ["run", "metric", "value"]
    assert set(long.run) == {"offload", "baseline"}
    s = json.loads((out / "summary.json").read_text())
    got = long.set_index(["run", "metric"]).value
    assert got["offload", "mean_ttft_ms"] == pytest.approx(s["mean_ttft_ms"])
    assert got["baseline", "mean_ttft_ms"] == pytest.approx(s["baseline_mean_ttft_ms"])
    base = json.loads((out / "baseline_bench.json").read_text())
    assert base["label"] == "baseline" and base["mean_ttft_ms"] == pytest.approx(b, abs=0.01)


# --- 4. the overload warning ---


def burst_trace(tmp_path: Path, name: str, gap_ms: int) -> str:
    """40 requests of 2000 prompt tokens; each takes 0.21 s to prefill (linear model)."""
    return write_jsonl(
        tmp_path / f"{name}.jsonl",
        [
            {
                "timestamp": i * gap_ms,
                "input_length": 2000,
                "output_length": 10,
                "hash_ids": [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3],
            }
            for i in range(40)
        ],
    )


def overload_args(tmp_path: Path, trace: str) -> list[object]:
    compute = tmp_path / "c.json"
    compute.write_text(json.dumps({"kind": "linear", "step_s": 0.01, "per_token_s": 0.0001}))
    return ["simulate", trace, "--compute-profile", compute, "--no-progress"]


def test_an_overloaded_run_says_so_on_stderr(tmp_path, capsys) -> None:
    trace = burst_trace(tmp_path, "heavy", 100)  # 20,513 prompt tokens/s offered
    code, out, err = run_main(overload_args(tmp_path, trace), capsys)
    assert code == 0
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: warning: overloaded"), err
    found = re.search(r"offered ([\d,]+) vs sustainable ~([\d,]+) prompt tokens/s", err)
    assert found, err
    offered, sustainable = (float(v.replace(",", "")) for v in found.groups())
    assert offered == pytest.approx(40 * 2000 / 3.9, abs=1)
    assert sustainable < offered
    assert "arrivals outpace the GPU" in err
    assert re.search(r"^mean queue \(ms\)\s+[\d,.]+$", out, flags=re.M)  # queue in the table
    assert re.search(r"^queueing share of TTFT\s+0\.\d+$", out, flags=re.M)


def test_a_light_run_does_not_warn(tmp_path, capsys) -> None:
    trace = burst_trace(tmp_path, "light", 1000)
    code, out, err = run_main(overload_args(tmp_path, trace), capsys)
    assert code == 0 and err == ""
    assert "mean queue (ms)" in out


def test_the_api_warns_with_a_category_of_its_own(tmp_path) -> None:
    trace = burst_trace(tmp_path, "heavy", 100)
    compute = tmp_path / "c.json"
    compute.write_text(json.dumps({"kind": "linear", "step_s": 0.01, "per_token_s": 0.0001}))
    with pytest.warns(OverloadWarning, match="offered 20,513 vs sustainable"):
        s = kvsim.simulate(trace, compute_profile=str(compute), record_steps=False).summary
    assert s["overloaded"] is True and s["gpu_busy_frac"] > 0.95
    assert s["offered_prompt_tok_s"] == pytest.approx(40 * 2000 / 3.9)


def test_queueing_that_dominates_ttft_is_overload(tmp_path) -> None:
    """All requests at once, one at a time (max_num_seqs 1): the tenth waits for nine."""
    trace = write_jsonl(
        tmp_path / "queue.jsonl",
        [
            {"timestamp": 0, "input_length": 100, "output_length": 20, "hash_ids": [i]}
            for i in range(10)
        ],
    )
    compute = tmp_path / "c.json"
    compute.write_text(json.dumps({"kind": "linear", "step_s": 0.01, "per_token_s": 0.001}))
    with pytest.warns(OverloadWarning, match=r"queueing is \d+% of TTFT"):
        s = kvsim.simulate(trace, compute_profile=str(compute), max_num_seqs=1).summary
    assert s["offered_prompt_tok_s"] is None  # no arrival span: no rate to compare
    assert s["queue_share_of_ttft"] > 0.5


# --- 5. metadata.json in every folder kvsim writes ---


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_metadata(folder: Path, trace: str) -> dict[str, object]:
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["kvsim_version"] == kvsim.__version__
    [identity] = meta["traces"]
    assert identity["sha256"] == sha256(trace) and identity["bytes"] == Path(trace).stat().st_size
    assert not list(folder.glob(".metadata.json.*"))  # no temp file left
    return meta


def test_simulate_out_has_metadata_listed_in_its_set(hand, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, _, err = run_main([*hand_args(hand), "--goodput", "ttft:250", "--out", out], capsys)
    assert code == 0, err
    meta = check_metadata(out, hand["trace"])
    config = meta["config"]
    assert isinstance(config, dict)
    assert config["max_num_seqs"] == 1 and config["async_scheduling"] is False
    assert config["compute"] == {"step_s": 0.01, "per_token_s": 0.001}
    assert config["bench"]["goodput"] == {"ttft": 250.0}
    marker = json.loads((out / ".kvsim-run.json").read_text())
    assert "metadata.json" in marker["files"] and "bench.json" in marker["files"]


def test_result_save_writes_metadata_too(hand, tmp_path) -> None:
    written = run_hand(hand).save(tmp_path / "saved")
    assert "metadata.json" in written
    check_metadata(tmp_path / "saved", hand["trace"])


def test_sweep_out_has_metadata(tmp_path, capsys) -> None:
    out = tmp_path / "sweep"
    code, _, err = run_main(
        [
            *("sweep", "--trace", SAMPLE, "--limit", "20", "--cpu-chunks", "10,20"),
            *("--executor", "serial", "--no-progress", "--out", out),
        ],
        capsys,
    )
    assert code == 0, err
    meta = check_metadata(out, SAMPLE)
    assert meta["command"] == "sweep" and meta["config"]["grid"] == {"cpu_chunks": [10, 20]}


def test_trace_stats_plot_folder_has_metadata(tmp_path, capsys) -> None:
    figs = tmp_path / "figs"
    code, _, err = run_main(["trace", "stats", SAMPLE, "--limit", "30", "--plot", figs], capsys)
    assert code == 0, err
    meta = check_metadata(figs, SAMPLE)
    assert meta["command"] == "trace stats" and meta["config"]["limit"] == 30


# --- 6. the vectorised peaks against vLLM's own loops ---


def vllm_peaks(starts: list[float], ends: list[float], times: list[list[float]]) -> tuple:
    """``max_output_tokens_per_s`` and ``max_concurrent_requests`` as vLLM's serve.py loops
    compute them (one-second buckets from the first start)."""
    first, last = min(starts), max(ends)
    seconds = int(np.ceil(last - first)) + 1
    tokens, concurrent = [0] * seconds, [0] * seconds
    for start, end, ts in zip(starts, ends, times):
        for t in ts:
            if 0 <= int(t - first) < seconds:
                tokens[int(t - first)] += 1
        for second in range(int(start - first), int(end - first) + 1):
            concurrent[second] += 1
    return float(max(tokens)), max(concurrent)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("batch", [1 << 20, 7])
@pytest.mark.parametrize("dense", [1 << 22, 0])
def test_peaks_match_vllms_loops(seed, batch, dense, monkeypatch) -> None:
    """Token times are counted a batch at a time (``batch``: a small one crosses batches
    mid-run), per second of the run or (``dense`` 0) only at the seconds something
    happens in; the peaks are vLLM's every way."""
    monkeypatch.setattr(serve_metrics, "_PEAK_BATCH", batch)
    monkeypatch.setattr(serve_metrics, "_DENSE_SECONDS", dense)
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.uniform(0, 20, 30))
    times = [s + np.cumsum(rng.exponential(0.3, rng.integers(1, 40))) for s in starts]
    ends = np.array([t[-1] for t in times])
    want = vllm_peaks(list(starts), list(ends), [list(t) for t in times])
    assert peak_rates(starts, ends, iter(times)) == want


def test_peaks_of_requests_ages_apart_take_memory_by_tokens_not_span() -> None:
    """Three requests, the last 10^15 s (and then 10^300 s) after the others: a count per
    second of that span would need petabytes (it ran out of memory, or overflowed int64)."""
    for far in (1e15, 1e300):
        starts = np.array([0.0, 0.5, far])
        times = [np.array([0.1, 0.2, 0.9]), np.array([0.6, 0.7]), far + np.array([1.0, 1.5])]
        ends = np.array([t[-1] for t in times])
        # second 0 holds 0.1, 0.2, 0.9, 0.6, 0.7; two requests in flight there
        assert peak_rates(starts, ends, iter(times)) == (5.0, 2)


def test_itls_pool_every_requests_gaps() -> None:
    gaps = [np.array([0.1, 0.2], np.float32), np.array([0.3], np.float32)]
    assert list(inter_token_latencies(gaps)) == pytest.approx([0.1, 0.2, 0.3])
    assert len(inter_token_latencies([])) == 0
