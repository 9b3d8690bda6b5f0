"""Worker processes that end with the process that started them: a sweep's cells and an
accuracy run's experiments run on such workers, and a driver killed by a signal must not
leave them running (or blocked forever on a pipe nobody writes)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from multiprocessing.context import BaseContext

from kvsim.core.errors import InputError
from kvsim.core.numeric import is_whole

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: how often a worker checks that its driver is still its parent
_PARENT_POLL_S = 0.5


def exit_with_parent(parent_pid: int | None) -> None:
    """Make this worker die with its driver (``parent_pid``; None: this process's parent
    now): Linux's parent-death signal, and everywhere a watchdog thread that exits when the
    parent changes (also covers a parent that died before this ran).

    Linux sends the signal when the *thread* that started the worker ends; the drivers start
    every worker from the thread that called them, which waits for them."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    parent = parent_pid or os.getppid()
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="kvsim-parent-watch", daemon=True).start()


def driver_pid(context: BaseContext) -> int | None:
    """The parent a worker that ``context`` starts has, for :func:`become_worker`: this
    process under fork and spawn; None under forkserver (Python 3.14's default on Linux),
    whose workers are the server's children: given this pid, each would see another parent
    and exit at once, and a pool would start them again forever."""
    return os.getpid() if context.get_start_method() in ("fork", "spawn") else None


def become_worker(parent_pid: int | None) -> None:
    """Set up a worker process: Ctrl-C is its driver's to handle (the driver stops the
    workers), SIGTERM and SIGHUP end it (not the CLI's handlers, which a fork inherits), and
    it dies with its driver (:func:`exit_with_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    exit_with_parent(parent_pid)


def check_workers(workers: int | None) -> int:
    """``workers`` as a count of worker processes (None: one per CPU).

    Raises:
        InputError: not a whole number of at least 1."""
    from kvsim.options.schema import short_repr

    if workers is None:
        return os.cpu_count() or 1
    if not is_whole(workers) or workers < 1:
        raise InputError(f"workers must be an integer >= 1, got {short_repr(workers)}")
    return int(workers)


def how_it_died(exitcode: int | None) -> str:
    """A dead worker's exit code in words: ``killed by SIGKILL``, ``exit status 1``."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"
