"""kvsim/core/numeric.py: the one rule for "a whole number, not a bool" (and the places
that use it keep to it), and the one hint for a number written as text."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from support import SAMPLE

import kvsim
from kvsim.core.errors import InputError
from kvsim.core.numeric import is_whole, text_number_hint
from kvsim.traces import open_trace
from kvsim.traces.synthetic import generate
from kvsim.workloads import build_workload


@pytest.mark.parametrize("value", [0, 3, -4, 10**30, np.int64(7), np.int8(-1), np.uint32(2)])
def test_integers_are_whole(value: object) -> None:
    assert is_whole(value)


@pytest.mark.parametrize(
    "value",
    [True, False, np.bool_(True), 3.0, 2.5, np.float64(4.0), Fraction(4, 1), "3", None, [3]],
)
def test_bools_floats_and_text_are_not(value: object) -> None:
    assert not is_whole(value)


SP = {
    "type": "shared_prefix",
    "num_groups": 1,
    "num_prompts_per_group": 1,
    "system_prompt_len": 16,
    "question_len": 16,
    "output_len": 4,
}
LOAD = {"type": "constant", "stages": [{"rate": 1, "duration": 2}]}

#: each place that asks for a whole number: a call with the value, and its error's start
PLACES: dict[str, tuple[Callable[[Any], object], str]] = {
    "mrc points": (lambda v: kvsim.mrc(SAMPLE, points=v), "--points must be a whole number"),
    "open_trace limit": (lambda v: open_trace(SAMPLE, limit=v), "limit must be"),
    "open_trace block_tokens": (
        lambda v: open_trace(SAMPLE, block_tokens=v),
        "block_tokens must be",
    ),
    "generate n_requests": (lambda v: generate("chat", v), "n_requests must be"),
    "generate seed": (lambda v: generate("chat", 2, v), "seed must be"),
    "build_workload seed": (lambda v: build_workload(SP, LOAD, seed=v), "seed must be"),
}


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("value", [True, 4.0])
def test_each_place_refuses_a_bool_and_a_float(place: str, value: object) -> None:
    call, message = PLACES[place]
    with pytest.raises(InputError, match=message) as info:
        call(value)
    assert str(info.value).endswith(f"got {value!r}")


@pytest.mark.parametrize("place", sorted(PLACES))
def test_each_place_takes_a_numpy_integer(place: str) -> None:
    call, _ = PLACES[place]
    call(np.int64(4))  # no error


@pytest.mark.parametrize(
    ("value", "plain"),
    [("1e3", "1000"), (" 64 ", "64"), ("2.5", "2.5"), ("-0.5", "-0.5"), ("1e20", "1e+20")],
)
def test_a_number_as_text_is_told_how_to_write_it(value: str, plain: str) -> None:
    assert text_number_hint(value) == f" (a number as text: write it unquoted, such as {plain})"


@pytest.mark.parametrize("value", ["abc", "", "nan", "inf", "-inf", 1000, 2.5, None, b"1"])
def test_other_values_get_no_hint(value: object) -> None:
    assert text_number_hint(value) == ""


def test_both_places_word_the_hint_the_same() -> None:
    hint = " (a number as text: write it unquoted, such as 1000)"
    with pytest.raises(InputError) as knob:
        generate("chat", 2, turns="1e3")
    with pytest.raises(InputError) as option:
        kvsim.sweep({"traces": [SAMPLE], "grid": {"cpu_chunks": ["1e3"]}})
    assert str(knob.value).endswith(f"got '1e3'{hint}")
    assert str(option.value).endswith(f"got '1e3'{hint}")
