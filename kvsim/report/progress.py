"""Progress of long runs, counted in requests: ``progress=True`` in the API, ``--progress``
on the command line.

One bar, three faces (tqdm.auto underneath): a widget in a Jupyter notebook, a bar redrawn
in place on a terminal, and, when stderr is a file (a batch job's log), a whole line at most
every :data:`LOG_INTERVAL_S` seconds instead of carriage-return redraws that would pile up
on one line of the log.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, TypeAlias, TypeVar

from kvsim.core.errors import InputError

if TYPE_CHECKING:
    from types import TracebackType

    from tqdm import tqdm

#: what the API's ``progress`` keyword takes: True (a bar), a ``progress(n)`` callback of
#: your own, or None / False (nothing)
ProgressArg: TypeAlias = "bool | Callable[[int], None] | None"

#: seconds between two progress lines in a log file
LOG_INTERVAL_S = 10.0
#: items between two calls of :func:`counted`'s callback
COUNT_EVERY = 1024

T = TypeVar("T")


class LogLines:
    """A file for tqdm that turns its in-place redraws into whole lines, for logs.

    tqdm redraws a bar as ``"\\r" + text + padding``; written to a file that is not a terminal
    those become one ever-growing line. Here each redraw is one stripped line, and tqdm's
    closing newline (the last redraw already ended its line) is dropped."""

    def __init__(self, out: IO[str]):
        self.out = out
        self.encoding = getattr(out, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self.out.write(line + "\n")
            self.out.flush()
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return False


def _is_widget(cls: type) -> bool:
    """True when tqdm.auto picked its notebook bar (a Jupyter kernel with ipywidgets)."""
    return any(c.__module__ == "tqdm.notebook" for c in cls.__mro__)


def request_bar(total: int | None, desc: str, unit: str = "req") -> tqdm[Any]:
    """A tqdm.auto bar over ``total`` requests (None: unknown, a count and a rate), on
    stderr outside a notebook. Without IPython loaded tqdm.auto picks the plain bar, so
    that one is imported directly, skipping tqdm.auto's notebook checks (20 ms). The bar
    starts no monitor thread: kvsim's loops report every part of a run (a thousand
    requests or so), so the thread would only add a second one to the process."""
    if "IPython" in sys.modules:
        from tqdm.auto import tqdm as chosen
    else:
        from tqdm.std import tqdm as chosen

    auto_tqdm = type("RequestBar", (chosen,), {"monitor_interval": 0})
    out = sys.stderr
    options: dict[str, Any] = {"total": total, "desc": desc, "unit": unit}
    if _is_widget(auto_tqdm):
        return auto_tqdm(**options)
    if out.isatty():
        return auto_tqdm(file=out, dynamic_ncols=True, **options)
    return auto_tqdm(file=LogLines(out), mininterval=LOG_INTERVAL_S, ncols=80, **options)


class Progress:
    """Requests (or ``unit``s) done, for one call: a bar (``how=True``), the caller's
    callback, or nothing.

    It is the ``progress(n)`` callback the replay loops and the engine call; use it as a
    context manager so the bar is closed however the run ends."""

    def __init__(self, how: ProgressArg, total: int | None, desc: str, unit: str = "req"):
        self._callback: Callable[[int], None] | None = how if callable(how) else None
        self._bar: tqdm[Any] | None = None
        self.total = total
        self.unit = unit
        if how is True:
            self._bar = request_bar(total, desc, unit)
        elif how not in (None, False) and self._callback is None:
            raise InputError(f"progress: True, False, None or a callable progress(n), got {how!r}")

    @property
    def callback(self) -> Callable[[int], None] | None:
        """What to hand a loop: this object when it shows or forwards anything, else None
        (the loops then skip the call per request)."""
        return self if self._bar is not None or self._callback is not None else None

    def __call__(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)
        if self._callback is not None:
            self._callback(n)

    def next_pass(self, desc: str) -> None:
        """Another pass over the same requests (``simulate(baseline=True)``'s run without
        offloading): the finished bar stays as it is and a new one counts this pass, so each
        bar's total is the number of requests, not requests times passes."""
        if self._bar is not None:
            self.close()
            self._bar = request_bar(self.total, desc, self.unit)

    def close(self, complete: bool = True) -> None:
        """Close the bar; a ``complete`` run ends at 100 % even when its total was an
        estimate (a trace's line count: blank lines, a header)."""
        bar, self._bar = self._bar, None
        if bar is None:
            return
        if complete and bar.total is not None and bar.n != bar.total and bar.n > 0:
            bar.total = bar.n  # shown by close's last redraw
        bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(complete=exc_type is None)


def counted(
    items: Iterable[T], progress: Callable[[int], None] | None, every: int = COUNT_EVERY
) -> Iterator[T]:
    """``items`` as they are, calling ``progress(n)`` once per ``every`` of them (and for the
    rest at the end), so a loop of cheap steps (a generated request) pays for a bar's update
    once per batch, not once per item. ``progress`` None: ``items`` untouched."""
    if progress is None:
        yield from items
        return
    n = 0
    for item in items:
        yield item
        n += 1
        if n == every:
            progress(n)
            n = 0
    if n:
        progress(n)
