"""Engine parameters: described once, with the other user-facing structures, in
:mod:`kvsim.options.engine` (re-exported here, where the engine's modules import it)."""

from kvsim.options.engine import EngineParams

__all__ = ["EngineParams"]
