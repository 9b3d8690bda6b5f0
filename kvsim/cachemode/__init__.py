"""Cache mode: everything without a clock.

* :mod:`.driver`: :class:`CacheReplay`, the per-request driver (GPU prefix cache + one CPU tier);
* :mod:`.protocol_tier`: the CPU tier through the full manager protocol (the reference);
* :mod:`.fused_tier`, :mod:`.fused_lru`, :mod:`.fused_arc`: the same decisions for vLLM's
  ``lru`` and ``arc``, fused for requests that run one at a time;
* :mod:`.object_protocol`: the cache-literature protocol (every chunk is a get);
* :mod:`.mrc`: one-pass LRU miss-ratio curves;
* :mod:`.bench`: the speed of all of the above, and against vLLM's own manager.

``kvsim.replay(...)`` (the function in :mod:`kvsim.api`) is the entry point; this package
holds the machinery, e.g. ``from kvsim.cachemode import CacheReplay``.
"""

from kvsim.cachemode.driver import FUSED_TIERS, REQUEST_COLUMNS, CacheReplay, fused_tier_class

__all__ = ["FUSED_TIERS", "REQUEST_COLUMNS", "CacheReplay", "fused_tier_class"]
