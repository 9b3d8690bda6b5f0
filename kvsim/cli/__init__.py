"""The ``kvsim`` command line: a thin layer that parses, calls the API and writes.

Each command lives in its own small file, ``kvsim/cli/cmd_*.py``, named in
:data:`COMMAND_TABLE` and imported only when it runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import click

from kvsim.core.ending import Terminated, end_on_signal, forget_ending
from kvsim.core.errors import EngineStalled, InputError, InputWarning

#: command -> (module under kvsim.cli, attribute, its short help at HELP_LIMIT characters).
#: Commands load on first use, so ``kvsim --help`` and ``kvsim policies`` never import
#: pandas, matplotlib or torch; a test keeps each help line equal to its command's own.
HELP_LIMIT = 80
COMMAND_TABLE: dict[str, tuple[str, str, str]] = {
    "accuracy": (
        "cmd_accuracy",
        "accuracy_command",
        "Re-create and simulate each experiment of a measurements FILE; print...",
    ),
    "bench": (
        "cmd_bench",
        "bench_command",
        "Time cache-mode replay on TRACE (default: the bundled Mooncake conversation...",
    ),
    "calibrate": (
        "cmd_real",
        "calibrate_command",
        "Measure host<->GPU copies (H2D, D2H, both at once; 4 KiB to 64 MiB) and write...",
    ),
    "calibrate-compute": (
        "cmd_real",
        "calibrate_compute_command",
        "Time the model's GEMMs, LM head and attention with torch; write a compute...",
    ),
    "cross-validate": (
        "cmd_accuracy",
        "cross_validate_command",
        "Leave one model out: for each model of FILE, fit the step-time model on the...",
    ),
    "fit-compute": (
        "cmd_accuracy",
        "fit_compute_command",
        "Fit the step-time model's few global parameters to the experiments of FILE...",
    ),
    "models": (
        "cmd_policies",
        "models_command",
        "List the model presets: KV bytes a token, parameters, weights as stored.",
    ),
    "mrc": (
        "cmd_mrc",
        "mrc_command",
        "Hit ratio at every CPU capacity of TRACE, in one pass over it: in chunks and...",
    ),
    "plot": (
        "cmd_plot",
        "plot_command",
        "Draw a KIND figure from RESULTS (a Parquet/CSV table or a results folder).",
    ),
    "policies": (
        "cmd_policies",
        "policies_command",
        "List every eviction and admission policy with a one-line description.",
    ),
    "replay": (
        "cmd_replay",
        "replay_command",
        "Replay TRACE in cache mode: requests one at a time, no timing.",
    ),
    "schema": (
        "cmd_schema",
        "schema_command",
        "Print the JSON Schema of NAME (e.g. kv-transfer-config); without NAME, list...",
    ),
    "simulate": (
        "cmd_simulate",
        "simulate_command",
        "Replay TRACE's arrivals through a modelled vLLM engine with CPU KV offloading.",
    ),
    "sweep": (
        "cmd_sweep",
        "sweep_command",
        "Run every combination of traces x grid values from SPEC (YAML) and/or the...",
    ),
    "trace": (
        "cmd_trace",
        "trace_group",
        "Inspect traces (`stats`) and generate synthetic ones (`gen`).",
    ),
    "validate": (
        "cmd_real",
        "validate_command",
        "Run TRACE twice through the same engine, manager and policies: simulated...",
    ),
}


def _shorten(text: str, limit: int) -> str:
    """``text`` cut at a word to fit ``limit`` characters, as click shortens command help."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 3)].rsplit(" ", 1)[0] + "..."


class _LazyGroup(click.Group):
    """A group whose commands are imported when run (or asked for), not at start-up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMAND_TABLE))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_TABLE:
            module, attribute, _ = COMMAND_TABLE[cmd_name]
            command = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(map(len, COMMAND_TABLE))
        rows = [(name, _shorten(COMMAND_TABLE[name][2], limit)) for name in sorted(COMMAND_TABLE)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="kvsim")
def cli() -> None:
    """kvsim: simulate LLM KV-cache offloading to CPU memory (vLLM OffloadingConnector semantics).

    Start with `kvsim replay TRACE --cpu-gib 64 --model llama-3.1-8b`.
    """


def one_line(text: str) -> str:
    """``text`` on one line: a newline or carriage return in it (a file name may hold one)
    is shown escaped, as Python writes it in a string."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


