"""The trace formats kvsim reads, each described once by the module that reads it.

A format module (``mooncake.py``, ``bailian.py``, ``azure.py``, ``native.py``) builds one
:class:`TraceFormat` and passes it to :func:`register` when it is imported; everything that
differs between formats (the parser, the block size when the file does not state one, how to
recognise a file, whether it carries block ids) lives there. :mod:`kvsim.traces.readers`
opens and sniffs files through this table only, so a new format is one new module here
(and its name in the package's import list, which fixes the order ``--format`` shows). It
must live in this package: the trace cache keys its entries by the code of every module
here (:data:`kvsim.traces.cache._READER_CODE`), so an edited parser never reads an entry
its previous version wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsim.traces.columns import TraceColumns

#: parse a whole file: ``(path, block_tokens)`` -> its requests as column batches, in file
#: order, ids from 0; raises :class:`~kvsim.core.errors.InputError` naming ``file:line`` at
#: the first bad record, after yielding the batches before it
BatchReader = Callable[[str, int], "Iterator[TraceColumns]"]


@dataclass(frozen=True)
class Sniff:
    """How a file of this format is recognised when no format is given.

    Tried in this order over all formats: the file name (``suffixes``, before any ``.gz``,
    lower case), then the first non-blank line's bytes (``line_prefixes``, after a UTF-8
    byte-order mark), then that line as a JSON object (``record``, formats by ascending
    ``rank``). A format whose records carry another format's fields (Bailian's include
    Mooncake's) needs the lower rank, so the more specific test runs first.
    """

    suffixes: tuple[str, ...] = ()
    line_prefixes: tuple[bytes, ...] = ()
    record: Callable[[dict[str, Any]], bool] | None = None
    rank: int = 0


@dataclass(frozen=True)
class TraceFormat:
    """One trace file format.

    Attributes:
        name: what ``fmt=`` / ``--format`` calls it.
        read_batches: the parser (see :data:`BatchReader`).
        default_block_tokens: tokens per hash block when the file does not state it.
        stated_block_tokens: ``path -> block size`` for formats whose file states it (a
            header line); it checks that statement and raises ``InputError`` naming
            ``file:line``. Exactly one of the two block-size fields is set.
        sniff: how the format is recognised (:class:`Sniff`).
        has_reuse_info: whether records carry block ids (Azure's do not).
    """

    name: str
    read_batches: BatchReader
    default_block_tokens: int | None = None
    stated_block_tokens: Callable[[str], int] | None = None
    sniff: Sniff = field(default_factory=Sniff)
    has_reuse_info: bool = True

    def __post_init__(self) -> None:
        if (self.default_block_tokens is None) == (self.stated_block_tokens is None):
            raise ValueError(
                f"trace format {self.name!r}: give exactly one of default_block_tokens "
                "and stated_block_tokens"
            )


#: name -> format, in the order the formats registered (the order ``--format`` lists them)
FORMATS: dict[str, TraceFormat] = {}


def register(fmt: TraceFormat) -> TraceFormat:
    """Add ``fmt`` to :data:`FORMATS` (a name may be registered once); returns it."""
    if fmt.name in FORMATS:
        raise ValueError(f"trace format {fmt.name!r} is registered twice")
    FORMATS[fmt.name] = fmt
    return fmt
