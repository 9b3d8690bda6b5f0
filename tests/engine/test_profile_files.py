"""The link and compute profile files are described once (kvsim.engine.link_file,
kvsim.engine.compute_file): errors name the file, the key and the value, with "did you
mean"; every number must be finite; ``kvsim schema`` prints each one's JSON Schema."""

from __future__ import annotations

import json

import pytest

from kvsim.core.errors import InputError
from kvsim.engine.compute_model import ComputeParams, load_compute_profile
from kvsim.engine.transfer_model import LINK_PRESETS, get_link, load_transfer_profile
from kvsim.options.registry import schema_named
from kvsim.options.schema import json_schema
from kvsim.specs.hardware import get_gpu


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_link_profile_round_trips_and_an_overflowing_number_is_not_finite(tmp_path):
    text = LINK_PRESETS["pcie4"].to_json()
    assert load_transfer_profile(_write(tmp_path, "ok.json", text)) == LINK_PRESETS["pcie4"]
    bad = text.replace('"duplex_factor": 0.8', '"duplex_factor": 1e999')
    path = _write(tmp_path, "inf.json", bad)
    with pytest.raises(InputError) as exc:
        load_transfer_profile(path)
    assert str(exc.value) == f"{path}: duplex_factor: must be finite, got inf"


def test_a_constant_link_names_the_key_with_did_you_mean(tmp_path):
    data = {"kind": "constant", "h2d_bytes_per_s": 1e9, "d2h_bytes_per_s": 1e9, "lnk": "x"}
    path = _write(tmp_path, "c.json", json.dumps(data))
    with pytest.raises(InputError, match=r"c\.json: lnk: unknown key \(did you mean 'link'\?\)"):
        get_link(path)
    data = {"kind": "constant", "h2d_bytes_per_s": 0, "d2h_bytes_per_s": 1e9}
    with pytest.raises(InputError, match=r"h2d_bytes_per_s: Expected `float` > 0.0, got 0$"):
        get_link(_write(tmp_path, "z.json", json.dumps(data)))
    with pytest.raises(InputError, match="kind: must be one of constant, profile, got 'cst'"):
        get_link(_write(tmp_path, "k.json", json.dumps({"kind": "cst"})))


def test_a_roofline_profile_replaces_only_what_it_gives(tmp_path):
    base = ComputeParams.for_gpu(get_gpu("a100"))
    got = load_compute_profile(_write(tmp_path, "r.json", '{"step_overhead_s": 0}'), base)
    assert got == ComputeParams(base.peak_flops, base.hbm_bytes_per_s, step_overhead_s=0.0)
    path = _write(tmp_path, "bad.json", '{"flops_eficiency": 0.5}')
    with pytest.raises(InputError, match="did you mean 'flops_efficiency'"):
        load_compute_profile(path, base)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("link-profile", "duplex_factor"),
        ("constant-link", "h2d_bytes_per_s"),
        ("compute-profile-roofline", "flops_efficiency"),
        ("compute-profile-linear", "per_token_s"),
        ("compute-profile-phases", "gemm_efficiency"),
    ],
)
def test_each_file_has_a_json_schema_with_help(name, key):
    schema = json_schema(schema_named(name))
    (top,) = (d for d in schema["$defs"].values() if key in d.get("properties", {}))
    prop = top["properties"][key]
    described = json.dumps(prop)
    assert "description" in described, (name, key, prop)
