"""Fleets: N instances of the vLLM-exact engine (or cache-mode tier) behind a router,
optionally sharing one tier (docs/fleets.md). Cache mode: :mod:`.cache_fleet`; timed
mode: :mod:`.timed_fleet`; the routers and their protocol: :mod:`.routers`; the router's
view and its lag: :mod:`.view`; the shared tier: :mod:`.shared`; outputs: :mod:`.summary`.
"""
