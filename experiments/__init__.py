"""Benchmark and measurement scripts; run each from the repository root as a module
(``python -m experiments.speedup``), or all of them with ``python -m experiments.run_all``."""