#: the signals that end a run as :class:`Terminated` (SIGHUP where the platform has it)
_ENDING_SIGNALS = [signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    """kvsim's own warnings as one line on stderr; others as Python prints them."""
    if issubclass(category, InputWarning):
        click.echo(f"kvsim: warning: {one_line(str(message))}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)  # type: ignore[arg-type]


_default_showwarning = warnings.showwarning


#: click 8.2+ raises this for a group called without a command (8.1 printed the help itself)
_NO_ARGS_IS_HELP: type[click.UsageError] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("_Never", (click.UsageError,), {})
)


def _usage_line(exc: click.UsageError) -> str:
    """click's usage error as one line, naming the command and where to look."""
    cmd = exc.ctx.command_path if exc.ctx is not None else "kvsim"
    return f"{cmd}: error: {exc.format_message()} (see '{cmd} --help')"


@contextlib.contextmanager
def _process_hooks() -> Iterator[None]:
    """SIGTERM and SIGHUP as an exception and kvsim's one-line warnings, for this call
    only: a caller that runs ``main`` in its own process (a test, a notebook) gets its
    handlers back."""
    previous_warning = warnings.showwarning
    previous: dict[int, Any] = {}
    forget_ending()
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        for signum in _ENDING_SIGNALS:
            previous[signum] = signal.signal(signum, end_on_signal)
    warnings.showwarning = _show_warning
    try:
        yield
    finally:
        forget_ending()
        warnings.showwarning = previous_warning
        for ending, handler in previous.items():
            signal.signal(ending, handler)


#: Arrow's allocator for a command: the C library's (malloc), not Arrow's default mimalloc.
#: Tables are written (Parquet) after the run, when the engine's memory is free: malloc
#: reuses it, where mimalloc maps pages of its own, so ``simulate --out`` peaked ~1 KB per
#: engine step higher (docs/speed.md, "Memory"). Read by Arrow at its first allocation, so
#: set before any command runs; a user's own setting stands.
ARROW_ALLOCATOR = ("ARROW_DEFAULT_MEMORY_POOL", "system")


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback; a
    timed run whose engine stalls (:class:`EngineStalled`) is one line and exit code 3."""
    os.environ.setdefault(*ARROW_ALLOCATOR)
    with _process_hooks():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    try:
        rv = cli.main(args=argv, prog_name="kvsim", standalone_mode=False)
    except InputError as exc:
        from kvsim.traces.readers import unspooled

        click.echo(f"kvsim: error: {one_line(unspooled(str(exc)))}", err=True)
        sys.exit(2)
    except EngineStalled as exc:  # a deadlock of vLLM's scheduling rules, not bad input
        click.echo(f"kvsim: error: {exc}", err=True)
        sys.exit(EngineStalled.exit_code)
    except click.exceptions.Abort:
        click.echo("kvsim: aborted", err=True)
        sys.exit(130)
    except _NO_ARGS_IS_HELP as exc:  # `kvsim`, `kvsim trace`: the help as it reads, not one line
        click.echo(exc.format_message(), err=True)
        sys.exit(2)
    except click.UsageError as exc:
        click.echo(one_line(_usage_line(exc)), err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"kvsim: error: {one_line(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("kvsim: interrupted", err=True)
        sys.exit(130)
    except Terminated as exc:
        hup = exc.signum != signal.SIGTERM
        with contextlib.suppress(OSError):  # after a hang-up, stderr may be gone too
            click.echo("kvsim: hung up" if hup else "kvsim: terminated", err=True)
        sys.exit(128 + int(exc.signum))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"kvsim: error: {one_line(f'{where}{exc.strerror or exc}')}", err=True)
        sys.exit(2)
    except SystemExit as exc:  # kvsim's commands never exit this way: a plugin's code did
        _exited(exc)
    except Exception as exc:
        _plugin_failed(exc)
        raise  # kvsim's own fault: its traceback is the report
    sys.exit(rv if isinstance(rv, int) else 0)


def _exited(exc: SystemExit) -> None:
    """An exit from inside a command: click's, after output to a closed pipe (``kvsim
    policies | head -1``: quiet, as a writer killed by SIGPIPE), else a plugin's."""
    if type(sys.stdout).__name__ == "_PacifyFlushWrapper":  # click's mark of that pipe
        sys.exit(128 + signal.SIGPIPE)
    click.echo(
        f"kvsim: error: code run by kvsim (a plugin?) called exit({exc.code!r}); "
        "the run did not finish",
        err=True,
    )
    sys.exit(2)


def _plugin_failed(exc: Exception) -> None:
    """A user's plugin raised (in any hook): one line naming where, exit 2; returns when
    ``exc`` came from kvsim's own code."""
    where = _plugin_frame(exc)
    if where is not None:
        message = one_line(f"{type(exc).__name__}: {exc}")
        click.echo(f"kvsim: error: a plugin failed ({where}): {message}", err=True)
        sys.exit(2)


def _plugin_frame(exc: BaseException) -> str | None:
    """Where the innermost frame of ``exc``'s traceback that is a user's code ran (a policy
    or router plugin's hook, however kvsim called it): ``file.py:LINE in NAME``; None when
    every frame is kvsim's, the repository's ``real`` package's, installed code (the
    standard library, site-packages), or compiled code whose source is no file here
    (``pyarrow/error.pxi``, a relative name: an int64 overflow in Arrow was blamed on a
    plugin), whose failures are kvsim's to show whole."""
    import traceback

    ours = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # the kvsim package
    real = sys.modules.get("real")
    if real is not None and getattr(real, "__file__", None):
        ours.append(os.path.dirname(os.path.abspath(real.__file__ or "")))
    installed = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.abspath(frame.filename)
        if (
            frame.filename.startswith("<")
            or not os.path.isfile(path)  # a user's plugin is a file; a Cython .pxi is not
            or any(path.startswith(os.path.join(root, "")) for root in (*ours, *installed))
        ):
            continue
        return f"{os.path.basename(path)}:{frame.lineno} in {frame.name}"
    return None
