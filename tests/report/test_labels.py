"""Issue 28 item 5: one home for labels, units and number formats; ``Result.compare()`` reads
like the CLI's table (no ``8.000000e+02``, no unit-less raw keys)."""

from __future__ import annotations

from support import SAMPLE, run_main

import kvsim
from kvsim.report.labels import format_metric, format_value, label_of


def test_numbers_read_alike_in_a_column():
    assert format_value(149.119) == "149.12" and format_value(15325.5) == "15,325.5"
    assert format_value(0.12345) == "0.1235" and format_value(1234567) == "1,234,567"
    assert format_metric("mean_ttft_ms", 35.889) == "35.89"
    assert format_metric("duration", 35.889, signed=True) == "+35.89"


def test_labels_carry_units():
    assert label_of("duration") == "duration (s)"
    assert label_of("p99_ttft_ms") == "P99 TTFT (ms)"
    assert label_of("max_output_tokens_per_s") == "peak output token throughput (tok/s)"
    assert label_of("some_new_key") == "some new key"


def test_compare_prints_as_the_cli_does(capsys):
    r = kvsim.simulate(SAMPLE, limit=30, cpu_gib=64, baseline=True, time_scale=8)
    c = r.compare()
    text = repr(c)
    assert "e+0" not in text and "duration (s)" in text and "mean TTFT (ms)" in text
    assert "max_output_tokens_per_s" not in text
    assert c.loc["duration", "ratio"] == 1.0 or c.loc["duration", "ratio"] > 0  # still numbers
    assert "<table" in c._repr_html_() and "duration (s)" in c._repr_html_()
    code, out, _ = run_main(
        ["simulate", SAMPLE, "--limit", "30", "--cpu-gib", "64", "--baseline", "--time-scale", "8"],
        capsys,
    )
    assert code == 0
    cli = {
        ln.split("  ")[0]: ln.split()[-4] for ln in out.splitlines() if ln.startswith("duration")
    }
    shown = c.formatted().loc["duration (s)", "offload"]
    assert cli["duration (s)"] == shown  # the same label and the same digits
