"""The command line's options come from the schemas: the same flags, aliases, types and
help texts, and ``kvsim schema NAME`` prints a structure's JSON Schema."""

from __future__ import annotations

import json

import click
import pytest
from support import run_main

from kvsim.cli.cmd_mrc import mrc_command
from kvsim.cli.cmd_replay import replay_command
from kvsim.cli.cmd_simulate import simulate_command
from kvsim.cli.common import CLI_OFFLOAD_FIELDS
from kvsim.options.offload import OffloadOptions
from kvsim.options.registry import SCHEMAS
from kvsim.options.runs import SimulateOptions
from kvsim.options.schema import field


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


@pytest.mark.parametrize("command", [replay_command, simulate_command], ids=["replay", "simulate"])
def test_every_offload_option_is_its_schema_field(command):
    options = _options(command)
    for name in CLI_OFFLOAD_FIELDS:
        option, f = options[name], field(OffloadOptions, name)
        assert option.opts[0] == "--" + name.replace("_", "-")
        assert (f.description or "").rstrip(".") in (option.help or ""), name
        assert option.default is None  # not given: the API's default or --vllm-config's
    # vLLM's spellings stay aliases
    assert "--kv-offloading-size" in options["cpu_gib"].opts
    assert "--tensor-parallel-size" in options["tp"].opts
    assert isinstance(options["cpu_gib"].type, click.types.FloatParamType)


def test_simulate_engine_options_come_from_the_simulate_schema():
    options = _options(simulate_command)
    for name in ("max_num_batched_tokens", "max_num_seqs", "time_scale", "link", "gpu"):
        assert options[name].help == field(SimulateOptions, name).description, name
    assert "--gpu-spec" in options["gpu"].opts and options["gpu"].default == "h200"
    assert list(options["tier_load_rule"].type.choices) == ["off", "pays-off"]
    assert options["async_scheduling"].secondary_opts == ["--no-async-scheduling"]


def test_mrc_sizes_with_the_same_options():
    options = _options(mrc_command)
    assert options["gpu_block_tokens"].default == 16
    assert "--tensor-parallel-size" in options["tp"].opts


def test_kvsim_schema_prints_a_json_schema_and_lists_the_names(capsys):
    code, out, _ = run_main(["schema", "kv-connector-extra-config"], capsys)
    assert code == 0
    props = json.loads(out)["$defs"]["KVConnectorExtraConfig"]["properties"]
    assert props["eviction_policy"]["default"] == "lru"
    code, out, _ = run_main(["schema"], capsys)
    assert code == 0 and out.split() == list(SCHEMAS)


def test_an_unknown_schema_is_one_line_with_a_guess(capsys):
    code, _, err = run_main(["schema", "kv-transfer-cfg"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "did you mean 'kv-transfer-config'?" in err
