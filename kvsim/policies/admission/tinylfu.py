"""TinyLFU admission (Einziger et al., 2017): store a chunk once it is seen often enough.

:class:`TinyLFUAdmission` stores a chunk only when its estimated recent frequency
(:class:`~kvsim.policies.frequency_sketch.FrequencySketch`: a count-min sketch with a
doorkeeper), counting the current offer, reaches ``min_frequency`` (default 2). Unlike
vLLM's store threshold its memory does not grow with the number of keys, and old counts
fade. W-TinyLFU (``kvsim.policies.wtinylfu``) uses the same sketch to compare an admission
candidate with the eviction victim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvsim.core.context import RequestContext
from kvsim.core.errors import InputError
from kvsim.core.keys import ChunkKey
from kvsim.policies.admission.base import AdmissionPolicy, parse_arg
from kvsim.policies.frequency_sketch import FrequencySketch


class TinyLFUAdmission(AdmissionPolicy):
    """Store a chunk once a bounded frequency sketch has seen it often enough (fixed memory)."""

    name = "tinylfu"
    description = (
        "TinyLFU: store a chunk once a count-min sketch (+doorkeeper) has seen it N times "
        "(tinylfu:N, N=2)"
    )
    filters = True
    records_offers = True

    def __init__(
        self, min_frequency: int = 2, width: int = 65_536, seed: int = 0, doorkeeper: bool = True
    ) -> None:
        if min_frequency < 1:
            raise InputError(f"--admission tinylfu: frequency must be >= 1, got {min_frequency}")
        self.min_frequency = min_frequency
        self.sketch = FrequencySketch(width, seed=seed, doorkeeper=doorkeeper)

    @classmethod
    def from_arg(cls, arg: str, **kwargs: Any) -> TinyLFUAdmission:
        return cls(parse_arg(arg, int, "tinylfu:N"), seed=kwargs.get("seed", 0))

    def record_offer(self, keys: Sequence[ChunkKey]) -> None:
        increment = self.sketch.increment
        for key in keys:
            increment(key)

    def admit(
        self, candidates: list[ChunkKey], ctx: RequestContext | None = None
    ) -> list[ChunkKey]:
        estimate = self.sketch.estimate
        n = self.min_frequency
        return [k for k in candidates if estimate(k) >= n]

    def clear(self) -> None:
        self.sketch.clear()
