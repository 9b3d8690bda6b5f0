"""Start-up: commands load when run, so `kvsim --help` and `kvsim policies` stay light."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys

import click
import pytest

import kvsim.cli
from kvsim.cli import COMMAND_TABLE, HELP_LIMIT, cli

HEAVY = ("pandas", "matplotlib", "torch", "pyarrow")


def test_table_names_every_command_with_its_own_help():
    """The table is the only list of commands: each cmd_* module's COMMANDS are in it, and its
    help line is the command's own (so `kvsim --help` cannot drift from `kvsim X --help`)."""
    found = {}
    for info in pkgutil.iter_modules(kvsim.cli.__path__):
        if info.name.startswith("cmd_"):
            module = importlib.import_module(f"kvsim.cli.{info.name}")
            for command in getattr(module, "COMMANDS", ()):
                found[command.name] = (info.name, command)
    assert set(found) == set(COMMAND_TABLE)
    for name, (module, attribute, short_help) in COMMAND_TABLE.items():
        command = getattr(importlib.import_module(f"kvsim.cli.{module}"), attribute)
        assert command is found[name][1]
        assert short_help == command.get_short_help_str(limit=HELP_LIMIT), name


def test_group_resolves_every_command_and_unknown_ones_fail():
    ctx = click.Context(cli)
    for name in COMMAND_TABLE:
        assert cli.get_command(ctx, name).name == name
    assert cli.get_command(ctx, "no-such-command") is None
    assert cli.list_commands(ctx) == sorted(COMMAND_TABLE)


@pytest.mark.parametrize("argv", [["--help"], ["policies"], ["models"], ["--version"]])
def test_light_commands_import_no_heavy_module(argv):
    assert _heavy_modules_after(argv) == []


def test_replay_with_rows_imports_no_table_library(tmp_path, monkeypatch):
    """A plain replay's wait is start-up, reading and the loop (issue 15): no pandas, and
    once the trace is cached neither pyarrow nor numpy (the first read parses with Arrow
    into numpy columns; a cached one reads plain records from the entry's bytes); rows
    written to a CSV load pyarrow's CSV writer (and numpy, which pyarrow imports), never
    pandas."""
    from support import SAMPLE

    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["replay", SAMPLE, "--cpu-chunks", "64"]
    heavy = (*HEAVY, "numpy")
    assert _heavy_modules_after(argv, heavy) == ["numpy", "pyarrow"]
    assert _heavy_modules_after(argv, heavy) == []
    argv += ["--requests-csv", str(tmp_path / "r.csv")]
    assert _heavy_modules_after(argv, heavy) == ["numpy", "pyarrow"]


def _heavy_modules_after(argv: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    code = (
        "import sys\n"
        "from kvsim.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


def test_help_lists_every_command_once():
    from click.testing import CliRunner

    out = CliRunner().invoke(cli, ["--help"]).output
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == sorted(COMMAND_TABLE)


@pytest.mark.parametrize("given", [None, "mimalloc"])
def test_commands_run_arrow_on_malloc_unless_told(given: str | None) -> None:
    """``main`` puts Arrow on the C library's allocator (tables written after a run reuse the
    engine's freed memory: docs/speed.md, "Memory"); a user's own choice stands."""
    code = (
        "import os\n"
        "from kvsim.cli import main\n"
        "try:\n    main(['policies'])\nexcept SystemExit:\n    pass\n"
        "import pyarrow\n"
        "print('pool', pyarrow.default_memory_pool().backend_name)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if given is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = given
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"pool {given or 'system'}"
