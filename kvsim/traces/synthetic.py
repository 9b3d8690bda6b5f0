"""Synthetic workloads in the Mooncake shape, with seeded, documented knobs.

A prompt is a list of *segments* (a system prompt, a document, one chat turn...), each an
opaque run of tokens with its own id. Block ids are interned from ``(parent block id,
the pieces of segments the block covers)``, so an id identifies the whole prefix: two
requests share the id at index ``i`` exactly when their prompts agree up to the end of
block ``i`` (Mooncake's prefix-chained ``hash_ids``, the trailing partial block included).

Kinds (``generate(kind, ...)``; every knob has a default, see :data:`KNOBS`):

- ``chat``: multi-turn sessions; turn k re-reads the system prompt and the whole history.
- ``system-prompt``: single-turn requests behind one of a few shared system prompts.
- ``rag``: documents drawn by Zipf popularity, placed before a unique question.
- ``agent``: loops whose context grows by tool output and model actions each step.
- ``mix``: each arrival picks one of the kinds above by weight.

Arrivals: ``poisson`` (``rate`` req/s), ``bursty`` (on/off: Poisson at ``rate`` during ON
periods of mean ``on_s``, silence for OFF periods of mean ``off_s``), or ``replay`` (the
timestamps of ``arrival_trace``, relative to its first request). Timestamps are whole ms.
A knob only another arrival process reads (``rate`` with ``replay``, ``on_s`` without
``bursty``, ``arrival_trace`` without ``replay``) is refused, not ignored.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from kvsim.core.errors import InputError, did_you_mean
from kvsim.core.io import atomic_text
from kvsim.core.numeric import is_whole, text_number_hint
from kvsim.core.units import MOST_TOKENS
from kvsim.report.progress import Progress, ProgressArg, counted

from .model import Request

KINDS = ("chat", "system-prompt", "rag", "agent", "mix")
ARRIVALS = ("poisson", "bursty", "replay")

#: knob -> (default, meaning), per kind; "common" applies to every kind.
KNOBS: dict[str, dict[str, tuple[Any, str]]] = {
    "common": {
        "block_tokens": (512, "tokens per hash block (Mooncake: 512)"),
        "arrival": ("poisson", "arrival process: poisson, bursty or replay"),
        "rate": (1.0, "requests per second (during ON periods when bursty)"),
        "on_s": (10.0, "bursty: mean ON period, seconds (exponential)"),
        "off_s": (30.0, "bursty: mean OFF period, seconds (exponential)"),
        "arrival_trace": (None, "replay: trace file whose timestamps are reused"),
        "output_tokens": (300, "mean output tokens per request"),
        "length_cv": (0.5, "coefficient of variation of every drawn length (lognormal)"),
    },
    "chat": {
        "system_tokens": (1000, "shared system prompt length"),
        "user_tokens": (200, "mean user message length"),
        "turns": (5.0, "mean turns per session (geometric, >= 1)"),
        "active_sessions": (16, "sessions open at once; each arrival continues one at random"),
        "max_context_tokens": (32000, "a session ends after the turn its context reaches this"),
    },
    "system-prompt": {
        "n_prompts": (8, "distinct system prompts"),
        "system_tokens": (2000, "system prompt length"),
        "zipf_s": (1.0, "Zipf exponent of system prompt popularity (0 = uniform)"),
        "user_tokens": (300, "mean unique user part length"),
    },
    "rag": {
        "system_tokens": (500, "shared instruction prefix length"),
        "n_docs": (1000, "documents in the corpus"),
        "doc_tokens": (1500, "mean document length (fixed per document)"),
        "docs_per_request": (3, "documents retrieved per request (distinct)"),
        "zipf_s": (1.1, "Zipf exponent of document popularity"),
        "user_tokens": (100, "mean question length"),
    },
    "agent": {
        "system_tokens": (3000, "tool-definition / instruction prefix shared by all agents"),
        "task_tokens": (500, "mean task description length"),
        "tool_tokens": (800, "mean tool output appended per step"),
        "steps": (10.0, "mean steps per agent loop (geometric, >= 1)"),
        "active_sessions": (4, "agent loops running at once"),
        "max_context_tokens": (64000, "a loop ends after the step its context reaches this"),
    },
    "mix": {
        "weights": (
            {"chat": 0.4, "rag": 0.3, "agent": 0.2, "system-prompt": 0.1},
            "kind -> share of requests",
        ),
        "component_knobs": (
            {},
            "kind -> knobs for that component (arrivals and block_tokens are the mix's)",
        ),
    },
}


def knob_defaults(kind: str) -> dict[str, Any]:
    """Defaults of every knob ``kind`` accepts (the common ones included)."""
    if kind not in KINDS:
        raise InputError(f"unknown workload kind {kind!r}; choose from {', '.join(KINDS)}")
    return {k: v for k, (v, _) in {**KNOBS["common"], **KNOBS[kind]}.items()}


# --------------------------------------------------------------------------- block ids


class _BlockIds:
    """Interns prefix-chained block ids from segment lists."""

    def __init__(self, block_tokens: int):
        self.block_tokens = block_tokens
        self._ids: dict[tuple[int, tuple[tuple[int, int, int], ...]], int] = {}

    def ids(self, segments: list[tuple[int, int]]) -> tuple[int, ...]:
        bt = self.block_tokens
        out: list[int] = []
        parent = -1
        pieces: list[tuple[int, int, int]] = []
        room = bt
        for sid, length in segments:
            pos = 0
            while pos < length:
                take = min(room, length - pos)
                pieces.append((sid, pos, pos + take))
                pos += take
                room -= take
                if room == 0:
                    parent = self._intern(parent, pieces)
                    out.append(parent)
                    pieces, room = [], bt
        if pieces:
            out.append(self._intern(parent, pieces))
        return tuple(out)

    def _intern(self, parent: int, pieces: list[tuple[int, int, int]]) -> int:
        key = (parent, tuple(pieces))
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._ids)
        return got


# --------------------------------------------------------------------------- sources


@dataclass
class _Ctx:
    rng: random.Random
    knobs: dict[str, Any]
    next_segment: int = 0

    def segment(self, length: int) -> tuple[int, int]:
        self.next_segment += 1
        return (self.next_segment, length)

    def length(self, mean: float) -> int:
        """A lognormal length with the given mean and the run's coefficient of variation."""
        if mean <= 0:
            return 0
        cv = float(self.knobs["length_cv"])
        if cv <= 0:
            return max(1, round(mean))
        sigma2 = math.log1p(cv * cv)
        mu = math.log(mean) - sigma2 / 2
        return max(1, round(self.rng.lognormvariate(mu, math.sqrt(sigma2))))

    def geometric(self, mean: float) -> int:
        """Number of trials >= 1 with the given mean."""
        if mean <= 1:
            return 1
        p = 1.0 / mean
        return 1 + int(math.log(1.0 - self.rng.random()) / math.log(1.0 - p))


