"""A count-min frequency sketch with aging and a doorkeeper (TinyLFU, Einziger et al., 2017).

It estimates how often a key was seen recently in bounded memory: 4 rows of 4-bit
counters (capped at 15), indexed by seeded multiplicative hashes; after ``sample_size``
increments every counter is halved (aging) and the doorkeeper is emptied. The doorkeeper
absorbs a key's first occurrence, so one-hit wonders never reach the sketch; a key's
estimate is the sketch minimum plus one if the doorkeeper holds it. TinyLFU admission
(``kvsim.policies.admission.tinylfu``) and W-TinyLFU (``kvsim.policies.wtinylfu``) share it.
"""

from __future__ import annotations

import random

from kvsim.core.keys import ChunkKey

_MASK64 = (1 << 64) - 1


class FrequencySketch:
    """Count-min sketch of 4-bit counters with aging and an (exact) doorkeeper set."""

    ROWS = 4
    #: the widest sketch (4 rows of 16M one-byte counters, 64 MiB): W-TinyLFU sizes it by
    #: the cache's capacity, and a tier of 10^10 chunks must not ask for 40 GB of counters
    #: (Caffeine caps its table the same way, at 2^30 4-bit counters)
    MAX_WIDTH = 1 << 24

    def __init__(
        self,
        width: int = 4096,
        sample_size: int | None = None,
        seed: int = 0,
        doorkeeper: bool = True,
    ) -> None:
        width = max(16, 1 << (max(1, min(width, self.MAX_WIDTH)) - 1).bit_length())
        self.width = width
        self.sample_size = sample_size if sample_size is not None else 10 * width
        self._shift = 64 - (width.bit_length() - 1)
        rng = random.Random(seed)
        self._multipliers = [rng.getrandbits(64) | 1 for _ in range(self.ROWS)]
        self._rows = [bytearray(width) for _ in range(self.ROWS)]
        self._doorkeeper: set[ChunkKey] | None = set() if doorkeeper else None
        self._additions = 0

    def _indexes(self, key: ChunkKey) -> list[int]:
        h = hash(key) & _MASK64
        shift = self._shift
        return [((h * m) & _MASK64) >> shift for m in self._multipliers]

    def increment(self, key: ChunkKey) -> None:
        door = self._doorkeeper
        if door is not None and key not in door:
            door.add(key)
        else:
            for row, i in zip(self._rows, self._indexes(key)):
                if row[i] < 15:
                    row[i] += 1
        self._additions += 1
        if self._additions >= self.sample_size:
            self._age()

    def estimate(self, key: ChunkKey) -> int:
        count = min(row[i] for row, i in zip(self._rows, self._indexes(key)))
        if self._doorkeeper is not None and key in self._doorkeeper:
            count += 1
        return count

    def _age(self) -> None:
        halve = bytes(b >> 1 for b in range(256))
        self._rows = [bytearray(row.translate(halve)) for row in self._rows]
        if self._doorkeeper is not None:
            self._doorkeeper.clear()
        self._additions //= 2

    def clear(self) -> None:
        for row in self._rows:
            row[:] = bytes(len(row))
        if self._doorkeeper is not None:
            self._doorkeeper.clear()
        self._additions = 0
