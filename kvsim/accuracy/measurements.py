"""The kvsim measurements format, version 1: published measurements of vLLM on real GPUs,
each experiment with what ran (model, GPU, parallelism, vLLM's engine arguments under
vLLM's own names, the benchmark client's workload and load) and what was measured, per load
stage and for the whole run.

One :class:`~kvsim.options.schema.Schema` describes it (``kvsim schema measurements``);
:func:`read_measurements` reads a file exactly: an unknown key, a wrong type or a stage
index past the load's stages is one line naming the file and the key path.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from kvsim.core.errors import InputError, did_you_mean
from kvsim.core.io import read_yaml
from kvsim.core.numeric import whole_floats_as_ints
from kvsim.options.fleet import MAX_INSTANCES, ROUTERS
from kvsim.options.schema import Schema, load, short_repr
from kvsim.options.vllm import KVTransferConfig
from kvsim.workloads import Load, RandomWorkload, SharedPrefixWorkload, load_workload
from kvsim.workloads.spec import WorkloadSpec

__all__ = [
    "Experiment",
    "Measured",
    "MeasurementsFile",
    "Stats",
    "VllmArgs",
    "read_measurements",
]

_Pos = Annotated[int, Meta(ge=1)]
_Ms = Annotated[float, Meta(ge=0)]


class Stats(Schema, frozen=True):
    """A latency's statistics in ms (any subset)."""

    mean: _Ms | None = None
    p50: _Ms | None = None
    p90: _Ms | None = None
    p99: _Ms | None = None

    def __post_init__(self) -> None:
        ranks = (("p50", self.p50), ("p90", self.p90), ("p99", self.p99))
        known = [(k, v) for k, v in ranks if v is not None]
        for (low, a), (high, b) in itertools.pairwise(known):
            if a > b:  # a percentile never falls as its rank rises: a typo or swapped keys
                raise ValueError(f"{low} {a:g} is above {high} {b:g}")


class Measured(Schema, frozen=True):
    """What one stage (by send time; ``all``: the whole run) measured."""

    stage: Annotated[
        Annotated[int, Meta(ge=0)] | Literal["all"],
        Meta(description="Load stage index from 0, or all (the whole run)."),
    ]
    ttft_ms: Stats | None = None
    e2e_ms: Stats | None = None
    itl_ms: Stats | None = None
    requests: Annotated[int, Meta(ge=0)] | None = None
    failed: Annotated[int, Meta(ge=0)] | None = None
    prompt_len_mean: Annotated[float, Meta(ge=0)] | None = None
    output_len_mean: (
        Annotated[
            float, Meta(ge=0, description="Output tokens per request as the client counted them.")
        ]
        | None
    ) = None
    output_tokens_per_s: Annotated[float, Meta(ge=0)] | None = None
    total_tokens_per_s: Annotated[float, Meta(ge=0)] | None = None
    requests_per_s: Annotated[float, Meta(ge=0)] | None = None

    def __post_init__(self) -> None:
        ttft = self.ttft_ms.mean if self.ttft_ms is not None else None
        e2e = self.e2e_ms.mean if self.e2e_ms is not None else None
        if ttft is not None and e2e is not None and e2e < ttft:
            # a request's E2E holds its TTFT, so the means do too (the ITL derived from
            # them would be negative)
            raise ValueError(f"e2e_ms.mean {e2e:g} is below ttft_ms.mean {ttft:g}")


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$ref``s to its own ``$defs`` replaced by their text."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(copy.deepcopy(defs[ref.split("/")[-1]]))
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return dict(walk(schema))


#: the one KV connector kvsim re-creates
MODELLED_CONNECTOR = "OffloadingConnector"


