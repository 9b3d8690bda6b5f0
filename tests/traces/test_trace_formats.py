"""The format registry is the only way in: a format registered there is sniffed, opened,
read and named in errors without any other change (what makes a new format one module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvsim.core.errors import InputError
from kvsim.traces import TRACE_FORMATS, cache, open_trace, sniff_format
from kvsim.traces.formats import FORMATS, Sniff, TraceFormat, register
from kvsim.traces.formats.batching import request_batches
from kvsim.traces.formats.files import numbered_lines, open_bin
from kvsim.traces.model import Request


def _read_tsv(path: str, block_tokens: int) -> Iterator:
    """A toy format: ``arrival<TAB>prompt<TAB>output`` per line."""

    def requests() -> Iterator[Request]:
        with open_bin(path) as f:
            for i, (lineno, line) in enumerate(numbered_lines(f, path)):
                cells = line.decode().split("\t")
                if len(cells) != 3:
                    raise InputError("expected 3 cells", source=path, line=lineno)
                yield Request(i, float(cells[0]), int(cells[1]), int(cells[2]), ())

    return request_batches(requests())


@pytest.fixture
def tsv() -> Iterator[TraceFormat]:
    fmt = register(
        TraceFormat(
            "toy-tsv",
            _read_tsv,
            default_block_tokens=64,
            sniff=Sniff(suffixes=(".tsv",)),
            has_reuse_info=False,
        )
    )
    try:
        with cache.settings(enabled=False):  # its code is not part of the cache's key
            yield fmt
    finally:
        del FORMATS["toy-tsv"]


def test_built_in_formats_in_their_listed_order():
    assert TRACE_FORMATS == ("mooncake", "bailian", "azure", "native")
    assert list(FORMATS)[:4] == list(TRACE_FORMATS)


def test_a_registered_format_is_sniffed_read_and_named(tmp_path, tsv):
    p = tmp_path / "t.tsv"
    p.write_text("0.5\t100\t3\n1.5\t40\t2\n")
    assert sniff_format(str(p)) == "toy-tsv"
    trace = open_trace(p)
    assert (trace.format, trace.block_tokens, trace.info.has_reuse_info) == ("toy-tsv", 64, False)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in trace] == [
        (0.5, 100, 3),
        (1.5, 40, 2),
    ]
    bad = tmp_path / "bad.tsv"
    bad.write_text("0.5\t100\t3\n1\t2\n")
    with pytest.raises(InputError, match=r"bad\.tsv:2: expected 3 cells"):
        list(open_trace(bad))
    with pytest.raises(
        InputError, match="expected one of mooncake, bailian, azure, native, toy-tsv"
    ):
        open_trace(p, fmt="nope")


def test_a_format_states_its_block_size_one_way():
    with pytest.raises(ValueError, match="exactly one"):
        TraceFormat("x", _read_tsv)
    with pytest.raises(ValueError, match="registered twice"):
        register(TraceFormat("mooncake", _read_tsv, default_block_tokens=1))
