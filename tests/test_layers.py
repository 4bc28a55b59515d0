"""The package's layers: each subpackage imports only what its docstring allows, and
nothing imports upward (the units' imports have no cycle).

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