def _kv_transfer_schema() -> dict[str, Any]:
    """What the file may give as ``kv_transfer_config`` as an object, as the reader takes
    it: the OffloadingConnector's config (KVTransferConfig's schema, its keys checked), or
    another connector's with keys of its own (its experiment fails alone). Its JSON text is
    the field's other type (:data:`_KV_TRANSFER_TEXT`)."""
    schema = _inline(msgspec.json.schema(KVTransferConfig))
    schema["properties"]["kv_connector"] = {
        "const": MODELLED_CONNECTOR,
        "description": f"The connector; kvsim models {MODELLED_CONNECTOR} (the other keys "
        "are its), and an experiment naming another fails alone. Required: vLLM does not "
        "start with a kv_transfer_config that names none.",
    }
    schema["required"] = sorted({*schema.get("required", []), "kv_connector"})
    other = {
        "type": "object",
        "description": "Another connector's config (LMCache's, NIXL's): read, not checked; "
        "its experiment fails alone.",
        "properties": {"kv_connector": {"type": "string", "not": {"const": MODELLED_CONNECTOR}}},
        "required": ["kv_connector"],
    }
    return {
        "anyOf": [schema, other],
        "description": "vLLM's --kv-transfer-config as an object (or as its JSON text).",
    }


_KV_TRANSFER_SCHEMA = _kv_transfer_schema()
#: the other way to write it, as copied from a command line
_KV_TRANSFER_TEXT = (
    "vLLM's --kv-transfer-config as the JSON text vllm serve --kv-transfer-config takes: a "
    'string holding the same JSON object (e.g. \'{"kv_connector": "OffloadingConnector", '
    '"kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes_to_use": 8589934592}}\'), '
    "read and checked as the object."
)


def _kv_config_object(text: str, key: str, source: str | None = None) -> dict[str, Any]:
    """``text``, a ``kv_transfer_config`` written as ``vllm serve --kv-transfer-config``
    takes it (a JSON object in a string, as copied from a command line), as that object;
    text that is not one is one line naming ``key``."""
    import json

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [k for k, _ in pairs]
        twice = sorted({k for k in names if names.count(k) > 1})
        if twice:  # json keeps the last silently, where the file's YAML keys are refused
            raise InputError(f"{key}: {', '.join(twice)} given twice", source=source)
        return dict(pairs)

    try:
        parsed = json.loads(text, object_pairs_hook=no_repeats)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{key}: not a JSON object ({e.msg}), got {short_repr(text)}", source=source
        ) from None
    if not isinstance(parsed, dict):
        raise InputError(f"{key}: not a JSON object, got {short_repr(text)}", source=source)
    return parsed


class VllmArgs(Schema, frozen=True):
    """vLLM's engine arguments, under vLLM's names (unset: vLLM's default)."""

    max_num_seqs: _Pos | None = None
    max_num_batched_tokens: _Pos | None = None
    max_model_len: _Pos | None = None
    block_size: _Pos = 16
    gpu_memory_utilization: Annotated[float, Meta(gt=0, le=1)] = 0.9
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    dtype: Annotated[
        Literal["auto", "float16", "half", "bfloat16", "float", "float32"],
        Meta(description="vLLM's --dtype; float/float32 is read but not modelled (it fails)."),
    ] = "auto"
    num_gpu_blocks_override: _Pos | None = None
    kv_cache_dtype: Annotated[
        str,
        Meta(
            min_length=1,
            description="vLLM's --kv-cache-dtype: auto (the model's dtype), float16, "
            "bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc; a packed layout vLLM has "
            "(int8_per_token_head, fp8_ds_mla, ...) is read, not modelled (it fails).",
        ),
    ] = "auto"
    # kept as written, read by connector(): another connector than vLLM's
    # OffloadingConnector (LMCache's, NIXL's) fails its experiment alone, not the file
    kv_transfer_config: (
        Annotated[dict[str, Any], Meta(extra_json_schema=_KV_TRANSFER_SCHEMA)]
        | Annotated[
            str,
            Meta(
                description=_KV_TRANSFER_TEXT,
                extra_json_schema={"contentMediaType": "application/json"},
            ),
        ]
        | None
    ) = None

    def transfer_config(
        self, source: str | None = None, where: str = "vllm.kv_transfer_config"
    ) -> dict[str, Any] | None:
        """``kv_transfer_config`` as its object, its JSON text read (the reader has read a
        file's already, naming the experiment)."""
        data = self.kv_transfer_config
        return _kv_config_object(data, where, source) if isinstance(data, str) else data

    def other_connector(self) -> Any:
        """The connector ``kv_transfer_config`` names where it is not the one kvsim models
        (its experiment fails alone), else None."""
        name = (self.transfer_config() or {}).get("kv_connector")
        return None if name in (None, MODELLED_CONNECTOR) else name

    def connector(
        self, source: str | None = None, where: str = "vllm.kv_transfer_config"
    ) -> KVTransferConfig | None:
        """``kv_transfer_config`` as the OffloadingConnector's config, or None without one;
        a bad one (one naming no connector, as vLLM refuses it), or another connector
        (which kvsim does not model), is one line naming ``where`` in ``source``."""
        data = self.transfer_config(source, where)
        if data is None:
            return None
        if data.get("kv_connector") is None:  # vLLM's scheduler refuses to start
            got = "null" if "kv_connector" in data else "no kv_connector"
            raise InputError(
                f"{where}.kv_connector: vLLM 0.33 does not start with a kv_transfer_config "
                "that names no connector (its scheduler builds one from every "
                f"kv_transfer_config); write {MODELLED_CONNECTOR} for a CPU tier, or leave "
                f"kv_transfer_config out for none, got {got}",
                source=source,
            )
        name = self.other_connector()
        if name is not None:
            raise InputError(
                f"{where}.kv_connector: {name!r} is not modelled (kvsim models vLLM's "
                f"{MODELLED_CONNECTOR})",
                source=source,
            )
        return load(KVTransferConfig, data, source=source, prefix=where)


