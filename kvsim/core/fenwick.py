"""A Fenwick (binary indexed) tree of counts: reuse distances and LRU stack depths in
O(log N) per access, for trace statistics and miss-ratio curves alike."""

from __future__ import annotations


class Fenwick:
    """Counts at positions 1, 2, ...; prefix sums in O(log n). Grows by doubling, so a
    caller that does not know the stream's length need not count it first."""

    __slots__ = ("n", "tree")

    def __init__(self, n: int = 1024) -> None:
        self.n = max(1, n)
        self.tree = [0] * (self.n + 1)

    def _grow(self, need: int) -> None:
        old = self.n
        n = old
        while n < need:
            n *= 2
        values = [self.prefix(i) - self.prefix(i - 1) for i in range(1, old + 1)]
        self.n, self.tree = n, [0] * (n + 1)
        for i, v in enumerate(values, 1):
            if v:
                self.add(i, v)

    def add(self, i: int, delta: int) -> None:
        """Add ``delta`` at position ``i`` (>= 1)."""
        if i > self.n:
            self._grow(i)
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of positions 1..i."""
        tree = self.tree
        s = 0
        i = min(i, self.n)
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s
