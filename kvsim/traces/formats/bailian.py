"""Alibaba Bailian's JSONL traces: Mooncake's fields (``timestamp`` in seconds) plus
``chat_id`` (the session), ``parent_chat_id``, ``type`` and ``turn``; 16-token blocks."""

from __future__ import annotations

from typing import Any

from .checks import (
    RecordFields,
    RecordParser,
    check_ids,
    check_int,
    check_nonneg_int,
    check_str,
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
    session="chat_id",
    ints=("parent_chat_id", "turn"),
    texts=("type",),
)


def parser(bt: int) -> RecordParser:
    def parse(d: Any, path: str, lineno: int) -> RecordFields:
        try:
            cid = d["chat_id"]
            pid = d["parent_chat_id"]
            ts = d["timestamp"]
            inp = d["input_length"]
            out = d["output_length"]
            typ = d["type"]
            turn = d["turn"]
            ids = d["hash_ids"]
        except (KeyError, TypeError, IndexError):
            cid = pid = ts = inp = out = typ = turn = ids = None
        if (
            type(cid) is int
            and type(pid) is int
            and type(turn) is int
            and type(typ) is str
            and shared_fields_ok(ts, inp, out, ids, bt)
        ):
            return float(ts), inp, out, tuple(ids), cid
        if type(d) is not dict:
            raise not_object(d, path, lineno)
        cid = check_int(d, "chat_id", path, lineno)
        check_int(d, "parent_chat_id", path, lineno)
        ts = check_time(d, "timestamp", path, lineno)
        inp = check_nonneg_int(d, "input_length", path, lineno)
        out = check_nonneg_int(d, "output_length", path, lineno)
        check_str(d, "type", path, lineno)
        check_int(d, "turn", path, lineno)
        ids = check_ids(d, "hash_ids", inp, "input_length", bt, path, lineno)
        return float(ts), inp, out, ids, cid

    return parse


FORMAT = register(
    TraceFormat(
        "bailian",
        jsonl_reader(parser, LAYOUT),
        default_block_tokens=16,
        sniff=Sniff(record=lambda d: "chat_id" in d, rank=1),
    )
)
