"""The prompts a benchmark client sends, as kvsim sees them: a length, an output length and
one id per complete block, prefix-chained (two prompts share the id at index ``b`` exactly
when their first ``(b+1)*block_tokens`` tokens are equal).

Token values never matter to the cache, only which blocks are equal; so a prompt is its
segments (a shared part, then its own part) and a block's id says which part it lies in.
A block that reaches past the shared part is the prompt's own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from kvsim.workloads.spec import RandomWorkload, SharedPrefixWorkload

__all__ = ["Prompt", "PromptSource", "RandomPrompts", "SharedPrefixPrompts", "make_prompts"]

#: requests drawn at once when a random workload gives no num_prompts
RANDOM_DRAW = 1000


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt as sent: its length, the output length asked for, its block ids."""

    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]


class PromptSource(ABC):
    """``prompt(i)``: the prompt that a client's i-th request sends (0-based, counted as
    the load says: over the run or within a stage)."""

    @abstractmethod
    def prompt(self, i: int) -> Prompt:
        """The i-th request's prompt; the same ``i`` always gives the same prompt."""


class SharedPrefixPrompts(PromptSource):
    """inference-perf's ``SharedPrefixDataGenerator``: prompt ``g*P + q`` is group g's
    system prompt followed by its own question; the G x P list is shuffled once with a
    seeded permutation; request i sends entry ``i mod G*P`` (``load_lazy_data``).

    Block ids: a complete block inside group g's system prompt is ``g*S + b`` (S the
    system prompt's complete blocks); every other complete block is the prompt's own, its
    ids counted on from ``G*S`` in the original order of the prompts.
    """

    def __init__(self, spec: SharedPrefixWorkload, seed: int, block_tokens: int) -> None:
        sys_len, q_len = spec.system_prompt_len, spec.question_len
        total = sys_len + q_len
        shared = sys_len // block_tokens  # complete blocks inside the system prompt
        full = total // block_tokens
        own = full - shared
        groups, per_group = spec.num_groups, spec.num_prompts_per_group
        built: list[Prompt] = []
        next_id = groups * shared
        for g in range(groups):
            head = tuple(range(g * shared, (g + 1) * shared))
            for _ in range(per_group):
                ids = head + tuple(range(next_id, next_id + own))
                next_id += own
                built.append(Prompt(total, spec.output_len, ids))
        order = np.random.default_rng(seed).permutation(len(built))
        self.prompts: list[Prompt] = [built[int(j)] for j in order]
        #: for each shuffled entry, its (group, question) in the unshuffled list
        self.origin: list[tuple[int, int]] = [divmod(int(j), per_group) for j in order]

    def prompt(self, i: int) -> Prompt:
        return self.prompts[i % len(self.prompts)]


class RandomPrompts(PromptSource):
    """vLLM 0.33's ``RandomDataset``: input lengths from ``rng.integers(lo, hi + 1)`` over
    ``[floor(L*(1-r)), ceil(L*(1+r))]`` with ``L = input_len - special_tokens``, then the
    output lengths likewise (at least 1), ``rng = numpy.random.default_rng(seed)``, drawn
    ``num_prompts`` at a time (else :data:`RANDOM_DRAW`); a prompt is the special tokens,
    the shared prefix and its own tokens (``(offset + i + arange) % vocab``, unique).
    """

    def __init__(self, spec: RandomWorkload, seed: int, block_tokens: int) -> None:
        self.spec = spec
        self.block_tokens = block_tokens
        self.rng = np.random.default_rng(seed)
        r = spec.range_ratio
        real = max(0, spec.input_len - spec.special_tokens)
        self.in_lo = int(np.floor(real * (1 - r)))
        self.in_hi = int(np.ceil(real * (1 + r)))
        self.out_lo = max(int(np.floor(spec.output_len * (1 - r))), 1)
        self.out_hi = max(int(np.ceil(spec.output_len * (1 + r))), 1)
        self.head = spec.special_tokens + spec.prefix_len  # tokens every prompt shares
        self.shared = self.head // block_tokens
        self.draw = spec.num_prompts or RANDOM_DRAW
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.first_id: list[int] = []  # id of each prompt's first own block
        self._next_id = self.shared

    def _draw(self) -> None:
        n = self.draw
        self.inputs += self.rng.integers(self.in_lo, self.in_hi + 1, size=n).tolist()
        self.outputs += self.rng.integers(self.out_lo, self.out_hi + 1, size=n).tolist()
        self.rng.integers(0, 2**31 - 1, size=n)  # the offsets: keeps the stream as vLLM's
        for length in self.inputs[len(self.first_id) :]:
            self.first_id.append(self._next_id)
            self._next_id += (self.head + length) // self.block_tokens - self.shared

    def prompt(self, i: int) -> Prompt:
        while i >= len(self.inputs):
            self._draw()
        total = self.head + self.inputs[i]
        own = total // self.block_tokens - self.shared
        first = self.first_id[i]
        ids = tuple(range(self.shared)) + tuple(range(first, first + own))
        return Prompt(total, self.outputs[i], ids)


def make_prompts(
    spec: SharedPrefixWorkload | RandomWorkload, seed: int, block_tokens: int
) -> PromptSource:
    """The prompt source of ``spec``, seeded."""
    if isinstance(spec, SharedPrefixWorkload):
        return SharedPrefixPrompts(spec, seed, block_tokens)
    return RandomPrompts(spec, seed, block_tokens)