class Router(Schema, frozen=True):
    """How requests are spread over ``instances`` engines, as ``kvsim simulate --router``
    spreads them (docs/fleets.md)."""

    name: Annotated[
        str,
        Meta(
            min_length=1,
            description=f"{', '.join(ROUTERS)}, or a plugin module:Class (docs/fleets.md).",
        ),
    ]

    def __post_init__(self) -> None:
        module, colon, cls = self.name.partition(":")
        if self.name not in ROUTERS and not (colon and module and cls):
            raise ValueError(
                f"unknown router {self.name!r}{did_you_mean(self.name, ROUTERS)}; known: "
                f"{', '.join(ROUTERS)}, or a plugin module:Class"
            )


def _workload_schema(kind: type[SharedPrefixWorkload] | type[RandomWorkload]) -> dict[str, Any]:
    """``kind``'s schema as the reader takes it: ``type`` required (it picks the kind)."""
    schema = _inline(msgspec.json.schema(kind))
    schema["required"] = ["type", *schema.get("required", [])]
    return schema


_WORKLOAD_SCHEMA = {
    "anyOf": [_workload_schema(t) for t in (SharedPrefixWorkload, RandomWorkload)],
    "description": "The benchmark client's data: type shared_prefix or random, with its keys.",
}


class Experiment(Schema, frozen=True, kw_only=True):
    """One run of vLLM on real GPUs and what it measured."""

    id: Annotated[str, Meta(min_length=1)]
    source: str
    model: Annotated[
        str,
        Meta(
            min_length=1,
            description="A preset, its Hugging Face id, or a config.json path (from the file).",
        ),
    ]
    gpu: Annotated[str, Meta(min_length=1, description="A preset, or a GPU spec JSON path.")]
    tp: _Pos = 1
    instances: Annotated[int, Meta(ge=1, le=MAX_INSTANCES)] = 1
    router: Router | None = None
    vllm: VllmArgs = VllmArgs()
    workload: Annotated[dict[str, Any], Meta(extra_json_schema=_WORKLOAD_SCHEMA)]
    load: Load
    measured: Annotated[list[Measured], Meta(min_length=1)]

    def __post_init__(self) -> None:
        if self.id != self.id.strip() or any(c in self.id for c in "\r\n\t"):
            raise InputError(  # tables and one-line messages name experiments by it
                f"id: {self.id!r} has spaces around it or a line break or tab in it"
            )
        stages = len(self.load.stages)
        seen: set[int | str] = set()
        for i, m in enumerate(self.measured):
            if m.stage != "all" and m.stage >= stages:
                raise InputError(
                    f"measured[{i}].stage: {m.stage} is past the load's {stages} stage(s)"
                )
            if m.stage in seen:
                raise InputError(f"measured[{i}].stage: {m.stage} is measured twice")
            seen.add(m.stage)

    def workload_spec(self, source: str | None = None, index: int | None = None) -> WorkloadSpec:
        """The ``workload:`` block as its structure (checked); an error names
        ``experiments[index].workload``, or with no ``index`` (a run of this experiment,
        named by its id) ``workload``."""
        prefix = "workload" if index is None else f"experiments[{index}].workload"
        return load_workload(self.workload, source=source, prefix=prefix)

    def checked_workload(self, source: str, index: int) -> None:
        """The ``workload:`` block checked as the file is read, but for ``ignore_eos:
        false``: a run kvsim cannot re-create (its output lengths were the model's text),
        not a bad file, so that experiment fails alone when it runs (:meth:`workload_spec`
        says why) and the file's others still run."""
        data = self.workload
        if data.get("ignore_eos") is False:
            data = {**data, "ignore_eos": True}
        load_workload(data, source=source, prefix=f"experiments[{index}].workload")

    def measured_at(self, stage: int | str) -> Measured | None:
        return next((m for m in self.measured if m.stage == stage), None)

    def model_arg(self, base_dir: str) -> str:
        """The model as the run takes it: a preset, or a ``config.json`` path relative to
        the file (``base_dir``); neither is one line naming the name as written."""
        from kvsim.specs.models import HF_ID_NAMES, MODELS, get_model, preset_of_hf_id

        return _preset_or_file(
            self.model, base_dir, MODELS, get_model, "model", preset_of_hf_id, HF_ID_NAMES
        )

    def gpu_arg(self, base_dir: str) -> str:
        """The GPU as the run takes it: a preset (named so, or by its product name, "NVIDIA
        H100 80GB HBM3"), or a GPU spec JSON path relative to the file (``base_dir``)."""
        from kvsim.specs.hardware import GPUS, get_gpu, preset_of_gpu_name

        return _preset_or_file(self.gpu, base_dir, GPUS, get_gpu, "GPU", preset_of_gpu_name)


