"""vLLM 0.33 CPU-tier sizing arithmetic (``CPUOffloadingSpec.__init__`` and
``CPUOffloadingInfo``); see docs/vllm-offload-semantics.md sections 1.2-1.4.

::

    num_copies   = 1 if replicated_layout else world_size
    raw_chunk    = worker_kv_bytes_per_block * num_copies * blocks_per_chunk
    row_bytes    = round_up(raw_chunk, 4096)          # host page alignment
    num_chunks   = cpu_bytes_to_use // row_bytes
    slot         = raw_chunk // num_copies            # one worker's unpadded share
    size_bytes   = num_chunks * row_bytes
    size_tokens  = num_chunks * max_model_len // sum_g min(cdiv(max_model_len, tpc), window_g)

``cpu_bytes_to_use`` is the total over all workers (vLLM's ``--kv-offloading-size``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvsim.core.errors import InputError
from kvsim.core.units import GIB
from kvsim.specs.models import ModelSpec

__all__ = [
    "NULL_GPU_BLOCKS",
    "PAGE_ALIGNMENT",
    "CPUTierSizing",
    "KVGroup",
    "capacity_tokens",
    "cdiv",
    "gib",
    "refuse_sizing_without_model",
    "round_up",
    "row_bytes",
    "size_cpu_tier",
    "size_for_model",
    "sliding_window_size_in_chunks",
    "usable_gpu_blocks",
]

#: the options that size a model's KV (flag, default): nothing reads them without a model
KV_SIZING_OPTIONS = (("--tp", 1), ("--kv-cache-dtype", "auto"), ("--gpu-block-tokens", 16))


def refuse_sizing_without_model(
    model: str | None, tp: int, kv_cache_dtype: str, gpu_block_tokens: int
) -> None:
    """Without a model no chunk has bytes, so ``tp``, ``kv_cache_dtype`` and
    ``gpu_block_tokens`` (the chunk's whole GPU blocks) are read by nothing: one given
    other than its default is refused, not ignored (``mrc``, ``trace stats``), as it is
    checked against the chunk when a model is given."""
    if model is not None:
        return
    values = (tp, kv_cache_dtype, gpu_block_tokens)
    unread = [
        f"{flag} {value}"
        for (flag, default), value in zip(KV_SIZING_OPTIONS, values, strict=True)
        if value != default
    ]
    if unread:
        one = len(unread) == 1
        raise InputError(
            f"{', '.join(unread)} {'sizes' if one else 'size'} the KV of a --model, and "
            f"without one nothing reads {'it' if one else 'them'}: give --model, or leave "
            f"{'it' if one else 'them'} out"
        )


PAGE_ALIGNMENT = 4096  # SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT (mmap.PAGESIZE)

GROUP_KINDS = ("full", "sliding", "chunked_local", "mamba")

# vLLM's BlockPool takes block 0 out of its free queue as the null block (a placeholder
# for skipped positions) and never gives it to a request: of ``num_gpu_blocks`` (from
# memory or ``num_gpu_blocks_override``) one fewer hold KV. Its auto-fit of
# ``max_model_len`` and its capacity check plan against the usable ones too.
NULL_GPU_BLOCKS = 1


def usable_gpu_blocks(num_gpu_blocks: int) -> int:
    """GPU KV blocks a request can get out of vLLM's ``num_gpu_blocks`` (the null block
    taken out). Raises :class:`InputError` when none is left."""
    usable = num_gpu_blocks - NULL_GPU_BLOCKS
    if usable < 1:
        raise InputError(
            f"{num_gpu_blocks} GPU KV block(s) leave none for requests: vLLM keeps one as "
            f"its null block, so at least {NULL_GPU_BLOCKS + 1} are needed"
        )
    return usable


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``x``."""
    return cdiv(x, multiple) * multiple


