"""kvsim against real GPUs: published measurements (the measurements format), each
experiment re-created and simulated (``kvsim accuracy``), and the step-time model fitted
to them (``kvsim fit-compute``). See ``docs/accuracy.md``."""

from kvsim.accuracy.measurements import MeasurementsFile, read_measurements
from kvsim.accuracy.report import AccuracyReport, accuracy

__all__ = ["AccuracyReport", "MeasurementsFile", "accuracy", "read_measurements"]
