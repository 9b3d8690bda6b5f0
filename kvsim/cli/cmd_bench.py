"""``kvsim bench``: replay speed per policy (and against vLLM's own manager when importable)."""

from __future__ import annotations

import os
import time

import click

from kvsim.cachemode.bench import bench_replay
from kvsim.cli.common import FiniteFloatRange, check_output_path, wants_progress
from kvsim.core.errors import InputError
from kvsim.core.io import atomic_write
from kvsim.options.engine import MAX_GPU_BLOCKS
from kvsim.traces import as_trace

DEFAULT_TRACE = os.path.join("traces", "mooncake_fast25_conversation_trace.jsonl")


@click.command("bench")
@click.argument("trace", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--cpu-chunks",
    type=click.IntRange(min=1),
    default=20_000,
    show_default=True,
    help="CPU tier capacity in chunks.",
)
@click.option(
    "--policies",
    default="lru,arc",
    show_default=True,
    help="Comma-separated eviction policies to time ('all' = every registered one).",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Best of N runs, for every engine, vLLM's included (with --timed kvsim's and "
    "vLLM's runs alternate).",
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Use only the first N requests."
)
@click.option(
    "--vllm/--no-vllm",
    "with_vllm",
    default=None,
    help="Also drive vLLM 0.33's CPUOffloadingManager (default: when importable).",
)
@click.option(
    "--stages",
    is_flag=True,
    help="Time each stage a user waits for (start-up, read, replay, write, the whole "
    "command) instead of the policies, against vLLM's manager loop when importable.",
)
@click.option(
    "--timed",
    is_flag=True,
    help="Time timed mode (kvsim simulate's engine) instead, against vLLM 0.33's own "
    "Scheduler + KVCacheManager + OffloadingConnector driven on CPU with a trivial forward "
    "(when importable), on the same requests and knobs, decisions checked; --limit "
    "defaults to 400 requests, the GPU to --gpu-blocks.",
)
@click.option(
    "--gpu-blocks",
    type=click.IntRange(min=2, max=MAX_GPU_BLOCKS),  # one is vLLM's null block
    default=8192,
    show_default=True,
    help="With --timed: GPU KV capacity in 16-token blocks.",
)
@click.option(
    "--miniature-error",
    "miniature_rate",
    type=FiniteFloatRange(min=0, min_open=True, max=1),
    default=None,
    metavar="RATE",
    help="Instead of timing: each policy's miniature-simulation curve (kvsim mrc --policy) "
    "at sampling RATE against full replays, at 1-100% of the trace's distinct chunks, "
    "both protocols. Each capacity's rate is printed: RATE, raised where its miniature "
    "would hold fewer than --min-chunks chunks.",
)
@click.option(
    "--min-chunks",
    type=click.IntRange(min=0),
    default=None,
    help="With --miniature-error: the fewest chunks a miniature may hold before its "
    "capacity is replayed at a higher rate (default: kvsim mrc's, 512; 0 = never).",
)
@click.option(
    "--min-keys",
    type=click.IntRange(min=0),
    default=None,
    help="With --miniature-error: on a trace with fewer than MIN_KEYS / RATE distinct chunk "
    "keys, sample MIN_KEYS of them instead (default: kvsim mrc's, 8192; 0 = never).",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --miniature-error: average this many independently seeded miniatures.",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the table as CSV.",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="With --timed: a bar counting the timed runs (default: on a terminal).",
)
def bench_command(
    trace: str | None,
    cpu_chunks: int,
    policies: str,
    repeat: int,
    limit: int | None,
    with_vllm: bool | None,
    stages: bool,
    timed: bool,
    gpu_blocks: int,
    miniature_rate: float | None,
    min_chunks: int | None,
    min_keys: int | None,
    seeds: int,
    csv_path: str | None,
    progress: bool | None,
) -> None:
    """Time cache-mode replay on TRACE (default: the bundled Mooncake conversation trace).

    Requests are read into memory first, so the figures are the simulator's, not the
    JSON parser's. Blocks/s counts complete prompt blocks of the trace.
    """
    check_output_path(csv_path, "--csv", trace)
    if trace is None:  # the checkout's copy (the file the docs name), else the package's
        from kvsim.api import bundled_trace

        trace = DEFAULT_TRACE if os.path.exists(DEFAULT_TRACE) else bundled_trace()
    if trace != "-" and not os.path.exists(trace):
        raise InputError(f"trace {trace} not found (give a TRACE argument)")
    ctx = click.get_current_context()
    _check_mode(ctx, stages, timed, miniature_rate is not None)
    if ctx.get_parameter_source("policies") is click.core.ParameterSource.DEFAULT and (
        timed or stages
    ):
        policies = "lru"  # the default list is for the policy table; these time one
    if miniature_rate is not None:
        _miniature_error(
            trace, policies, miniature_rate, limit, csv_path, (min_chunks, min_keys), seeds
        )
        return
    if timed:
        _timed(
            trace, cpu_chunks, policies, repeat, limit, with_vllm, gpu_blocks, csv_path, progress
        )
        return
    if stages:
        _stages(trace, cpu_chunks, policies, repeat, limit, with_vllm, csv_path)
        return
    tr = as_trace(trace, limit=limit)
    start = time.perf_counter()
    requests = list(tr)
    read_s = time.perf_counter() - start

    names = _policy_names(policies)
    if "lru" in names:
        names.remove("lru")
    names.insert(0, "lru")
    table = bench_replay(
        requests,
        tr.block_tokens,
        cpu_chunks=cpu_chunks,
        policies=names,
        repeat=repeat,
        with_vllm=with_vllm,
    )
    blocks = int(table["blocks"].iloc[0])
    click.echo(
        f"trace {trace}: {len(requests):,} requests, {blocks:,} blocks; "
        f"read in {read_s:.2f} s ({blocks / read_s:,.0f} blocks/s)"
    )
    shown = table.copy()
    shown["blocks_per_s"] = shown["blocks_per_s"].map(lambda v: f"{v:,.0f}")
    for col in ("seconds", "vs_kvsim_lru", "vs_protocol_lru", "cpu_hit_ratio", "kvsim_speedup"):
        if col in shown:
            shown[col] = shown[col].map(lambda v: "" if v != v or v is None else f"{v:.3f}")
    click.echo(shown.fillna("").to_string(index=False))
    if csv_path:
        with atomic_write(csv_path, newline="") as f:
            table.to_csv(f, index=False)


