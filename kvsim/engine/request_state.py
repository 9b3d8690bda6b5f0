"""Per-request state of the timed engine (scheduler, connector and metrics fields)."""

from __future__ import annotations

from array import array
from collections.abc import Hashable

from kvsim.core.context import RequestContext
from kvsim.core.keys import ChunkKey

WAITING = 0
WAITING_FOR_KV = 1  # vLLM WAITING_FOR_REMOTE_KVS: an async CPU->GPU load is in flight
RUNNING = 2
FINISHED = 3
REJECTED = 4  # cannot fit in GPU KV memory even alone


class SimRequest:
    """One request's mutable state in the timed engine (slotted: it is touched every step)."""

    __slots__ = (
        "admitted",
        "arrival",
        "block_keys",
        "blocks",
        "chunk_keys",
        "cpu_hit",
        "ctx",
        "deferrals",
        "finish",
        "first_scheduled",
        "first_token",
        "forward_tokens",
        "free_hit_memo",
        "gpu_hit",
        "hit_memo",
        "in_flight",
        "jobs",
        "kv_wait",
        "kv_wait_start",
        "last_seq",
        "last_token",
        "load_done",
        "n_cached",
        "n_prompt_chunks",
        "next_store",
        "num_computed",
        "num_output",
        "output",
        "pending_ext",
        "placeholders",
        "preemptions",
        "prompt",
        "rid",
        "sched",
        "stale",
        "status",
        "token_gaps",
        "unit_keys",
    )

    def __init__(
        self,
        rid: int,
        arrival: float,
        prompt: int,
        output: int,
        unit_keys: list[ChunkKey],
        chunk_keys: list[ChunkKey],
        ctx: RequestContext,
    ) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.unit_keys = unit_keys
        self.chunk_keys = chunk_keys
        self.n_prompt_chunks = len(chunk_keys)
        self.ctx = ctx
        self.status = WAITING
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.block_keys: list[Hashable] = []  # GPU prefix-cache keys, made as needed
        self.n_cached = 0  # leading blocks that carry a prefix-cache hash
        # the scheduler's last GPU hit lookups while it waits, kept while the pool has not
        # changed: (blocks looked up, pool lost_seq, hit), (hit, pool held_seq, free hits)
        self.hit_memo: tuple[int, int, int] | None = None
        self.free_hit_memo: tuple[int, int, int] | None = None
        self.sched = 0  # tokens scheduled in the current step
        # async scheduling (vLLM num_in_flight_tokens, num_output_placeholders,
        # num_stale_output_tokens, last_sched_seq): tokens of batches not processed yet
        self.in_flight = 0  # scheduled, not yet added to num_computed
        self.placeholders = 0  # sampled tokens scheduled but not yet returned
        self.stale = 0  # in-flight tokens of a batch scheduled before a preemption
        self.last_seq = 0  # fence of the last non-empty step that scheduled it
        self.next_store = 0  # connector: next chunk index to offer
        self.jobs: set[int] = set()  # connector jobs in flight
        self.load_done = False  # async load finished (vLLM finished_recving)
        self.pending_ext = 0  # external tokens of the in-flight async load
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        # the gap before each output token but the first (vLLM's itls; 4 bytes a token, exact
        # to nanoseconds for gaps of seconds) and the latest token's time
        self.token_gaps = array("f")
        self.last_token = 0.0
        self.finish: float | None = None
        self.gpu_hit = 0
        self.cpu_hit = 0
        self.admitted = False
        self.forward_tokens = 0
        self.preemptions = 0
        self.kv_wait = 0.0
        self.kv_wait_start: float | None = None
        self.deferrals = 0

    def retire(self) -> None:
        """Drop what only a live request reads (its keys and its context, with the manager's
        and the policy's state in it) once it finished, made its last store offer and its
        last transfer ended: its row needs only its numbers. ~8 KB a request (docs/speed.md,
        "Memory"); a read of them after this fails loudly."""
        del self.unit_keys, self.chunk_keys, self.ctx

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.num_output
