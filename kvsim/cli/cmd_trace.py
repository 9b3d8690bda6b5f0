"""``kvsim trace stats`` and ``kvsim trace gen``: inspect a workload, or make one."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

import click
import yaml

from kvsim.cli.common import (
    check_output_folder,
    check_output_path,
    model_options,
    wants_progress,
)
from kvsim.core.errors import InputError
from kvsim.core.io import json_text
from kvsim.core.units import with_human_bytes
from kvsim.core.yaml_text import load_yaml
from kvsim.report.result import METADATA, format_table, write_metadata
from kvsim.traces import write_native
from kvsim.traces.synthetic import (
    ARRIVALS,
    KINDS,
    KNOBS,
    check_knobs,
    generate,
    write_mooncake,
)

MOONCAKE_BLOCK_TOKENS = 512
#: the benchmark tools' workloads (kvsim.workloads): KIND -> the workload block's type
BENCH_KINDS = {"shared-prefix": "shared_prefix", "random": "random"}


@click.group("trace")
def trace_group() -> None:
    """Inspect traces (`stats`) and generate synthetic ones (`gen`)."""


@trace_group.command("stats")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Only the first N requests."
)
@click.option(
    "--block-tokens", type=int, default=None, help="Tokens per hash block (default: the format's)."
)
@click.option(
    "--bin-s", type=float, default=None, help="Arrival-rate window in seconds (default: ~50 bins)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the summary and distributions as JSON."
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write figures (PNG + SVG) into this folder.",
)
@model_options
def stats_command(
    trace: str,
    limit: int | None,
    block_tokens: int | None,
    bin_s: float | None,
    as_json: bool,
    plot_dir: str | None,
    model: str | None,
    tp: int | None,
    kv_cache_dtype: str | None,
) -> None:
    """Requests, token and block counts, infinite-cache hit ratio, reuse distances and times,
    popularity skew and arrival rate of TRACE. With --model, also the CPU memory (GiB) an
    LRU tier needs to keep the median / p90 / p99 reuse.

    \b
    Example:
      kvsim trace stats traces/mooncake_fast25_conversation_trace.jsonl --plot figs/
    """
    from kvsim.traces.stats import trace_stats

    check_output_folder(plot_dir, "--plot", _receives_figures, [trace, model])
    st = trace_stats(
        trace,
        limit=limit,
        block_tokens=block_tokens,
        bin_s=bin_s,
        model=model,
        tp=1 if tp is None else tp,
        kv_cache_dtype=kv_cache_dtype or "auto",
    )
    if as_json:
        payload = {
            "summary": st.summary,
            "distributions": st.distributions.to_dict(orient="records"),
        }
        click.echo(json_text(payload))
    else:
        click.echo(format_table(with_human_bytes(st.summary), "kvsim trace stats"))
        click.echo("")
        click.echo(st.distributions.to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
    if plot_dir:
        import matplotlib

        matplotlib.use("Agg")  # the CLI only writes files
        from kvsim.plots import save_all, trace_figures

        paths = save_all(trace_figures(st), plot_dir)
        options = {"limit": limit, "block_tokens": block_tokens, "bin_s": bin_s}
        write_metadata(plot_dir, [trace], options, command="trace stats")
        click.echo(f"wrote {len(paths)} figure files to {plot_dir}", err=True)


def _receives_figures(name: str) -> bool:
    """The files ``--plot DIR`` writes: figures and the run's metadata."""
    return name == METADATA or name.endswith((".png", ".svg"))


def _knob_help() -> str:
    lines = []
    for kind, knobs in KNOBS.items():
        lines.append(f"{kind}:")
        lines += [f"  {k}={v!r}  {doc}" for k, (v, doc) in knobs.items()]
    return "\n".join(lines)


