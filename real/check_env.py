"""The GPU check's first sections: the machine, what page-locking costs, and the clock.

* :func:`environment`: versions (Python, torch, CUDA runtime and driver, Triton,
  cuda-bindings), the GPU, its PCIe link (generation and width, read from sysfs while a copy
  runs: an idle link may train down to a lower generation) and its NUMA node, the host's
  CPUs and nodes, and which copy paths resolved;
* :func:`pinning_cost`: ``cudaHostRegister`` and ``cudaHostUnregister`` seconds per GiB of
  pre-faulted memory, and the NUMA node the pages landed on, or why registering was refused;
* :func:`timing_quantum`: the resolution of event timing, the float32 quantum of absolute
  event times as their reference ages, and how far mapping an event onto the host clock
  strays.

Everything is read with what the device image has (ctypes on the ``libcudart`` torch
loaded, sysfs, procfs, ``nvidia-smi`` when present); a figure that cannot be read is
recorded as ``None`` with the reason, never guessed. On a CPU device the CUDA parts say so.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import statistics
import subprocess
import time
from typing import Any

import numpy as np
import torch

from real.copy_path import resolve_batch_copy
from real.cuda_rt import PinError, host_register, host_unregister, libcudart
from real.device import Device, as_cuda_stream
from real.host_pool import aligned_empty
from real.triton_load import resolve_gather_kernel

GT_PER_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
ATTR_HOST_POINTER_FOR_REGISTERED_MEM = 91  # cudaDevAttrCanUseHostPointerForRegisteredMem
GIB = 1 << 30


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _rt_int(name: str, *args: int) -> int | None:
    """An ``int``-returning CUDA runtime query (``cudaDriverGetVersion`` and the like)."""
    lib = libcudart()
    if lib is None:
        return None
    out = ctypes.c_int(0)
    fn = getattr(lib, name)
    return out.value if fn(ctypes.byref(out), *args) == 0 else None


def _version(code: int | None) -> str | None:
    return None if code is None else f"{code // 1000}.{code % 1000 // 10}"


def pci_bus_id(index: int) -> str | None:
    """The GPU's PCI address as sysfs spells it (``0000:3b:00.0``), from the runtime."""
    lib = libcudart()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(32)
    if lib.cudaDeviceGetPCIBusId(buf, len(buf), index) != 0:
        return None
    domain, bus, rest = buf.value.decode().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


def pcie_link(bus_id: str | None, devices: str = "/sys/bus/pci/devices") -> dict[str, Any]:
    """The link's speed, generation and width (current and maximum) from sysfs, the GPU's
    NUMA node, and each link on the way up to the root port (a switch may be narrower)."""
    if bus_id is None:
        return {"error": "no PCI bus id"}
    base = os.path.realpath(f"{devices}/{bus_id}")
    if not os.path.isdir(base):
        return {"error": f"no sysfs entry for {bus_id}"}
    out: dict[str, Any] = {"bus_id": bus_id, "numa_node": _read(f"{base}/numa_node")}
    for which in ("current", "max"):
        speed = _read(f"{base}/{which}_link_speed")  # "32.0 GT/s PCIe"
        out[f"{which}_speed"] = speed
        out[f"{which}_gen"] = GT_PER_GEN.get((speed or "").split(" ")[0])
        out[f"{which}_width"] = _read(f"{base}/{which}_link_width")
    upstream = []
    parent = os.path.dirname(base)
    while os.path.exists(f"{parent}/current_link_width"):
        upstream.append(
            {
                "device": os.path.basename(parent),
                "speed": _read(f"{parent}/current_link_speed"),
                "width": _read(f"{parent}/current_link_width"),
            }
        )
        parent = os.path.dirname(parent)
    out["upstream"] = upstream
    return out


