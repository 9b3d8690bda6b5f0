"""``kvsim calibrate`` and ``kvsim validate``: the real backend (``real/``) from the CLI.

``real`` (and so torch) is imported inside the commands, so the rest of the CLI starts
fast and works where torch is missing. Without CUDA both commands run on the threaded CPU
device (copies run on stream threads, asynchronously, as DMA does on a GPU), and
``validate`` sizes its defaults to the machine's free memory (:mod:`real.machine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kvsim.cli.common import check_output_path
from kvsim.core.errors import InputError, named
from kvsim.core.io import atomic_write, json_text
from kvsim.report.result import format_table

if TYPE_CHECKING:
    from real.device import Device


def _need_torch(command: str) -> None:
    """torch is an extra (``kvsim[real]``), needed by the real backend only: without it the
    command stops with one line saying how to install it."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise InputError(
            f"kvsim {command} runs the real backend, which needs torch ({exc}): "
            "pip install 'kvsim[real]'"
        ) from None


def _device(kind: str) -> Device:
    from real.device import Device, cpu_stand_in, cuda_available

    if kind == "auto":
        kind = "cuda" if cuda_available() else "cpu"
    if kind == "cuda" and not cuda_available():
        raise InputError("--device cuda: torch.cuda.is_available() is False on this machine")
    return Device("cuda") if kind == "cuda" else cpu_stand_in()


_ALLOW_UNPINNED = click.option(
    "--allow-unpinned",
    is_flag=True,
    help="On CUDA, go on when page-locking host memory fails (default: refuse; the "
    "numbers would measure staged, synchronous copies).",
)


def _pin_failure(exc: Exception) -> InputError:
    return InputError(f"{exc} (pass --allow-unpinned to measure pageable copies anyway)")


#: where calibrate and calibrate-compute measure
device_option = click.option(
    "--device",
    "device_kind",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    help="Where to measure (default: CUDA when available, else CPU tensors).",
)


@click.command("calibrate")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Write the transfer profile (the simulator's link model) here.",
)
@device_option
@click.option(
    "--max-mib",
    type=click.IntRange(min=1),
    default=None,
    help="Largest bytes per measured transfer (default 256 on CUDA, 128 on CPU).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=None,
    help="Timed repeats per point, median kept (default 5 on CUDA, 2 on CPU).",
)
@click.option("--link", default=None, help="Name stored in the profile (default: the device name).")
@click.option(
    "--report",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the raw points and the fitted curve as JSON.",
)
@_ALLOW_UNPINNED
def calibrate_command(
    out: str,
    device_kind: str,
    max_mib: int | None,
    repeats: int | None,
    link: str | None,
    report: str | None,
    allow_unpinned: bool,
) -> None:
    """Measure host<->GPU copies (H2D, D2H, both at once; 4 KiB to 64 MiB) and write the
    profile that `kvsim simulate --link PROFILE` and `kvsim validate --profile` load.
    (`kvsim calibrate-compute` measures the forward pass instead.)

    \b
    Example:
      kvsim calibrate --out profile.json
    """
    _need_torch("calibrate")
    from real.calibrate import CPU_COLD_SPAN_FACTOR, MIB, calibrate
    from real.host_pool import PinError

    check_output_path(out, "--out")
    check_output_path(report, "--report", outputs={"--out": out})
    device = _device(device_kind)
    max_bytes = (max_mib or (256 if device.is_cuda else 128)) * MIB
    reps = repeats or (5 if device.is_cuda else 2)
    from kvsim.engine.transfer_model import TransferModelParams

    try:
        params, fitted = calibrate(
            device,
            link=link,
            max_bytes=max_bytes,
            repeats=reps,
            require_pin=not allow_unpinned,
            span_bytes=None if device.is_cuda else CPU_COLD_SPAN_FACTOR * max_bytes,
        )
    except PinError as exc:
        raise _pin_failure(exc) from None
    assert isinstance(params, TransferModelParams)
    with atomic_write(out) as f:
        f.write(params.to_json())
    if report:
        with atomic_write(report) as f:
            f.write(json_text(fitted))
    rows: list[tuple[str, object]] = [
        ("device", device.kind),
        ("pinned", fitted["pinned"]),
        ("copy path", fitted["copy_path"]),
    ]
    for d, v in fitted["directions"].items():
        rows.append((f"{d} peak GB/s", v["peak_gbps"]))
        rows.append((f"{d} overhead us", v["overhead_s"] * 1e6))
    rows.append(("duplex_factor", fitted.get("duplex_factor")))
    rows.append(("profile", out))
    click.echo(format_table(rows, "kvsim calibrate"))


