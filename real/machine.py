"""Sizing a real run to the machine it runs on.

A CPU-only run keeps both the host pool and the stand-in "GPU" cache in RAM, so the
defaults that suit an H200 host (a 16 GiB tier, up to 48 GiB of GPU KV) would exhaust a
small machine; here they are derived from the memory actually available, and what a
command would allocate (host pools, the GPU KV cache or its CPU stand-in, calibration
buffers) is compared with what the machine has first: a run that cannot fit is refused with
one line (exit 2) before anything is allocated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.units import GIB


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (``MemAvailable``)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class CpuDefaults:
    """Defaults of a CPU-only validation run on a machine with ``available`` bytes free."""

    cpu_gib: float  # host pool: 1/11 of what is free, at most 16 GiB
    max_gpu_kv_gib: float  # stand-in GPU cache: 1/14 of it, at most 2 GiB
    compute_scale: float = 0.25  # a quarter-length H200 forward: the run stays short

    @classmethod
    def for_memory(cls, available: int | None) -> CpuDefaults:
        free = available if available is not None else 8 * GIB
        pool = min(16.0, _quarter_gib(free / 11))
        gpu = min(2.0, _quarter_gib(free / 14))
        return cls(max(pool, 0.25), max(gpu, 0.25))


def _quarter_gib(nbytes: float) -> float:
    return int(nbytes / GIB * 4) / 4


def device_memory_available(torch_device: Any) -> int | None:
    """Free bytes on a CUDA device (``torch.cuda.mem_get_info``); None off CUDA or when the
    driver cannot say."""
    import torch

    if getattr(torch_device, "type", None) != "cuda":
        return None
    try:
        return int(torch.cuda.mem_get_info(torch_device)[0])
    except (RuntimeError, AssertionError):
        return None


def _gib(nbytes: int) -> str:
    """``nbytes`` in GiB, two decimals; a count too large for a float (``--tokens`` of 400
    digits) as a power of ten rather than an OverflowError."""
    if nbytes < 1 << 1000:
        return f"{nbytes / GIB:.2f}"
    return f"about 10^{len(str(int(nbytes) // GIB)) - 1}"


def check_fits(
    host_bytes: int,
    what: str,
    available: int | None = None,
    hint: str = "use a smaller --cpu-gib / --cpu-chunks",
) -> None:
    """Raise a one-line :class:`InputError` when ``host_bytes`` exceed the free memory
    (``available``, default ``MemAvailable``); ``hint`` names the options that shrink it."""
    free = available if available is not None else available_memory()
    if free is not None and host_bytes > free:
        raise InputError(
            f"{what} needs {_gib(host_bytes)} GiB of host memory but only "
            f"{free / GIB:.2f} GiB is available; {hint}"
        )


def check_device_fits(
    device_bytes: int, torch_device: Any, what: str, hint: str, available: int | None = None
) -> None:
    """The same check for memory on a CUDA device (``available``, default what the driver
    reports free); nothing to check off CUDA (the caller counts a CPU stand-in as host)."""
    free = available if available is not None else device_memory_available(torch_device)
    if free is not None and device_bytes > free:
        raise InputError(
            f"{what} needs {_gib(device_bytes)} GiB on {torch_device} but only "
            f"{free / GIB:.2f} GiB is free there; {hint}"
        )
