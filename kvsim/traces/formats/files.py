"""Opening a trace file and walking its lines, with every failure an ``InputError`` that
names the file (and the line, once one has been read)."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterable, Iterator

from kvsim.core.errors import InputError


def open_bin(path: str) -> io.BufferedIOBase:
    """Open ``path`` for binary reading (gunzipping ``*.gz``); missing file -> InputError."""
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError("trace file not found", source=path) from None
    except IsADirectoryError:
        raise InputError("trace path is a directory, not a file", source=path) from None
    except OSError as e:
        raise InputError(f"cannot open trace file: {e.strerror or e}", source=path) from None


#: the longest trace line kvsim reads (about two million block ids): parsing a line takes
#: some 20 times its size in memory, so a longer one is refused before it is parsed
MAX_LINE_BYTES = 16 << 20


class LineTooLong(ValueError):
    """A line longer than :data:`MAX_LINE_BYTES` (the line reader says which)."""


def numbered_lines(f: Iterable[bytes], path: str) -> Iterator[tuple[int, bytes]]:
    """Enumerate raw lines (1-based), turning gzip/read errors and lines longer than
    :data:`MAX_LINE_BYTES` into InputError."""
    lineno = 0
    it = iter(f)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            raise InputError(f"cannot read file: {e}", source=path, line=lineno + 1) from None
        lineno += 1
        if len(line) > MAX_LINE_BYTES:
            raise InputError(
                f"line of {len(line):,} bytes, longer than the {MAX_LINE_BYTES >> 20} MiB "
                "kvsim reads (a request of millions of block ids); see docs/testing.md#limits",
                source=path,
                line=lineno,
            )
        yield lineno, line


def first_line(path: str) -> tuple[int, bytes | None]:
    """The first non-blank line and its number; ``(0, None)`` for a blank file."""
    with open_bin(path) as f:
        for lineno, line in numbered_lines(f, path):
            if line.strip():
                return lineno, line
    return 0, None