@click.command("validate")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option(
    "--model",
    default="llama-3.1-8b",
    show_default=True,
    help="Model preset, its Hugging Face id or a config.json (KV geometry and compute).",
)
@click.option(
    "--cpu-gib",
    type=float,
    default=None,
    help="CPU tier size in GiB (default 16 with CUDA; without it, 1/11 of the free memory, "
    "at most 16).",
)
@click.option("--cpu-chunks", type=int, default=None, help="CPU tier size in chunks.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Only the first N requests."
)
@click.option(
    "--profile",
    default=None,
    metavar="JSON|LINK",
    help="Transfer profile from `kvsim calibrate` (or a link preset); default: the GPU's link.",
)
@click.option(
    "--layout",
    type=click.Choice(["layer_major", "block_first"]),
    default="layer_major",
    show_default=True,
    help="GPU KV layout: vLLM's per-layer pages, or contiguous cross-layer blocks.",
)
@click.option(
    "--gpu", "gpu_name", default="h200", show_default=True, help="GPU preset for the compute model."
)
@click.option(
    "--gpu-kv-blocks",
    type=click.IntRange(min=2),
    default=None,
    help="GPU KV blocks (key units; one is vLLM's null block); default: vLLM's budget "
    "capped by --max-gpu-kv-gib.",
)
@click.option(
    "--max-gpu-kv-gib",
    type=float,
    default=None,
    help="Cap on the real GPU KV cache, above 0 and at most 1024 (more than any GPU has); "
    "default 48 on CUDA, on CPU 1/14 of the free memory, at most 2.",
)
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Arrival = trace timestamp x this.",
)
@click.option(
    "--compute-scale",
    type=float,
    default=None,
    help="Multiply every modelled forward pass (both runs; default 1 on CUDA, 0.25 on CPU). "
    "Above 0 and at most 1000: a 10 ms step then lasts 10 s, and beyond it a run would "
    "sleep for days rather than measure.",
)
@click.option("--policy", default="lru", show_default=True, help="Eviction policy.")
@click.option(
    "--select",
    type=click.Choice(["all", "conversations"]),
    default="all",
    show_default=True,
    help="Which requests: the first --limit, or the first --limit turns of multi-turn "
    "conversations among 10 x --limit requests (later turns load what earlier ones stored; "
    "a Mooncake stretch otherwise has almost no loads).",
)
@click.option(
    "--noise-jobs",
    type=click.IntRange(min=0),
    default=24,
    show_default=True,
    help="Jobs of the run replayed alone 5 times each after it, to report the measurement's "
    "own noise beside the job-time error (0: skip).",
)
@device_option
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the full comparison report as JSON.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_ALLOW_UNPINNED
def validate_command(
    trace: str,
    model: str,
    cpu_gib: float | None,
    cpu_chunks: int | None,
    limit: int | None,
    profile: str | None,
    layout: str,
    gpu_name: str,
    gpu_kv_blocks: int | None,
    max_gpu_kv_gib: float | None,
    time_scale: float,
    compute_scale: float | None,
    policy: str,
    select: str,
    noise_jobs: int,
    device_kind: str,
    out: str | None,
    as_json: bool,
    allow_unpinned: bool,
) -> None:
    """Run TRACE twice through the same engine, manager and policies: simulated transfers
    on the virtual clock, then real copies (CUDA, or CPU tensors without it) on a
    monotonic clock; print how far simulation and hardware differ, beside the noise of
    the measurement itself and caveats (too few load jobs, an error within the noise).

    \b
    Example:
      kvsim validate traces/mooncake_fast25_conversation_trace.jsonl \\
          --model llama-3.1-8b --cpu-gib 16 --limit 500 --profile profile.json
    """
    _need_torch("validate")
    from kvsim.engine.transfer_model import get_link
    from kvsim.specs.hardware import get_gpu
    from kvsim.specs.models import get_model
    from real.host_pool import PinError
    from real.machine import CpuDefaults, available_memory
    from real.validate import ValidationSpec, run_validation

    check_output_path(out, "--out", trace, profile)
    named("--model", get_model, model)
    named("--gpu", get_gpu, gpu_name)
    if cpu_gib is not None and cpu_chunks is not None:
        raise InputError("give only one CPU tier size, got --cpu-gib and --cpu-chunks")
    device = _device(device_kind)
    if device.is_cuda:
        default_cpu_gib, default_gpu_gib, default_scale = 16.0, 48.0, 1.0
    else:
        d = CpuDefaults.for_memory(available_memory())
        default_cpu_gib, default_gpu_gib = d.cpu_gib, d.max_gpu_kv_gib
        default_scale = d.compute_scale
    if cpu_gib is None and cpu_chunks is None:
        cpu_gib = default_cpu_gib
    spec = ValidationSpec(
        model=model,
        cpu_gib=cpu_gib,
        cpu_chunks=cpu_chunks,
        limit=limit,
        layout=layout,
        gpu=gpu_name,
        gpu_blocks=gpu_kv_blocks,
        max_gpu_kv_gib=max_gpu_kv_gib if max_gpu_kv_gib is not None else default_gpu_gib,
        time_scale=time_scale,
        compute_scale=compute_scale if compute_scale is not None else default_scale,
        policy=policy,
        allow_unpinned=allow_unpinned,
        select=select,
        noise_jobs=noise_jobs,
    )
    params = get_link(profile) if profile else None
    try:
        report = run_validation(trace, spec, device=device, params=params)
    except PinError as exc:
        raise _pin_failure(exc) from None
    if out:
        with atomic_write(out) as f:
            f.write(json_text(report.as_dict()))
    summary = report.summary()
    from real.check_goals import validation_failures

    failed = "; ".join(validation_failures(summary))
    if as_json:
        click.echo(json_text(summary))
    else:
        notes = summary.pop("caveats")
        click.echo(format_table(summary, "kvsim validate (simulated vs real)"))
        for note in notes:
            click.echo(f"caveat: {note}")
    if failed:
        click.echo(f"kvsim: validate: {failed}", err=True)
        raise click.exceptions.Exit(1)


