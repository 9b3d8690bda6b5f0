"""The CPU tier as the tiering manager drives it.

Secondary tiers reach GPU data only through the CPU tier: a cascade *reads* CPU chunks
(pinned while the copy runs) and a promotion *writes* them. A cascade read is the
orchestrator's own transfer, not a request's access, so unlike ``prepare_load`` it must
not change what the eviction policy learns about the request (vLLM's
``CPUPrimaryTierOffloadingManager.prepare_read``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import OffloadManager, ProtocolError


class PrimaryTier(OffloadManager):
    """kvsim's CPU manager plus the pin-without-recording read that cascades need."""

    def prepare_read(self, keys: Sequence[ChunkKey]) -> list[int]:
        """Pin ready chunks for a copy to a secondary tier; their chunk ids."""
        chunks = []
        newly_pinned: list[ChunkKey] = []
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ref_cnt < 0:
                raise ProtocolError(f"prepare_read: chunk {key!r} is not ready in the CPU tier")
            if chunk.ref_cnt == 0:
                newly_pinned.append(key)
            chunk.ref_cnt += 1
            chunks.append(chunk)
        if newly_pinned:
            self._num_evictable -= len(newly_pinned)
            if self._tracks:
                self.policy.mark_non_evictable_many(newly_pinned)
        return [chunk.chunk_id for chunk in chunks]

    def complete_read(self, keys: Sequence[ChunkKey]) -> None:
        """Unpin after a cascade copy (the same bookkeeping as a finished load)."""
        self.complete_load(keys)
