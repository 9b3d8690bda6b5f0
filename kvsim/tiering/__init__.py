"""Secondary tiers behind the CPU tier: vLLM 0.33's ``TieringOffloadingManager``.

* :mod:`~kvsim.tiering.manager`: the orchestrator (lookups that promote, cascades, failures);
* :mod:`~kvsim.tiering.secondary`: one secondary tier (its store, lookups and jobs);
* :mod:`~kvsim.tiering.store`: what a tier holds, unbounded as vLLM's or with a capacity;
* :mod:`~kvsim.tiering.async_lookup`: existence checks answered a step later (``fs``, ``obj``);
* :mod:`~kvsim.tiering.backpressure`: dropping cascades to a slow tier;
* :mod:`~kvsim.tiering.primary`: the CPU tier as the orchestrator drives it;
* :mod:`~kvsim.tiering.metrics`: the ``vllm:kv_offload_tiering_*`` metrics;
* :mod:`~kvsim.tiering.build`: all of it from a :class:`~kvsim.options.offload.CacheConfig`.

The tier specifications themselves (vLLM's JSON, the ``--tier`` shorthand) are
:mod:`kvsim.options.tiers`; the cache-mode driver is :mod:`kvsim.cachemode.tiered_tier`.
"""

from kvsim.tiering.build import build_tiered_manager
from kvsim.tiering.manager import TieredManager

__all__ = ["TieredManager", "build_tiered_manager"]
