"""``kvsim calibrate`` and ``kvsim validate``: the real backend (``real/``) from the CLI.

``real`` (and so torch) is imported inside the commands, so the rest of the CLI starts
fast and works where torch is missing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from kvsim.cli.common import check_output_path
from kvsim.errors import InputError
from kvsim.io import atomic_write
from kvsim.results import format_table

if TYPE_CHECKING:
    from real.device import Device


def _device(kind: str) -> Device:
    from real.device import Device, cuda_available

    if kind == "auto":
        kind = "cuda" if cuda_available() else "cpu"
    if kind == "cuda" and not cuda_available():
        raise InputError("--device cuda: torch.cuda.is_available() is False on this machine")
    return Device(kind)


@click.command("calibrate")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Write the transfer profile (the simulator's link model) here.",
)
@click.option(
    "--device",
    "device_kind",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    help="Where to measure (default: CUDA when available, else CPU tensors).",
)
@click.option(
    "--max-mib",
    type=click.IntRange(min=1),
    default=None,
    help="Largest bytes per measured transfer (default 256 on CUDA, 32 on CPU).",
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
def calibrate_command(
    out: str,
    device_kind: str,
    max_mib: int | None,
    repeats: int | None,
    link: str | None,
    report: str | None,
) -> None:
    """Measure host<->GPU copies (H2D, D2H, both at once; 4 KiB to 64 MiB) and write the
    profile that `kvsim simulate --link PROFILE` and `kvsim validate --profile` load.

    \b
    Example:
      kvsim calibrate --out profile.json
    """
    from real.calibrate import MIB, calibrate

    check_output_path(out, "--out")
    check_output_path(report, "--report")
    device = _device(device_kind)
    max_bytes = (max_mib or (256 if device.is_cuda else 32)) * MIB
    reps = repeats or (5 if device.is_cuda else 2)
    from kvsim.engine.transfer_model import TransferModelParams

    params, fitted = calibrate(device, link=link, max_bytes=max_bytes, repeats=reps)
    assert isinstance(params, TransferModelParams)  # real.calibrate types it as object
    with atomic_write(out) as f:
        f.write(params.to_json())
    if report:
        with atomic_write(report) as f:
            json.dump(fitted, f, indent=2)
    rows: list[tuple[str, object]] = [("device", device.kind), ("pinned", fitted["pinned"])]
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
    help="Model preset (KV geometry and compute).",
)
@click.option(
    "--cpu-gib",
    type=float,
    default=None,
    help="CPU tier size in GiB (default 16 unless --cpu-chunks).",
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
    type=click.IntRange(min=1),
    default=None,
    help="GPU KV blocks (key units); default: vLLM's budget capped by --max-gpu-kv-gib.",
)
@click.option(
    "--max-gpu-kv-gib",
    type=float,
    default=None,
    help="Cap on the real GPU KV cache (default 48 on CUDA, 2 on CPU).",
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
    default=1.0,
    show_default=True,
    help="Multiply every modelled forward pass (both runs).",
)
@click.option("--policy", default="lru", show_default=True, help="Eviction policy.")
@click.option("--device", "device_kind", type=click.Choice(["auto", "cuda", "cpu"]), default="auto")
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the full comparison report as JSON.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
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
    compute_scale: float,
    policy: str,
    device_kind: str,
    out: str | None,
    as_json: bool,
) -> None:
    """Run TRACE twice through the same engine, manager and policies: simulated transfers
    on the virtual clock, then real copies (CUDA, or CPU tensors without it) on a
    monotonic clock; print how far simulation and hardware differ.

    \b
    Example:
      kvsim validate traces/mooncake_fast25_conversation_trace.jsonl \\
          --model llama-3.1-8b --cpu-gib 16 --limit 500 --profile profile.json
    """
    from kvsim.engine.transfer_model import get_link
    from real.validate import ValidationSpec, run_validation

    check_output_path(out, "--out")
    device = _device(device_kind)
    if cpu_gib is None and cpu_chunks is None:
        cpu_gib = 16.0
    spec = ValidationSpec(
        model=model,
        cpu_gib=cpu_gib,
        cpu_chunks=cpu_chunks,
        limit=limit,
        layout=layout,
        gpu=gpu_name,
        gpu_blocks=gpu_kv_blocks,
        max_gpu_kv_gib=max_gpu_kv_gib or (48.0 if device.is_cuda else 2.0),
        time_scale=time_scale,
        compute_scale=compute_scale,
        policy=policy,
    )
    params = get_link(profile) if profile else None
    report = run_validation(trace, spec, device=device, params=params)
    if out:
        with atomic_write(out) as f:
            json.dump(report.as_dict(), f, indent=2)
    summary = report.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(format_table(summary, "kvsim validate (simulated vs real)"))


COMMANDS = [calibrate_command, validate_command]