def gib(x: float) -> int:
    """``x`` GiB in bytes, as vLLM converts ``--kv-offloading-size``."""
    return int(x * GIB)


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group as vLLM sees it."""

    kind: str = "full"  # "full" | "sliding" | "chunked_local" | "mamba"
    window: int | None = None  # sliding window tokens, or attention chunk size
    extra_retained_tokens: int = 0  # sliding window only (SlidingWindowSpec)


@dataclass(frozen=True)
class CPUTierSizing:
    """The CPU tier geometry vLLM derives from ``cpu_bytes_to_use``."""

    worker_kv_bytes_per_block: int
    num_copies: int
    raw_chunk_bytes: int  # worker bytes * copies * bpc
    row_bytes: int  # = vLLM's exposed kv_bytes_per_chunk, rounded up to 4096
    slot_bytes_per_worker: int  # raw_chunk // copies (cpu_page_size_per_worker)
    num_chunks: int
    tokens_per_chunk: int
    cpu_kv_cache_size_bytes: int  # num_chunks * row_bytes
    cpu_kv_cache_size_tokens: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sliding_window_size_in_chunks(
    group: KVGroup, tokens_per_chunk: int, extra_retained_tokens: int | None = None
) -> int | None:
    """Chunks of ``group`` the tier keeps for one request; None for full attention.

    ``extra_retained_tokens`` defaults to the group's own field.
    """
    if tokens_per_chunk <= 0:
        raise InputError(f"tokens per chunk must be positive, got {tokens_per_chunk}")
    kind = group.kind
    if kind == "full":
        return None
    if kind == "mamba":
        return 1  # Mamba depends on a single state
    if kind not in ("sliding", "chunked_local"):
        raise InputError(f"unknown KV group kind {kind!r}; known: {', '.join(GROUP_KINDS)}")
    w = group.window
    if w is None or w <= 0:
        raise InputError(f"a {kind} KV group needs a positive window, got {w}")
    if kind == "chunked_local":
        return cdiv(w, tokens_per_chunk)
    extra = group.extra_retained_tokens if extra_retained_tokens is None else extra_retained_tokens
    if extra < 0:
        raise InputError(f"extra_retained_tokens must be >= 0, got {extra}")
    return max(cdiv(w, tokens_per_chunk), cdiv(w - 1 + extra, tokens_per_chunk))


def capacity_tokens(
    num_chunks: int,
    max_model_len: int,
    tokens_per_chunk: int,
    groups: Sequence[KVGroup] = (KVGroup(),),
) -> int | None:
    """vLLM 0.33's ``cpu_kv_cache_size_tokens``: tokens the tier holds for requests of
    ``max_model_len`` tokens, or None when ``max_model_len <= 0`` or there are no groups."""
    if num_chunks < 0:
        raise InputError(f"num_chunks must be >= 0, got {num_chunks}")
    if max_model_len <= 0 or not groups:
        return None
    if tokens_per_chunk <= 0:
        raise InputError(f"tokens per chunk must be positive, got {tokens_per_chunk}")
    chunks_per_request = 0
    for group in groups:
        group_chunks = cdiv(max_model_len, tokens_per_chunk)
        window = sliding_window_size_in_chunks(group, tokens_per_chunk)
        if window is not None:
            group_chunks = min(group_chunks, window)
        chunks_per_request += group_chunks
    return num_chunks * max_model_len // chunks_per_request


def size_cpu_tier(
    cpu_bytes_to_use: int,
    *,
    worker_kv_bytes_per_block: int,
    blocks_per_chunk: int = 1,
    gpu_block_tokens: int = 16,
    world_size: int = 1,
    replicated_layout: bool = False,
    max_model_len: int = 0,
    groups: Sequence[KVGroup] = (KVGroup(),),
    require_one_chunk: bool = True,
) -> CPUTierSizing:
    """Size the CPU tier exactly as vLLM 0.33's ``CPUOffloadingSpec`` does.

    ``cpu_bytes_to_use`` is the total over all workers. With ``require_one_chunk`` a
    capacity that cannot hold a single chunk raises :class:`InputError`.
    """
    cpu_bytes_to_use = int(cpu_bytes_to_use)
    if cpu_bytes_to_use < 0:
        raise InputError(f"--cpu-gib must be >= 0, got {cpu_bytes_to_use} bytes")
    if worker_kv_bytes_per_block <= 0:
        raise InputError(
            f"worker_kv_bytes_per_block must be positive, got {worker_kv_bytes_per_block}"
        )
    if blocks_per_chunk <= 0:
        raise InputError(f"--blocks-per-chunk must be > 0, got {blocks_per_chunk}")
    if gpu_block_tokens <= 0:
        raise InputError(f"--block-size must be positive, got {gpu_block_tokens}")
    if world_size <= 0:
        raise InputError(f"--tp (world size) must be positive, got {world_size}")

    num_copies = 1 if replicated_layout else world_size
    raw_chunk = worker_kv_bytes_per_block * num_copies * blocks_per_chunk
    row_bytes = round_up(raw_chunk, PAGE_ALIGNMENT)
    num_chunks = cpu_bytes_to_use // row_bytes
    if require_one_chunk and num_chunks == 0:
        raise InputError(
            f"{cpu_bytes_to_use} bytes: capacity too small for one chunk "
            f"(needs {row_bytes} bytes per chunk)"
        )
    tokens_per_chunk = gpu_block_tokens * blocks_per_chunk
    return CPUTierSizing(
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        num_copies=num_copies,
        raw_chunk_bytes=raw_chunk,
        row_bytes=row_bytes,
        slot_bytes_per_worker=raw_chunk // num_copies,
        num_chunks=num_chunks,
        tokens_per_chunk=tokens_per_chunk,
        cpu_kv_cache_size_bytes=num_chunks * row_bytes,
        cpu_kv_cache_size_tokens=capacity_tokens(
            num_chunks, max_model_len, tokens_per_chunk, tuple(groups)
        ),
    )


def size_for_model(
    model: ModelSpec,
    cpu_bytes_to_use: int,
    *,
    gpu_block_tokens: int = 16,
    blocks_per_chunk: int = 1,
    tp: int = 1,
    dtype_bytes: int | None = None,
    replicated_layout: bool | None = None,
    max_model_len: int = 0,
    groups: Sequence[KVGroup] | None = None,
    require_one_chunk: bool = True,
) -> CPUTierSizing:
    """Size the CPU tier for a model at tensor-parallel size ``tp``.

        ``replicated_layout=None`` picks vLLM's default: on for MLA models at ``tp > 1``
        (single node, mp backend, CUDA assumed). ``groups=None`` means one full-attention
        group, or one sliding-window group when the model has ``sliding_window`` (and a full one
    beside it when only some layers slide). The model is
        a spec, looked up by the caller (names are resolved at the edge, once).
    """
    spec = model
    if gpu_block_tokens <= 0:
        raise InputError(f"--block-size must be positive, got {gpu_block_tokens}")
    if replicated_layout is None:
        replicated_layout = spec.is_mla and tp > 1
    if groups is None:
        sliding = spec.sliding_window
        if not sliding:
            groups = (KVGroup(),)
        elif spec.full_attention_layers:  # hybrid (gpt-oss): a full and a sliding group
            groups = (KVGroup(), KVGroup("sliding", sliding))
        else:
            groups = (KVGroup("sliding", sliding),)
    worker_bytes = spec.kv_bytes_per_token(dtype_bytes, tp) * gpu_block_tokens
    return size_cpu_tier(
        cpu_bytes_to_use,
        worker_kv_bytes_per_block=worker_bytes,
        blocks_per_chunk=blocks_per_chunk,
        gpu_block_tokens=gpu_block_tokens,
        world_size=tp,
        replicated_layout=replicated_layout,
        max_model_len=max_model_len,
        groups=groups,
        require_one_chunk=require_one_chunk,
    )


def row_bytes(chunk_bytes: int) -> int:
    """Host bytes one chunk takes: its raw bytes rounded up to the page (vLLM's row)."""
    return round_up(int(chunk_bytes), PAGE_ALIGNMENT)