def _preset_or_file(
    name: str,
    base_dir: str,
    presets: Mapping[str, Any],
    read: Callable[[str], Any],
    noun: str,
    alias: Callable[[str], str | None] | None = None,
    aliases: tuple[str, ...] = (),
) -> str:
    """``name`` if it is a preset, else the path it names relative to ``base_dir``, read
    once here (a bad file is its reader's one line), else the preset ``alias`` gives it
    (a model's Hugging Face id: a folder of that name beside the file wins, as ``vllm
    serve`` reads a local folder first); ``aliases``: the names ``alias`` knows, for the
    closest one to a misspelt name."""
    if name.strip().lower() in presets:
        return name
    path = name if os.path.isabs(name) else os.path.join(base_dir, name)
    preset = alias(name) if alias is not None and not os.path.exists(path) else None
    if preset is not None:
        return preset
    if not os.path.exists(path):
        from kvsim.specs.models import HF_IDS_SAID

        hint = did_you_mean(name, presets) or did_you_mean(name, aliases)
        if aliases and names_a_hub_model(name, base_dir):
            raise InputError(
                f"kvsim has no spec for the Hugging Face model {name!r}{hint}; save its "
                "config.json beside the measurements file and give its path as the model "
                f"(presets: {', '.join(sorted(presets))}{HF_IDS_SAID})"
            )
        ids = HF_IDS_SAID if aliases else ""
        raise InputError(
            f"unknown {noun} {name!r}{hint}; known: {', '.join(sorted(presets))}{ids}, or a "
            "file path (relative to the measurements file)"
        )
    read(path)
    return path


