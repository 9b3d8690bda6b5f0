"""Options shared by several commands, and output helpers."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kvsim.core.errors import InputError
from kvsim.core.input_files import referenced_files
from kvsim.core.io import (
    check_file_name,
    json_text,
    refuse_filling_folder,
    refuse_overwriting_inputs,
    same_file,
)
from kvsim.core.units import with_human_bytes
from kvsim.options.offload import OFFLOAD_FIELDS, OffloadOptions
from kvsim.options.runs import ReplayOptions
from kvsim.options.schema import Schema, field, fields
from kvsim.report.result import format_table
from kvsim.traces import TRACE_FORMATS

if TYPE_CHECKING:
    from kvsim.traces.model import TraceInfo

#: a click command function, before or after other option decorators
FC = TypeVar("FC", bound=Callable[..., Any])


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that refuses NaN and infinity: NaN passes every comparison with
    a bound, so ``--max-stage-s nan`` would otherwise run as if no cap were given."""

    name = "float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def schema_option(
    schema: type[Schema], name: str, *flags: str, **overrides: Any
) -> Callable[[FC], FC]:
    """A click option for field ``name`` of ``schema``: its flag (``--`` + the name with
    dashes, and the ``aliases`` of its ``Meta(extra=...)``), type, choices, metavar and help
    text come from the schema; ``flags`` replace the flags (a ``--x/--no-x`` switch),
    ``overrides`` any click keyword. The default is None, so an option not given leaves the
    API's default (or ``--vllm-config``'s value) in place."""
    f = field(schema, name)
    decls = list(flags) or ["--" + name.replace("_", "-"), *f.extra.get("aliases", ())]
    kwargs: dict[str, Any] = {"default": None, "help": f.description}
    if f.choices is not None:
        kwargs["type"] = click.Choice([str(c) for c in f.choices])
    elif f.kind in (int, float):
        kwargs["type"] = f.kind
    if "metavar" in f.extra:
        kwargs["metavar"] = f.extra["metavar"]
    if overrides.get("show_default"):
        kwargs["default"] = f.default
    kwargs.update(overrides)
    return click.option(*decls, name, **kwargs)


def _apply(f: FC, options: Sequence[Callable[[FC], FC]]) -> FC:
    for option in reversed(options):
        f = option(f)
    return f


def _with_default(name: str) -> str:
    """``name``'s help text, saying its default where the text does not."""
    f = field(OffloadOptions, name)
    text = f.description or ""
    if "default" in text or f.default is None:
        return text
    return f"{text.rstrip('.')} (default {f.default})."


#: the offload options on the command line, in --help's order (the rest: API / vllm_config)
CLI_OFFLOAD_FIELDS = tuple(
    f.name
    for f in fields(OffloadOptions)
    if f.extra.get("cli", True) and f.name != "prefill_chunk_tokens"
)
_MODEL_FIELDS = ("model", "tp", "kv_cache_dtype")


def model_options(f: FC) -> FC:
    """``--model`` (optional: it adds GiB to chunk counts), ``--tp``, ``--kv-cache-dtype``:
    what sizes a chunk in bytes, under kvsim's names and vLLM's (``--tensor-parallel-size``)."""
    help_text = (field(OffloadOptions, "model").description or "") + " Adds GiB to the output."
    return _apply(
        f,
        [
            schema_option(OffloadOptions, "model", help=help_text),
            schema_option(OffloadOptions, "tp"),
            schema_option(OffloadOptions, "kv_cache_dtype"),
        ],
    )


def offload_options(f: FC) -> FC:
    """CPU tier, policy and key-layout options (the fields of ``OffloadOptions`` that the
    command line takes, from its schema); vLLM's names (``--kv-offloading-size``,
    ``--tensor-parallel-size``) are aliases; and ``--vllm-config``."""
    options = [schema_option(OffloadOptions, n, help=_with_default(n)) for n in CLI_OFFLOAD_FIELDS]
    return _apply(f, [*options, schema_option(ReplayOptions, "vllm_config")])


