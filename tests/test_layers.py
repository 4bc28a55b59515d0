"""The package's layers: each subpackage imports only what its docstring allows, no
import runs up the layers' order (:data:`LAYERS`), and the units' imports have no cycle.
A plan's trip through the planner's stages runs down from the planner and climbs back
once (:data:`STAGES`).

A subpackage's ``__init__`` docstring holds a line ``May import: a, b.`` (units named
as under ``autostream/``: ``cost``, ``stages``...; ``nothing``; ``anything``), and may
give some of its modules a layer of their own: ``experts may import: dialects.``
Imports inside functions and under ``TYPE_CHECKING`` count too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

import autostream

ROOT = Path(autostream.__file__).parent
RULE = re.compile(r"^(?P<who>.*?)\bmay import: (?P<what>.*?)(?:\s*\(.*\))?\.?$", re.I | re.M)
TOP_LEVEL_LIMIT = 8


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted
    line: int


@dataclass(frozen=True)
class Rule:
    unit: str  # "cost", or "models.experts" for a module given its own layer
    allowed: frozenset[str] | None  # None: anything


def module_name(path: Path) -> str:
    parts = ["autostream", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [Import(name, a.name, node.lineno) for a in node.names
                    if a.name.split(".")[0] == "autostream"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: len(name.split(".")) - (not is_package)]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "autostream":
                continue
            for a in node.names:  # `from autostream.x import y`: y may be a module
                sub = f"{base}.{a.name}"
                out.append(Import(name, sub if sub in known else base, node.lineno))
    return out


def all_imports() -> list[Import]:
    mods = modules()
    return [i for name, path in mods.items() for i in imports_of(name, path, set(mods))]


def rules() -> dict[str, Rule]:
    """Unit -> its rule, from the subpackages' docstrings."""
    out = {}
    for init in sorted(ROOT.glob("*/__init__.py")):
        package = init.parent.name
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        own = {p.stem for p in init.parent.glob("*.py")} | \
            {p.parent.name for p in init.parent.glob("*/__init__.py")}
        for m in RULE.finditer(doc):
            what = m.group("what").strip()
            allowed = None if what.startswith("anything") else frozenset(
                () if what.startswith("nothing") else re.findall(r"\w+", what))
            who = [w for w in re.findall(r"\w+", m.group("who")) if w in own]
            for unit in [f"{package}.{w}" for w in who] or [package]:
                out[unit] = Rule(unit, allowed)
    return out


def unit_of(module: str, units: set[str]) -> str:
    """``autostream.models.experts`` -> ``models.experts`` when it has a layer of its own,
    else ``models``; a top-level module is its own unit, the package itself ``autostream``."""
    parts = module.split(".")[1:]
    if not parts:
        return "autostream"
    if len(parts) > 1 and ".".join(parts[:2]) in units:
        return ".".join(parts[:2])
    return parts[0]


def violations(imports: list[Import], rule_of: dict[str, Rule]) -> list[str]:
    """Imports a subpackage's docstring does not allow, each with where and why."""
    units = set(rule_of)
    out = []
    for i in imports:
        src, dst = unit_of(i.module, units), unit_of(i.target, units)
        package, target_package = src.split(".")[0], dst.split(".")[0]
        if package == target_package and (src == dst or "." not in dst):
            continue  # within a layer, or down to the package's own lower layer
        rule = rule_of.get(src)
        if rule is None:
            continue  # a top-level module: only the cycle check applies
        allowed = rule.allowed
        if "." in src and rule_of.get(package) and allowed is not None:
            allowed = allowed | (rule_of[package].allowed or frozenset())
        if allowed is None or dst in allowed or target_package in allowed:
            continue
        out.append(f"{i.module} (line {i.line}) imports {i.target}, but {src} may import: "
                   f"{', '.join(sorted(allowed)) or 'nothing'} (its __init__ docstring); "
                   f"import downward, or move the code to a layer that may")
    return out


def unit_graph(imports: list[Import], units: set[str]) -> nx.DiGraph:
    g = nx.DiGraph()
    for i in imports:
        src, dst = unit_of(i.module, units), unit_of(i.target, units)
        if src != dst:
            g.add_edge(src, dst)
    return g


def test_every_subpackage_says_what_it_may_import():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - set(rules()) == set(), \
        "add a line 'May import: ...' to these subpackages' __init__ docstrings"


def test_subpackages_import_only_what_their_docstring_allows():
    assert violations(all_imports(), rules()) == []


def test_nothing_imports_upward():
    g = unit_graph(all_imports(), set(rules()))
    cycles = list(nx.simple_cycles(g))
    assert cycles == [], f"import cycles between layers: {cycles}"
    module_cycles = list(nx.simple_cycles(nx.DiGraph(
        [(i.module, i.target) for i in all_imports() if i.module != i.target])))
    assert module_cycles == []


