"""Opening a trace file (Mooncake, Alibaba Bailian, Azure LLM 2023, native kvsim).

The formats themselves live in :mod:`kvsim.traces.formats`, one module each; this module
picks one (given, or sniffed from the file) and hands the file to it. A JSONL trace is read
in blocks of whole lines. A block that is plainly valid is decoded in one call
(:mod:`kvsim.traces.fast_jsonl`); any other block is read line by line, one ``json.loads``
and the record checks per line, which raise :class:`kvsim.core.errors.InputError` naming
``file:line`` (1-based; the CSV header is line 1) at the first bad record, after the records
before it. Records are kept in file order (timestamps going backwards are kept as given).
Files ending in ``.gz`` are read (and written) through :mod:`gzip` transparently. A file
read whole and without error is kept in the trace cache (:mod:`kvsim.traces.cache`), so
reading it again loads its columns instead of parsing it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvsim.core.errors import InputError
from kvsim.core.numeric import is_whole

from .formats import FORMATS
from .formats.files import first_line, open_bin
from .model import Trace, TraceInfo

if TYPE_CHECKING:
    from .columns import TraceColumns

#: the built-in formats: the names ``--format`` accepts (``fmt=`` also takes any format
#: registered later, see :mod:`kvsim.traces.formats.registry`)
TRACE_FORMATS: tuple[str, ...] = tuple(FORMATS)

#: tokens per hash block when the file does not say (Azure has none; 512 like Mooncake)
DEFAULT_BLOCK_TOKENS: dict[str, int] = {
    name: f.default_block_tokens for name, f in FORMATS.items() if f.default_block_tokens
}


def read_batches(path: str, fmt: str, block_tokens: int) -> Iterator[TraceColumns]:
    """Parse the ``fmt`` trace file at ``path`` whole, as column batches (no cache)."""
    return FORMATS[fmt].read_batches(path, block_tokens)


def sniff_format(path: str) -> str:
    """Guess a trace file's format from its name, then its first non-blank line (each
    format's :class:`~kvsim.traces.formats.registry.Sniff` says how)."""
    formats = list(FORMATS.values())
    base = (path[:-3] if path.endswith(".gz") else path).lower()
    for f in formats:
        if base.endswith(f.sniff.suffixes):
            open_bin(path).close()  # missing file -> InputError
            return f.name
    lineno, line = first_line(path)
    if line is None:
        raise InputError("no requests in trace file (file is empty)", source=path)
    bare = line.removeprefix(b"\xef\xbb\xbf")
    for f in formats:
        if bare.startswith(f.sniff.line_prefixes):
            return f.name
    try:
        d = json.loads(line)
    except (ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else getattr(e, "msg", e)
        raise InputError(
            f"cannot determine trace format: first line is not JSON ({why})",
            source=path,
            line=lineno,
        ) from None
    if type(d) is dict:
        for f in sorted(formats, key=lambda f: f.sniff.rank):
            if f.sniff.record is not None and f.sniff.record(d):
                return f.name
    raise InputError(
        "cannot determine trace format from the first line; pass fmt= one of " + ", ".join(FORMATS),
        source=path,
        line=lineno,
    )


_SPOOLED: dict[str, str] = {}  # stream name -> its copy, so a second open reads the copy


def _remove_spooled() -> None:
    for name in _SPOOLED.values():
        with contextlib.suppress(OSError):
            os.unlink(name)


def unspooled(text: str) -> str:
    """``text`` (an error message) with each spooled copy's temporary path replaced by the
    input the user gave (``<stdin>`` for ``-``): that copy is gone by the time it is read."""
    for shown, tmp in _SPOOLED.items():
        text = text.replace(tmp, "<stdin>" if shown == "-" else shown)
    return text


def _spool_stream(shown: str) -> str:
    """A regular file to read ``shown`` from, as often as needed.

    Standard input (``-``), a FIFO or a process substitution (``<(cat t.jsonl)``) can be
    read only once, but a trace is opened to sniff its format and then streamed (and a timed
    run may stream it twice): such an input is copied once to a temporary file, removed
    when the process exits. A regular file is read in place.
    """
    if shown in _SPOOLED:
        return _SPOOLED[shown]
    if shown != "-":
        try:
            mode = os.stat(shown).st_mode
        except OSError:
            return shown  # missing: the reader names it
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            return shown
    base = os.path.basename(shown) if shown != "-" else "stdin"
    suffix = "".join(s for s in (".csv", ".gz") if s in base.lower()) or ".jsonl"
    fd, tmp = tempfile.mkstemp(prefix="kvsim-trace-", suffix=suffix)
    if not _SPOOLED:
        atexit.register(_remove_spooled)
    _SPOOLED[shown] = tmp
    try:
        with os.fdopen(fd, "wb") as out:
            if shown == "-":
                shutil.copyfileobj(sys.stdin.buffer, out)
            else:
                with open(shown, "rb") as src:
                    shutil.copyfileobj(src, out)
    except OSError as exc:
        raise InputError(f"cannot read trace: {exc.strerror or exc}", source=shown) from None
    if not tmp.endswith(".gz"):  # a stream has no name to say it is gzipped: its bytes do
        with open(tmp, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        if gzipped:
            os.replace(tmp, tmp + ".gz")
            tmp = _SPOOLED[shown] = tmp + ".gz"
    return tmp


def open_trace(
    path: str | os.PathLike[str],
    fmt: str | None = None,
    block_tokens: int | None = None,
    limit: int | None = None,
) -> Trace:
    """Open a trace file for streaming.

    ``fmt`` is one of :data:`TRACE_FORMATS`, or None to sniff it (``.csv`` -> azure; JSONL with a
    ``{"kvsim_trace": 1, ...}`` header -> native, ``chat_id`` -> bailian, ``hash_ids`` +
    ``input_length`` -> mooncake). ``block_tokens`` overrides the format's block size (Mooncake
    512, Bailian 16, native: from the header, Azure: 512). ``limit`` caps the number of requests.
    Only the first line is read here; records are validated as they are iterated, or loaded
    from the trace cache when this content was read before (:mod:`kvsim.traces.cache`).
    ``-`` reads standard input; a FIFO or ``<(...)`` works too (cached by content alike).
    """
    shown = os.fspath(path)
    p = _spool_stream(shown)
    if fmt is None:
        fmt = sniff_format(p)
    elif fmt not in FORMATS:
        raise InputError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
    else:
        open_bin(p).close()  # missing file -> InputError now, not at first iteration
    if limit is not None:  # a numpy integer counts as the int it holds
        if not is_whole(limit) or limit < 0:
            raise InputError(f"limit must be a non-negative integer, got {limit!r}")
        limit = int(limit)
    if block_tokens is not None:
        if not is_whole(block_tokens) or block_tokens <= 0:
            raise InputError(f"block_tokens must be a positive integer, got {block_tokens!r}")
        block_tokens = int(block_tokens)
    form = FORMATS[fmt]
    if form.stated_block_tokens is not None:
        bt = form.stated_block_tokens(p)  # checked even when block_tokens overrides it
    else:
        assert form.default_block_tokens is not None
        bt = form.default_block_tokens
    if block_tokens is not None:
        bt = block_tokens
    info = TraceInfo(path=shown, format=fmt, block_tokens=bt, has_reuse_info=form.has_reuse_info)
    from .source import FileSource

    return Trace(info, limit, FileSource(p, fmt, bt, read_batches))