def fleet_options(f: FC) -> FC:
    """``--instances``, ``--router`` and the rest of :class:`FleetOptions` (docs/fleets.md):
    a fleet behind a router, optionally with a shared tier."""
    from kvsim.options.fleet import FLEET_FIELDS, FleetOptions

    return _apply(f, [schema_option(FleetOptions, n) for n in FLEET_FIELDS])


def pop_fleet_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The fleet options of a command's keywords (removed from ``kwargs``)."""
    from kvsim.options.fleet import FLEET_FIELDS

    return {k: kwargs.pop(k) for k in FLEET_FIELDS if k in kwargs}


def save_fleet_figure(result: Any, out_dir: str) -> list[str]:
    """A fleet run's ``fleet_balance.png`` / ``.svg`` (load and hit share per instance)
    beside its tables; nothing for one engine."""
    if "instances" not in result.tables:
        return []
    from kvsim.plots import fleet_balance, save

    return save(fleet_balance(result), os.path.join(out_dir, "fleet_balance"))


def pop_offload_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The offload options of a command's keywords (removed from ``kwargs``)."""
    return {k: kwargs.pop(k) for k in OFFLOAD_FIELDS if k in kwargs}


def format_option(f: FC) -> FC:
    """``--format``: one of the trace formats kvsim reads (default: detected)."""
    return schema_option(ReplayOptions, "fmt", "--format", type=click.Choice(list(TRACE_FORMATS)))(
        f
    )


def check_output_path(
    path: str | None,
    option: str,
    *inputs: str | None,
    outputs: Mapping[str, str | None] | None = None,
) -> None:
    """Fail before the run, not after it, when an output cannot be written, would replace
    one of the run's ``inputs`` (the trace, a config file), or is the file another of its
    ``outputs`` (option -> path) writes too."""
    if path is None:
        return
    check_file_name(path, option)
    for other, where in (outputs or {}).items():
        if where is not None and same_file(path, where):
            raise InputError(f"{option} and {other} both name {path}: give each its own file")
    refuse_overwriting_inputs({option: path}, list(inputs))
    folder = os.path.dirname(os.path.realpath(path)) or "."  # a link's target's folder
    if os.path.isdir(path):
        raise InputError(f"{option}: {path} is a directory")
    if not os.path.isdir(folder):
        raise InputError(f"{option}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{option}: folder {folder} is not writable")


def check_output_folder(
    path: str | None,
    option: str,
    receives: Callable[[str], bool],
    values: Iterable[Any],
    folders: Collection[str] = (),
) -> None:
    """Fail before the run when output folder ``path`` is a file, or when a file it will
    receive (``receives(name)``: see :func:`kvsim.core.io.refuse_filling_folder`, whose
    ``folders`` this passes on) is a folder or one the run reads: any file the option
    ``values`` name (the trace, a config file, a plugin module; see
    :func:`kvsim.core.input_files.referenced_files`)."""
    if path is None:
        return
    refuse_filling_folder(option, path, receives, referenced_files(values), folders)


@contextlib.contextmanager
def plugin_output_to_stderr() -> Iterator[None]:
    """While a run goes, whatever its plugins print goes to stderr: stdout carries kvsim's
    result alone (printed after the run), so ``--json`` stays one JSON document."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def echo_summary(summary: dict[str, Any], as_json: bool, title: str) -> None:
    """The summary as JSON (numbers as they are), or as a table whose byte counts also read
    in binary units (``67,108,864 (64.0 MiB)``)."""
    if as_json:
        click.echo(json_text(summary))
    else:
        click.echo(format_table(with_human_bytes(summary), title))


def wants_progress(flag: bool | None) -> bool:
    """``--progress/--no-progress``: a bar on stderr; by default only on a terminal (a log
    file gets one only when asked, as a line every few seconds, see
    :mod:`kvsim.report.progress`)."""
    return sys.stderr.isatty() if flag is None else flag


def note_missing_reuse(info: TraceInfo) -> None:
    """Say so when a trace carries no prefix information (Azure): nothing can ever hit."""
    if not info.has_reuse_info:
        click.echo(
            f"kvsim: note: {info.path} has no prefix-reuse information ({info.format} format); "
            "no prompt block can hit a cache, so hit ratios are 0 by construction",
            err=True,
        )
