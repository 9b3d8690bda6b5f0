"""The JSONL reader every JSONL format shares: blocks of whole lines, each decoded in one
call when it is plainly valid (:mod:`kvsim.traces.fast_jsonl`), else line by line with the
format's record parser, which names the first bad ``file:line``.

A format supplies three things: its record parser (the reference), its :class:`JsonlLayout`
(the same fields, for the one-call decoder) and, where its files start with one, a header
check. :func:`jsonl_reader` turns them into the format's ``read_batches``.
"""

from __future__ import annotations

import collections
import dataclasses
import io
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kvsim.core.errors import InputError

from .batching import line_batches
from .checks import RecordParser
from .files import numbered_lines, open_bin
from .jsonl_layout import JsonlLayout

if TYPE_CHECKING:
    from kvsim.traces.columns import TraceColumns

    from .registry import BatchReader

#: ``check(line, path) -> block_tokens``: validates a file's header line
HeaderCheck = Callable[[bytes, str], int]


def jsonl_reader(
    parser: Callable[[int], RecordParser], layout: JsonlLayout, header: HeaderCheck | None = None
) -> BatchReader:
    """The ``read_batches`` of a JSONL format: ``parser(block_tokens)`` checks one record,
    ``layout`` describes the same records to the one-call decoder, ``header`` checks the
    first non-blank line when the format starts with one."""

    def read_batches(path: str, block_tokens: int) -> Iterator[TraceColumns]:
        return jsonl_batches(path, block_tokens, parser(block_tokens), layout, header)

    return read_batches


def jsonl_batches(
    path: str, bt: int, parse: RecordParser, layout: JsonlLayout, header: HeaderCheck | None
) -> Iterator[TraceColumns]:
    """A JSONL trace as batches: each block of lines decoded in one call when it is plainly
    valid, else line by line; a file without a request is an error."""
    n = 0
    for batch in _decoded_blocks(path, bt, parse, layout, header):
        n += len(batch)
        yield batch
    if n == 0:
        raise InputError("no requests in trace file", source=path)


#: bytes of whole lines decoded at once
_BLOCK_BYTES = 1 << 21
#: blocks read ahead and decoding while the caller works on the one before
_AHEAD = 2


def _decoded_blocks(
    path: str, bt: int, parse: RecordParser, layout: JsonlLayout, header: HeaderCheck | None
) -> Iterator[TraceColumns]:
    """Each block decoded in one call on a helper thread (Arrow's parser lets go of the
    GIL, so the next block decodes while the caller replays this one), or read line by
    line when the fast path declines it."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from kvsim.traces import fast_jsonl  # looked up per call: tests replace decode_block

    pieces = _pieces(path, header)
    ahead: collections.deque[tuple[int, bytes | None, bool, Future[Any] | None]]
    ahead = collections.deque()
    rid = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvsim-decode") as decoder:

        def read_ahead() -> None:
            while len(ahead) < _AHEAD:
                piece = next(pieces, None)
                if piece is None:
                    return
                start, block, header_left = piece
                job = decoder.submit(fast_jsonl.decode_block, block, layout, bt) if block else None
                ahead.append((start, block, header_left, job))
                if block is None:
                    return

        read_ahead()
        while ahead:
            start, block, header_left, job = ahead.popleft()
            read_ahead()
            if block is None or job is None:  # the file could not be read on
                yield from _reread(path, parse, start, header if header_left else None, rid)
                return
            batch = job.result()
            if batch is not None:
                yield dataclasses.replace(batch, first_id=rid)
                rid += len(batch)
                continue
            for batch in line_batches(_numbered(block, start), parse, path, rid):
                rid += len(batch)
                yield batch


def _blocks(f: io.BufferedIOBase) -> Iterator[bytes]:
    """``f``'s bytes in pieces of about :data:`_BLOCK_BYTES`, each ending at a line end
    (the last one may not)."""
    rest = b""
    while True:
        data = f.read(_BLOCK_BYTES)
        if not data:
            if rest:
                yield rest
            return
        if rest:
            data = rest + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # a line longer than a block: read on
            rest = data
            continue
        yield data[:cut]
        rest = data[cut:]


def _numbered(block: bytes, start: int) -> Iterator[tuple[int, bytes]]:
    """The lines of ``block`` as a binary file yields them (newline kept), numbered from
    ``start + 1``."""
    parts = block.split(b"\n")
    last = parts.pop()  # after the final newline: empty, or a last line without one
    for lineno, part in enumerate(parts, start + 1):
        yield lineno, part + b"\n"
    if last:
        yield start + len(parts) + 1, last


def _cut_header(
    block: bytes, start: int, path: str, header: HeaderCheck
) -> tuple[bytes, int] | None:
    """``block`` after its first non-blank line, the header (checked), and the number of
    the header's line; None when the block is blank."""
    pos = 0
    for lineno, line in _numbered(block, start):
        pos += len(line)
        if line.strip():
            header(line, path)  # the block size it states was taken when the trace opened
            return block[pos:], lineno
    return None


def _reread(
    path: str, parse: RecordParser, skip: int, header: HeaderCheck | None, first_id: int
) -> Iterator[TraceColumns]:
    """Line by line from line ``skip + 1`` of a fresh read: a read error (a corrupt
    ``.gz``) is reported as the line reader reports it, with the line it stopped at.
    ``header``: the header check when the header is still to come."""
    with open_bin(path) as f:
        lines = numbered_lines(f, path)
        for _ in zip(range(skip), lines):
            pass
        if header is not None:
            for _lineno, line in lines:
                if line.strip():
                    header(line, path)
                    break
        yield from line_batches(lines, parse, path, first_id)


def _pieces(path: str, header: HeaderCheck | None) -> Iterator[tuple[int, bytes | None, bool]]:
    """``(lines before it, block, False)`` per block of whole lines, the header cut off
    (and checked); after a read error (a corrupt ``.gz``) a last ``(lines read, None,
    whether the header is still to come)``."""
    done = 0
    with open_bin(path) as f:
        blocks = _blocks(f)
        while True:
            try:
                block = next(blocks, None)
            except (OSError, EOFError):  # gzip.BadGzipFile is an OSError
                yield done, None, header is not None
                return
            if block is None:
                return
            start = done
            done += block.count(b"\n") + (not block.endswith(b"\n"))
            if header is not None:
                cut = _cut_header(block, start, path, header)
                if cut is None:
                    continue
                block, start = cut
                header = None
            if block and not block.isspace():
                yield start, block, False
