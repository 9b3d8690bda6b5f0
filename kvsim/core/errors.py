"""Errors that carry a user-facing, one-line message.

The CLI turns an :class:`InputError` into ``kvsim: error: <message>`` and exit code 2
without a traceback, so every check on user input raises this type and names the
file and line, or the option, that is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class InputError(ValueError):
    """Bad user input: a malformed trace line, an impossible option, an unknown name."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(where + message)
        self.source = source
        self.line = line


class PolicyFault(InputError):
    """A user's policy plugin failed or broke the protocol (raised, returned the wrong type).

    It is the user's code, not kvsim's, so it is reported like bad input: one line naming the
    class and the call, exit code 2."""

    def __init__(self, cls: type, call: str, problem: str) -> None:
        super().__init__(f"policy {cls.__module__}:{cls.__qualname__} failed in {call}: {problem}")


class EngineStalled(RuntimeError):
    """The timed engine holds work nothing can ever move: nothing runs, no transfer is in
    flight, no arrival is left, and every waiting request needs GPU blocks it cannot get.
    vLLM 0.33's scheduler stops in the same state (its engine idles forever); kvsim says so
    in one line. Neither bad input nor a kvsim fault, so it has its own exit code
    (:data:`exit_code`, 3), and what was simulated up to the stall is kept: ``result`` (a
    :class:`kvsim.Result` when the run came through :func:`kvsim.simulate`, whose ``--out``
    is still written)."""

    exit_code = 3

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.result: Any = None
        self.partial: Any = None  # the engine layer's (summary, tables), before a Result


class InputWarning(UserWarning):
    """Input kvsim can use but changed or doubts (out-of-order arrivals it sorted); the CLI
    prints it as one ``kvsim: warning:`` line."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, or ``""``: the one
    wording of that hint for options, keys and names everywhere."""
    import difflib  # only to word an error

    guess = difflib.get_close_matches(str(name), sorted(known), n=1)
    return f" (did you mean {guess[0]!r}?)" if guess else ""


def named(option: str, lookup: Callable[[str], T], value: str) -> T:
    """``lookup(value)`` (a preset such as ``get_model``), its one-line error prefixed with
    the option that gave the value (``--model: unknown model 'x' (did you mean ...)``), so
    every command names the option the same way."""
    try:
        return lookup(value)
    except InputError as exc:
        raise InputError(f"{option}: {exc}") from None
