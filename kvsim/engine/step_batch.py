"""What one engine step computes, in aggregate (:class:`StepBatch`): the one value every
step-time model reads (:mod:`kvsim.engine.compute_model`, :mod:`kvsim.engine.phase_compute`,
the real backend's emulated compute), in a module of its own so that they import it, not
each other."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["StepBatch"]


class StepBatch(NamedTuple):
    """What one step computes, in aggregate. A named tuple, not a frozen dataclass: the
    engine makes one per step, and a tuple is built in C (a frozen dataclass sets each
    field through ``object.__setattr__``)."""

    num_seqs: int
    num_prefill_seqs: int
    prefill_tokens: int
    decode_tokens: int
    context_tokens: int  # cached tokens read by attention (sum over the batch)
    attention_pairs: float  # (query, key) pairs
    # the part of context_tokens that decoding requests read; None (callers that predate
    # it): all of it in a batch without prefills, none otherwise
    decode_context_tokens: int | None = None

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    @property
    def decode_context(self) -> int:
        if self.decode_context_tokens is not None:
            return self.decode_context_tokens
        return self.context_tokens if self.num_prefill_seqs == 0 else 0
