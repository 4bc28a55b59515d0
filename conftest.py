"""Suite-wide settings, for the tests and the doctests of ``autostream`` and ``experiments``.

The suite runs strict (a planning or rewrite failure is a bug, raised, never a silent
fallback); every test and doctest gets its own plan cache and headline directory.
No result may depend on how fast or loaded the machine is: CP-SAT's searches stop on
their deterministic limits alone (``AUTOSTREAM_WALL_CLOCK=off``, inherited by the
subprocesses tests start), the backend plans synchronously (``AUTOSTREAM_ANYTIME=off``:
when a background plan takes over depends on the machine; ``tests/test_anytime.py``
turns it on), and Hypothesis neither times examples nor fails a slow
generation.  Tests marked ``slow`` (more than ~2 s) run only with ``--slow``, as CI runs
them; tests marked ``cuda`` skip, saying so, where no CUDA device is present.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

os.environ["AUTOSTREAM_STRICT"] = "1"
os.environ["AUTOSTREAM_WALL_CLOCK"] = "off"
# the default CPU table is the shipped one as it is: no test probes the machine unless it
# asks to (``cost.fitted``)
os.environ["AUTOSTREAM_COST_PROBE"] = "off"
# background planning off: every compile plans as a synchronous one (planning/anytime.py)
os.environ["AUTOSTREAM_ANYTIME"] = "off"
settings.register_profile("autostream", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("autostream")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true",
                     help="also run the tests marked slow (CI runs the whole suite)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("cuda")]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs a CUDA device (CI has none; run on a lent GPU)")
            for item in gpu:
                item.add_marker(skip)
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    """No test reads plans or fitted cost tables another test (or the user) stored, none
    writes to ~/.cache, and experiments run from a test record their headline rows under the
    test's directory."""
    monkeypatch.setenv("AUTOSTREAM_PLAN_CACHE", str(tmp_path / "plans"))
    monkeypatch.setenv("AUTOSTREAM_COST_CACHE", str(tmp_path / "costs"))
    monkeypatch.setenv("AUTOSTREAM_HEADLINES", str(tmp_path / "headlines"))
