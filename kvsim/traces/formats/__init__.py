"""The trace file formats, one module each, and what they share.

Each format module registers one :class:`~kvsim.traces.formats.registry.TraceFormat` when
imported; the import below is the list of built-in formats, in the order ``--format``
lists them. The shared pieces: :mod:`.files` (opening, lines), :mod:`.checks` (the record
checks and their one-line errors), :mod:`.batching` (records to column batches),
:mod:`.jsonl` (the block reader every JSONL format uses).
"""

from __future__ import annotations

from .registry import FORMATS, Sniff, TraceFormat, register

# isort: off
# each registers itself; this order is the order of TRACE_FORMATS and `--format`'s choices
from . import mooncake  # noqa: F401
from . import bailian  # noqa: F401
from . import azure  # noqa: F401
from . import native  # noqa: F401

# isort: on

__all__ = ["FORMATS", "Sniff", "TraceFormat", "register"]