def nvidia_smi(bus_id: str | None) -> dict[str, Any]:
    """The driver's own view of the link and version, when ``nvidia-smi`` is installed."""
    exe = shutil.which("nvidia-smi")
    if exe is None or bus_id is None:
        return {"error": "nvidia-smi not found" if exe is None else "no PCI bus id"}
    fields = (
        "driver_version,pcie.link.gen.current,pcie.link.gen.max,"
        "pcie.link.width.current,pcie.link.width.max"
    )
    try:
        proc = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", bus_id],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    values = [v.strip() for v in proc.stdout.strip().split(",")]
    if proc.returncode != 0 or len(values) != 5:
        return {"error": (proc.stderr or proc.stdout).strip()[:200]}
    return dict(zip(fields.split(","), values))


def _link_while_busy(device: Device, bus: str | None, seconds: float = 0.3) -> dict[str, Any]:
    """The link read while about ``seconds`` of H2D copies run on a side stream, so it is
    trained up to its working generation (asynchronous copies need pinned memory)."""
    try:
        host = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as exc:
        return {"error": f"no pinned buffer to keep the link busy ({exc})"}
    gpu = torch.empty_like(host, device=device.torch_device)
    stream = as_cuda_stream(device.stream("check-link")).raw
    with torch.cuda.stream(stream):
        for _ in range(int(seconds * 50e9 / host.numel()) + 1):
            gpu.copy_(host, non_blocking=True)
    link = pcie_link(bus)
    stream.synchronize()
    link["busy"] = True
    return link


def host_numa() -> dict[str, Any]:
    """The host's NUMA nodes (their CPUs) and the CPUs this process may run on."""
    nodes = {}
    root = "/sys/devices/system/node"
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if name.startswith("node") and name[4:].isdigit():
            nodes[name[4:]] = _read(f"{root}/{name}/cpulist")
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = []
    return {"nodes_cpus": nodes, "process_cpus": _ranges(allowed)}


def _ranges(cpus: list[int]) -> str:
    parts, start = [], None
    for i, c in enumerate(cpus):
        start = c if start is None else start
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            parts.append(f"{start}-{c}" if c != start else str(c))
            start = None
    return ",".join(parts)


def environment(device: Device) -> dict[str, Any]:
    """What the check ran on (see the module docstring)."""
    cpu_model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in (_read("/proc/cpuinfo") or "").splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or None,
    )
    env: dict[str, Any] = {
        "device": device.kind,
        "mode": device.mode,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host_cpu": cpu_model,
        "host_cpus": os.cpu_count(),
        "host_memory_gib": _meminfo_gib(),
        "host_numa": host_numa(),
        "copy_path": device.copy_path().name,
        "load_kernel": resolve_gather_kernel(device)[1],
    }
    if not device.is_cuda:
        return env
    index = device.torch_device.index or 0
    props = torch.cuda.get_device_properties(index)
    bus = pci_bus_id(index)
    link_busy = _link_while_busy(device, bus)
    env.update(
        gpu=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        gpu_memory_gib=props.total_memory / GIB,
        sms=props.multi_processor_count,
        cuda_runtime=torch.version.cuda,
        cuda_runtime_loaded=_version(_rt_int("cudaRuntimeGetVersion")),
        cuda_driver_api=_version(_rt_int("cudaDriverGetVersion")),
        nvidia_driver=(_read("/sys/module/nvidia/version") or None),
        triton=_module_version("triton"),
        cuda_bindings=_module_version("cuda.bindings"),
        batch_copy=resolve_batch_copy()[1],
        host_pointer_usable_for_registered_memory=_rt_int(
            "cudaDeviceGetAttribute", ATTR_HOST_POINTER_FOR_REGISTERED_MEM, index
        ),
        pcie_under_load=link_busy,
        pcie_idle=pcie_link(bus),
        nvidia_smi=nvidia_smi(bus),
    )
    return env


def _module_version(name: str) -> str | None:
    try:
        module = __import__(name, fromlist=["__version__"])
    except Exception as exc:  # not installed, or broken
        return f"not importable ({type(exc).__name__})"
    return str(getattr(module, "__version__", "?"))


def _meminfo_gib() -> float | None:
    for ln in (_read("/proc/meminfo") or "").splitlines():
        if ln.startswith("MemTotal:"):
            return int(ln.split()[1]) * 1024 / GIB
    return None


