"""Probabilistic admission: store each new chunk with probability ``p``.

A cheap way to keep one-off prompts from flushing the CPU tier (popular chunks are
offered again and get in eventually). Coins come from a ``random.Random(seed)`` owned by
the policy, so a run is reproducible.
"""

from __future__ import annotations

import random
from typing import Any

from kvsim.core.context import RequestContext
from kvsim.core.errors import InputError
from kvsim.core.keys import ChunkKey
from kvsim.policies.admission.base import AdmissionPolicy, parse_arg


class ProbabilisticAdmission(AdmissionPolicy):
    """Admit each new chunk with probability ``p`` (seeded), so one-offs rarely flush the tier."""

    name = "probabilistic"
    description = "admit each new chunk with probability p (probabilistic:P, P=0.5; seeded)"
    filters = True

    def __init__(self, probability: float = 0.5, seed: int = 0) -> None:
        if not 0.0 <= probability <= 1.0:
            raise InputError(f"--admission probabilistic:P needs 0 <= P <= 1, got {probability}")
        self.probability = probability
        self.seed = seed
        self._rng = random.Random(seed)

    @classmethod
    def from_arg(cls, arg: str, **kwargs: Any) -> ProbabilisticAdmission:
        return cls(parse_arg(arg, float, "probabilistic:P"), seed=kwargs.get("seed", 0))

    def admit(
        self, candidates: list[ChunkKey], ctx: RequestContext | None = None
    ) -> list[ChunkKey]:
        p = self.probability
        rnd = self._rng.random
        return [k for k in candidates if rnd() < p]

    def clear(self) -> None:
        self._rng = random.Random(self.seed)
