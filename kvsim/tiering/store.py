"""What a secondary tier holds.

vLLM's ``fs``, ``obj`` and ``example`` tiers have no capacity limit: a chunk written stays
(:class:`UnboundedStore`). Beyond vLLM, kvsim can give a tier a capacity and any kvsim
eviction policy (:class:`BoundedStore`): the tier is then a kvsim CPU-tier manager of its
own, so a policy means the same thing on every tier. Either way a chunk becomes visible
when its write finishes, as a file appears when vLLM's ``fs`` tier renames it into place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey
from kvsim.manager.offload import LookupResult, OffloadManager


class TierStore(Protocol):
    """The few calls a secondary tier makes on its backing store."""

    @property
    def capacity_chunks(self) -> int | None: ...

    @property
    def evicted_chunks(self) -> int: ...

    def contains(self, key: ChunkKey) -> bool: ...

    def begin_write(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> list[ChunkKey] | None:
        """Reserve room for a write; the keys that will be written, or None (no room)."""

    def end_write(self, keys: Sequence[ChunkKey], ctx: RequestContext, success: bool) -> None: ...

    def read(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        """A promotion read these (present) keys: the policy sees the access."""

    def on_request_finished(self, ctx: RequestContext) -> None: ...

    def __len__(self) -> int: ...


class UnboundedStore:
    """vLLM's tiers: every written chunk stays; a rewrite overwrites."""

    def __init__(self) -> None:
        self._keys: set[ChunkKey] = set()

    @property
    def capacity_chunks(self) -> int | None:
        return None

    @property
    def evicted_chunks(self) -> int:
        return 0

    def contains(self, key: ChunkKey) -> bool:
        return key in self._keys

    def begin_write(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> list[ChunkKey] | None:
        return list(keys)

    def end_write(self, keys: Sequence[ChunkKey], ctx: RequestContext, success: bool) -> None:
        if success:
            self._keys.update(keys)

    def read(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        return

    def on_request_finished(self, ctx: RequestContext) -> None:
        return

    def __len__(self) -> int:
        return len(self._keys)


class BoundedStore:
    """A capacity in chunks and an eviction policy (beyond vLLM), run by kvsim's manager:
    a write evicts as a CPU-tier store does, a read is an access, a request's accesses
    reach the policy when it finishes; chunks that are being written cannot be evicted."""

    def __init__(self, manager: OffloadManager) -> None:
        self.manager = manager

    @property
    def capacity_chunks(self) -> int | None:
        return self.manager.num_chunks

    @property
    def evicted_chunks(self) -> int:
        return self.manager.counters.evicted_chunks

    def contains(self, key: ChunkKey) -> bool:
        return self.manager.lookup(key) is LookupResult.HIT

    def begin_write(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> list[ChunkKey] | None:
        out = self.manager.prepare_store(keys, ctx)
        return None if out is None else list(out.keys_to_store)

    def end_write(self, keys: Sequence[ChunkKey], ctx: RequestContext, success: bool) -> None:
        if keys:
            self.manager.complete_store(keys, ctx, success)

    def read(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        if keys:
            self.manager.prepare_load(keys, ctx)
            self.manager.complete_load(keys, ctx)

    def on_request_finished(self, ctx: RequestContext) -> None:
        self.manager.on_request_finished(ctx)

    def __len__(self) -> int:
        return self.manager.num_resident
