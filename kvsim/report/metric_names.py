"""vLLM's offload metric names and histogram buckets, and a tiny histogram type.

kvsim reports the CPU tier under vLLM's own names so a dashboard built for vLLM reads
kvsim output unchanged.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CPU_CACHE_USAGE_PERC = "vllm:kv_offload_cpu_cache_usage_perc"
CPU_CACHE_WRITE_USAGE_PERC = "vllm:kv_offload_cpu_cache_write_usage_perc"
CPU_CACHE_READ_USAGE_PERC = "vllm:kv_offload_cpu_cache_read_usage_perc"
CPU_ALLOCATION_SIZE = "vllm:kv_offload_cpu_allocation_size"
STORES_SKIPPED = "vllm:kv_offload_stores_skipped"

ALLOCATION_SIZE_BUCKETS: tuple[float, ...] = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)


@dataclass
class Histogram:
    """Cumulative-bucket histogram (Prometheus style: ``le`` upper bounds, plus +Inf)."""

    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.count += 1
        self.sum += value

    def observe_all(self, values: Iterable[int]) -> None:
        """:meth:`observe` each value, a distinct value at a time: a hot loop collects its
        (few distinct, integer) values in a list rather than calling per value."""
        counts, buckets = self.counts, self.buckets
        for value, times in Counter(values).items():
            counts[bisect_left(buckets, value)] += times
            self.count += times
            self.sum += value * times