#: a Hugging Face repository id as ``vllm serve`` takes it: ``org/name``, of the characters
#: the Hub allows
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def names_a_hub_model(name: str, base_dir: str) -> bool:
    """Whether ``name`` reads as a Hugging Face model id (``org/name``, not a ``.json``
    file, nothing of that name beside the measurements file): a real model, which kvsim
    may lack a spec for, so that its experiment fails alone (exit 1 after the others ran,
    as another KV connector does) where a name of kvsim's own vocabulary that no preset
    has (a misspelt preset or GPU, a missing spec file) is a bad file (exit 2)."""
    path = name if os.path.isabs(name) else os.path.join(base_dir, name)
    return (
        _HUB_ID.fullmatch(name.strip()) is not None
        and not name.strip().lower().endswith(".json")
        and not os.path.exists(path)
    )


class MeasurementsFile(Schema, frozen=True):
    """A kvsim measurements file (format version 1)."""

    kvsim_measurements: Annotated[Literal[1], Meta(description="The format version: 1.")]
    experiments: Annotated[list[Experiment], Meta(min_length=1)]


def read_measurements(path: str | os.PathLike[str]) -> MeasurementsFile:
    """A measurements file, checked whole (every experiment's workload too) before anything
    runs; a bad file is one line naming it and the key path."""
    source = os.fspath(path)
    data = read_yaml(source, "measurements file")
    if not isinstance(data, dict):
        raise InputError("a measurements file is a YAML mapping", source=source)
    if "kvsim_measurements" in data and data["kvsim_measurements"] != 1:
        raise InputError(
            f"kvsim_measurements: version {data['kvsim_measurements']!r} is not one this "
            "kvsim reads (1)",
            source=source,
        )
    _vllm_nulls_unset(data)
    _parse_kv_config_text(data, source)
    _stage_texts(data, source)
    parsed = load(MeasurementsFile, whole_floats_as_ints(data), source=source)
    ids: set[str] = set()
    for i, exp in enumerate(parsed.experiments):
        if exp.id in ids:
            raise InputError(f"experiments[{i}].id: {exp.id!r} is used twice", source=source)
        ids.add(exp.id)
        exp.checked_workload(source, i)
        base_dir = os.path.dirname(os.path.abspath(source))
        for key, resolve in (("model", exp.model_arg), ("gpu", exp.gpu_arg)):
            try:
                resolve(base_dir)
            except InputError as e:
                if key == "model" and names_a_hub_model(exp.model, base_dir):
                    continue  # a real model kvsim has no spec for: its experiment fails alone
                raise InputError(f"experiments[{i}].{key}: {e}", source=source) from None
        if exp.router is not None and ":" in exp.router.name:  # a plugin: loaded now
            from kvsim.fleet.routers import router_plugin_class

            try:
                router_plugin_class(exp.router.name, "router.name")
            except InputError as e:
                raise InputError(f"experiments[{i}].{e}", source=source) from None
        _check_connector(exp, f"experiments[{i}].vllm.kv_transfer_config", source)
        _check_kv_cache_dtype(exp.vllm.kv_cache_dtype, f"experiments[{i}].vllm", source)
    return parsed


def _check_kv_cache_dtype(dtype: str, where: str, source: str) -> None:
    """A ``kv_cache_dtype`` vLLM does not have is a bad file; one it has in a packed layout
    kvsim does not size (``int8_per_token_head``) is read, and its experiment fails alone
    when it runs, as vLLM could have run it."""
    from kvsim.specs.models import KV_CACHE_DTYPES, packed_kv_dtype

    if dtype.strip().lower() in KV_CACHE_DTYPES or packed_kv_dtype(dtype):
        return
    raise InputError(
        f"{where}.kv_cache_dtype: unknown value {dtype!r}"
        f"{did_you_mean(dtype, KV_CACHE_DTYPES)}; known: {', '.join(KV_CACHE_DTYPES)}",
        source=source,
    )


