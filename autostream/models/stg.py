"""Read the Standard Task Graph Set (Kasahara lab) into a ``SchedulingProblem``.

An ``.stg`` file starts with the task count ``N`` (dummy tasks excluded), then one
line per task, ``id time n_preds pred...``, for the ``N + 2`` tasks ``0..N+1``
(``0`` is the dummy entry, ``N+1`` the dummy exit, both of time 0), then ``#``
comment lines.  Times become microseconds; shares and sync latency are 0 (the
benchmark has no communication cost and no contention).  Node names are the task
ids as strings, ``order`` is the id.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from autostream.scheduling.problem import SchedulingProblem

#: a small sample graph, shipped with the package (``autostream plan`` takes it)
SAMPLE = Path(__file__).with_name("sample.stg")


def resolve_stg(path: str | Path) -> Path:
    """The ``.stg`` file ``path`` names: as given (from the current directory), else a
    file shipped with the package (``sample.stg``, or ``autostream/models/sample.stg`` as
    the README writes it), from any directory.

    >>> resolve_stg("autostream/models/sample.stg").resolve() == resolve_stg("sample.stg")
    True
    >>> resolve_stg("nowhere.stg")
    Traceback (most recent call last):
    ...
    FileNotFoundError: STG file nowhere.stg does not exist (nor is it a file shipped with autostream); try the sample graph autostream/models/sample.stg
    """
    given = Path(path)
    if given.is_file():
        return given
    package_root = SAMPLE.parents[2]  # the folder that holds the autostream package
    for shipped in (package_root / given, SAMPLE.with_name(given.name)):
        if not given.is_absolute() and shipped.is_file() and shipped.suffix == ".stg":
            return shipped
    raise FileNotFoundError(f"STG file {path} does not exist (nor is it a file shipped with "
                            f"autostream); try the sample graph autostream/models/sample.stg")


def benchmark_missing(root: Path) -> str:
    """Why the STG benchmark cannot run from ``root``, and where to get it.

    >>> benchmark_missing(Path("/nowhere")).startswith("no STG benchmark at /nowhere")
    True
    """
    return (f"no STG benchmark at {root} (expected 50/, 100/ and optimal.csv there): it is the "
            f"Standard Task Graph Set of the Kasahara lab, Waseda University (random DAGs of "
            f"50 and 100 tasks and their proven optimal makespans), published on the lab's "
            f"site; put it there, or try the sample graph {SAMPLE}")


def _int(text: str, where: str, field: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}: field {field!r}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"{where}: field {field!r}: expected an integer >= {minimum}, got {value}")
    return value


def parse_stg(text: str, streams: int = 1, name: str = "<stg>") -> SchedulingProblem:
    """Parse STG text; errors name ``name``, the line number and the field.

    >>> p = parse_stg("1\\n0 0 0\\n1 5 1 0\\n2 0 1 1\\n", streams=2)
    >>> sorted(p.graph.edges), p.critical_path()
    ([('0', '1'), ('1', '2')], 5.0)
    >>> parse_stg("1\\n0 0 0\\n1 x 1 0\\n2 0 1 1\\n")
    Traceback (most recent call last):
    ...
    ValueError: <stg>:3: field 'time': expected an integer, got 'x'
    """
    lines = [(i + 1, ln.split()) for i, ln in enumerate(text.splitlines())]
    lines = [(no, f) for no, f in lines if f and not f[0].startswith("#")]
    if not lines:
        raise ValueError(f"{name}: empty file: expected the task count on the first line")
    no, fields = lines[0]
    count = _int(fields[0], f"{name}:{no}", "task count", minimum=0)
    tasks = lines[1:]
    if len(tasks) != count + 2:
        raise ValueError(
            f"{name}: the header (line {no}) announces {count} tasks plus 2 dummies, "
            f"but {len(tasks)} task lines follow"
        )
    g = nx.DiGraph()
    for expected, (no, fields) in enumerate(tasks):
        where = f"{name}:{no}"
        if len(fields) < 3:
            raise ValueError(f"{where}: expected 'id time n_preds preds...', got {len(fields)} fields")
        tid = _int(fields[0], where, "id")
        if tid != expected:
            raise ValueError(f"{where}: field 'id': expected task {expected}, got {tid}")
        time = _int(fields[1], where, "time")
        n_preds = _int(fields[2], where, "n_preds")
        preds = fields[3:]
        if len(preds) != n_preds:
            raise ValueError(
                f"{where}: field 'n_preds': says {n_preds} predecessors, {len(preds)} listed"
            )
        g.add_node(str(tid), duration=float(time), share=0.0, order=tid)
        for k, text in enumerate(preds):
            p = _int(text, where, f"pred[{k}]")
            if p >= tid:
                raise ValueError(
                    f"{where}: field 'pred[{k}]': predecessor {p} is not an earlier task"
                )
            g.add_edge(str(p), str(tid))
    return SchedulingProblem(g, streams=streams)


def read_stg(path: str | Path, streams: int = 1) -> SchedulingProblem:
    """Read an ``.stg`` file as a problem on ``streams`` streams (times in microseconds)."""
    path = Path(path)
    return parse_stg(path.read_text(), streams=streams, name=str(path))


@dataclass(frozen=True)
class Optimum:
    """The known optimal makespan of an instance, or its bounds when it is open.

    ``optimal.csv`` rows have three fields (``graph,streams,optimum``) when the
    optimum is proven, four (``graph,streams,lower,upper``) when it is not: the
    best lower bound and the best known makespan.
    """

    lower: float
    upper: float

    @property
    def proven(self) -> bool:
        return self.lower == self.upper


def read_optimal_csv(path: str | Path) -> dict[tuple[str, int], Optimum]:
    """``(graph, streams) -> Optimum`` from an ``optimal.csv``.

    ``graph`` is the file's path relative to the benchmark directory, e.g.
    ``"50/rand0000.stg"``.
    """
    path = Path(path)
    table: dict[tuple[str, int], Optimum] = {}
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][:3] != ["graph", "streams", "optimal_makespan"]:
        raise ValueError(f"{path}:1: expected the header 'graph,streams,optimal_makespan'")
    for row_no, row in enumerate(rows[1:], start=2):
        where = f"{path}:{row_no}"
        if not row:
            continue
        if len(row) not in (3, 4):
            raise ValueError(f"{where}: expected 3 or 4 fields, got {len(row)}")
        lower = float(_int(row[2], where, "optimal_makespan"))
        upper = float(_int(row[3], where, "upper_bound")) if len(row) == 4 else lower
        if upper < lower:
            raise ValueError(f"{where}: field 'upper_bound': {upper:g} is below the lower bound {lower:g}")
        table[(row[0], _int(row[1], where, "streams", 1))] = Optimum(lower, upper)
    return table
