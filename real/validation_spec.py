"""What a validation run runs (:class:`ValidationSpec`), in a module of its own: the run
(:mod:`real.validate`) and its report (:mod:`real.validation_report`) both name it, and
neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsim.core.errors import InputError
from kvsim.specs.models import ModelSpec, get_model
from real import job_noise
from real.kv_cache import LAYER_MAJOR, LAYOUTS
from real.trace_slice import SELECTIONS

__all__ = [
    "MAX_COMPUTE_SCALE",
    "MAX_GPU_KV_GIB",
    "SMALL_KV_MODEL",
    "TINY_KV_MODEL",
    "ValidationSpec",
]

#: the most a modelled forward pass is stretched (``--compute-scale``): at 1000x a 10 ms
#: decode step lasts 10 s and a 500-request run days, so beyond it a run sleeps rather than
#: measures (and a sleep of centuries overflows ``time.sleep``: the process aborted)
MAX_COMPUTE_SCALE = 1000.0
#: the largest real GPU KV cache asked for (``--max-gpu-kv-gib``): more than any GPU holds
#: (an H200 has 141 GB, a B200 192 GB); what the machine cannot hold is refused later, by
#: the run's memory check, and a bound keeps the block count a finite integer
MAX_GPU_KV_GIB = 1024.0

TINY_KV_MODEL = replace(
    get_model("llama-3.2-1b"), name="tiny-kv", num_layers=2, num_kv_heads=1, head_dim=16
)
#: llama-3.2-1b's compute with a KV small enough for a CPU machine's memory: 2 KiB a token
#: (one 32-dim KV head per layer), so a 512-token Mooncake block is 1 MiB in 16 pages of
#: 64 KiB (the size of one layer's page of a Llama-3.1-8B block in vLLM's layout)
SMALL_KV_MODEL = replace(
    get_model("llama-3.2-1b"), name="llama-3.2-1b-small-kv", num_kv_heads=1, head_dim=32
)


@dataclass(frozen=True)
class ValidationSpec:
    """What to run; the same values drive both runs."""

    model: str | ModelSpec = "llama-3.1-8b"  # a preset name, or a ModelSpec (tests)
    cpu_gib: float | None = 16.0
    cpu_chunks: int | None = None
    limit: int | None = 500
    layout: str = LAYER_MAJOR
    gpu: str = "h200"
    gpu_blocks: int | None = None  # None: vLLM's budget, capped by max_gpu_kv_gib
    max_gpu_kv_gib: float = 48.0  # real GPU cache is allocated: keep it bounded
    time_scale: float = 1.0
    poisson_rate: float | None = None
    compute_scale: float = 1.0  # multiplies every modelled step (both runs)
    policy: str = "lru"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    seed: int = 0
    allow_unpinned: bool = False  # on CUDA, run even if page-locking the pool fails
    select: str = "all"  # or "conversations" (real.trace_slice)
    noise_jobs: int = job_noise.DEFAULT_JOBS  # jobs replayed alone to measure noise (0: none)
    noise_repeats: int = job_noise.DEFAULT_REPEATS

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InputError(f"--layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.select not in SELECTIONS:
            raise InputError(
                f"--select must be one of {', '.join(SELECTIONS)}, got {self.select!r}"
            )
        if self.noise_jobs < 0 or self.noise_repeats < 2:
            raise InputError("noise needs noise_jobs >= 0 and noise_repeats >= 2")
        _check_range("--compute-scale", self.compute_scale, MAX_COMPUTE_SCALE)
        _check_range("--max-gpu-kv-gib", self.max_gpu_kv_gib, MAX_GPU_KV_GIB)

    @classmethod
    def small_for_tests(cls) -> ValidationSpec:
        """Seconds on CPU for the bundled Bailian sample (26 chat requests, 16-token
        blocks): llama-3.2-1b's compute with a tiny KV (2 KiB per block), and a GPU cache
        small enough that later turns hit the CPU tier (60 blocks, 61 with vLLM's null
        block)."""
        return cls(
            model=TINY_KV_MODEL,
            cpu_gib=None,
            cpu_chunks=512,
            limit=None,
            gpu_blocks=61,
            time_scale=0.03,
            compute_scale=0.1,
            max_gpu_kv_gib=1.0,
        )

    @classmethod
    def for_cpu_check(cls) -> ValidationSpec:
        """About a minute on a 2-core machine: 150 conversation turns of the Mooncake trace
        with :data:`SMALL_KV_MODEL` (1 MiB blocks), a 2 GiB tier and a 60-block cache
        (61 with vLLM's null block; 36 load and 226 store jobs), arrivals 10x faster, a
        quarter-length forward."""
        return cls(
            model=SMALL_KV_MODEL,
            cpu_gib=None,
            cpu_chunks=2048,
            limit=150,
            select="conversations",
            gpu_blocks=61,
            time_scale=0.1,
            compute_scale=0.25,
            max_gpu_kv_gib=1.0,
            noise_jobs=16,
        )

    @classmethod
    def for_gpu_check(cls) -> ValidationSpec:
        """About 30 s of run on one H200 (simulated: 28 s): 300 conversation turns of the
        Mooncake trace (``select="conversations"``) with llama-3.2-1b (16 MiB per 512-token
        block), a 24 GiB pinned tier, a 60-block GPU cache (61 with vLLM's null block)
        tight enough that later turns load from the tier (simulated: 51 load and 466 store
        jobs), arrivals 10x faster and a quarter-length forward, so the run is short and the
        copies weigh."""
        return cls(
            model="llama-3.2-1b",
            cpu_gib=24.0,
            limit=300,
            select="conversations",
            gpu_blocks=61,
            time_scale=0.1,
            compute_scale=0.25,
        )


def _check_range(option: str, value: float, most: float) -> None:
    """``0 < value <= most``, written so that NaN fails it too (NaN passes ``value <= 0``)."""
    if not 0 < value <= most:
        raise InputError(f"{option} must be above 0 and at most {most:g}, got {value:g}")
