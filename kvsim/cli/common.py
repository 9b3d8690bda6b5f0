"""Options shared by several commands, and output helpers."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kvsim.core.errors import InputError
from kvsim.core.io import refuse_overwriting_inputs
from kvsim.core.units import with_human_bytes
from kvsim.options.offload import DEFAULT_MODEL
from kvsim.report.result import format_table
from kvsim.traces import TRACE_FORMATS

if TYPE_CHECKING:
    from kvsim.traces.model import TraceInfo

#: a click command function, before or after other option decorators
FC = TypeVar("FC", bound=Callable[..., Any])


def _model_option_list(model_help: str) -> list[Callable[[FC], FC]]:
    """``--model``, ``--tp`` and ``--kv-cache-dtype``: what sizes a chunk in bytes, under
    kvsim's names and vLLM's (``--tensor-parallel-size``)."""
    return [
        click.option("--model", default=None, metavar="NAME|CONFIG.JSON", help=model_help),
        click.option(
            "--tp",
            "--tensor-parallel-size",
            "tp",
            type=int,
            default=None,
            help="Tensor-parallel world size for sizing (default 1).",
        ),
        click.option(
            "--kv-cache-dtype",
            default=None,
            metavar="DTYPE",
            help=(
                "vLLM's KV cache dtype: auto (the model's, default), bfloat16, float16, fp8, "
                "fp8_e4m3, fp8_e5m2, fp8_inc; fp8 halves the KV bytes per token."
            ),
        ),
    ]


_MODEL_HELP = (
    "Model preset (see `kvsim models`) or a Hugging Face config.json path, for the KV bytes "
    "per token"
)


def model_options(f: FC) -> FC:
    """``--model`` (optional: it adds GiB to chunk counts), ``--tp``, ``--kv-cache-dtype``."""
    for option in reversed(_model_option_list(_MODEL_HELP + "; adds GiB to the output.")):
        f = option(f)
    return f


def offload_options(f: FC) -> FC:
    """CPU tier, policy and key-layout options (the fields of ``OffloadOptions``); vLLM's
    names (``--kv-offloading-size``, ``--tensor-parallel-size``) are aliases."""
    options = [
        click.option("--cpu-chunks", type=int, help="CPU tier capacity in chunks."),
        click.option(
            "--cpu-gib",
            "--kv-offloading-size",
            "cpu_gib",
            type=float,
            help=(
                "CPU tier size in GiB (vLLM's --kv-offloading-size: cpu_bytes_to_use / 2**30 "
                f"over all TP workers), sized for --model (default {DEFAULT_MODEL})."
            ),
        ),
        *_model_option_list(_MODEL_HELP + f" (default {DEFAULT_MODEL})."),
        click.option(
            "--policy",
            default=None,
            help="Eviction policy: lru (default), arc, ... or module:Class.",
        ),
        click.option(
            "--admission",
            default=None,
            help="Admission policy (default always; see `kvsim policies`).",
        ),
        click.option(
            "--store-threshold",
            type=int,
            default=None,
            help="vLLM store_threshold: offers before a chunk is stored (>= 2 enables).",
        ),
        click.option(
            "--max-tracker-size",
            type=int,
            default=None,
            help="vLLM max_tracker_size of the threshold counter table (default 64000).",
        ),
        click.option(
            "--block-tokens",
            type=int,
            default=None,
            help="Tokens per trace hash block (default: the trace format's, 512 for Mooncake).",
        ),
        click.option(
            "--chunk-tokens",
            type=int,
            default=None,
            help="Tokens per CPU chunk (default: one trace block; vLLM block_size).",
        ),
        click.option(
            "--gpu-block-tokens",
            type=int,
            default=None,
            help=(
                "vLLM GPU block size (--block-size, default 16): sizes CPU chunks; in "
                "simulate also the GPU KV blocks."
            ),
        ),
        click.option(
            "--gpu-blocks",
            type=int,
            default=None,
            help=(
                "replay: GPU prefix-cache size in key-unit blocks, 0 (default) disables it; "
                "simulate: GPU KV capacity in --gpu-block-tokens blocks (vLLM "
                "num_gpu_blocks_override), default from GPU memory."
            ),
        ),
        click.option(
            "--vllm-config",
            default=None,
            metavar="JSON|FILE",
            help="vLLM kv_connector_extra_config (inline JSON or a file); explicit options win.",
        ),
        click.option(
            "--seed", type=int, default=None, help="Seed for randomised policies (default 0)."
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def format_option(f: FC) -> FC:
    """``--format``: one of the trace formats kvsim reads (default: detected)."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(list(TRACE_FORMATS)),
        default=None,
        help="Trace format (default: detected from the file).",
    )(f)


OFFLOAD_KEYS = (
    "cpu_chunks",
    "cpu_gib",
    "model",
    "tp",
    "kv_cache_dtype",
    "policy",
    "admission",
    "store_threshold",
    "max_tracker_size",
    "block_tokens",
    "chunk_tokens",
    "gpu_block_tokens",
    "gpu_blocks",
    "seed",
    "prefill_chunk_tokens",
)


def pop_offload_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs.pop(k) for k in OFFLOAD_KEYS if k in kwargs}


def check_output_path(path: str | None, option: str, *inputs: str | None) -> None:
    """Fail before the run, not after it, when an output cannot be written or would replace
    one of the run's ``inputs`` (the trace, a config file)."""
    if path is None:
        return
    refuse_overwriting_inputs({option: path}, list(inputs))
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise InputError(f"{option}: {path} is a directory")
    if not os.path.isdir(folder):
        raise InputError(f"{option}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{option}: folder {folder} is not writable")


def echo_summary(summary: dict[str, Any], as_json: bool, title: str) -> None:
    """The summary as JSON (numbers as they are), or as a table whose byte counts also read
    in binary units (``67,108,864 (64.0 MiB)``)."""
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
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
