"""Per-request rows written as CSV text, formatted off the replay's critical path.

Formatting a row (ten values, one a float) costs about as much as replaying its request's
blocks does in a plain ``kvsim replay``, and the replay loop cannot run in parallel. So
where it is safe, a forked helper process formats and writes the rows while the loop runs
on: each batch crosses a pipe as :mod:`marshal` bytes (a tenth of the formatting's cost)
and the helper writes exactly the text the loop's process would. "Safe" means a POSIX
``fork``, one Python thread and no IPython kernel: forking a process that runs other
threads can copy a held lock, so anything else (a notebook, a program with threads,
Windows) formats in process. Either way the bytes are the same, and the caller's
:func:`~kvsim.core.io.atomic_path` makes the file whole or absent.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

try:  # imported here, not when forking: a signal that lands in an import can trip
    import fcntl  # CPython's import locks (gh-87712), and the fork is where one lands
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

#: a helper's exit status below this (and above 1) is the ``errno`` that stopped it
_ERRNO_LIMIT = 126
#: bytes that announce a batch's length on the pipe
_LENGTH = 8

#: the pipe's capacity asked for (Linux's default is 64 KiB; a batch is about 100 KiB)
_PIPE_BYTES = 1 << 20


def can_fork() -> bool:
    """Whether a helper process may be forked here (see the module's note)."""
    return hasattr(os, "fork") and threading.active_count() == 1 and "IPython" not in sys.modules


@contextlib.contextmanager
def csv_rows(path: str, header: str, line: str) -> Iterator[Callable[[list[Any]], object]]:
    """A sink for batches of rows written to ``path`` (opened anew) after ``header``, each
    row as ``line % row``; by a forked helper when :func:`can_fork`, else here. Raises
    ``OSError`` when the helper could not write the file (the ``errno`` that stopped it,
    from its exit status: nothing of its own on stderr, so the error stays one line; a
    fault in the formatting itself is also said on stderr, with its detail)."""
    if not can_fork():
        with open(path, "w", newline="") as f:
            f.write(header)
            yield lambda rows: f.write(_text(rows, line))
        return
    read_end, write_end = os.pipe()
    _widen(write_end)
    pid = os.fork()
    if pid == 0:  # the helper: never returns, whatever happens (a signal included)
        code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler
            if hasattr(signal, "SIGHUP"):
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
            os.close(write_end)
            code = _helper(read_end, path, header, line)
        finally:
            os._exit(code)
    pipe = None
    try:  # from here on, however the parent stops, the helper is stopped and reaped
        os.close(read_end)
        pipe = os.fdopen(write_end, "wb")
        yield lambda rows: _send(pipe, rows, line)
        pipe.close()
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        pid = 0  # reaped
    except BrokenPipeError:  # the helper stopped reading: it failed, and its status says why
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
        _raise_helper_failure(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        raise
    except BaseException:
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
            os.waitpid(pid, 0)
        raise
    _raise_helper_failure(code)


def _raise_helper_failure(code: int) -> None:
    """The helper's exit status as the error the parent raises: an ``errno`` (a full disk,
    a file size limit) as that OSError, so the caller's one line names the file and why."""
    if code == 0:
        return
    if 1 < code < _ERRNO_LIMIT:
        raise OSError(code, os.strerror(code))
    raise OSError(f"the helper process writing the rows failed (exit code {code})")


def _widen(fd: int) -> None:
    """A pipe that holds a few batches (Linux; elsewhere the default), so the replay
    rarely waits on the helper."""
    if fcntl is not None:
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


def _text(rows: Sequence[Any], line: str) -> str:
    return "".join([line % row for row in rows])


def _send(pipe: IO[bytes], rows: list[Any], line: str) -> None:
    """One batch down the pipe: marshalled rows, or their text when a value is not
    marshallable (an id of a type of the caller's)."""
    try:
        payload = marshal.dumps(rows)
    except ValueError:
        payload = marshal.dumps(_text(rows, line))
    pipe.write(len(payload).to_bytes(_LENGTH, "little"))
    pipe.write(payload)


def _helper(read_end: int, path: str, header: str, line: str) -> int:
    """Format what comes down the pipe into ``path`` until it closes; the exit code: 0
    only if every byte was written. The file is the one the parent made: never created
    here, so a helper that outlives it leaves nothing behind."""
    try:
        out = os.open(path, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(read_end, "rb") as pipe, open(out, "w", newline="") as f:
            f.write(header)
            while size := pipe.read(_LENGTH):
                batch = marshal.loads(pipe.read(int.from_bytes(size, "little")))
                f.write(batch if isinstance(batch, str) else _text(batch, line))
    except OSError as exc:  # reported by the exit status alone: the parent's line says it
        if exc.errno and 1 < exc.errno < _ERRNO_LIMIT:
            return exc.errno
        _say(path, exc)
        return 1
    except Exception as exc:  # a fault of kvsim's own: its detail on stderr too
        _say(path, exc)
        return 1
    return 0


def _say(path: str, exc: BaseException) -> None:
    with contextlib.suppress(Exception):  # not sys.stderr: it may hold the parent's text
        os.write(2, f"kvsim: writing {path}: {exc}\n".encode())