def _zipf_cdf(n: int, s: float) -> list[float]:
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    total = sum(weights)
    acc, out = 0.0, []
    for w in weights:
        acc += w / total
        out.append(acc)
    out[-1] = 1.0
    return out


#: draws of an already chosen document a request takes before it takes the next most
#: popular ones instead
_MOST_REPEATS = 1000


def _pick(rng: random.Random, cdf: list[float]) -> int:
    import bisect

    return bisect.bisect_left(cdf, rng.random())


@dataclass
class _Session:
    sid: int
    segments: list[tuple[int, int]]
    turns_left: int
    tokens: int
    turns_done: int = 0


class _SessionSource:
    """chat and agent: an open pool of sessions whose context grows each turn."""

    def __init__(self, ctx: _Ctx, kind: str, session_base: int):
        self.ctx, self.kind = ctx, kind
        k = ctx.knobs
        self.system = ctx.segment(int(k["system_tokens"])) if k["system_tokens"] else None
        self.pool: list[_Session] = []
        self.n_sessions = session_base

    def _open(self) -> _Session:
        ctx, k = self.ctx, self.ctx.knobs
        segs = [self.system] if self.system else []
        if self.kind == "agent":
            segs.append(ctx.segment(ctx.length(k["task_tokens"])))
            turns = ctx.geometric(k["steps"])
        else:
            turns = ctx.geometric(k["turns"])
        self.n_sessions += 1
        return _Session(self.n_sessions, segs, turns, sum(n for _, n in segs))

    def next(self) -> tuple[list[tuple[int, int]], int, int]:
        ctx, k = self.ctx, self.ctx.knobs
        while len(self.pool) < int(k["active_sessions"]):
            self.pool.append(self._open())
        i = ctx.rng.randrange(len(self.pool))
        s = self.pool[i]
        grow = k["tool_tokens"] if self.kind == "agent" else k["user_tokens"]
        new: tuple[int, int] | None = ctx.segment(ctx.length(grow))
        if self.kind == "agent" and s.turns_done == 0:
            new = None  # the first step of a loop reads the task only
        s.turns_done += 1
        if new:
            s.segments.append(new)
            s.tokens += new[1]
        prompt = list(s.segments)
        out = ctx.length(k["output_tokens"])
        answer = ctx.segment(out)
        s.segments.append(answer)
        s.tokens += out
        s.turns_left -= 1
        if s.turns_left <= 0 or s.tokens >= int(k["max_context_tokens"]):
            self.pool.pop(i)
        return prompt, out, s.sid


