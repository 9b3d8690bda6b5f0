"""A signal that asked the run to end, remembered until the run ends.

The CLI turns SIGTERM and SIGHUP into :class:`Terminated`, raised wherever the process is,
so that every ``with`` block cleans up. But Python drops an exception raised inside a
weakref callback or a ``__del__`` (it prints "Exception ignored in ..." and goes on), and
CPython runs such callbacks during imports (its module locks): a signal landing there
would be lost and the run would write its outputs as if never asked to stop. So the
handler also notes the signal here, and :func:`kvsim.core.io.atomic_path` refuses to
commit a file while one is noted: the run still ends with the signal's exit code and
leaves no output, at the latest when it would have written one.
"""

from __future__ import annotations

import signal

_noted: list[int] = []  # the signal received, at most one; empty while none is


class Terminated(BaseException):
    """SIGTERM or SIGHUP (a closed terminal, a dropped ssh connection), raised where the
    process is, so every ``with`` block cleans up (no temp file or half-written output is
    left behind, as on Ctrl-C)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum


def end_on_signal(signum: int, frame: object) -> None:
    """Signal handler: note ``signum``, then raise :class:`Terminated`."""
    if not _noted:
        _noted.append(signum)
    raise Terminated(signum)


def raise_if_ending() -> None:
    """Raise :class:`Terminated` again when a signal was noted (its first raise may have
    been dropped); nothing otherwise."""
    if _noted:
        raise Terminated(_noted[0])


def forget_ending() -> None:
    """Forget a noted signal (a caller running the CLI in its own process, a test, starts
    and ends each call clean)."""
    _noted.clear()
