"""The schema base: one-line errors naming the source, the key path and the bad value, the
closest key for an unknown one, help texts and a JSON Schema from the same description."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import pytest
from msgspec import Meta

from kvsim.core.errors import InputError, did_you_mean
from kvsim.options.schema import Schema, fields, json_schema, load, short_repr


class Tier(Schema):
    type: Literal["fs", "obj"]
    capacity_gib: Annotated[float, Meta(gt=0, description="Tier size in GiB.")] | None = None


class Spec(Schema):
    name: Annotated[str, Meta(description="What the run is called.")] = "run"
    seed: Annotated[int, Meta(ge=0)] = 0
    tiers: tuple[Tier, ...] = ()
    named: dict[str, Tier] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name == "bad":
            raise ValueError("name must not be 'bad'")


def _error(data: object, **kw: str) -> str:
    with pytest.raises(InputError) as info:
        load(Spec, data, source="spec.yaml", **kw)
    return str(info.value)


def test_a_valid_structure_loads_frozen() -> None:
    spec = load(Spec, {"seed": 3, "tiers": [{"type": "fs"}]}, source="x")
    assert spec.seed == 3 and spec.tiers[0].type == "fs"
    with pytest.raises(AttributeError):
        spec.seed = 4  # type: ignore[misc]


def test_a_bad_value_names_source_key_bound_and_value() -> None:
    assert _error({"seed": -1}) == "spec.yaml: seed: Expected `int` >= 0, got -1"


def test_a_nested_bad_value_names_its_whole_path() -> None:
    msg = _error({"tiers": [{"type": "fs"}, {"type": "fs", "capacity_gib": 0}]})
    assert msg.startswith("spec.yaml: tiers[1].capacity_gib: ")
    assert msg.endswith("got 0")


def test_an_unknown_key_gets_the_closest_known_one_at_its_level() -> None:
    assert _error({"sed": 1}) == "spec.yaml: sed: unknown key (did you mean 'seed'?), got 1"
    msg = _error({"tiers": [{"type": "fs", "capacity_gb": 1}]})
    assert msg.startswith("spec.yaml: tiers[0].capacity_gb: unknown key")
    assert "did you mean 'capacity_gib'?" in msg


def test_a_mapping_value_error_names_the_key_that_failed() -> None:
    msg = _error({"named": {"ok": {"type": "fs"}, "broken": {"type": "tape"}}})
    assert msg.startswith("spec.yaml: named.broken.type: ")
    assert msg.endswith("got 'tape'")


def test_a_cross_field_rule_reads_after_the_path_and_a_prefix_is_kept() -> None:
    # its message says what is wrong; the whole object after it would only repeat it
    assert _error({"name": "bad"}, prefix="options") == (
        "spec.yaml: options: name must not be 'bad'"
    )


def test_a_huge_value_is_shown_shortened() -> None:
    msg = _error({"seed": "x" * 10_000})
    assert len(msg) < 150
    nested: object = 1
    for _ in range(500):
        nested = [nested]
    assert len(short_repr(nested)) < 40


def test_fields_give_help_texts_and_defaults() -> None:
    by_name = {f.name: f for f in fields(Spec)}
    assert by_name["name"].description == "What the run is called."
    assert by_name["seed"].default == 0 and not by_name["seed"].required
    assert by_name["tiers"].default == ()
    assert [f.description for f in fields(Tier)] == [None, "Tier size in GiB."]


def test_the_json_schema_forbids_unknown_keys_and_carries_bounds() -> None:
    schema = json_schema(Spec)
    spec = schema["$defs"]["Spec"]
    assert spec["additionalProperties"] is False
    assert spec["properties"]["seed"]["minimum"] == 0
    assert spec["properties"]["name"]["description"] == "What the run is called."


def test_did_you_mean_is_empty_without_a_close_name() -> None:
    assert did_you_mean("zzzz", ["seed"]) == ""
    assert did_you_mean("polcy", ["policy", "seed"]) == " (did you mean 'policy'?)"
