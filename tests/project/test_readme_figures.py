"""The README's "two questions" section and the docs' tier answer: their figures exist and
their commands name real options.

The sections answer the main questions end to end with commands a reader copies; a renamed
option or a lost figure would make them lie, so both are checked here. The numbers they
paste are real outputs of those commands and are not re-run (that takes minutes).
"""

from __future__ import annotations

import itertools
import re
import shlex

import click
import pytest
from support import ROOT

from kvsim.cli import cli
from kvsim.specs.hardware import GPUS
from kvsim.specs.models import MODELS

SECTION_TITLE = "## The two questions, answered end to end"
FIGURES = ("docs/figures/capacity_policies.png", "docs/figures/ttft_offload.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_FIGURE_BYTES = 160_000


def _readme() -> str:
    return _read("README.md")


def _read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _section(readme: str, title: str = SECTION_TITLE) -> str:
    """The section's text, from its title up to the next title of its level or above."""
    start = readme.index(title)
    level = title.split(" ")[0]
    ends = [readme.find(f"\n{'#' * n} ", start + len(title)) for n in range(2, len(level) + 1)]
    end = min((e for e in ends if e != -1), default=len(readme))
    return readme[start:end]


def _shown_commands(section: str) -> list[str]:
    """Every `kvsim ...` command line: in code blocks (continuations joined; in an output
    block only the `$ ` prompt lines, the rest being output) and in the prose's code spans."""
    commands: list[str] = []
    for lang, block in re.findall(r"```([a-z]*)\n(.*?)```", section, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            if line.startswith("$ kvsim ") or (lang == "bash" and line.startswith("kvsim ")):
                commands.append(line.removeprefix("$ ").strip())
    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if span.startswith("kvsim "):
            commands.append(span)
    return commands


def _resolve(words: list[str]) -> tuple[click.Command, str]:
    """The click command a `kvsim` command line runs (sub-groups followed) and its name."""
    command: click.Command = cli
    names = []
    for word in words:
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        ctx = click.Context(command)
        found = command.get_command(ctx, word)
        assert found is not None, f"shown: an unknown command: kvsim {word}"
        command = found
        names.append(word)
    return command, " ".join(names)


def _option_names(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def _unknown_options(line: str) -> tuple[str, list[str]]:
    """The command's name and the options on LINE that the command does not have."""
    words = shlex.split(line)[1:]
    command, name = _resolve(words)
    known = _option_names(command)
    used = [w.split("=", 1)[0] for w in words if w.startswith("-") and len(w) > 1]
    return name, [w for w in used if w not in known]


def test_section_comes_after_the_quick_start_and_before_the_command_table():
    readme = _readme()
    titles = [line for line in readme.splitlines() if line.startswith("## ")]
    i = titles.index(SECTION_TITLE)
    assert titles.index("## Quick start") < i < titles.index("## Commands")


@pytest.mark.parametrize("figure", FIGURES)
def test_figure_exists_is_shown_and_made_by_a_shown_command(figure):
    _check_figure(_section(_readme()), figure)


def _check_figure(section: str, figure: str, shown_as: str | None = None) -> None:
    """A small PNG, displayed in ``section`` (as ``shown_as``: the link relative to the
    page) and made there by a shown `kvsim plot`."""
    data = (ROOT / figure).read_bytes()
    assert data[:8] == PNG_MAGIC
    assert 10_000 < len(data) <= MAX_FIGURE_BYTES
    assert f"]({shown_as or figure})" in section  # displayed as an image
    makers = [c for c in _shown_commands(section) if f"--out {figure}" in c]
    assert makers and all(c.startswith("kvsim plot ") for c in makers)


def _checked_command_names(section: str) -> set[str]:
    """The kvsim commands ``section`` shows, each checked to use only options it has."""
    names = set()
    for line in _shown_commands(section):
        name, unknown = _unknown_options(line)
        assert not unknown, f"section: `{line}` uses {unknown}, unknown to kvsim {name}"
        names.add(name)
    return names


def test_every_option_shown_in_the_section_exists():
    # the section answers with these commands; losing one would empty the check
    assert {"mrc", "sweep", "plot", "simulate"} <= _checked_command_names(_section(_readme()))


def test_the_option_check_catches_a_misspelt_option():
    name, unknown = _unknown_options("kvsim mrc TRACE --model llama-3.1-8b --polcy arc")
    assert (name, unknown) == ("mrc", ["--polcy"])
    assert _unknown_options("kvsim trace stats T --limit 5 --bogus")[1] == ["--bogus"]


def test_the_shown_trace_model_and_gpu_exist():
    commands = _shown_commands(_section(_readme()))
    values: dict[str, set[str]] = {}
    for line in commands:
        words = shlex.split(line)
        for flag, value in itertools.pairwise(words):
            values.setdefault(flag, set()).add(value)
    assert values["--model"] == {"llama-3.1-8b"} and "llama-3.1-8b" in MODELS
    assert values["--gpu"] <= set(GPUS)
    traces = {w for c in commands for w in shlex.split(c) if w.startswith("traces/")}
    assert traces and all((ROOT / t).is_file() for t in traces)
    simulate = [c for c in commands if c.startswith("kvsim simulate ") and "--out" in c]
    assert simulate and all("--baseline" in c for c in simulate)


TIER_PAGE = "docs/secondary-tiers.md"
TIER_TITLE = "## Is an NVMe tier worth it?"
TIER_FIGURE = "docs/figures/tiers_timed.png"


def test_the_tier_answer_shows_its_figure_and_real_commands():
    """The secondary-tier answer (issue 16): its figure exists and is made by a shown
    command, every option it shows exists, and the sweep spec it runs is in the checkout."""
    section = _section(_read(TIER_PAGE), TIER_TITLE)
    _check_figure(section, TIER_FIGURE, shown_as="figures/tiers_timed.png")
    assert {"replay", "sweep", "plot", "simulate"} <= _checked_command_names(section)
    commands = _shown_commands(section)
    specs = {w for c in commands for w in shlex.split(c) if w.endswith(".yaml")}
    assert specs and all((ROOT / spec).is_file() for spec in specs)


def test_the_python_example_quotes_what_the_same_cli_run_printed():
    """The Python section's ``simulate`` is question 2's command (same trace, limit, scale,
    tier): its quoted median TTFTs must be that table's (they once kept an older run's)."""
    readme = _readme()
    quoted = re.search(
        r'run\.summary\["median_ttft_ms"\]\s+# ([\d.]+); "baseline_median_ttft_ms": ([\d.]+)',
        readme,
    )
    table = re.search(r"median TTFT \(ms\)\s+([\d,.]+)\s+([\d,.]+)", readme)
    assert quoted and table
    assert [float(v.replace(",", "")) for v in table.groups()] == [
        float(v) for v in quoted.groups()
    ]
    python = readme[readme.index("## In Python") :]
    assert "limit=1500, time_scale=2.5, baseline=True" in python and "cpu_gib=1024" in python
