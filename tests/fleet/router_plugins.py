"""Router plugins for the fleet tests (``module:Class`` through ``--router``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar


class Last:
    """Always the last instance (a valid plugin that needs no prefix)."""

    needs_prefix = False

    def __init__(self, instances: int, seed: int = 0) -> None:
        self.n = instances

    def route(self, request: Any, views: Sequence[Any]) -> int:
        return self.n - 1


class MostHeld:
    """The instance holding the most of the prompt (reads the prefix views)."""

    def __init__(self, instances: int, seed: int = 0) -> None:
        self.n = instances

    def route(self, request: Any, views: Sequence[Any]) -> int:
        return max(views, key=lambda v: (v.gpu_hit_tokens + v.cpu_hit_tokens, -v.index)).index


class OutOfRange:
    needs_prefix = False

    def __init__(self, instances: int, seed: int = 0) -> None:
        self.n = instances

    def route(self, request: Any, views: Sequence[Any]) -> int:
        return self.n


class Raises:
    needs_prefix = False

    def __init__(self, instances: int, seed: int = 0) -> None:
        pass

    def route(self, request: Any, views: Sequence[Any]) -> int:
        raise RuntimeError("no instance for you")


class Recording:
    """Instance 0 always; keeps every view it was shown (class-level, for the test)."""

    seen: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, instances: int, seed: int = 0) -> None:
        pass

    def route(self, request: Any, views: Sequence[Any]) -> int:
        Recording.seen.append(tuple(views))
        return 0
