"""The ``kvsim`` command line: a thin layer that parses, calls the API and writes.

Every module ``kvsim/cli/cmd_*.py`` contributes its click commands through a module-level
``COMMANDS`` list, so each command lives in its own small file.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import signal
import sys
import warnings
from collections.abc import Iterator

import click

from kvsim.errors import InputError, InputWarning


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kvsim")
def cli() -> None:
    """kvsim: simulate LLM KV-cache offloading to CPU memory (vLLM OffloadingConnector semantics).

    Start with `kvsim replay TRACE --cpu-gib 64 --model llama-3.1-8b`.
    """


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            for command in getattr(module, "COMMANDS", ()):
                cli.add_command(command)


_register_commands()


class Terminated(BaseException):
    """SIGTERM, raised where the process is, so every ``with`` block cleans up (no temp file
    or half-written output is left behind, as on Ctrl-C)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


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
        click.echo(f"kvsim: warning: {message}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)  # type: ignore[arg-type]


_default_showwarning = warnings.showwarning


def _usage_line(exc: click.UsageError) -> str:
    """click's usage error as one line, naming the command and where to look."""
    cmd = exc.ctx.command_path if exc.ctx is not None else "kvsim"
    return f"{cmd}: error: {exc.format_message()} (see '{cmd} --help')"


@contextlib.contextmanager
def _process_hooks() -> Iterator[None]:
    """SIGTERM as an exception and kvsim's one-line warnings, for this call only: a caller
    that runs ``main`` in its own process (a test, a notebook) gets its handlers back."""
    previous_warning = warnings.showwarning
    previous_term = None
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
    warnings.showwarning = _show_warning
    try:
        yield
    finally:
        warnings.showwarning = previous_warning
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    with _process_hooks():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    try:
        rv = cli.main(args=argv, prog_name="kvsim", standalone_mode=False)
    except InputError as exc:
        click.echo(f"kvsim: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("kvsim: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        click.echo(_usage_line(exc), err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"kvsim: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("kvsim: interrupted", err=True)
        sys.exit(130)
    except Terminated:
        click.echo("kvsim: terminated", err=True)
        sys.exit(143)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"kvsim: error: {where}{exc.strerror or exc}", err=True)
        sys.exit(2)
    sys.exit(rv if isinstance(rv, int) else 0)