class _SystemPromptSource:
    def __init__(self, ctx: _Ctx, kind: str, session_base: int):
        self.ctx = ctx
        k = ctx.knobs
        self.prompts = [ctx.segment(int(k["system_tokens"])) for _ in range(int(k["n_prompts"]))]
        self.cdf = _zipf_cdf(len(self.prompts), float(k["zipf_s"]))

    def next(self) -> tuple[list[tuple[int, int]], int, int | None]:
        ctx, k = self.ctx, self.ctx.knobs
        p = self.prompts[_pick(ctx.rng, self.cdf)]
        return [p, ctx.segment(ctx.length(k["user_tokens"]))], ctx.length(k["output_tokens"]), None


class _RagSource:
    def __init__(self, ctx: _Ctx, kind: str, session_base: int):
        self.ctx = ctx
        k = ctx.knobs
        self.system = ctx.segment(int(k["system_tokens"])) if k["system_tokens"] else None
        self.docs = [ctx.segment(ctx.length(k["doc_tokens"])) for _ in range(int(k["n_docs"]))]
        self.cdf = _zipf_cdf(len(self.docs), float(k["zipf_s"]))

    def next(self) -> tuple[list[tuple[int, int]], int, int | None]:
        ctx, k = self.ctx, self.ctx.knobs
        want = min(int(k["docs_per_request"]), len(self.docs))
        chosen: list[int] = []
        repeats = 0
        while len(chosen) < want:
            d = _pick(ctx.rng, self.cdf)
            if d not in chosen:
                chosen.append(d)
            elif (repeats := repeats + 1) > _MOST_REPEATS:
                # a Zipf exponent so steep that the first documents hold all the mass (the
                # others' share rounds to 0): the next most popular ones, where the draws
                # never ended
                rest = [i for i in range(len(self.docs)) if i not in chosen]
                chosen += rest[: want - len(chosen)]
        segs = ([self.system] if self.system else []) + [self.docs[d] for d in chosen]
        segs.append(ctx.segment(ctx.length(k["user_tokens"])))
        return segs, ctx.length(k["output_tokens"]), None


class _Source(Protocol):
    """What a kind's request source does: the next prompt's segments, output length, session."""

    def next(self) -> tuple[list[tuple[int, int]], int, int | None]: ...


_SOURCES: dict[str, Callable[[_Ctx, str, int], _Source]] = {
    "chat": _SessionSource,
    "agent": _SessionSource,
    "system-prompt": _SystemPromptSource,
    "rag": _RagSource,
}


# --------------------------------------------------------------------------- arrivals


