"""vLLM 0.33's ``store_threshold``: store a chunk only once it was offered N times.

Counts live in an LRU-ordered table capped at ``max_tracker_size``; keys of the current
offer are never dropped from the table to make room for other keys of the same offer
(PR #54759), so an oversized offer still makes progress. Counts never decay and are not
deleted when a chunk gets stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvsim.core.context import RequestContext
from kvsim.core.errors import InputError
from kvsim.core.keys import ChunkKey
from kvsim.options.config import THRESHOLD_FILTERS_FROM
from kvsim.policies.admission.base import AdmissionPolicy, parse_arg


class StoreThresholdAdmission(AdmissionPolicy):
    """vLLM's ``store_threshold``: store a chunk only once offered N times, keeping one-offs out."""

    name = "threshold"
    description = "vLLM store_threshold: admit a chunk after N offers (bounded LRU counter table)"
    filters = True
    records_offers = True

    def __init__(
        self, store_threshold: int = THRESHOLD_FILTERS_FROM, max_tracker_size: int = 64_000
    ) -> None:
        if store_threshold < THRESHOLD_FILTERS_FROM:
            raise InputError(
                f"--store-threshold must be >= {THRESHOLD_FILTERS_FROM} to filter, "
                f"got {store_threshold}"
            )
        if max_tracker_size < 1:
            raise InputError(f"--max-tracker-size must be >= 1, got {max_tracker_size}")
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[ChunkKey, int] = OrderedDict()

    @classmethod
    def from_arg(cls, arg: str, max_tracker_size: int = 64_000) -> StoreThresholdAdmission:
        """``--admission threshold:N``: ``--store-threshold N``."""
        return cls(parse_arg(arg, int, "threshold:N"), max_tracker_size)

    def record_offer(self, keys: Sequence[ChunkKey]) -> None:
        counts = self.counts
        protected = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                protected.add(key)
        unprotected = len(counts) - len(protected)
        limit = self.max_tracker_size
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= limit:
                if unprotected == 0:
                    continue  # not tracked this time
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1

    def admit(
        self, candidates: list[ChunkKey], ctx: RequestContext | None = None
    ) -> list[ChunkKey]:
        counts = self.counts
        threshold = self.store_threshold
        return [k for k in candidates if counts.get(k, 0) >= threshold]

    def clear(self) -> None:
        self.counts.clear()