def _int_list(option: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise InputError(f"{option}: expected positive integers separated by commas, got {text!r}")
    return values


@click.command("calibrate-compute")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help='Write the "kind": "phases" profile here (for `kvsim simulate --compute-profile`).',
)
@click.option(
    "--model",
    default="llama-3.1-8b",
    show_default=True,
    help="Model preset, its Hugging Face id or a config.json whose shapes are timed.",
)
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Time one TP worker's shard.",
)
@device_option
@click.option(
    "--gpu",
    "gpu_name",
    default=None,
    help="GPU preset whose data-sheet peaks the efficiencies are relative to, and the profile's "
    "name (default: the CUDA device's name; on CPU the best rates measured).",
)
@click.option(
    "--tokens",
    default=None,
    help="GEMM token counts, e.g. 1,32,512 (default 1..8192 on CUDA, 1,16,128 on CPU).",
)
@click.option(
    "--contexts",
    default=None,
    help="Attention context lengths (default 1024,4096,16384 on CUDA, 128,512 on CPU).",
)
@click.option(
    "--decode-batch",
    type=click.IntRange(min=1),
    default=None,
    help="Requests in the decode-attention and LM-head batch (default 32 on CUDA, 4 on CPU).",
)
@click.option(
    "--trials",
    type=click.IntRange(min=1),
    default=None,
    help="Timed runs per point, median kept (default 10 on CUDA, 2 on CPU).",
)
@click.option(
    "--max-weight-mib",
    type=click.IntRange(min=1),
    default=None,
    help="Cap on one weight matrix (default: none on CUDA, 32 on CPU).",
)
def calibrate_compute_command(
    out: str,
    model: str,
    tp: int,
    device_kind: str,
    gpu_name: str | None,
    tokens: str | None,
    contexts: str | None,
    decode_batch: int | None,
    trials: int | None,
    max_weight_mib: int | None,
) -> None:
    """Time the model's GEMMs, LM head and attention with torch; write a compute profile.

    Times one layer's GEMMs at a few token counts, the LM head, causal prefill attention
    and decode attention (torch's scaled_dot_product_attention), fits the per-phase
    compute model's efficiencies and writes the profile that `kvsim simulate
    --compute-profile` loads.

    \b
    Example:
      kvsim calibrate-compute --model llama-3.1-8b --out h200-compute.json
    """
    _need_torch("calibrate-compute")
    from dataclasses import replace

    from kvsim.specs.hardware import get_gpu
    from kvsim.specs.models import get_model
    from real.calibrate_compute import (
        MIB,
        ComputeCalibration,
        calibrate_compute,
        resolve_device,
    )

    check_output_path(out, "--out")
    spec = named("--model", get_model, model)
    gpu = named("--gpu", get_gpu, gpu_name) if gpu_name else None
    device = resolve_device(device_kind)
    plan = ComputeCalibration.for_device(device)
    plan = replace(
        plan,
        tokens=_int_list("--tokens", tokens) or plan.tokens,
        contexts=_int_list("--contexts", contexts) or plan.contexts,
        decode_batch=decode_batch or plan.decode_batch,
        trials=trials or plan.trials,
        max_weight_bytes=max_weight_mib * MIB if max_weight_mib else plan.max_weight_bytes,
    )
    profile, points = calibrate_compute(spec, device, plan, tp=tp, gpu=gpu)
    with atomic_write(out) as f:
        f.write(profile.to_json(measurements=[p.as_dict() for p in points]))
    rows: list[tuple[str, object]] = [("device", str(device)), ("gpu", profile.gpu)]
    rows += [(k, v) for k, v in profile.to_dict().items() if k not in ("kind", "gpu", "sources")]
    rows.append(("profile", out))
    click.echo(format_table(rows, "kvsim calibrate-compute"))


COMMANDS = [calibrate_command, calibrate_compute_command, validate_command]
