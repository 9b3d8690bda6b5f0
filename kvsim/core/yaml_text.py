"""YAML as kvsim reads it (sweep specs, values on the command line): PyYAML's safe loader
without aliases and without repeated keys.

An alias repeats a node by reference, so a 2 KB file of nine levels of nine aliases stands
for 9^9 values: expanding it (to check it, to word an error about it) takes gigabytes and
minutes. No kvsim input needs an alias, so one is refused where it is met, before anything
is built. A key given twice in one mapping (``traces:`` twice) is refused too: YAML keeps the
last silently, so half of what the user wrote would be dropped. Numbers in exponent form
without a dot or a signed exponent (``1e12``, ``1.0e3``) are numbers, as in YAML 1.2 and JSON
(``1e3`` a whole one).
"""

from __future__ import annotations

import re
from typing import IO, Any

import yaml

from kvsim.core.errors import InputError


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """The safe loader, refusing aliases (and merge keys, which are aliases) and keys
    given twice in one mapping."""

    source: str | None = None

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise InputError(
                f"YAML aliases (*{event.anchor}) are not accepted in kvsim files; "
                "write the value out",
                source=self.source,
                line=event.start_mark.line + 1,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class names it
                    continue
                if repeated:
                    raise InputError(
                        f"key {str(key)[:80]!r} is given twice in one mapping; "
                        "YAML would keep only the last",
                        source=self.source,
                        line=key_node.start_mark.line + 1,
                    )
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads 1e12 and 1.0e12 as text (its floats need a dot and a signed exponent:
# 1.0e+12); YAML 1.2, JSON and Python read them as numbers, and so does kvsim. A whole
# mantissa with a non-negative exponent (1e3, 64e9) is a whole number, so it fills a count
# (``cpu_chunks: 1e3``) as 1000 would.
_EXPONENT_TAG = "tag:kvsim,2026:exponent-number"
_Loader.add_implicit_resolver(
    _EXPONENT_TAG,
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _exponent_number(loader: _Loader, node: Any) -> int | float:
    text = str(loader.construct_scalar(node)).replace("_", "")
    mantissa, _, exponent = text.lower().partition("e")
    if "." not in mantissa and not exponent.startswith("-") and int(exponent) <= 300:
        whole: int = int(mantissa) * 10 ** int(exponent)  # ** of ints is Any to mypy
        return whole
    return float(text)


_Loader.add_constructor(_EXPONENT_TAG, _exponent_number)


def load_yaml(stream: str | IO[str], source: str | None = None) -> Any:
    """The YAML document in ``stream`` as plain values.

    Raises:
        InputError: an alias or a repeated key, naming ``source`` and the line.
        yaml.YAMLError: text that is not YAML (the caller words it).
    """
    loader = _Loader(stream)
    loader.source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