def _parse_knob(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise InputError(f"--set expects KNOB=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed = load_yaml(value, f"--set {key}") if value else None
    except yaml.YAMLError:
        parsed = value
    return key.strip().replace("-", "_"), parsed


def _bench_help() -> str:
    return (
        "shared-prefix / random (--set gives the workload's fields, --load is required):\n"
        "  shared-prefix: num_groups, num_prompts_per_group, system_prompt_len, question_len,\n"
        "  output_len (inference-perf's shared_prefix); random: input_len, output_len,\n"
        "  range_ratio, prefix_len, num_prompts, special_tokens (vllm bench serve's random);\n"
        "  block_tokens (default 16). See docs/experiments.md."
    )


@trace_group.command(
    "gen",
    epilog="\b\nKnobs (name=default  meaning):\n" + _knob_help() + "\n\n\b\n" + _bench_help(),
)
@click.argument("kind", type=click.Choice([*KINDS, *BENCH_KINDS]))
@click.option(
    "-n",
    "--requests",
    "n_requests",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Number of requests.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option(
    "--arrival",
    type=click.Choice(ARRIVALS),
    default=None,
    help="Arrival process (default poisson).",
)
@click.option("--rate", type=float, default=None, help="Requests per second (ON rate when bursty).")
@click.option(
    "--arrival-trace",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --arrival replay: reuse this trace's timestamps.",
)
@click.option(
    "--set",
    "knobs",
    multiple=True,
    metavar="KNOB=VALUE",
    help="Any knob below, repeatable; values are YAML (e.g. weights={chat: 1, rag: 1}).",
)
@click.option(
    "--load",
    "load_text",
    default=None,
    metavar="YAML|FILE",
    help="shared-prefix / random: the load, e.g. '{type: constant, stages: [{rate: 8, "
    "duration: 600}]}' (a file path works too).",
)
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Output file: Mooncake JSONL, or a kvsim trace (other block sizes; shared-prefix "
    "and random); .gz compresses; - is standard output.",
)
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="A bar counting the requests made (default: on a terminal).",
)
@click.pass_context
def gen_command(
    ctx: click.Context,
    kind: str,
    n_requests: int,
    seed: int,
    arrival: str | None,
    rate: float | None,
    arrival_trace: str | None,
    knobs: tuple[str, ...],
    load_text: str | None,
    out: str,
    show_progress: bool | None,
) -> None:
    """Generate a synthetic KIND workload as a Mooncake JSONL trace (512-token blocks,
    prefix-chained hash_ids). Same KIND, seed and knobs: the same file.

    shared-prefix and random are the benchmark tools' workloads (inference-perf's
    shared_prefix, vllm bench serve's random) sent under --load, written as a kvsim trace
    (16-token blocks) whose header states each load stage's first request, so
    `kvsim simulate` reports every metric per stage. A concurrency load (and
    inference-perf's multi-stage timing) has no fixed arrival times: they come out of
    the run, so simulate it with `kvsim simulate --workload ... --load ...` instead.

    \b
    Examples:
      kvsim trace gen chat -n 5000 --rate 4 --set turns=8 -o chat.jsonl
      kvsim trace gen shared-prefix --set num_groups=10 --set num_prompts_per_group=10 \\
          --set system_prompt_len=100 --set question_len=447 --set output_len=248 \\
          --load '{type: constant, stages: [{rate: 8, duration: 600}]}' -o sp.jsonl
    """
    out, say = _gen_target(out)
    check_output_path(out, "--out", arrival_trace)
    params = dict(_parse_knob(k) for k in knobs)
    if kind in BENCH_KINDS:
        flags = {"n_requests": "-n/--requests"}  # the rest are --NAME
        given = [
            flags.get(name, f"--{name.replace('_', '-')}")
            for name in ("n_requests", "arrival", "rate", "arrival_trace")
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            verb = "does" if len(given) == 1 else "do"
            raise InputError(
                f"{kind}: {', '.join(given)} {verb} not apply; --load says when requests are sent"
            )
        _gen_bench(kind, params, load_text, seed, out, say, wants_progress(show_progress))
        return
    if load_text is not None:
        raise InputError(f"--load is for shared-prefix and random, not {kind}")
    words = _gen_words(by_set=set(params))  # before the flags join them
    for name, value in zip(_GEN_FLAGS, (arrival, rate, arrival_trace), strict=True):
        if value is not None:
            if name in params:
                raise InputError(f"--{name.replace('_', '-')} and --set {name}: give one of them")
            params[name] = value
    check_knobs(kind, params, words)  # before generate, to name the options as given
    requests = generate(kind, n_requests, seed, progress=wants_progress(show_progress), **params)
    block_tokens = int(params.get("block_tokens", MOONCAKE_BLOCK_TOKENS))  # type: ignore[call-overload]
    if block_tokens == MOONCAKE_BLOCK_TOKENS:
        n = write_mooncake(out, requests)
        fmt = "Mooncake"
    else:  # a Mooncake file cannot say its block size: the native format records it
        n = write_native(out, requests, block_tokens)
        fmt = f"kvsim native ({block_tokens}-token blocks)"
    last = requests[-1].arrival_s if requests else 0.0
    say(f"wrote {n} {kind} requests over {last:,.1f} s to {os.fspath(out)} ({fmt})")


COMMANDS = [trace_group]

#: the knobs ``trace gen`` also takes as flags of their own
_GEN_FLAGS = ("arrival", "rate", "arrival_trace")


def _gen_words(by_set: Collection[str]) -> Callable[..., str]:
    """How ``trace gen``'s knob errors write a knob: as its user gave it, ``--set rate``
    (``--set arrival=replay``) for one given through ``--set`` (``by_set``), else its flag
    (``--arrival replay``), or ``--set on_s`` for a knob without one."""

    def words(name: str, value: object = None) -> str:
        if name in _GEN_FLAGS and name not in by_set:
            flag = f"--{name.replace('_', '-')}"
            return flag if value is None else f"{flag} {value}"
        return f"--set {name}" if value is None else f"--set {name}={value}"

    return words


def _gen_target(out: str) -> tuple[str, Callable[[str], None]]:
    """Where ``trace gen`` writes and where it reports: ``-`` is standard output (the
    report then goes to standard error); a ``.csv`` name is refused, since kvsim reads
    such a file as an Azure trace, not the JSONL written."""
    name = out[:-3] if out.endswith(".gz") else out
    if name.lower().endswith(".csv"):
        raise InputError(
            f"--out {out}: trace gen writes JSONL, and a .csv file is read as an Azure "
            "trace: name it .jsonl (or .jsonl.gz)"
        )
    if out == "-" or _is_stdout(out):  # -o /dev/stdout too: the report is no trace line
        return "/dev/stdout", lambda text: click.echo(text, err=True)
    return out, click.echo


def _is_stdout(path: str) -> bool:
    """Whether ``path`` is a name of this process's standard output."""
    return os.path.normpath(path) in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


def _gen_bench(
    kind: str,
    params: dict[str, object],
    load_text: str | None,
    seed: int,
    out: str,
    say: Callable[[str], None],
    progress: bool,
) -> None:
    """``trace gen shared-prefix`` / ``random``: the workload under its load, as a kvsim
    trace whose header states the stages (and the workload, load and seed it came from)."""
    from kvsim.report.progress import Progress, counted
    from kvsim.workloads import build_workload
    from kvsim.workloads.spec import load_workload, read_load

    if load_text is None:
        raise InputError(
            f"{kind} needs --load (e.g. '{{type: constant, stages: [{{rate: 8, duration: 60}}]}}')"
        )
    block = params.pop("block_tokens", 16)
    if type(block) is not int or block <= 0:
        raise InputError(f"--set: block_tokens: must be a positive integer, got {block!r}")
    spec = load_workload({"type": BENCH_KINDS[kind], **params}, source="--set", prefix="")
    w = build_workload(spec, read_load(load_text), seed=seed, block_size=block)
    with Progress(progress, None, f"generating {kind}") as bar:  # the load says how many
        reqs = list(counted(w.trace(), bar.callback))
    stages = w.stages()
    starts = [sum(1 for s in stages if s < k) for k in range(w.num_stages)]  # empty: repeats
    header = {"stage_starts": starts, **w.describe()}
    header.pop("block_tokens")
    n = write_native(out, reqs, block, header=header)
    last = reqs[-1].arrival_s if reqs else 0.0
    say(
        f"wrote {n} {kind} requests in {w.num_stages} stage(s) over {last:,.1f} s to "
        f"{os.fspath(out)} (kvsim trace, {block}-token blocks)"
    )
