"""The shipped CPU table fitted to this machine: probed once, then read from a cache.

A shipped table's times are those of the machine it was measured on (its ``device.name``:
CPU model, cores, torch threads).  On any other machine the first default table asked for
comes from a short probe (``cost.probe``) that rescales it (``cost.rescale``); the result
is a table file under the cache folder, one per machine and shipped table, so later
processes read it instead of probing.  A cache file that cannot be read, or that was
fitted from another version of the shipped table, is a miss (with a warning for the
former) and is replaced.  Processes starting together (the ranks of one job) take a lock
on the folder, so one probes and the others read its table: they plan with the same costs.

Settings (environment):

- ``AUTOSTREAM_COST_PROBE``: ``off`` never probes (the shipped table as it is; the test
  suite runs so), ``on`` (the default) probes where the table was not measured here.
- ``AUTOSTREAM_COST_CACHE``: the cache folder; default ``$XDG_CACHE_HOME/autostream/costs``,
  else ``~/.cache/autostream/costs``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from autostream.cost.calibrate import device_name
from autostream.cost.probe import Probe, ProbeStarved, run_probe
from autostream.cost.rescale import rescaled
from autostream.cost.table import CostTable, TableError

log = logging.getLogger("autostream")

PROBE_ENV = "AUTOSTREAM_COST_PROBE"
CACHE_ENV = "AUTOSTREAM_COST_CACHE"
_ON, _OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")
#: the tables of cache files this process could not write (or a probe that could not
#: finish: the shipped table), by path: probed once per process, not once per pass
_UNSAVED: dict[Path, CostTable] = {}


def probe_enabled() -> bool:
    """Whether ``AUTOSTREAM_COST_PROBE`` lets the probe run (unset: yes).

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {PROBE_ENV: "off"}):
    ...     probe_enabled()
    False
    """
    value = os.environ.get(PROBE_ENV, "on").strip().lower()
    if value in _ON or value == "":
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{PROBE_ENV}={os.environ[PROBE_ENV]!r}: set it to on (probe this machine "
                     f"where the default cost table was measured elsewhere) or off")


def cache_dir() -> Path:
    """Where fitted tables are kept (module docstring).

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {CACHE_ENV: "/tmp/x"}):
    ...     cache_dir()
    PosixPath('/tmp/x')
    """
    where = os.environ.get(CACHE_ENV)
    if where:
        return Path(where).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autostream" / "costs"


def this_machine() -> str:
    """This machine as tables name theirs (``calibrate.device_name``)."""
    return device_name(torch.device("cpu"))


def measured_here(table: CostTable, machine: str | None = None) -> bool:
    """Whether ``table`` was measured, or fitted, on this machine (``machine``: its name).

    >>> from autostream.cost import TableCostModel
    >>> t = TableCostModel.load("cpu").table
    >>> measured_here(t, t.device["name"]), measured_here(t, "another CPU")
    (True, False)
    """
    return table.device.get("name") == (machine or this_machine())


def cache_path(shipped: CostTable, name: str, machine: str, root: Path) -> Path:
    """The cache file of ``shipped`` (the shipped table ``name``) fitted to ``machine``."""
    key = "|".join((machine, torch.__version__, platform.machine(), shipped.digest()))
    return root / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def fitted_table(shipped: CostTable, name: str, *, machine: str | None = None,
                 root: Path | None = None,
                 probe: Callable[[CostTable], Probe] | None = None) -> CostTable:
    """``shipped`` fitted to this machine: read from the cache, else probed (by ``probe``)
    and kept there (``probe``: :func:`cost.probe.run_probe` when ``None``).  A cache that cannot be written logs a warning, and the table is kept
    in this process (the next process probes again)."""
    machine = machine or this_machine()
    path = cache_path(shipped, name, machine, root or cache_dir())
    if path in _UNSAVED:
        return _UNSAVED[path]
    with _locked(path.parent):
        table = _read(path, shipped)
        if table is not None:
            return table
        try:
            table = rescaled(shipped, (probe or run_probe)(shipped), name)
        except ProbeStarved as exc:
            _UNSAVED[path] = shipped
            log.warning("autostream: the default cost table could not be fitted to this "
                        "machine (%s); this process plans with the shipped table as it is, "
                        "measured on %s, and the next one probes again", exc,
                        shipped.device.get("name"))
            return shipped
        try:
            table.save(path)
        except OSError as exc:
            _UNSAVED[path] = table
            log.warning("autostream: the cost table fitted to this machine cannot be kept at "
                        "%s (%s): the next process probes again; set %s to a writable folder",
                        path, exc, CACHE_ENV)
        return table


def _read(path: Path, shipped: CostTable) -> CostTable | None:
    if not path.exists():
        return None
    try:
        table = CostTable.load(path, expect_kind=shipped.device["kind"])
    except (OSError, TableError) as exc:
        log.warning("autostream: the cached cost table %s cannot be read (%s): probing this "
                    "machine again", path, exc)
        return None
    if table.device.get("probe", {}).get("shipped_digest") != shipped.digest():
        return None  # fitted from another version of the shipped table
    return table


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (nothing where it cannot be taken)."""
    try:
        import fcntl

        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".lock", "a")  # noqa: SIM115 - held across the yield
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
