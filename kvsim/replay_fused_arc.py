"""vLLM 0.33's ARC variant (§3.3) in the fused one-request-at-a-time tier.

The lists are :class:`~kvsim.policies.arc.ARCPolicy`'s (T1, T2, ghosts B1 and B2, target
``p``) without chunk objects; what the manager records per request becomes three sets:
the keys the request observed, those it inserted and those it reused. With nothing pinned
when a store is prepared, eviction skips only the offer's own keys.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import filterfalse

from kvsim.policies.admission.base import AdmissionPolicy
from kvsim.policies.base import Key
from kvsim.replay_fused import FusedTier

_END = object()


class FusedARCTier(FusedTier):
    """vLLM's ARC variant: insert into T1, promote on reuse at finish, ghosts adapt ``p``."""

    name = "fused-arc"

    def __init__(self, num_chunks: int, chunk_tokens: int, prefill_step: int | None,
                 admission: AdmissionPolicy | None = None) -> None:
        super().__init__(num_chunks, chunk_tokens, prefill_step, admission)
        self.p: float = 0.0  # vLLM's target_t1_size
        self.t1: OrderedDict[Key, None] = OrderedDict()
        self.t2: OrderedDict[Key, None] = OrderedDict()
        self.b1: OrderedDict[Key, None] = OrderedDict()
        self.b2: OrderedDict[Key, None] = OrderedDict()
        # the running request's access record (the manager's, per request)
        self._observed: set[Key] = set()
        self._inserted: set[Key] = set()
        self._reused: set[Key] = set()
        self._missed: set[Key] = set()  # store misses already shown to the ghosts

    @property
    def num_resident(self) -> int:
        return len(self.t1) + len(self.t2)

    def resident_keys(self) -> list[Key]:
        return [*self.t1, *self.t2]

    def _lookup(self, keys: Sequence[Key]) -> int:
        t1, t2 = self.t1, self.t2
        count = 0
        for key in keys:
            if key not in t1 and key not in t2:
                break
            count += 1
        return count

    def _load(self, keys: Sequence[Key]) -> None:
        self._observed.update(keys)
        self._reused.update(keys)  # loads come before any insertion of the request

    def _offer(self, offer: Sequence[Key], retry: bool) -> list[Key]:
        t1, t2 = self.t1, self.t2
        if not any(map(t1.__contains__, offer)) and not any(map(t2.__contains__, offer)):
            return offer
        ready = [k for k in offer if k in t1 or k in t2]
        self._observed.update(ready)
        inserted = self._inserted
        self._reused.update([k for k in ready if k not in inserted] if inserted else ready)
        return [k for k in offer if k not in t1 and k not in t2]

    def _candidates(self, keys: Sequence[Key]) -> None:
        self._observed.update(keys)
        missed = self._missed
        new = [k for k in keys if k not in missed] if missed else keys
        missed.update(new)
        b1, b2 = self.b1, self.b2
        if not b1 and not b2:
            return
        for key in reversed(new):  # ghost hits adapt p, once per request per key
            if key in b1:
                self.p = min(self.p + max(1, len(b2) / len(b1)), self.num_chunks)
                b1.move_to_end(key)
            elif key in b2:
                self.p = max(self.p - max(1, len(b1) / len(b2)), 0)
                b2.move_to_end(key)

    def _evict(self, need: int, offer: Sequence[Key], keys: Sequence[Key]) -> bool:
        t1, t2 = self.t1, self.t2
        protected = set(offer)
        scan_t1 = filterfalse(protected.__contains__, t1)
        scan_t2 = filterfalse(protected.__contains__, t2)
        virtual_t1 = len(t1)
        target = int(self.p)
        from_t1: list[Key] = []
        from_t2: list[Key] = []
        for _ in range(need):
            if virtual_t1 >= target:
                key = next(scan_t1, _END)
                if key is not _END:
                    from_t1.append(key)
                    virtual_t1 -= 1
                    continue
            key = next(scan_t2, _END)
            if key is not _END:
                from_t2.append(key)
                continue
            key = next(scan_t1, _END)  # T1 fallback
            if key is _END:
                return False
            from_t1.append(key)
            virtual_t1 -= 1
        for victims, live, ghost in ((from_t1, t1, self.b1), (from_t2, t2, self.b2)):
            for key in victims:
                del live[key]
                ghost[key] = None
            for _ in range(len(ghost) - self.num_chunks):
                ghost.popitem(last=False)
        return True

    def _insert(self, keys: list[Key]) -> None:
        t1, b1, b2 = self.t1, self.b1, self.b2
        for key in keys:
            t1[key] = None
            b1.pop(key, None)
            b2.pop(key, None)
        self._inserted.update(keys)

    def _finish(self, keys: Sequence[Key]) -> None:
        observed = self._observed
        if not observed:
            return
        t1, t2 = self.t1, self.t2
        reused = self._reused
        insertion_only = self._inserted - reused
        for key in reversed(keys):  # tail first, head last
            if key not in observed:
                continue
            if key in insertion_only:  # a store is not a frequency hit
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    t2.move_to_end(key)
            elif key in reused:
                if key in t1:
                    del t1[key]
                    t2[key] = None
                elif key in t2:
                    t2.move_to_end(key)
        observed.clear()
        self._inserted.clear()
        reused.clear()
        self._missed.clear()