def arrivals_ms(n: int, rng: random.Random, knobs: dict[str, Any]) -> list[int]:
    """``n`` non-decreasing arrival times in whole milliseconds, the first at 0 (or as replayed)."""
    kind = knobs["arrival"]
    rate = float(knobs["rate"])
    if kind in ("poisson", "bursty") and not rate > 0:
        raise InputError(f"rate must be positive, got {rate}")
    out: list[int] = []
    if kind == "poisson":
        t = 0.0
        for _ in range(n):
            out.append(round(t * 1000))
            t += rng.expovariate(rate)
    elif kind == "bursty":
        on_s, off_s = float(knobs["on_s"]), float(knobs["off_s"])
        if on_s <= 0 or off_s < 0:
            raise InputError("bursty arrivals need on_s > 0 and off_s >= 0")
        t, on_end = 0.0, rng.expovariate(1.0 / on_s)
        while len(out) < n:
            if t < on_end:
                out.append(round(t * 1000))
                t += rng.expovariate(rate)
            else:  # an OFF period, then a new ON period (the overshoot is memoryless)
                start = on_end + (rng.expovariate(1.0 / off_s) if off_s else 0.0)
                t = start + (t - on_end)
                on_end = start + rng.expovariate(1.0 / on_s)
    elif kind == "replay":
        src = knobs.get("arrival_trace")
        if not src:
            raise InputError("replay arrivals need arrival_trace=PATH")
        from .readers import open_trace

        # its first n arrival times, in time order: an arrival process never goes back
        times = sorted(r.arrival_s for r in open_trace(src, limit=n))
        if len(times) < n:
            raise InputError(f"arrival_trace {src} has {len(times)} requests, fewer than {n}")
        t0 = times[0]
        out = [round((t - t0) * 1000) for t in times]
    else:
        raise InputError(f"unknown arrival process {kind!r}; choose from {', '.join(ARRIVALS)}")
    return out


# --------------------------------------------------------------------------- API


#: numeric knobs that must be at least 1 (the others must be >= 0)
_AT_LEAST_ONE = frozenset({"block_tokens", "turns", "steps", "n_prompts", "n_docs"})
#: the longest length knob (one home: kvsim.core.units)
_MOST_TOKENS = MOST_TOKENS
_POSITIVE = frozenset({"rate", "on_s", "off_s", "active_sessions", "docs_per_request"})
#: the most a knob takes, short of an overflow (a geometric mean of 1e300 turns, a Zipf
#: exponent or a length spread whose powers are no float) or a hang (1e12 documents, each
#: a weight; 1e300 sessions opened at once)
_AT_MOST: dict[str, float] = {
    "turns": 1e6,
    "steps": 1e6,
    "length_cv": 100.0,
    "zipf_s": 100.0,
    "active_sessions": 10_000_000,
    "n_docs": 10_000_000,
    "n_prompts": 10_000_000,
    "docs_per_request": 10_000_000,
}


def _knob_words(name: str, value: Any = None) -> str:
    """How the API's errors write a knob (``knob rate``) or a value (``arrival='replay'``)."""
    return f"knob {name}" if value is None else f"{name}={value!r}"


def _check_knob(
    name: str, value: Any, default: Any, words: Callable[..., str] = _knob_words
) -> None:
    """A knob's value has its default's type, and numbers are finite and in range, so a
    typo fails here in one line instead of deep inside the generator."""
    said = words(name)
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = text_number_hint(value)
            raise InputError(f"{said} must be a number, got {value!r}{hint}")
        if not math.isfinite(value):
            raise InputError(f"{said} must be finite, got {value!r}")
        if isinstance(default, int) and not float(value).is_integer():
            raise InputError(f"{said} must be a whole number, got {value!r}")
        low = 1 if name in _AT_LEAST_ONE else 0
        if value < low or (name in _POSITIVE and value <= 0):
            bound = "> 0" if name in _POSITIVE else f">= {low}"
            raise InputError(f"{said} must be {bound}, got {value!r}")
        if name.endswith("_tokens") and value > _MOST_TOKENS:  # a request's block ids are
            raise InputError(  # built one by one: 10^23 tokens never ended
                f"{said} must be at most {_MOST_TOKENS:,} tokens, got {value!r}"
            )
        most = _AT_MOST.get(name.rpartition(".")[2])
        if most is not None and value > most:
            raise InputError(f"{said} must be at most {most:,.0f}, got {value:g}")
    elif isinstance(default, dict) and not isinstance(value, dict):
        raise InputError(f"{said} must be a mapping like {default!r}, got {value!r}")
    elif name == "weights":
        for kind, share in value.items():
            _check_knob(f"weights.{kind}", share, 1.0, words)
    elif isinstance(default, str) and not isinstance(value, str):
        raise InputError(f"{said} must be text, got {value!r}")


