"""The sweep spec described once (kvsim.sweeps.spec_schema): the loader's checks and the JSON
Schema editors use come from one description and agree; option rules agree with the API's;
cells are counted before they are built and hold the values as written."""

from __future__ import annotations

import math
from pathlib import Path

import jsonschema
import pytest
import yaml
from support import ROOT, SAMPLE

from kvsim.core.errors import InputError
from kvsim.options.offload import OffloadOptions
from kvsim.options.registry import schema_named
from kvsim.options.schema import json_schema
from kvsim.sweeps import SweepSpec, check_value, option_names
from kvsim.sweeps.spec_schema import NOT_OPTIONS


def sweep_spec_json_schema() -> dict:
    return json_schema(schema_named("sweep"))  # what `kvsim schema sweep` prints


GOOD = [
    {"traces": [SAMPLE], "grid": {"cpu_chunks": [10, 20], "policy": ["lru", "arc"]}},
    {"traces": SAMPLE, "limit": 5, "options": {"cpu_gib": 4}, "grid": {"seed": 3}},
    {
        "traces": [{"kind": "chat", "n_requests": 10, "rate": 2.0}],
        "mode": "timed",
        "options": {"gpu": "h100", "gpu_memory_utilization": 0.9},
        "grid": {"max_num_seqs": [8, 16], "tiers": ["none", "fs:capacity=1TiB"]},
    },
    {"traces": [SAMPLE], "limit": 5.0, "grid": {"cpu_chunks": [10.0, 20]}},  # whole floats
]
BAD = [
    {"grid": {"cpu_chunks": [10]}},  # no traces
    {"traces": [], "grid": {"cpu_chunks": [10]}},
    {"traces": [SAMPLE], "grid": {"polcy": ["lru"], "cpu_chunks": [10]}},
    {"traces": [SAMPLE], "grid": {"cpu_chunks": [0]}},
    {"traces": [SAMPLE], "grid": {"cpu_chunks": []}},
    {"traces": [SAMPLE], "options": {"cpu_gib": "64"}, "grid": {"seed": [1]}},
    {"traces": [SAMPLE], "mode": "fast", "grid": {"cpu_chunks": [10]}},
    {"traces": [SAMPLE], "limit": 0, "grid": {"cpu_chunks": [10]}},
    {"traces": [{"n_requests": 10}], "grid": {"cpu_chunks": [10]}},  # a generator needs kind
    {"traces": [SAMPLE], "gird": {"cpu_chunks": [10]}},
    {"traces": [SAMPLE], "grid": {"cpu_chunks": [2.5]}},  # not a whole number
]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = sweep_spec_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("spec", GOOD)
def test_a_good_spec_passes_the_loader_and_the_json_schema(spec, validator):
    SweepSpec.from_mapping(spec)
    validator.validate(spec)


@pytest.mark.parametrize("spec", BAD)
def test_a_bad_spec_fails_the_loader_and_the_json_schema(spec, validator):
    with pytest.raises(InputError):
        SweepSpec.from_mapping(spec)
    assert not validator.is_valid(spec)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("sweep_*.yaml")))
def test_the_shipped_example_specs_pass_the_json_schema(path, validator):
    validator.validate(yaml.safe_load(path.read_text()))


def test_the_json_schema_carries_the_options_kinds_and_bounds():
    defs = sweep_spec_json_schema()["$defs"]
    options, grid = defs["SweepSpecOptions"], defs["SweepSpecGrid"]
    assert options["additionalProperties"] is False and grid["additionalProperties"] is False
    every = option_names("cache") | option_names("timed")
    assert set(options["properties"]) == set(grid["properties"]) == every
    own = json_schema(OffloadOptions)["$defs"]["OffloadOptions"]["properties"]["cpu_chunks"]
    own = {k: v for k, v in own.items() if k != "default"}
    assert options["properties"]["cpu_chunks"] == own  # OffloadOptions' kind, bound and help
    assert {"type": "array", "items": own, "minItems": 1} in grid["properties"]["cpu_chunks"][
        "anyOf"
    ]
    assert defs["GeneratedTrace"]["required"] == ["kind"]
    assert defs["GeneratedTrace"].get("additionalProperties", True) is True  # the kind's knobs