def _raw_experiments(data: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, experiment)`` of each experiment of the file as read, before its schema
    is checked: the passes that rewrite what a writer may spell otherwise skip what is not
    a mapping, which the schema then names."""
    experiments = data.get("experiments")
    for i, exp in enumerate(experiments if isinstance(experiments, list) else []):
        if isinstance(exp, dict):
            yield i, exp


def _vllm_nulls_unset(data: dict[str, Any]) -> None:
    """Each experiment's ``vllm`` keys given as null (vLLM's own default of ``block_size``,
    ``enable_prefix_caching``, ``enable_chunked_prefill``: None, as a dump of its engine
    arguments writes them), and an empty ``vllm:``, taken as unset, in place: vLLM's
    default, as every key already is where it is absent."""
    for _, exp in _raw_experiments(data):
        if "vllm" not in exp:
            continue
        vllm = exp["vllm"]
        if vllm is None:
            del exp["vllm"]
        elif isinstance(vllm, dict):
            exp["vllm"] = {k: v for k, v in vllm.items() if v is not None}


def _parse_kv_config_text(data: dict[str, Any], source: str) -> None:
    """Each ``vllm.kv_transfer_config`` written as the text ``vllm serve
    --kv-transfer-config`` takes (a JSON object in a string, as copied from a command
    line) replaced, in place, by that object; text that is not one is one line naming it."""
    for i, exp in _raw_experiments(data):
        vllm = exp.get("vllm")
        if not isinstance(vllm, dict) or not isinstance(vllm.get("kv_transfer_config"), str):
            continue
        key = f"experiments[{i}].vllm.kv_transfer_config"
        vllm["kv_transfer_config"] = _kv_config_object(vllm["kv_transfer_config"], key, source)


def _stage_texts(data: dict[str, Any], source: str) -> None:
    """Each ``measured[j].stage`` written as the text of its index (``stage: "0"``, as a
    file that quotes ``"all"`` quotes its neighbours) replaced, in place, by the index; other
    text but ``all`` is one line naming it and what a stage is."""
    for i, exp in _raw_experiments(data):
        measured = exp.get("measured")
        for j, m in enumerate(measured if isinstance(measured, list) else []):
            stage = m.get("stage") if isinstance(m, dict) else None
            if not isinstance(stage, str) or stage == "all":
                continue
            if stage.isascii() and stage.isdigit():
                m["stage"] = int(stage)
                continue
            raise InputError(
                f"experiments[{i}].measured[{j}].stage: a load stage's index from 0, or all "
                f"(the whole run), got {short_repr(stage)}",
                source=source,
            )


def _check_connector(exp: Experiment, where: str, source: str) -> None:
    """What the file's OffloadingConnector config must say for vLLM to start: a config
    of its schema, the CPU tier's size, an eviction policy it can load, an offloaded block
    of whole GPU blocks."""
    from msgspec import UNSET

    from kvsim.policies.registry import eviction_policy_class

    name = (exp.vllm.transfer_config(source, where) or {}).get("kv_connector")
    if name is not None and not isinstance(name, str):
        raise InputError(f"{where}.kv_connector: a connector's name, got {name!r}", source=source)
    if exp.vllm.other_connector() is not None:
        return  # its experiment fails alone when it runs
    kv = exp.vllm.connector(source, where)
    if kv is None:
        return
    extra = kv.kv_connector_extra_config
    key = f"{where}.kv_connector_extra_config"
    if extra.cpu_bytes_to_use is UNSET and extra.num_cpu_blocks is UNSET:
        raise InputError(
            f"{key}: give the CPU tier's size, cpu_bytes_to_use or num_cpu_blocks", source=source
        )
    if extra.block_size is not UNSET and extra.block_size % exp.vllm.block_size:
        raise InputError(
            f"{key}.block_size: {extra.block_size} is not a multiple of vllm.block_size "
            f"{exp.vllm.block_size} (an offloaded block is whole GPU blocks)",
            source=source,
        )
    if extra.eviction_policy is not UNSET:
        module = None if extra.cache_policy_module_path is UNSET else extra.cache_policy_module_path
        try:
            eviction_policy_class(extra.eviction_policy, module, option=f"{key}.eviction_policy")
        except InputError as e:
            raise InputError(str(e), source=source) from None
