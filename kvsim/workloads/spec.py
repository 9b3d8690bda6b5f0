"""What a benchmark client was asked to send: the workload (``shared_prefix`` as
inference-perf's generator, ``random`` as ``vllm bench serve --dataset-name random``) and
the load (``constant``, ``poisson`` or ``concurrency``, in stages).

These are the ``workload:`` and ``load:`` blocks of a measurements file and of
``kvsim simulate``'s ``--workload`` / ``--load`` files, under the tools' own names; one
:class:`~kvsim.options.schema.Schema` each, so a bad key or value is one line naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from kvsim.core.errors import InputError, did_you_mean
from kvsim.core.units import MOST_TOKENS
from kvsim.options.schema import Schema, load

__all__ = [
    "TIMINGS",
    "WORKLOAD_TYPES",
    "Load",
    "LoadStage",
    "RandomWorkload",
    "SharedPrefixWorkload",
    "WorkloadSpec",
    "load_load",
    "load_workload",
    "read_load",
    "read_workload_and_load",
]

Tokens = Annotated[int, Meta(ge=0, le=MOST_TOKENS)]
Positive = Annotated[int, Meta(gt=0)]
Length = Annotated[int, Meta(gt=0, le=MOST_TOKENS)]


class SharedPrefixWorkload(Schema, frozen=True, kw_only=True):
    """inference-perf's ``shared_prefix`` data: ``num_groups`` system prompts, each followed
    by ``num_prompts_per_group`` questions; the G x P prompts are built once, shuffled once
    (seeded) and request i sends prompt ``i mod G*P``, so repeats are exact."""

    type: Literal["shared_prefix"] = "shared_prefix"
    num_groups: Annotated[Positive, Meta(description="Groups (distinct system prompts).")]
    num_prompts_per_group: Annotated[
        Positive, Meta(description="Prompts (distinct questions) per group.")
    ]
    system_prompt_len: Annotated[Tokens, Meta(description="System prompt tokens (per group).")]
    question_len: Annotated[Tokens, Meta(description="Question tokens (per prompt).")]
    output_len: Annotated[Length, Meta(description="Output tokens per request.")]
    ignore_eos: Annotated[
        bool,
        Meta(description="Generate exactly output_len tokens (the only mode kvsim models)."),
    ] = True

    def __post_init__(self) -> None:
        if not self.ignore_eos:
            raise ValueError(
                "ignore_eos: false is not modelled (the output length would depend on the "
                "model's text); use ignore_eos: true, as the benchmark runs do"
            )
        if self.system_prompt_len + self.question_len < 1:
            raise ValueError("system_prompt_len + question_len must be at least 1")

    @property
    def num_prompts(self) -> int:
        """G x P, the distinct prompts."""
        return self.num_groups * self.num_prompts_per_group


class RandomWorkload(Schema, frozen=True, kw_only=True):
    """``vllm bench serve --dataset-name random``: each request draws its input and output
    length uniformly from ``[floor(len*(1-r)), ceil(len*(1+r))]`` (the input after the
    tokenizer's ``special_tokens``), behind one shared ``prefix_len``-token random prefix;
    the rest of each prompt is its own. Lengths are drawn as vLLM 0.33 draws them
    (``numpy.random.default_rng(seed)``), so a seed gives the tool's lengths."""

    type: Literal["random"] = "random"
    input_len: Annotated[
        Length, Meta(description="--random-input-len: mean input tokens, after the prefix.")
    ] = 1024
    output_len: Annotated[Length, Meta(description="--random-output-len: mean output tokens.")] = (
        128
    )
    range_ratio: Annotated[
        float, Meta(ge=0, lt=1, description="--random-range-ratio: lengths within +-ratio.")
    ] = 0.0
    prefix_len: Annotated[
        Tokens, Meta(description="--random-prefix-len: tokens of the prefix all requests share.")
    ] = 0
    num_prompts: (
        Annotated[
            Positive,
            Meta(
                description="--num-prompts: requests sampled in one draw (default 1000, "
                "drawn again as the load needs more)."
            ),
        ]
        | None
    ) = None
    special_tokens: Annotated[
        Tokens,
        Meta(description="Tokens the tokenizer adds to a prompt (Llama's BOS: 1; default 0)."),
    ] = 0
    ignore_eos: Annotated[
        bool,
        Meta(
            description="--ignore-eos: generate exactly each drawn output length (the only "
            "mode kvsim models)."
        ),
    ] = True

    def __post_init__(self) -> None:
        if not self.ignore_eos:
            raise ValueError(
                "ignore_eos: false is not modelled (the output length would depend on the "
                "model's text); use ignore_eos: true, as vllm bench serve --ignore-eos runs"
            )


WorkloadSpec = SharedPrefixWorkload | RandomWorkload
WORKLOAD_TYPES: dict[str, type[SharedPrefixWorkload] | type[RandomWorkload]] = {
    "shared_prefix": SharedPrefixWorkload,
    "random": RandomWorkload,
}

#: how the client times its sends (see :class:`Load`)
TIMINGS = ("ideal", "inference-perf")


class LoadStage(Schema, frozen=True, kw_only=True):
    """One stage: ``{rate, duration}`` for ``constant`` / ``poisson`` loads,
    ``{concurrency, duration | num_requests}`` for ``concurrency``."""

    rate: Annotated[float, Meta(gt=0, description="Requests per second.")] | None = None
    duration: Annotated[float, Meta(gt=0, description="Stage length, seconds.")] | None = None
    concurrency: Annotated[Positive, Meta(description="Clients (requests in flight).")] | None = (
        None
    )
    num_requests: Annotated[Positive, Meta(description="Requests the stage sends.")] | None = None

    def __post_init__(self) -> None:
        if self.concurrency is None:
            if self.rate is None or self.duration is None:
                raise ValueError("a rate stage needs rate and duration")
            if self.num_requests is not None:
                raise ValueError("num_requests belongs to a concurrency stage, not a rate stage")
        else:
            if self.rate is not None:
                raise ValueError("give rate or concurrency in a stage, not both")
            if (self.duration is None) == (self.num_requests is None):
                raise ValueError("a concurrency stage needs duration or num_requests (one)")


class Load(Schema, frozen=True, kw_only=True):
    """How requests are sent: ``constant`` (at ``rate``, evenly spaced), ``poisson`` (seeded
    exponential gaps) or ``concurrency`` (a closed loop: N clients, each sending its next
    request when its previous one finishes), in stages run one after the other.

    ``timing`` picks the client whose timing is reproduced:

    - ``ideal`` (default): the textbook processes; stages back to back (a rate stage starts
      when the previous one's duration ends, a concurrency stage when the previous one has
      sent its last request or its duration ends); request i of the run sends prompt i.
    - ``inference-perf``: its ``ConstantLoadTimer`` (``int(rate*duration)`` exponential
      gaps scaled to sum to the duration, the last request at the stage's end; this is also
      ``vllm bench serve --request-rate R``'s timing), its ``PoissonLoadTimer`` (a Poisson
      count per whole second, spread so), a concurrency stage's ``num_requests`` queued
      over its first second; each stage starts once every request of the previous one has
      finished (seen by its once-a-second check), plus ``stage_gap_s``; the prompt index
      restarts at 0 in each stage (a new ``get_data()``).
    """

    type: Annotated[Literal["constant", "poisson", "concurrency"], Meta(description="Load type.")]
    stages: Annotated[list[LoadStage], Meta(min_length=1, description="Stages, in order.")]
    timing: Annotated[
        Literal["ideal", "inference-perf"],
        Meta(description="Whose client timing: ideal (default) or inference-perf."),
    ] = "ideal"
    stage_gap_s: Annotated[
        float,
        Meta(
            ge=0,
            description="inference-perf: idle seconds between a stage's drain and the next "
            "stage's first slot (its interval, 1 s, plus the 1 s it gives the queue).",
        ),
    ] = 2.0

    def __post_init__(self) -> None:
        closed = self.type == "concurrency"
        for i, stage in enumerate(self.stages):
            if (stage.concurrency is not None) != closed:
                want = "{concurrency, duration | num_requests}" if closed else "{rate, duration}"
                raise ValueError(f"stages[{i}]: a {self.type} load's stages are {want}")
            if closed and self.timing == "inference-perf" and stage.num_requests is None:
                raise ValueError(
                    f"stages[{i}]: inference-perf's concurrent load counts num_requests, "
                    "not a duration"
                )

    @property
    def closed(self) -> bool:
        """Whether arrivals come out of the run (a closed loop, or stages that wait for the
        previous one to drain) rather than from a fixed schedule."""
        return self.type == "concurrency" or (
            self.timing == "inference-perf" and len(self.stages) > 1
        )


def load_workload(
    data: Any, *, source: str | None = None, prefix: str = "workload"
) -> WorkloadSpec:
    """A ``workload:`` block (a dict with ``type``) as its structure, or a one-line
    :class:`InputError` naming ``source`` and the key."""
    if isinstance(data, (SharedPrefixWorkload, RandomWorkload)):
        return data
    kind = data.get("type") if isinstance(data, dict) else None
    schema = WORKLOAD_TYPES.get(kind) if isinstance(kind, str) else None
    if schema is None:
        hint = did_you_mean(str(kind), WORKLOAD_TYPES) if isinstance(kind, str) else ""
        key = f"{prefix}.type" if prefix else "type"
        if isinstance(data, dict) and "type" not in data:
            raise InputError(
                f"{key}: missing (a required key: {', '.join(WORKLOAD_TYPES)})", source=source
            )
        raise InputError(
            f"{key}: expected one of {', '.join(WORKLOAD_TYPES)}, got {kind!r}{hint}",
            source=source,
        )
    return load(schema, data, source=source, prefix=prefix)


def load_load(data: Any, *, source: str | None = None, prefix: str = "load") -> Load:
    """A ``load:`` block as a :class:`Load`, or a one-line :class:`InputError`."""
    if isinstance(data, Load):
        return data
    return load(Load, data, source=source, prefix=prefix)


def read_workload_and_load(workload_text: str, load_text: str | None) -> tuple[WorkloadSpec, Load]:
    """``kvsim simulate``'s ``--workload`` and ``--load`` (a ``--workload`` file may hold
    both, as ``workload:`` and ``load:`` blocks; ``--load`` wins), checked. An error names
    the option as typed, or the file and its block, as ``--vllm-config``'s do:
    ``--workload: num_groups: ...``, ``both.yaml: load.stages: ...``."""
    data, source = _read_block(workload_text, "--workload")
    prefix = ""
    load = (*_read_block(load_text, "--load"), "") if load_text is not None else None
    if "workload" in data:  # a file with both blocks
        if load is None and "load" in data:
            load = (data["load"], source, "load")
        data, prefix = data["workload"], "workload"
    if load is None:
        raise InputError("--workload needs --load (or a file with workload: and load:)")
    load_data, load_source, load_prefix = load
    return (
        load_workload(data, source=source, prefix=prefix),
        load_load(load_data, source=load_source, prefix=load_prefix),
    )


def read_load(text: str, option: str = "--load") -> Load:
    """A ``--load`` block given on the command line, checked; an error names ``option`` (or
    the file), as :func:`read_workload_and_load`'s do."""
    data, source = _read_block(text, option)
    return load_load(data, source=source, prefix="")


def _read_block(text: str, option: str) -> tuple[Any, str]:
    """A ``workload:`` or ``load:`` block given on the command line: the path of a YAML /
    JSON file, or the YAML itself (``'{type: constant, stages: [{rate: 8, duration: 60}]}'``),
    and what an error about it names: the file, or ``option``. Bad YAML is a one-line
    :class:`InputError` naming the file (and line) or ``option``."""
    import os

    import yaml

    source = option
    if os.path.isfile(text):
        source = text
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read it ({e})", source=source) from None
    from kvsim.core.yaml_text import load_yaml  # no aliases, no repeated keys

    try:
        data = load_yaml(text, source)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None and source != option else None
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"bad YAML ({problem})", source=source, line=line) from None
    if not isinstance(data, dict):
        if isinstance(data, str) and source == option and text.endswith((".yaml", ".yml", ".json")):
            raise InputError(f"{text}: no such file", source=source)  # a path meant, not YAML
        raise InputError(
            f"expected a mapping (a file path or YAML such as '{{type: ...}}'), got {text!r}",
            source=source,
        )
    return data, source