def test_a_cell_takes_every_keyword_of_its_modes_job():
    """The options a cell may set are exactly the API's keywords (read from the job's
    signature), less those the sweep sets, plus the tiers axis."""
    import inspect

    from kvsim.api import replay, simulate

    for mode, job in (("cache", replay), ("timed", simulate)):
        params = inspect.signature(job).parameters.values()
        keywords = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert option_names(mode) == (keywords - NOT_OPTIONS - {"progress"}) | {"tiers"}
    assert "gpu" in option_names("timed") and "gpu" not in option_names("cache")
    assert "protocol" in option_names("cache") and "protocol" not in option_names("timed")


@pytest.mark.parametrize(
    "name", [n for n in OffloadOptions.__struct_fields__ if n != "secondary_tiers"]
)
def test_a_sweep_takes_an_offload_option_value_exactly_when_the_api_does(name):
    """The drift issue 23 found (a sweep refused seed -1, which replay() took) cannot come
    back unseen."""
    for value in (-1, 0, 1, 7, 2.5, math.inf, "x", "", True, None, [1]):
        try:
            OffloadOptions(**{name: value})
            api = True
        except (InputError, TypeError, ValueError):
            api = False
        try:
            check_value(name, value, name)
            swept = True
        except InputError:
            swept = False
        assert swept == api, f"{name}={value!r}: sweep {swept}, OffloadOptions {api}"


def test_cells_are_counted_before_any_is_built():
    spec = SweepSpec(
        traces=[SAMPLE, "b.jsonl"],
        grid={"cpu_chunks": list(range(1, 1001)), "seed": list(range(1000))},
    )
    assert spec.n_cells == 2_000_000
    first = next(spec.iter_cells())
    assert first == {"trace": SAMPLE, "mode": "cache", "limit": None, "cpu_chunks": 1, "seed": 0}


def test_cells_hold_the_values_as_written():
    spec = SweepSpec.from_mapping(
        {"traces": [Path(SAMPLE)], "options": {"cpu_gib": 64}, "grid": {"seed": [1, 2]}}
    )
    cells = spec.cells()
    assert spec.n_cells == len(cells) == 2
    assert type(cells[0]["cpu_gib"]) is int and cells[0]["cpu_gib"] == 64  # not 64.0
    assert cells[0]["trace"] == SAMPLE and [c["seed"] for c in cells] == [1, 2]


def test_a_whole_float_is_read_as_its_int_as_a_measurements_file_reads_it(tmp_path):
    """``max_num_seqs: 256.0`` (a spreadsheet's transcription) is 256, in options, grid,
    limit and a generated trace alike; ``2.5`` is still refused where an int is expected."""
    path = tmp_path / "s.yaml"
    path.write_text(
        f"traces: [{SAMPLE}, {{kind: chat, n_requests: 10.0}}]\nmode: timed\nlimit: 2000.0\n"
        "options: {max_num_seqs: 256.0, cpu_gib: 64.0}\ngrid: {gpu_blocks: [1000.0, 2000]}\n"
    )
    spec = SweepSpec.load(path)
    cell = spec.cells()[0]
    assert spec.limit == 2000 and spec.traces[1]["n_requests"] == 10
    assert [type(cell[k]) for k in ("max_num_seqs", "cpu_gib", "gpu_blocks")] == [int] * 3
    assert (cell["max_num_seqs"], cell["cpu_gib"], spec.grid["gpu_blocks"]) == (
        256,
        64,
        [1000, 2000],
    )
    path.write_text(f"traces: [{SAMPLE}]\nmode: timed\noptions: {{max_num_seqs: 2.5}}\n")
    with pytest.raises(InputError, match=r"options.max_num_seqs: Expected `int.*got 2.5"):
        SweepSpec.load(path)


def test_an_empty_section_is_no_section():
    spec = SweepSpec.from_mapping({"traces": [SAMPLE], "options": None, "grid": {"cpu_chunks": 4}})
    assert spec.options == {} and spec.grid == {"cpu_chunks": [4]}


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe\x00binary", "a sweep spec is YAML text, not binary"),
        (b"grid: [1,\n", "bad YAML"),
        (b"- a\n- b\n", "a sweep spec is a mapping, got ['a', 'b']"),
        (None, "cannot read the sweep spec"),  # a folder
    ],
)
def test_an_unreadable_spec_file_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "spec.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(InputError) as info:
        SweepSpec.load(path)
    assert str(info.value).startswith(f"{path}:") and message in str(info.value)
