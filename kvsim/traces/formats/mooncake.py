"""Mooncake's JSONL traces (FAST'25): ``timestamp`` in milliseconds, ``input_length``,
``output_length`` and ``hash_ids``, one id per 512-token block (the partial one included)."""

from __future__ import annotations

from typing import Any

from .checks import (
    RecordFields,
    RecordParser,
    check_ids,
    check_nonneg_int,
    check_time,
    not_object,
    shared_fields_ok,
)
from .jsonl import JsonlLayout, jsonl_reader
from .registry import Sniff, TraceFormat, register

LAYOUT = JsonlLayout(
    arrival="timestamp",
    prompt="input_length",
    output="output_length",
    hashes="hash_ids",
    time_scale=1000.0,
)


def parser(bt: int) -> RecordParser:
    def parse(d: Any, path: str, lineno: int) -> RecordFields:
        try:
            ts = d["timestamp"]
            inp = d["input_length"]
            out = d["output_length"]
            ids = d["hash_ids"]
        except (KeyError, TypeError, IndexError):
            ts = inp = out = ids = None
        if shared_fields_ok(ts, inp, out, ids, bt):
            return ts / 1000.0, inp, out, tuple(ids), None
        if type(d) is not dict:
            raise not_object(d, path, lineno)
        # slow path: find and report the first problem
        ts = check_time(d, "timestamp", path, lineno)
        inp = check_nonneg_int(d, "input_length", path, lineno)
        out = check_nonneg_int(d, "output_length", path, lineno)
        ids = check_ids(d, "hash_ids", inp, "input_length", bt, path, lineno)
        return ts / 1000.0, inp, out, ids, None

    return parse


FORMAT = register(
    TraceFormat(
        "mooncake",
        jsonl_reader(parser, LAYOUT),
        default_block_tokens=512,
        # rank 2: Bailian's records carry these fields too, so its test runs first
        sniff=Sniff(record=lambda d: "hash_ids" in d and "input_length" in d, rank=2),
    )
)