def check_arrival_knobs(knobs: Mapping[str, Any], words: Callable[..., str] = _knob_words) -> None:
    """The knobs given (not their defaults) name one arrival process: ``arrival_trace`` is
    read by ``replay`` only, ``on_s`` / ``off_s`` by ``bursty`` only, and ``replay`` keeps
    the trace's times, so no ``rate`` applies. Without this each would be ignored without a
    word. ``words(name, value=None)`` writes a knob as the caller's user spells it (the
    CLI: its flags)."""
    arrival = knobs.get("arrival", KNOBS["common"]["arrival"][0])
    for name in ("on_s", "off_s"):
        if name in knobs and arrival != "bursty":
            raise InputError(f"{words(name)} is read by {words('arrival', 'bursty')} only")
    replayed = arrival == "replay"
    if knobs.get("arrival_trace") is not None and not replayed:
        raise InputError(f"{words('arrival_trace')} is read by {words('arrival', 'replay')} only")
    if replayed and knobs.get("rate") is not None:
        raise InputError(
            f"{words('rate')} does not apply to {words('arrival', 'replay')}: "
            "the trace's times are kept"
        )


def check_knobs(
    kind: str, knobs: dict[str, Any], words: Callable[..., str] = _knob_words
) -> dict[str, Any]:
    """``kind``'s knobs checked (names, types and ranges, one arrival process) and merged
    with their defaults. ``words`` as for :func:`check_arrival_knobs`: the CLI checks first
    with its own, so an error names the option its user typed (``--rate``)."""
    allowed = knob_defaults(kind)
    unknown = sorted(set(knobs) - set(allowed))
    if unknown:
        raise InputError(
            f"unknown knob(s) for {kind}: {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    for name, value in knobs.items():
        _check_knob(name, value, allowed[name], words)
    check_arrival_knobs(knobs, words)
    merged = {**allowed, **knobs}
    if "docs_per_request" in merged and merged["docs_per_request"] > merged["n_docs"]:
        raise InputError(  # distinct documents: more than the corpus holds cannot be drawn
            f"{words('docs_per_request')} ({merged['docs_per_request']}) is more than n_docs "
            f"({merged['n_docs']}), and a request's documents are distinct"
        )
    return merged


#: knobs of a mix as a whole: one arrival process and one block size for all its kinds
_MIX_WHOLE = frozenset({"arrival", "rate", "on_s", "off_s", "arrival_trace", "block_tokens"})


def _component_knobs(name: str, comp_knobs: Mapping[str, Any]) -> dict[str, Any]:
    """A mix component's own knobs; one of the mix's whole knobs there would be ignored."""
    own = comp_knobs.get(name, {})
    if not isinstance(own, dict):
        raise InputError(f"knob component_knobs.{name} must be a mapping of knobs, got {own!r}")
    whole = sorted(_MIX_WHOLE & set(own))
    if whole:
        raise InputError(
            f"knob component_knobs.{name}.{whole[0]}: one for the whole mix (its arrivals "
            f"and block ids are shared): set {whole[0]} at the top level"
        )
    return own


def _component_words(name: str) -> Callable[..., str]:
    """How a mix component's knob errors write a knob: by its path in the mix's knobs
    (``knob component_knobs.chat.turns``), where the user set it."""

    def words(knob: str, value: Any = None) -> str:
        return _knob_words(f"component_knobs.{name}.{knob}", value)

    return words


def generate(
    kind: str,
    n_requests: int = 1000,
    seed: int = 0,
    *,
    progress: ProgressArg = None,
    **knobs: Any,
) -> list[Request]:
    """``n_requests`` synthetic requests of ``kind`` (see the module doc and :data:`KNOBS`).

    Deterministic: the same kind, seed and knobs give the same requests. ``session_id`` is
    set for chat and agent requests (it is not part of the Mooncake output). ``progress``
    (True: a bar; a callable: ``progress(n)``) counts the requests made: 200,000 agent
    steps take a quarter of a minute.
    """
    if not is_whole(n_requests) or n_requests < 0:
        raise InputError(f"n_requests must be an integer >= 0, got {n_requests!r}")
    if not is_whole(seed):
        raise InputError(f"seed must be an integer, got {seed!r}")
    seed = int(seed)  # a numpy integer seeds as the int it holds
    k = check_knobs(kind, knobs)
    rng = random.Random(seed)
    ctx = _Ctx(rng, k)
    times = arrivals_ms(n_requests, random.Random(f"{seed}/arrivals"), k)
    ids = _BlockIds(int(k["block_tokens"]))
    if kind == "mix":
        weights = dict(k["weights"])
        comp_knobs = dict(k["component_knobs"] or {})
        unknown = [n for n in weights if n not in _SOURCES]
        if unknown:
            raise InputError(
                f"mix weights name {unknown[0]!r}, not a kind among {', '.join(_SOURCES)}"
            )
        stray = [n for n in comp_knobs if n not in weights]
        if stray:  # a misspelt kind (chatt), or one the mix does not weigh: never read
            raise InputError(
                f"knob component_knobs.{stray[0]}: not a kind of this mix's weights "
                f"({', '.join(weights)}){did_you_mean(str(stray[0]), weights)}"
            )
        names = [n for n in weights if weights[n] > 0]
        if not names:
            raise InputError("mix weights are all 0: give at least one kind a weight > 0")
        sources: list[_Source] = []
        shared = {c: k[c] for c in KNOBS["common"] if c not in _MIX_WHOLE}
        for i, name in enumerate(names):
            sub = check_knobs(
                name, {**shared, **_component_knobs(name, comp_knobs)}, _component_words(name)
            )
            sub_ctx = _Ctx(rng, sub)
            sub_ctx.next_segment = (i + 1) << 40  # segments never collide across components
            sources.append(_SOURCES[name](sub_ctx, name, (i + 1) << 32))
        total = sum(weights[n] for n in names)
        acc, cdf = 0.0, []
        for n in names:
            acc += weights[n] / total
            cdf.append(acc)
        cdf[-1] = 1.0
        pick: Callable[[], _Source] = lambda: sources[_pick(rng, cdf)]  # noqa: E731
    else:
        source = _SOURCES[kind](ctx, kind, 0)
        pick = lambda: source  # noqa: E731
    out: list[Request] = []
    with Progress(progress, n_requests, f"generating {kind}") as bar:
        for i, ms in enumerate(counted(times, bar.callback)):
            segments, n_out, session = pick().next()
            prompt = sum(n for _, n in segments)
            out.append(Request(i, ms / 1000.0, prompt, n_out, ids.ids(segments), session))
    return out


def to_mooncake_records(requests: Iterable[Request]) -> Iterable[dict[str, Any]]:
    for r in requests:
        yield {
            "timestamp": round(r.arrival_s * 1000),
            "input_length": r.prompt_tokens,
            "output_length": r.output_tokens,
            "hash_ids": list(r.block_hashes),
        }


def write_mooncake(path: str | os.PathLike[str], requests: Iterable[Request]) -> int:
    """Write requests as Mooncake JSONL (timestamp ms), atomically (gzip for ``.gz``);
    return the count."""
    n = 0
    with atomic_text(path) as f:
        for rec in to_mooncake_records(requests):
            f.write(json.dumps(rec, separators=(", ", ": ")) + "\n")
            n += 1
    return n


def to_frame(requests: Iterable[Request]) -> pd.DataFrame:
    """One row per request (for notebooks): arrival, lengths, block count, session."""
    return pd.DataFrame.from_records(
        [
            (
                r.request_id,
                r.arrival_s,
                r.prompt_tokens,
                r.output_tokens,
                len(r.block_hashes),
                r.session_id,
            )
            for r in requests
        ],
        columns=["request", "arrival_s", "prompt_tokens", "output_tokens", "blocks", "session"],
    )


def generate_from(kind: str, n_requests: int, seed: int, knobs: Mapping[str, Any]) -> list[Request]:
    """:func:`generate` with its knobs as a mapping (a sweep spec's trace): every key is a
    knob, so one named as a keyword of :func:`generate` (``progress``) is refused as an
    unknown knob rather than taken as that keyword."""
    if "progress" in knobs:
        check_knobs(kind, dict(knobs))  # raises: not a knob of any kind
    return generate(kind, n_requests, seed, **knobs)


@dataclass(frozen=True)
class WorkloadSpec:
    """A generator call as a value (used by sweep specs: ``{kind: chat, n_requests: 500}``)."""

    kind: str
    n_requests: int = 1000
    seed: int = 0
    knobs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> WorkloadSpec:
        d = dict(d)
        if "kind" not in d:
            raise InputError("a generated trace needs 'kind'")
        return cls(d.pop("kind"), int(d.pop("n_requests", 1000)), int(d.pop("seed", 0)), d)

    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.knobs.items()))
        return (
            f"gen:{self.kind}(n={self.n_requests},seed={self.seed}{',' + extra if extra else ''})"
        )

    def requests(self) -> list[Request]:
        return generate_from(self.kind, self.n_requests, self.seed, self.knobs)
