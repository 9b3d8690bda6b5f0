"""vLLM 0.33's ARC variant (the one vLLM ships as ``arc``; not textbook ARC).

Differences from the paper that this class keeps on purpose, because vLLM makes them:
insertions always go to T1; promotion to T2 happens only when a request that *reused* a
ready chunk finishes; ghost hits adapt ``p`` once per request per key, from store misses;
the eviction test is ``virtual |T1| >= int(p)``, with a T2 fallback and then a T1
fallback, scanning each list once; B1 and B2 are each capped at ``capacity``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from enum import Enum
from typing import Final, TypeVar

from kvsim.core.context import RequestContext, order_request_keys
from kvsim.core.keys import ChunkKey
from kvsim.policies.base import Chunk, EvictionPolicy

_V = TypeVar("_V")  # what T1 and T2 map keys to: chunks here, None in the fused tier
_E = TypeVar("_E")  # a scanned entry: (key, chunk) here, a key in the fused tier


class _End(Enum):
    """The end of a scan (an enum member, so ``is`` narrows the type)."""

    END = 0


_END: Final = _End.END


def _evictable_entries(
    entries: OrderedDict[ChunkKey, Chunk], protected: AbstractSet[ChunkKey]
) -> Iterator[tuple[ChunkKey, Chunk]]:
    for key, chunk in entries.items():
        if chunk.ref_cnt == 0 and key not in protected:
            yield key, chunk


def adapt_to_ghost_hit(
    p: float,
    key: ChunkKey,
    b1: OrderedDict[ChunkKey, None],
    b2: OrderedDict[ChunkKey, None],
    capacity: int,
) -> float:
    """vLLM's ghost adaptation: a B1 hit grows the T1 target, a B2 hit shrinks it; the
    ghost moves to its list's MRU end. Returns the new target."""
    if key in b1:
        b1.move_to_end(key)
        return min(p + max(1, len(b2) / len(b1)), capacity)
    if key in b2:
        b2.move_to_end(key)
        return max(p - max(1, len(b1) / len(b2)), 0)
    return p


def finish_request(
    keys: Sequence[ChunkKey],
    insertion_only: AbstractSet[ChunkKey],
    reused: AbstractSet[ChunkKey],
    t1: OrderedDict[ChunkKey, _V],
    t2: OrderedDict[ChunkKey, _V],
) -> None:
    """vLLM's ARC at a request's finish, tail first (``keys`` head first): a key it only
    inserted moves to its list's MRU end (a store is no frequency hit); a key it reused is
    promoted from T1, or moved within T2, to T2's MRU end. Other keys are left alone."""
    for key in reversed(keys):
        if key in insertion_only:
            if key in t1:
                t1.move_to_end(key)
            elif key in t2:
                t2.move_to_end(key)
        elif key in reused:
            if key in t1:
                t2[key] = t1.pop(key)
            elif key in t2:
                t2.move_to_end(key)


def retire_victims(
    picked: Iterable[tuple[ChunkKey, bool]],
    t1: OrderedDict[ChunkKey, _V],
    t2: OrderedDict[ChunkKey, _V],
    b1: OrderedDict[ChunkKey, None],
    b2: OrderedDict[ChunkKey, None],
    capacity: int,
) -> None:
    """Move picked ``(key, from_t1)`` victims to their ghost list's MRU end, in pick order,
    then cap B1 and B2 at ``capacity`` each (vLLM's variant), dropping their LRU ends."""
    for key, from_t1 in picked:
        if from_t1:
            del t1[key]
            b1[key] = None
        else:
            del t2[key]
            b2[key] = None
    for ghost in (b1, b2):
        for _ in range(len(ghost) - capacity):
            ghost.popitem(last=False)


def pick_victims(
    n: int, t1_size: int, target: int, scan_t1: Iterator[_E], scan_t2: Iterator[_E]
) -> list[tuple[_E, bool]] | None:
    """vLLM's walk: from T1 while its virtual size is at least ``int(p)``, else from T2, else
    the T1 fallback; each scan (of evictable entries, in LRU order) is consumed once.
    Returns ``[(entry, from_t1), ...]`` in pick order, or None when n cannot be found."""
    picked: list[tuple[_E, bool]] = []
    virtual_t1 = t1_size
    for _ in range(n):
        if virtual_t1 >= target:
            entry = next(scan_t1, _END)
            if entry is not _END:
                picked.append((entry, True))
                virtual_t1 -= 1
                continue
        entry = next(scan_t2, _END)
        if entry is not _END:
            picked.append((entry, False))
            continue
        entry = next(scan_t1, _END)  # T1 fallback
        if entry is _END:
            return None
        picked.append((entry, True))
        virtual_t1 -= 1
    return picked


class ARCPolicy(EvictionPolicy):
    """vLLM 0.33's ``arc``, decision for decision, so kvsim's ARC runs match vLLM's."""

    name = "arc"
    description = (
        "vLLM 0.33 ARC variant: T1/T2 with ghost lists, promotion on reuse at request finish"
    )

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p: float = 0.0  # vLLM's target_t1_size
        self.t1: OrderedDict[ChunkKey, Chunk] = OrderedDict()
        self.t2: OrderedDict[ChunkKey, Chunk] = OrderedDict()
        self.b1: OrderedDict[ChunkKey, None] = OrderedDict()
        self.b2: OrderedDict[ChunkKey, None] = OrderedDict()

    def get(self, key: ChunkKey) -> Chunk | None:
        chunk = self.t1.get(key)
        return chunk if chunk is not None else self.t2.get(key)

    def keys(self) -> Iterable[ChunkKey]:
        return [*self.t1, *self.t2]

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def insert(self, key: ChunkKey, chunk: Chunk, ctx: RequestContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: ChunkKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: ChunkKey) -> None:
        self.p = adapt_to_ghost_hit(self.p, key, self.b1, self.b2, self.capacity)

    def on_store_miss(self, keys: Sequence[ChunkKey], ctx: RequestContext) -> None:
        if not self.b1 and not self.b2:
            return
        for key in reversed(keys):
            self._adapt_to_ghost_hit(key)

    def touch(self, keys: Iterable[ChunkKey], ctx: RequestContext) -> None:
        t1, t2 = self.t1, self.t2
        for key in reversed(list(keys)):
            if key in t1:
                chunk = t1.pop(key)
                if chunk.is_ready:
                    t2[key] = chunk
                else:
                    t1[key] = chunk
            elif key in t2:
                t2.move_to_end(key)
            else:
                self._adapt_to_ghost_hit(key)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[ChunkKey]],
        insertion_only: AbstractSet[ChunkKey],
        reused: AbstractSet[ChunkKey],
        ctx: RequestContext,
    ) -> None:
        keys = key_groups[0] if len(key_groups) == 1 else order_request_keys(key_groups, ctx)
        finish_request(keys, insertion_only, reused, self.t1, self.t2)

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.p = 0.0

    def evict(
        self, n: int, protected: AbstractSet[ChunkKey]
    ) -> list[tuple[ChunkKey, Chunk]] | None:
        if n == 0:
            return []
        picked = pick_victims(
            n,
            len(self.t1),
            int(self.p),
            _evictable_entries(self.t1, protected),
            _evictable_entries(self.t2, protected),
        )
        if picked is None:
            return None
        retire_victims(
            [(key, from_t1) for (key, _), from_t1 in picked],
            self.t1,
            self.t2,
            self.b1,
            self.b2,
            self.capacity,
        )
        return [entry for entry, _ in picked]
