"""YAML as kvsim reads it (sweep specs, values on the command line): PyYAML's safe loader
without aliases and without repeated keys.

An alias repeats a node by reference, so a 2 KB file of nine levels of nine aliases stands
for 9^9 values: expanding it (to check it, to word an error about it) takes gigabytes and
minutes. No kvsim input needs an alias, so one is refused where it is met, before anything
is built. A key given twice in one mapping (``traces:`` twice) is refused too: YAML keeps the
last silently, so half of what the user wrote would be dropped.
"""

from __future__ import annotations

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