#: options that only one mode reads -> that mode's flag
_MODE_ONLY = {
    "gpu_blocks": "--timed",
    "progress": "--timed",
    "min_chunks": "--miniature-error",
    "min_keys": "--miniature-error",
    "seeds": "--miniature-error",
}


def _check_mode(ctx: click.Context, stages: bool, timed: bool, miniature: bool) -> None:
    """One mode at a time, and no option of another mode: either would be ignored."""
    modes = (("--stages", stages), ("--timed", timed), ("--miniature-error", miniature))
    given = [flag for flag, on in modes if on]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} are different modes: give one of them")
    mode = given[0] if given else None
    for name, owner in _MODE_ONLY.items():
        source = ctx.get_parameter_source(name)
        if source is click.core.ParameterSource.COMMANDLINE and owner != mode:
            flag = next(p.opts[0] for p in ctx.command.params if p.name == name)
            raise InputError(f"{flag} is read by {owner} only")


def _policy_names(policies: str) -> list[str]:
    """``--policies``: a comma-separated list, or ``all`` registered eviction policies."""
    from kvsim.policies.registry import EVICTION_POLICIES, eviction_policy_class

    if policies == "all":
        return sorted(EVICTION_POLICIES)
    names = list(dict.fromkeys(p.strip() for p in policies.split(",") if p.strip()))
    if not names:
        raise InputError(f"--policies: give at least one policy, got {policies!r}")
    for name in names:
        eviction_policy_class(name, option="--policies")
    return names


def _one_policy(policies: str, mode: str) -> str:
    """``--policies`` where ``mode`` times one policy: exactly one name."""
    names = _policy_names(policies)
    if len(names) != 1:
        raise InputError(f"{mode} times one policy; got --policies {policies!r}")
    return names[0]


def _stages(
    trace: str,
    cpu_chunks: int,
    policies: str,
    repeat: int,
    limit: int | None,
    with_vllm: bool | None,
    csv_path: str | None,
) -> None:
    from kvsim.cachemode.stages import bench_stages

    if limit is not None:
        raise InputError("--stages times the whole trace, as kvsim replay reads it; drop --limit")
    policy = _one_policy(policies, "--stages")
    table = bench_stages(
        trace, cpu_chunks=cpu_chunks, policy=policy, repeat=repeat, with_vllm=with_vllm
    )
    shown = table.copy()
    shown["seconds"] = shown["seconds"].map(lambda v: f"{v:.3f}")
    click.echo(f"trace {trace}")
    click.echo(shown.to_string(index=False))
    if csv_path:
        with atomic_write(csv_path, newline="") as f:
            table.to_csv(f, index=False)


def _timed(
    trace: str,
    cpu_chunks: int,
    policies: str,
    repeat: int,
    limit: int | None,
    with_vllm: bool | None,
    gpu_blocks: int,
    csv_path: str | None,
    progress: bool | None,
) -> None:
    from kvsim.cachemode.bench import use_vllm
    from kvsim.engine.bench import bench_trace

    policy = _one_policy(policies, "--timed")
    head, table = bench_trace(
        trace,
        limit or 400,
        gpu_blocks,
        cpu_chunks,
        policy,
        repeat,
        use_vllm(with_vllm),
        progress=wants_progress(progress),
    )
    click.echo(head)
    click.echo(table.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    if csv_path:
        with atomic_write(csv_path, newline="") as f:
            table.to_csv(f, index=False)


def _miniature_error(
    trace: str,
    policies: str,
    rate: float,
    limit: int | None,
    csv_path: str | None,
    minimums: tuple[int | None, int | None],
    seeds: int,
) -> None:
    from kvsim.cachemode.miniature import MIN_CHUNKS, MIN_KEYS, error_table

    chunks = MIN_CHUNKS if minimums[0] is None else minimums[0]
    keys = MIN_KEYS if minimums[1] is None else minimums[1]
    table = error_table(
        trace, _policy_names(policies), rate, limit, min_chunks=chunks, min_keys=keys, seeds=seeds
    )
    click.echo(
        f"trace {trace}: miniature simulation at {rate:g} vs full replays (min {chunks} "
        f"chunks per miniature, min {keys} sampled keys: base rate "
        f"{table.attrs['base_rate']:.3g}; {seeds} seed{'s' if seeds > 1 else ''})"
    )
    attrs = table.attrs
    points = ", ".join(
        f"{c:,} at {r:g} ({m:,} chunks{f', {f} forced' if f else ''})"
        for c, r, m, f in zip(
            attrs["capacities"], attrs["rates"], attrs["miniature_chunks"], attrs["forced_keys"]
        )
    )
    click.echo(f"capacities (rate, miniature size, keys forced into every miniature): {points}")
    shown = table.drop(columns=["rates"])
    click.echo(shown.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if csv_path:
        with atomic_write(csv_path, newline="") as f:
            table.to_csv(f, index=False)


COMMANDS = [bench_command]
