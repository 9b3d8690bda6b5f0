"""Back-pressure: a secondary tier whose stores slow down stops receiving cascades.

vLLM 0.33's ``EMABackpressureDetector`` with its ``ThrottledDropPolicy`` (default) or
``DropStorePolicy``: the detector keeps an exponential moving average of store latency
per MiB; above the high-water mark the tier is under pressure, below the low-water mark
it recovers; with no completions the average decays (half-life); right after recovery
every second store is dropped for a cool-down; a run of failed stores trips pressure too.
A dropped cascade leaves the chunk in the CPU tier only, and is counted.

The detector reads the manager's clock. Cache mode has no time (every store takes zero
seconds), so there pressure never builds and nothing is dropped; a timed model gives the
clock meaning.
"""

from __future__ import annotations

from collections.abc import Callable

from kvsim.options.tiers import BackpressureSpec

_MIB = 1 << 20
#: consecutive fast completions after which the detector skips the policy (vLLM's)
HEALTHY_THRESHOLD = 10
#: failure-tripped pressure raises the average to this multiple of the high-water mark
FAILURE_EMA_FACTOR = 4.0


class DropPolicy:
    """What to do under pressure; counts what it drops (``pop_dropped`` empties the counts
    vLLM reports per interval; the totals are the tier's own counters)."""

    def __init__(self) -> None:
        self.stores_dropped = 0
        self.blocks_dropped = 0

    def should_store(self, detector: EMADetector) -> bool:
        return not detector.is_under_pressure()

    def on_store_skipped(self, num_blocks: int) -> None:
        self.stores_dropped += 1
        self.blocks_dropped += num_blocks

    def pop_dropped(self) -> tuple[int, int]:
        out = (self.stores_dropped, self.blocks_dropped)
        self.stores_dropped = self.blocks_dropped = 0
        return out

    def reset(self) -> None:
        self.stores_dropped = self.blocks_dropped = 0


class ThrottledDropPolicy(DropPolicy):
    """Drop a share of stores that grows with how far the average overshoots the
    high-water mark: none at the mark, all at ``1 + ramp_factor`` times it; the share is
    accumulated across decisions, so a 30 % rate drops every third-or-so store."""

    def __init__(self, ramp_factor: float = 2.0) -> None:
        super().__init__()
        self.ramp_factor = ramp_factor
        self._accumulated = 0.0

    def should_store(self, detector: EMADetector) -> bool:
        if not detector.is_under_pressure():
            return True
        high = detector.high_water_s
        if high <= 0:
            return False
        overshoot = max(0.0, detector.ema - high) / high
        rate = min(1.0, overshoot / self.ramp_factor)
        if rate <= 0:
            return True
        if rate >= 1.0:
            return False
        self._accumulated += rate
        if self._accumulated >= 1.0:
            self._accumulated -= 1.0
            return False
        return True

    def reset(self) -> None:
        super().reset()
        self._accumulated = 0.0


POLICIES: dict[str, type[DropPolicy]] = {
    "ThrottledDropPolicy": ThrottledDropPolicy,
    "DropStorePolicy": DropPolicy,
}


class EMADetector:
    """Store latency (seconds per MiB) as a moving average, with vLLM's warm-up, decay,
    cool-down, healthy fast path and failure trip."""

    def __init__(self, spec: BackpressureSpec, clock: Callable[[], float]) -> None:
        self.spec = spec
        self.policy = POLICIES[spec.policy]()
        self.high_water_s = spec.high_water_s
        self.low_water_s = spec.low_water_s
        self._clock = clock
        self.reset(policy=False)

    def reset(self, *, policy: bool = True) -> None:
        self.ema = 0.0
        self._under_pressure = False
        self._completions = 0
        self._warmup: list[float] = []
        self._last_update = 0.0
        self._healthy_streak = 0
        self._cleared_at = 0.0
        self._cooldown_count = 0
        self._failures = 0
        self._failure_tripped = False
        if policy:
            self.policy.reset()

    # --- observations ---

    def update(self, submit_time: float, num_bytes: int) -> None:
        """A store job that started at ``submit_time`` finished now, writing ``num_bytes``."""
        if num_bytes <= 0:
            return
        self.on_store_completed(self._clock() - submit_time, num_bytes)

    def on_store_completed(self, elapsed_s: float, num_bytes: int) -> None:
        now = self._clock()
        s_per_mib = elapsed_s / (num_bytes / _MIB)
        self._failures = 0
        self._completions += 1
        warmup = self.spec.warmup_completions
        if self._completions <= warmup:
            self._warmup.append(s_per_mib)
            if self._completions == warmup:
                self.ema = sum(self._warmup) / len(self._warmup)
                self._last_update = now
            return
        alpha = self.spec.alpha
        self.ema = alpha * s_per_mib + (1 - alpha) * self.ema
        self._last_update = now
        if self.ema > self.high_water_s:
            self._under_pressure = True
            self._cleared_at = 0.0
            self._healthy_streak = 0
        elif self.ema < self.low_water_s:
            if self._under_pressure:
                self._cleared_at = now
                self._cooldown_count = 0
            self._under_pressure = False
            self._failure_tripped = False
            self._healthy_streak += 1
        else:
            self._healthy_streak = 0

    def on_store_failed(self) -> None:
        threshold = self.spec.failure_threshold
        if threshold is None:
            return
        self._failures += 1
        self._healthy_streak = 0
        if self._failures < threshold:
            return
        self.ema = max(self.ema, self.high_water_s * FAILURE_EMA_FACTOR)
        self._last_update = self._clock()
        self._under_pressure = True
        self._failure_tripped = True
        self._cleared_at = 0.0

    # --- decisions ---

    def _decay(self) -> None:
        now = self._clock()
        dt = now - self._last_update
        half_life = self.spec.decay_half_life_s
        if dt <= 0 or half_life <= 0:
            return
        self.ema *= 0.5 ** (dt / half_life)
        self._last_update = now

    def is_under_pressure(self) -> bool:
        if self._under_pressure and (
            self._completions >= self.spec.warmup_completions or self._failure_tripped
        ):
            self._decay()
            if self.ema < self.low_water_s:
                self._under_pressure = False
                self._failure_tripped = False
                self._cleared_at = self._clock()
                self._cooldown_count = 0
        return self._under_pressure

    def is_healthy(self) -> bool:
        return not self._under_pressure and self._healthy_streak >= HEALTHY_THRESHOLD

    def should_store(self, num_blocks: int) -> bool:
        """Whether a cascade of ``num_blocks`` chunks goes ahead; a drop is counted."""
        under_pressure = self.is_under_pressure()
        if self.is_healthy():
            return True
        if (
            not under_pressure
            and self._cleared_at > 0
            and self._clock() - self._cleared_at < self.spec.cooldown_s
        ):
            self._cooldown_count += 1
            if self._cooldown_count % 2 == 0:
                self.policy.on_store_skipped(num_blocks)
                return False
        if not self.policy.should_store(self):
            self.policy.on_store_skipped(num_blocks)
            return False
        return True