def numa_pages(address: int) -> dict[str, int]:
    """Pages per NUMA node of the mapping holding ``address`` (``/proc/self/maps`` for the
    mapping, which the kernel may have merged with a neighbour; ``numa_maps`` for its
    pages)."""
    start = None
    for ln in (_read("/proc/self/maps") or "").splitlines():
        lo, hi = (int(v, 16) for v in ln.split()[0].split("-"))
        if lo <= address < hi:
            start = lo
            break
    for ln in (_read("/proc/self/numa_maps") or "").splitlines():
        fields = ln.split()
        if start is not None and fields and int(fields[0], 16) == start:
            return {
                f[1:].split("=")[0]: int(f.split("=")[1])
                for f in fields
                if f.startswith("N") and "=" in f
            }
    return {}


def pinning_cost(device: Device, sizes_gib: tuple[float, ...] = (1.0, 4.0)) -> dict[str, Any]:
    """Seconds per GiB to register and unregister pre-faulted memory, per size; ``works``
    False (with the error) when ``cudaHostRegister`` is refused on this host."""
    if not device.is_cuda:
        return {"works": None, "why": "not a CUDA device: nothing is page-locked"}
    runs: list[dict[str, Any]] = []
    for gib in sizes_gib:
        nbytes = int(gib * GIB)
        region = aligned_empty(nbytes, torch.uint8)
        region.zero_()  # pre-faulted, as the pool is: only the registration is timed
        ptr = region.data_ptr()
        t0 = time.perf_counter()
        try:
            host_register(ptr, nbytes)
        except PinError as exc:
            return {"works": False, "error": str(exc), "runs": runs}
        t1 = time.perf_counter()
        nodes = numa_pages(ptr)
        host_unregister(ptr)
        t2 = time.perf_counter()
        runs.append(
            {
                "gib": gib,
                "register_s_per_gib": (t1 - t0) / gib,
                "unregister_s_per_gib": (t2 - t1) / gib,
                "numa_pages": nodes,
            }
        )
    return {
        "works": True,
        "runs": runs,
        "register_s_per_gib": max(float(r["register_s_per_gib"]) for r in runs),
    }


def timing_quantum(device: Device, pairs: int = 200) -> dict[str, Any]:
    """How fine job times are (see the module docstring)."""
    ages = (10.0, 60.0, 300.0)
    if not device.is_cuda:
        info = time.get_clock_info("perf_counter")
        steps = [b - a for a, b in _consecutive(time.perf_counter, pairs)]
        return {
            "clock": "perf_counter (float64 seconds)",
            "resolution_s": info.resolution,
            "smallest_step_s": min((s for s in steps if s > 0), default=None),
            "absolute_quantum_us_at_age_s": {str(a): float(np.spacing(a)) * 1e6 for a in ages},
        }
    stream = as_cuda_stream(device.stream("check-timing")).raw
    events = []
    with torch.cuda.stream(stream):
        for _ in range(pairs):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record(stream)
            b.record(stream)
            events.append((a, b))
    stream.synchronize()
    gaps = [a.elapsed_time(b) * 1e3 for a, b in events]  # us
    mapping = []
    device.reanchor()
    for _ in range(20):
        ev = device.new_event()
        ev.record(device.compute_stream)
        ev.synchronize()
        host = device.clock()
        mapping.append(abs(ev.time() - host) * 1e6)
    return {
        "clock": "CUDA events: durations between two events, absolute times from a reference",
        "back_to_back_us": {
            "min_nonzero": min((g for g in gaps if g > 0), default=None),
            "median": statistics.median(gaps),
            "max": max(gaps),
        },
        "absolute_quantum_us_at_age_s": {
            str(a): float(np.spacing(np.float32(a * 1e3))) * 1e3 for a in ages
        },
        "host_mapping_error_us": {"median": statistics.median(mapping), "max": max(mapping)},
    }


def _consecutive(clock: Any, n: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(n):
        a = clock()
        out.append((a, clock()))
    return out
