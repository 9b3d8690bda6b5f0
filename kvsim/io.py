"""Output files are written whole or not at all: temp file in the same folder, then rename."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from kvsim.errors import InputError


def _umask_mode() -> int:
    """The mode a plain ``open()`` would give a new file (mkstemp makes 0600 files)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary path to write with any library; renamed onto ``path`` on success."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "w", **open_kwargs: Any
) -> Iterator[IO[Any]]:
    """Yield a file object; on success it replaces ``path``, on any error nothing is left."""
    with atomic_path(path) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f


FIGURE_FORMATS = ("png", "pdf", "svg")


def figure_format(path: str | os.PathLike[str], option: str = "--plot") -> str:
    """The file format a figure path asks for; checked before a run, not after it."""
    ext = os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png"
    if ext not in FIGURE_FORMATS:
        raise InputError(
            f"{option}: cannot write a .{ext} figure; use one of {', '.join(FIGURE_FORMATS)}"
        )
    return ext


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file; unreadable or malformed files are a one-line :class:`InputError`."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror})", source=path) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", source=path
        ) from None
