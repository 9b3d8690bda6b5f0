"""The admission interface: which new chunks may enter the CPU tier.

Admission is separate from eviction so any rule combines with any eviction policy.
The manager calls ``record_offer`` with every ``prepare_store`` offer (before it splits
the offer), then ``admit`` with the non-resident candidates; resident ready chunks
bypass admission, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, TypeVar

from kvsim.core.context import RequestContext
from kvsim.core.errors import InputError
from kvsim.core.keys import ChunkKey

_Number = TypeVar("_Number", int, float)


def parse_arg(arg: str, kind: type[_Number], usage: str) -> _Number:
    """The ``N`` of ``--admission name:N`` as ``kind``; a one-line error names the usage."""
    try:
        return kind(arg)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise InputError(f"--admission {usage} needs {noun}, got {arg!r}") from None


class AdmissionPolicy:
    """Admit everything. Subclasses override ``record_offer`` and ``admit``, and say so
    with the flags: a manager calls a hook only when its flag is set."""

    name: ClassVar[str] = "always"
    description: ClassVar[str] = "admit every new chunk (vLLM's default, store_threshold < 2)"
    #: True when ``record_offer`` does something; False lets the manager skip the
    #: per-offer bookkeeping call entirely.
    records_offers: ClassVar[bool] = False
    #: True when ``admit`` may keep a candidate out; False lets the manager skip the call
    #: (every candidate is admitted) and build no request context for it.
    filters: ClassVar[bool] = False

    def record_offer(self, keys: Sequence[ChunkKey]) -> None:
        """See one offer (every key passed to one prepare_store call)."""

    def admit(
        self, candidates: list[ChunkKey], ctx: RequestContext | None = None
    ) -> list[ChunkKey]:
        """Return the admitted subset of the non-resident candidates, order kept.

        ``ctx`` is the offering request (its key positions tell the request's length)."""
        return candidates

    def clear(self) -> None:
        """Forget everything learned so far."""
