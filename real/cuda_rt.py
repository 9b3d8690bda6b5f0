"""Page-locking host memory with ``cudaHostRegister``, leaving no CUDA error behind.

A failed ``cudaHostRegister`` (or ``cudaHostUnregister``) records its error as the CUDA
runtime's *last error*; torch checks ``cudaGetLastError`` after its next kernel launch and
would raise it there, as an unrelated failure. vLLM clears it at once
(``host_register.py``); so do we, through the same ``libcudart`` torch loaded (read off
``/proc/self/maps``: cuda-bindings' runtime is a different instance with its own error
state). Nothing here runs unless CUDA is used.
"""

from __future__ import annotations

import ctypes
import functools

import torch


class PinError(RuntimeError):
    """Page-locking host memory failed."""


def _code(err: object) -> int:
    value = getattr(err, "value", err)
    return int(value)  # type: ignore[call-overload]


@functools.cache
def _libcudart() -> ctypes.CDLL | None:
    """The ``libcudart`` this process already loaded (torch's), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = [ln.split()[-1] for ln in f if "libcudart" in ln and "/" in ln]
    except OSError:
        paths = []
    names = [*dict.fromkeys(paths), "libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def libcudart() -> ctypes.CDLL | None:
    """The CUDA runtime library torch loaded (for queries torch does not expose)."""
    return _libcudart()


def clear_last_error() -> None:
    """Reset the CUDA runtime's last error (``cudaGetLastError``), as vLLM does."""
    lib = _libcudart()
    if lib is not None:
        lib.cudaGetLastError()


def host_register(ptr: int, nbytes: int) -> None:
    """``cudaHostRegister(ptr, nbytes, 0)``; raises :class:`PinError` with the error cleared."""
    err = _code(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))
    if err != 0:
        clear_last_error()
        raise PinError(f"cudaHostRegister({nbytes} bytes) failed with error {err}")


def host_unregister(ptr: int) -> None:
    """``cudaHostUnregister(ptr)``; raises :class:`PinError` with the error cleared."""
    err = _code(torch.cuda.cudart().cudaHostUnregister(ptr))
    if err != 0:
        clear_last_error()
        raise PinError(f"cudaHostUnregister failed with error {err}")
