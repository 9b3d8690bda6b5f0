"""A JSONL format's record fields (:class:`JsonlLayout`), in a module of its own: the
format's reader (:mod:`kvsim.traces.formats.jsonl`) passes it to the one-call decoder
(:mod:`kvsim.traces.fast_jsonl`), which reads it; neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JsonlLayout"]


@dataclass(frozen=True)
class JsonlLayout:
    """A JSONL format's record fields, as the one-call decoder reads them.

    It must accept exactly the records the format's parser accepts (a test compares them).

    Attributes:
        arrival, prompt, output, hashes: the fields of the arrival time, the prompt and
            output lengths and the block ids.
        session: the session-id field, or None when records have none.
        session_optional: records may leave the session out (or null).
        ints, texts: other fields that must be present, as integers / strings.
        empty_hashes: an empty id list is allowed whatever the prompt length.
        time_scale: arrival seconds = the field's value / ``time_scale`` (None: 1).
    """

    arrival: str
    prompt: str
    output: str
    hashes: str
    session: str | None = None
    session_optional: bool = False
    ints: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    empty_hashes: bool = False
    time_scale: float | None = None
