"""The sweep's axis of secondary-tier sets (``grid: {tiers: [...]}``, ``--tier-set``): what a
value means (vLLM ``secondary_tiers`` objects), its one-line label, and the hit shares a
tier-set row adds so that every row of the sweep has the same columns.

A value is one tier *set*: the text ``none``, tiers joined by ``+`` in ``kvsim replay
--tier``'s shorthand (``fs:capacity=1TiB+obj``), or a list of vLLM tier objects."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from kvsim.core.errors import InputError
from kvsim.options.schema import short_repr
from kvsim.options.tiers import as_tier_specs, tier_from_shorthand, tier_to_shorthand

#: the sweep's axis of secondary-tier sets: a cell's ``secondary_tiers``, with a row label
TIERS = "tiers"
#: joins the tiers of one set in its text form (``fs:capacity=1TiB+obj``)
TIER_JOIN = "+"
#: the tier set without secondary tiers
NO_TIERS = "none"
#: a ``+`` that starts the next tier (a name, then ``:``, ``+`` or the end); one inside a
#: value (``capacity=1.5e+12``) does not
_NEXT_TIER = re.compile(r"\+(?=\s*[A-Za-z_][\w-]*\s*(?::|\+|$))")
#: a secondary tier's hit share in a replay summary (``tier1_fs_hit_ratio``) and in a timed
#: run's (``tier1_fs_hit_share``, of the prompt tokens)
_TIER_HIT = re.compile(r"tier\d+_\w+_hit_ratio")
_TIER_SHARE = re.compile(r"tier\d+_\w+_hit_share")


def tier_set(value: Any, where: str = TIERS) -> list[dict[str, Any]]:
    """One tier set as vLLM ``secondary_tiers`` objects, each checked (an error names
    ``where``): ``none`` or an empty list is no tiers; text is tiers joined by ``+``, each in
    ``kvsim replay --tier``'s shorthand; a list holds shorthand texts or vLLM tier objects
    (one object alone is a set of one)."""
    if isinstance(value, Mapping):
        value = [value]
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == NO_TIERS:
            return []
        if not text:
            raise InputError(f"{where}: empty tier set; write {NO_TIERS!r} for no secondary tiers")
        items: list[Any] = _NEXT_TIER.split(text)
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise InputError(
            f"{where}: a tier set is text such as 'fs:capacity=2TiB+obj' or {NO_TIERS!r}, "
            f"or a list of tier objects; got {short_repr(value)}"
        )
    tiers = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            try:
                as_tier_specs([dict(item)], where)
            except InputError as e:  # named by its place in the set, not in a list of one
                raise InputError(str(e).replace(f"{where}[0]", f"{where}[{i}]", 1)) from None
            tiers.append(dict(item))
        elif isinstance(item, str) and item.strip().lower() == NO_TIERS:
            raise InputError(f"{where}: {NO_TIERS!r} is a tier set of its own, not a tier")
        elif isinstance(item, str) and item.strip():
            tiers.append(tier_from_shorthand(item.strip(), f"{where}: {item.strip()!r}"))
        else:
            raise InputError(
                f"{where}: each tier is TYPE[:KEY=VALUE,...] (tiers joined by "
                f"{TIER_JOIN!r}) or a tier object; got {short_repr(item)}"
            )
    return tiers


def tier_set_label(value: Any) -> str:
    """A tier set as one line of text: ``none``, or its tiers in the shorthand joined by
    ``+`` (a value the shorthand has no form for, such as a ``backpressure`` object, as
    JSON)."""
    return TIER_JOIN.join(tier_to_shorthand(t) for t in tier_set(value)) or NO_TIERS


def canonical_tier_set(value: Any) -> str | list[dict[str, Any]]:
    """A tier set as its cells hold it: its label when that reads back as the same tiers
    (``fs: capacity=1TiB`` and ``[{type: fs, kvsim_capacity: 1TiB}]`` are one cell), else
    its tier objects."""
    tiers = tier_set(value)
    label = tier_set_label(tiers)
    try:
        same = tier_set(label) == tiers
    except InputError:
        same = False
    return label if same else tiers


def secondary_tiers(value: Any, has_vllm_config: bool) -> dict[str, Any]:
    """The API keyword a cell's tier set becomes. ``none`` passes nothing, so its row is the
    plain run's, unless a ``vllm_config`` is there, whose tiers it then clears."""
    tiers = tier_set(value)
    return {"secondary_tiers": tiers} if tiers or has_vllm_config else {}


def tier_shares(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a tier-set row adds to its run's summary, so every row of the sweep has the same
    shares: ``cpu_tier_hit_ratio`` (in a run without secondary tiers, all its CPU hits) and
    ``secondary_tier_hit_ratio``, the share of prompt blocks promoted from any secondary
    tier (the sum of the ``tierN_TYPE_hit_ratio`` columns; 0 without tiers); for a timed
    run, ``combined_hit_share`` (GPU and CPU hit tokens over prompt tokens, the timed
    counterpart of ``combined_hit_ratio``) and ``secondary_tier_hit_share``, the sum of its
    ``tierN_TYPE_hit_share`` (0 without tiers)."""
    out: dict[str, Any] = {}
    if "cpu_tier_hit_ratio" not in summary and "cpu_hit_ratio" in summary:
        out["cpu_tier_hit_ratio"] = summary["cpu_hit_ratio"]
        if "cpu_hit_blocks" in summary:
            out["cpu_tier_hit_blocks"] = summary["cpu_hit_blocks"]
    if "cpu_tier_hit_ratio" in summary or out:
        out["secondary_tier_hit_ratio"] = float(
            sum(v for k, v in summary.items() if _TIER_HIT.fullmatch(k) and _number(v))
        )
    prompt = summary.get("total_input_tokens")
    if _number(prompt) and "cpu_hit_tokens" in summary:  # a timed run
        hits = summary.get("gpu_hit_tokens", 0) + summary.get("cpu_hit_tokens", 0)
        out["combined_hit_share"] = hits / prompt if prompt else 0.0
        out["secondary_tier_hit_share"] = float(
            sum(v for k, v in summary.items() if _TIER_SHARE.fullmatch(k) and _number(v))
        )
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
