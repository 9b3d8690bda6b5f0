"""Azure's LLM inference traces (2023): a CSV of ``TIMESTAMP,ContextTokens,GeneratedTokens``.

They carry no block ids, so a replay of one has nothing to reuse; the block size (512, as
Mooncake's) only matters to the timed mode's prompt arithmetic.
"""

from __future__ import annotations

import csv
import datetime as _dt
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvsim.core.errors import InputError
from kvsim.traces.model import Request

from .batching import request_batches
from .checks import decode_error, show
from .files import numbered_lines, open_bin
from .registry import Sniff, TraceFormat, register

if TYPE_CHECKING:
    from kvsim.traces.columns import TraceColumns

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)")


def _time(s: str, path: str, lineno: int) -> tuple[int, float]:
    """Parse ``2023-11-16 18:17:03.9799600`` (any number of fractional digits).

    Returns (day ordinal, seconds within the day) so differences keep full precision.
    """
    m = _TIMESTAMP.fullmatch(s.strip())
    bad = m is None
    if m is not None:
        y, mo, dd, hh, mi, ss = m.groups()
        try:
            day = _dt.date(int(y), int(mo), int(dd)).toordinal()
        except ValueError:
            bad = True
        else:
            h, mn, sec = int(hh), int(mi), float(ss)
            bad = h > 23 or mn > 59 or sec >= 61.0
    if bad:
        raise InputError(
            f"column 'TIMESTAMP' must look like 2023-11-16 18:17:03.9799600, got {show(s)}",
            source=path,
            line=lineno,
        )
    return day, h * 3600 + mn * 60 + sec


def _count(s: str, col: str, path: str, lineno: int) -> int:
    t = s.strip()
    if t.isascii() and t.isdigit():
        return int(t)
    raise InputError(
        f"column '{col}' must be a non-negative integer, got {show(s)}", source=path, line=lineno
    )


def _text_lines(lines: Iterator[tuple[int, bytes]], path: str) -> Iterator[str]:
    for lineno, raw in lines:
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise decode_error(path, lineno) from None


def _requests(path: str) -> Iterator[Request]:
    """The file's requests in order, arrivals relative to the first one's."""
    rid = 0
    with open_bin(path) as f:
        header_seen = False
        day0 = 0
        sod0 = 0.0
        reader = csv.reader(_text_lines(numbered_lines(f, path), path))
        for row in reader:
            lineno = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if not header_seen:
                cells = tuple(c.strip().lstrip("\ufeff") for c in row)
                if cells != HEADER:
                    raise InputError(
                        f"expected CSV header {','.join(HEADER)}, got {show(','.join(row))}",
                        source=path,
                        line=lineno,
                    )
                header_seen = True
                continue
            if len(row) != 3:
                raise InputError(
                    f"expected 3 columns ({','.join(HEADER)}), got {len(row)}",
                    source=path,
                    line=lineno,
                )
            day, sod = _time(row[0], path, lineno)
            inp = _count(row[1], "ContextTokens", path, lineno)
            out = _count(row[2], "GeneratedTokens", path, lineno)
            if rid == 0:
                day0, sod0 = day, sod
            yield Request(rid, round((day - day0) * 86400 + (sod - sod0), 7), inp, out, ())
            rid += 1
    if rid == 0:
        raise InputError("no requests in trace file", source=path)


def read_batches(path: str, block_tokens: int) -> Iterator[TraceColumns]:
    """The file's requests as column batches (no block ids: ``block_tokens`` is unused)."""
    return request_batches(_requests(path))


FORMAT = register(
    TraceFormat(
        "azure",
        read_batches,
        default_block_tokens=512,
        sniff=Sniff(suffixes=(".csv",), line_prefixes=(b"TIMESTAMP,",)),
        has_reuse_info=False,
    )
)