def test_the_top_level_holds_the_entry_points_and_little_else():
    top = sorted(p.stem for p in ROOT.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, f"{top}: move modules into the subpackage of their stage"


def test_an_upward_import_is_caught():
    """The checks fail on an import that breaks the layering (here: the graph reading the
    planner, a layer above it), naming the module and the rule."""
    upward = Import("autostream.fx.graph", "autostream.planning.plan", 1)
    found = violations([*all_imports(), upward], rules())
    ours = [f for f in found if f.startswith("autostream.fx.graph (line 1) imports "
                                             "autostream.planning.plan")]
    assert len(ours) == 1 and "fx may import: comm" in ours[0]
    g = unit_graph([*all_imports(), upward], set(rules()))
    assert list(nx.simple_cycles(g)) != []


def test_a_module_with_a_layer_of_its_own_is_checked_against_it():
    r = rules()
    assert r["models.experts"].allowed is not None and "dialects" in r["models.experts"].allowed
    assert violations([Import("autostream.models.experts", "autostream.dialects.torchair", 3)],
                      r) == []
    found = violations([Import("autostream.models.zoo", "autostream.dialects.torchair", 3)], r)
    assert len(found) == 1 and "models may import: scheduling" in found[0]


# -- the layers' order -----------------------------------------------------------------------

#: Every unit (a subpackage, or a top-level module), lowest first: a unit imports only the
#: units before it.  The pipeline runs up it: what communicates, the graph, costs, the
#: scheduling problem and its solvers, syncs and simulator, memory, the dialects'
#: rewrites, the planner (``plan``, the loop that evaluates and fits a plan), the
#: runtimes, the reports, then the entry points (docs/design.md).
LAYERS = ("version", "stages", "comm", "fx", "cost", "scheduling", "memory", "dialects",
          "models", "planning", "runtime", "report", "passes", "calibration", "backend",
          "equivalence", "commands", "cli", "autostream")


def unit(module: str) -> str:
    """``autostream.comm.ops`` -> ``comm`` (no module a layer of its own); the package
    itself -> ``autostream``."""
    return unit_of(module, set())


def upward(imports: list[Import]) -> list[Import]:
    """The imports from a unit up to a unit above it in :data:`LAYERS`."""
    rank = {u: i for i, u in enumerate(LAYERS)}
    return [i for i in imports if rank[unit(i.target)] > rank[unit(i.module)]]


def unit_cycles(imports: list[Import]) -> list[list[str]]:
    return list(nx.simple_cycles(unit_graph(imports, set())))


def test_every_unit_has_a_layer():
    units = {unit(m) for m in modules()}
    assert units - set(LAYERS) == set(), "add these units to LAYERS, above what they import"


def test_no_import_runs_up_the_layers():
    found = [f"{i.module} (line {i.line}) imports {i.target}" for i in upward(all_imports())]
    assert found == [], "move the code to the layer it belongs to, or import downward"
    assert unit_cycles(all_imports()) == []


def test_an_import_up_the_layers_is_caught():
    up = Import("autostream.memory.predict", "autostream.planning.fit", 1)
    assert upward([*all_imports(), up]) == [*upward(all_imports()), up]
    assert unit_cycles([*all_imports(), up]) != []


# -- a plan's trip ------------------------------------------------------------------------------

#: The planner's stages, in pipeline order, and the files each is made of (a folder ends
#: in ``/``).  ``plan`` is the planner itself: it builds the problem and evaluates each
#: candidate; ``fit`` keeps a plan within its memory budget.  A plan's trip (issue 44):
#: the planner hands a candidate down to each stage in this order, once, and the trip
#: climbs back up the layers once (to ``memory``, then the planner's ``fit``).
STAGES = {
    "plan": ("planning/plan.py", "planning/evaluate.py"),
    "solve": ("scheduling/solvers/",),
    "syncs": ("scheduling/waits.py", "scheduling/sync.py"),
    "simulate": ("scheduling/simulate.py", "scheduling/timeline.py"),
    "memory": ("memory/",),
    "fit": ("planning/fit.py",),
}
PLANNER = "planning/"


@dataclass(frozen=True)
class Visit:
    """The planner calling into a stage: the callee's file and stage."""

    file: str
    stage: str


def stage_of(file: str) -> str | None:
    for stage, parts in STAGES.items():
        if any(file == p or (p.endswith("/") and file.startswith(p)) for p in parts):
            return stage
    return None


def planner_visits(run) -> list[Visit]:
    """Every call the planner (a function under ``planning/``) makes into a stage other
    than its own, in order, while ``run()`` runs.  What a stage calls in turn is its own
    business, not the planner's: the trip follows the plan as the planner hands it on."""
    import sys

    root = str(ROOT) + "/"
    visits: list[Visit] = []

    def ours(frame) -> str | None:
        f = frame.f_code.co_filename
        return f[len(root):] if f.startswith(root) else None

    def on_event(frame, event, arg):
        if event != "call" or (callee := ours(frame)) is None:
            return
        stage = stage_of(callee)
        caller = frame.f_back
        while caller is not None and ours(caller) is None:  # through functools, contextlib
            caller = caller.f_back
        if stage is None or caller is None:
            return
        source = ours(caller)
        if source.startswith(PLANNER) and stage_of(source) != stage:
            visits.append(Visit(callee, stage))

    before = sys.getprofile()
    sys.setprofile(on_event)
    try:
        run()
    finally:
        sys.setprofile(before)
    return visits


def candidate_trip(visits: list[Visit]) -> list[Visit]:
    """One candidate's trip: from the planner's last solve before the plan reaches
    ``fit`` (the candidate's own solve, after the single-stream plan's) to ``fit``."""
    stages = [v.stage for v in visits]
    end = stages.index("fit") + 1 if "fit" in stages else len(stages)
    start = max(i for i in range(end) if stages[i] == "solve")
    return visits[start:end]


def layer_of(file: str) -> int:
    return LAYERS.index(file.split("/")[0])


@dataclass(frozen=True)
class Trip:
    """A trip's figures: the stages it enters in order (from ``plan``), the files, how
    often it climbs back up (turns from going down the layers to going up), and how
    often it returns to a stage or file it had left."""

    stages: tuple[str, ...]
    files: tuple[str, ...]
    climbs: int
    stage_returns: int
    file_returns: int

    @classmethod
    def of(cls, visits: list[Visit], start: str = "planning/plan.py") -> Trip:
        files = _collapsed([start, *(v.file for v in visits)])
        stages = _collapsed(["plan", *(v.stage for v in visits)])
        return cls(tuple(stages), tuple(dict.fromkeys(files)), _climbs([layer_of(f) for f in files]),
                   len(stages) - len(set(stages)), len(files) - len(set(files)))


def _collapsed(seq: list[str]) -> list[str]:
    return [x for i, x in enumerate(seq) if i == 0 or seq[i - 1] != x]


def _climbs(layers: list[int]) -> int:
    """How often a walk over these layers turns from going down (or starting) to going up."""
    steps = [b - a for a, b in zip(layers, layers[1:]) if b != a]
    return sum(1 for i, s in enumerate(steps) if s > 0 and (i == 0 or steps[i - 1] < 0))


def plan_trip(spec: str = "two_branch_gemv", **options) -> Trip:
    from autostream.fx.capture import capture_graphs
    from autostream.models import zoo
    from autostream.planning.plan import PlanOptions, plan_graph

    model, inputs = getattr(zoo, spec)()
    gm = max(capture_graphs(model, tuple(inputs)), key=lambda g: len(g.graph.nodes))
    opts = PlanOptions(**{"max_streams": 2, "solver": "cpsat", **options})
    plan = None

    def run() -> None:
        nonlocal plan
        plan = plan_graph(gm, opts)

    visits = planner_visits(run)
    assert plan is not None and plan.schedule.streams_used > 1, "trace a multi-stream plan"
    return Trip.of(candidate_trip(visits))


def test_a_plans_trip_enters_each_stage_once_in_pipeline_order():
    trip = plan_trip()
    assert trip.stages == tuple(STAGES), trip
    assert trip.climbs <= 1 and trip.stage_returns == trip.file_returns == 0, trip


def test_a_trip_out_of_order_or_climbing_back_twice_is_caught():
    """Before issue 44 the planner handed a candidate to ``memory/fit.py``, which ran its
    syncs, simulation and memory itself; its calls (the loop's own trip) climbed back
    twice: up from the solver to ``memory/``, down to ``comm/`` (floor 1) for the waits,
    and up again through ``scheduling/`` to ``memory/``."""
    old = Trip.of([Visit("scheduling/solvers/cpsat/__init__.py", "solve"),
                   Visit("memory/fit.py", "memory")])
    assert old.stages == ("plan", "solve", "memory") != tuple(STAGES)
    loop = ["planning/plan.py", "scheduling/solvers/heft.py", "memory/fit.py",
            "comm/affinity.py", "scheduling/sync.py", "scheduling/simulate.py",
            "memory/predict.py", "memory/fit.py"]
    assert _climbs([layer_of(f) for f in loop]) == 2
    now = ["planning/plan.py", "scheduling/solvers/heft.py", "scheduling/waits.py",
           "scheduling/sync.py", "memory/predict.py", "planning/fit.py"]
    assert _climbs([layer_of(f) for f in now]) == 1
