"""vLLM 0.33's ARC variant (§3.3) in the fused one-request-at-a-time tier.

The lists are :class:`~kvsim.policies.arc.ARCPolicy`'s (T1, T2, ghosts B1 and B2, target
``p``) without chunk objects; what the manager records per request becomes three sets:
the keys the request inserted, those it reused and its store misses so far. With nothing pinned
when a store is prepared, eviction skips only the offer's own keys.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import filterfalse
from typing import Any

from kvsim.cachemode.fused_tier import FusedTier
from kvsim.core.keys import ChunkKey
from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.arc import adapt_to_ghost_hit, finish_request, pick_victims, retire_victims


class FusedARCTier(FusedTier):
    """vLLM's ARC variant: insert into T1, promote on reuse at finish, ghosts adapt ``p``."""

    name = "fused-arc"

    def __init__(
        self,
        num_chunks: int,
        chunk_tokens: int,
        prefill_step: int | None,
        admission: AdmissionPolicy | None = None,
    ) -> None:
        super().__init__(num_chunks, chunk_tokens, prefill_step, admission)
        self.p: float = 0.0  # vLLM's target_t1_size
        self.t1: OrderedDict[ChunkKey, None] = OrderedDict()
        self.t2: OrderedDict[ChunkKey, None] = OrderedDict()
        self.b1: OrderedDict[ChunkKey, None] = OrderedDict()
        self.b2: OrderedDict[ChunkKey, None] = OrderedDict()
        # the running request's access record (the manager's, per request)
        self._inserted: set[ChunkKey] = set()
        self._reused: set[ChunkKey] = set()
        self._missed: set[ChunkKey] = set()  # store misses already shown to the ghosts

    @property
    def num_resident(self) -> int:
        return len(self.t1) + len(self.t2)

    def resident_keys(self) -> list[ChunkKey]:
        return [*self.t1, *self.t2]

    def _lookup(self, keys: Sequence[ChunkKey], ctx: Any = None) -> int:
        t1, t2 = self.t1, self.t2
        count = 0
        for key in keys:
            if key not in t1 and key not in t2:
                break
            count += 1
        return count

    def _reuse(self, keys: Sequence[ChunkKey]) -> None:
        self._reused.update(keys)  # loads come before any insertion of the request

    def _offer(self, offer: list[ChunkKey], retry: bool) -> list[ChunkKey]:
        t1, t2 = self.t1, self.t2
        if not any(map(t1.__contains__, offer)) and not any(map(t2.__contains__, offer)):
            return offer
        ready = [k for k in offer if k in t1 or k in t2]
        inserted = self._inserted
        self._reused.update([k for k in ready if k not in inserted] if inserted else ready)
        return [k for k in offer if k not in t1 and k not in t2]

    def _candidates(self, keys: Sequence[ChunkKey]) -> None:
        missed = self._missed
        new = [k for k in keys if k not in missed] if missed else keys
        missed.update(new)
        b1, b2 = self.b1, self.b2
        if not b1 and not b2:
            return
        for key in reversed(new):  # ghost hits adapt p, once per request per key
            if key in b1 or key in b2:
                self.p = adapt_to_ghost_hit(self.p, key, b1, b2, self.num_chunks)

    def _evict(self, need: int, offer: Sequence[ChunkKey], keys: Sequence[ChunkKey]) -> bool:
        t1, t2 = self.t1, self.t2
        protected = set(offer)
        picked = pick_victims(
            need,
            len(t1),
            int(self.p),
            filterfalse(protected.__contains__, t1),
            filterfalse(protected.__contains__, t2),
        )
        if picked is None:
            return False
        retire_victims(picked, t1, t2, self.b1, self.b2, self.num_chunks)
        return True

    def _insert(self, keys: Sequence[ChunkKey]) -> None:
        t1, b1, b2 = self.t1, self.b1, self.b2
        for key in keys:
            t1[key] = None
            b1.pop(key, None)
            b2.pop(key, None)
        self._inserted.update(keys)

    def _finish(self, keys: Sequence[ChunkKey], ctx: Any = None) -> None:
        reused, inserted = self._reused, self._inserted
        if inserted or reused:
            # keys the request never observed are in neither set, so all its keys can be passed
            finish_request(keys, inserted - reused, reused, self.t1, self.t2)
            inserted.clear()
            reused.clear()
        self._missed.clear()
