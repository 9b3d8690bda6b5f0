"""Which copy path a transfer job takes, as vLLM 0.33's CPU offloading worker chooses it.

One place for the rule, so that the simulated link (:mod:`kvsim.engine.transfer_model`)
and the real backend (:mod:`real.copy_path`) cannot disagree. vLLM 0.33
(``v1/kv_offload/cpu/gpu_worker.py``, ``_select_swap_blocks_fn``; constants in
``swap_blocks_triton.py``, tuned on an H100): GPU->CPU stores always go through the copy
engine (one ``cuMemcpyBatchAsync`` per job). CPU->GPU loads go through a Triton gather
kernel instead when the host memory is pinned, Triton is usable (CUDA, not ROCm/XPU),
every page is under 28 KiB and a multiple of 8 bytes, and the job has at least 16
descriptors; otherwise through the copy engine.
"""

from __future__ import annotations

KERNEL_MAX_PAGE_BYTES = 28 * 1024  # pages must be strictly smaller
KERNEL_MIN_DESCRIPTORS = 16
KERNEL_WORD_BYTES = 8  # the kernel copies 8-byte words


def load_uses_kernel(
    page_bytes: int, descriptors: int, *, pinned: bool = True, kernel_available: bool = True
) -> bool:
    """True when vLLM would run a CPU->GPU job of ``descriptors`` pages of at most
    ``page_bytes`` bytes through its Triton gather kernel rather than DMA."""
    return (
        pinned
        and kernel_available
        and 0 < page_bytes < KERNEL_MAX_PAGE_BYTES
        and page_bytes % KERNEL_WORD_BYTES == 0
        and descriptors >= KERNEL_MIN_DESCRIPTORS
    )
