"""Length admission: do not offload requests shorter than ``min_tokens`` tokens.

Short prompts are cheap to recompute and rarely shared; keeping them out leaves the CPU
tier to long contexts. A request's length is the end position of its last complete chunk,
read from the request context the manager passes to ``admit``; without a context (a bare
call) it is measured from the offer, as ``len(offer) * chunk_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvsim.core.context import RequestContext
from kvsim.core.errors import InputError
from kvsim.core.keys import ChunkKey
from kvsim.policies.admission.base import AdmissionPolicy, parse_arg


class LengthAdmission(AdmissionPolicy):
    """Keep short requests out of the CPU tier: they are cheap to recompute and rarely shared."""

    name = "length"
    description = "skip requests shorter than N tokens (length:N, N=1024)"
    filters = True
    records_offers = True

    def __init__(self, min_tokens: int = 1024, chunk_tokens: int = 512, seed: int = 0) -> None:
        if min_tokens < 0:
            raise InputError(f"--admission length:N needs N >= 0, got {min_tokens}")
        if chunk_tokens < 1:
            raise InputError(f"length admission: chunk_tokens must be >= 1, got {chunk_tokens}")
        self.min_tokens = min_tokens
        self.chunk_tokens = chunk_tokens
        self._offer_tokens = 0

    @classmethod
    def from_arg(cls, arg: str, **kwargs: Any) -> LengthAdmission:
        extra = {k: kwargs[k] for k in ("chunk_tokens", "seed") if k in kwargs}
        return cls(parse_arg(arg, int, "length:N"), **extra)

    def record_offer(self, keys: Sequence[ChunkKey]) -> None:
        self._offer_tokens = len(keys) * self.chunk_tokens

    def admit(
        self, candidates: list[ChunkKey], ctx: RequestContext | None = None
    ) -> list[ChunkKey]:
        if ctx is not None and ctx.positions:
            tokens = max(ctx.positions.values())
        else:
            tokens = self._offer_tokens
        return candidates if tokens >= self.min_tokens else []
