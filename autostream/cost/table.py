"""Cost tables: the versioned JSON format, strict validation, save and merge.

The format is documented in ``cost_models/README.md``.  Loading never guesses: a
corrupt file, an unknown schema version, a negative or missing time raises
:class:`TableError` naming the file and the field.

>>> t = CostTable(device={"name": "x", "kind": "cpu", "origin": "spec"},
...               profile=GENERIC_CPU, entries=())
>>> CostTable.from_json(t.to_json(), source="<mem>").device["name"]
'x'
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autostream.comm.registry import KINDS as COLLECTIVES
from autostream.cost.collectives import LinkFit
from autostream.cost.pairs import PairTiming
from autostream.cost.profile import GENERIC_CPU, KINDS, ORIGINS, DeviceProfile

SCHEMA = "autostream.cost_table"
VERSION = 1
#: how an entry's median was measured: inside its whole graph, the op alone in a loop, or
#: back to back in a captured graph replayed (``autostream.cost.replay``)
TIMINGS = ("graph", "isolated", "replay")
#: profile fields a table writes only when measured (non-zero)
OPTIONAL_PROFILE = ("link_bandwidth", "link_latency_us", "link_share", "cores", "cores_source",
                    "graph_kernel_us", "graph_sync_us", "graph_call_us")
#: where an entry's numbers come from: ``calibrate``'s micro-benchmarks, a profile the
#: user took (``calibrate --from-profile``), or the probe that fitted a shipped table to
#: this machine (``cost.rescale``)
PROVENANCES = ("microbenchmark", "profile", "probe")


class TableError(ValueError):
    """A cost table that cannot be trusted; the message names the file and the field."""

    def __init__(self, source: str, field_: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field_, problem
        where = f" field {field_!r}" if field_ else ""
        super().__init__(f"cost table {source}:{where} {problem}")


@dataclass(frozen=True)
class Entry:
    """One measured op signature.

    ``time_us`` is the time the planner uses: the median over timing rounds of each
    round's fastest call, which a burst of load from other processes (a lost scheduler
    time slice) cannot inflate.  ``median_us`` and ``spread_us`` (interquartile range)
    describe all samples.
    """

    op: str
    signature: str
    dtype: str
    flops: int
    bytes: int
    median_us: float
    spread_us: float
    samples: int
    share: float
    slowdown: float = 1.0
    #: time in a multi-stream plan (on its share of the intra-op threads) / time alone
    split: float = 1.0
    flop_formula: bool = False
    timing: str = "isolated"
    isolated_us: float | None = None
    time_us: float = -1.0
    provenance: str = "microbenchmark"

    def __post_init__(self) -> None:
        if self.time_us < 0:  # tables without a separate planning time use the median
            object.__setattr__(self, "time_us", self.median_us)

    @property
    def key(self) -> tuple[str, str]:
        return (self.op, self.signature)


@dataclass(frozen=True)
class Skipped:
    """An op signature calibration could not run, with the reason."""

    op: str
    signature: str
    reason: str


@dataclass(frozen=True)
class CostTable:
    """A device descriptor, its profile, measured entries, skipped ops and link fits."""

    device: dict[str, Any]
    profile: DeviceProfile
    entries: tuple[Entry, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    #: alpha-beta fits of collectives (``cost.collectives``), optional in the file
    links: tuple[LinkFit, ...] = ()
    #: two ops timed alone and together (``cost.pairs``), optional in the file
    pairs: tuple[PairTiming, ...] = ()
    source: str = field(default="<memory>", compare=False)

    # -- I/O -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        prof = self.profile.to_json()
        for k in ("name", "kind", "origin", "notes", "extra"):
            prof.pop(k)
        for k in OPTIONAL_PROFILE:
            if not prof[k]:  # optional: tables without these figures stay as they were
                prof.pop(k)
        links = {"links": [_link_json(f) for f in sorted(self.links, key=lambda f: f.key)]}
        pairs = {"pairs": [_pair_json(p) for p in sorted(self.pairs, key=lambda p: p.key)]}
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "device": dict(self.device),
            "profile": prof,
            "entries": [_entry_json(e) for e in sorted(self.entries, key=lambda e: e.key)],
            "skipped": [asdict(s) for s in sorted(self.skipped, key=lambda s: (s.op, s.signature))],
            **(links if self.links else {}),
            **(pairs if self.pairs else {}),
        }

    def digest(self) -> str:
        """SHA-256 of the table's content (not its file name): a recalibrated table differs.

        >>> t = CostTable.from_profile()
        >>> t.digest() == CostTable.from_profile().digest() != CostTable.from_profile(
        ...     replace(GENERIC_CPU, record_wait_us=11.0)).digest()
        True
        """
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    def save(self, path: str | os.PathLike) -> Path:
        """Write the table as indented JSON (atomically: a crash leaves the old file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, expect_kind: str | None = None) -> CostTable:
        """Read and validate a table file; ``expect_kind`` rejects another device's table."""
        path = Path(path)
        source = str(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise FileNotFoundError(f"cost table {source} does not exist") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TableError(source, "", f"is not valid JSON (corrupt or truncated?): {exc}") from None
        table = cls.from_json(data, source=source)
        if expect_kind is not None and table.device["kind"] != expect_kind:
            raise TableError(source, "device.kind",
                             f"the table was made for a {table.device['kind']!r} device "
                             f"({table.device['name']}), not {expect_kind!r}; calibrate one for "
                             f"this device with `autostream calibrate --device {expect_kind}`")
        return table

    @classmethod
    def from_json(cls, data: Any, source: str = "<memory>") -> CostTable:
        """Validate parsed JSON into a table (see ``cost_models/README.md``)."""
        v = _Validator(source)
        v.mapping(data, "")
        if data.get("schema") != SCHEMA:
            raise TableError(source, "schema", f"is {data.get('schema')!r}, expected {SCHEMA!r}: "
                             "not an autostream cost table")
        version = data.get("version")
        if version != VERSION:
            raise TableError(source, "version", f"unknown schema version {version!r}; this "
                             f"autostream reads version {VERSION} (upgrade autostream or recalibrate)")
        dev = v.mapping(v.get(data, "device", ""), "device")
        name = v.string(v.get(dev, "name", "device"), "device.name")
        kind = v.choice(v.get(dev, "kind", "device"), "device.kind", KINDS)
        origin = v.choice(v.get(dev, "origin", "device"), "device.origin", ORIGINS)
        prof = v.mapping(v.get(data, "profile", ""), "profile")
        peaks = v.mapping(v.get(prof, "peak_flops", "profile"), "profile.peak_flops")
        if not peaks:
            raise TableError(source, "profile.peak_flops", "is empty; give at least 'f32'")
        profile = DeviceProfile(
            name=name, kind=kind, origin=origin,
            peak_flops={k: v.positive(x, f"profile.peak_flops.{k}") for k, x in peaks.items()},
            bandwidth=v.positive(v.get(prof, "bandwidth", "profile"), "profile.bandwidth"),
            launch_overhead_us=v.time(v.get(prof, "launch_overhead_us", "profile"),
                                      "profile.launch_overhead_us"),
            record_wait_us=v.time(v.get(prof, "record_wait_us", "profile"), "profile.record_wait_us"),
            stream_switch_us=v.time(v.get(prof, "stream_switch_us", "profile"),
                                    "profile.stream_switch_us"),
            # optional: tables written before it was measured read as 0
            runtime_op_us=v.time(prof.get("runtime_op_us", 0.0), "profile.runtime_op_us"),
            runtime_call_us=v.time(prof.get("runtime_call_us", 0.0), "profile.runtime_call_us"),
            runtime_segment_us=v.time(prof.get("runtime_segment_us", 0.0),
                                      "profile.runtime_segment_us"),
            compile_call_us=v.time(prof.get("compile_call_us", 0.0), "profile.compile_call_us"),
            link_bandwidth=v.time(prof.get("link_bandwidth", 0.0), "profile.link_bandwidth"),
            link_latency_us=v.time(prof.get("link_latency_us", 0.0), "profile.link_latency_us"),
            link_share=v.unit(prof.get("link_share", 0.0), "profile.link_share"),
            cores={k: int(v.positive(n, f"profile.cores.{k}"))
                   for k, n in v.mapping(prof.get("cores", {}), "profile.cores").items()},
            cores_source=str(prof.get("cores_source", "")),
            graph_kernel_us=v.time(prof.get("graph_kernel_us", 0.0), "profile.graph_kernel_us"),
            graph_sync_us=v.time(prof.get("graph_sync_us", 0.0), "profile.graph_sync_us"),
            graph_call_us=v.time(prof.get("graph_call_us", 0.0), "profile.graph_call_us"),
            notes=str(dev.get("notes", "")),
        )
        entries = []
        seen: dict[tuple[str, str], int] = {}
        for i, e in enumerate(v.sequence(data.get("entries", []), "entries")):
            f = f"entries[{i}]"
            v.mapping(e, f)
            entry = Entry(
                op=v.string(v.get(e, "op", f), f"{f}.op"),
                signature=v.string(v.get(e, "signature", f), f"{f}.signature", empty=True),
                dtype=v.string(v.get(e, "dtype", f), f"{f}.dtype"),
                flops=int(v.time(v.get(e, "flops", f), f"{f}.flops")),
                bytes=int(v.time(v.get(e, "bytes", f), f"{f}.bytes")),
                median_us=v.time(v.get(e, "median_us", f), f"{f}.median_us"),
                spread_us=v.time(v.get(e, "spread_us", f), f"{f}.spread_us"),
                samples=int(v.positive(v.get(e, "samples", f), f"{f}.samples")),
                share=v.unit(v.get(e, "share", f), f"{f}.share"),
                slowdown=v.time(e.get("slowdown", 1.0), f"{f}.slowdown"),
                split=v.positive(e.get("split", 1.0), f"{f}.split"),
                flop_formula=bool(e.get("flop_formula", False)),
                timing=v.choice(e.get("timing", "isolated"), f"{f}.timing", TIMINGS),
                isolated_us=(None if e.get("isolated_us") is None
                             else v.time(e["isolated_us"], f"{f}.isolated_us")),
                time_us=v.time(e.get("time_us", e["median_us"]), f"{f}.time_us"),
                provenance=v.choice(e.get("provenance", "microbenchmark"), f"{f}.provenance",
                                    PROVENANCES),
            )
            if entry.key in seen:
                raise TableError(source, f"{f}.signature",
                                 f"duplicates entries[{seen[entry.key]}] ({entry.op}({entry.signature}))")
            seen[entry.key] = i
            entries.append(entry)
        skipped = []
        for i, s in enumerate(v.sequence(data.get("skipped", []), "skipped")):
            f = f"skipped[{i}]"
            v.mapping(s, f)
            skipped.append(Skipped(v.string(v.get(s, "op", f), f"{f}.op"),
                                   v.string(v.get(s, "signature", f), f"{f}.signature", empty=True),
                                   v.string(v.get(s, "reason", f), f"{f}.reason")))
        links = tuple(_read_link(v, x, f"links[{i}]")
                      for i, x in enumerate(v.sequence(data.get("links", []), "links")))
        seen_links: dict[tuple[str, str, int], int] = {}
        for i, fit in enumerate(links):
            if fit.key in seen_links:
                raise TableError(source, f"links[{i}]", f"duplicates links[{seen_links[fit.key]}] "
                                 f"({fit.collective} on {fit.backend}, {fit.world_size} ranks)")
            seen_links[fit.key] = i
        pairs = tuple(_read_pair(v, x, f"pairs[{i}]")
                      for i, x in enumerate(v.sequence(data.get("pairs", []), "pairs")))
        seen_pairs: dict[tuple[tuple[str, str], tuple[str, str]], int] = {}
        for i, pair in enumerate(pairs):
            if pair.key in seen_pairs:
                raise TableError(source, f"pairs[{i}]", f"duplicates pairs[{seen_pairs[pair.key]}]")
            seen_pairs[pair.key] = i
        return cls(device=dict(dev), profile=profile, entries=tuple(entries),
                   skipped=tuple(skipped), links=links, pairs=pairs, source=source)

    # -- combining -------------------------------------------------------------------
    def merged(self, newer: CostTable) -> CostTable:
        """This table updated with ``newer``'s entries, device and profile.

        Entries of the same signature are replaced by the newer measurement; a skip
        is dropped once the signature has an entry.  Tables of different device
        kinds or names do not merge.
        """
        for k in ("kind", "name"):
            if self.device.get(k) != newer.device.get(k):
                raise TableError(self.source, f"device.{k}",
                                 f"is {self.device.get(k)!r} but the new measurements are for "
                                 f"{newer.device.get(k)!r}; merge only tables of one device")
        entries = {e.key: e for e in self.entries}
        entries.update({e.key: e for e in newer.entries})
        skipped = {(s.op, s.signature): s for s in (*self.skipped, *newer.skipped)}
        skipped = {k: s for k, s in skipped.items() if k not in entries}
        device = dict(newer.device)
        models = set(self.device.get("models", ())) | set(newer.device.get("models", ()))
        if models:
            device["models"] = sorted(models)
        links = {f.key: f for f in (*self.links, *newer.links)}
        pairs = {p.key: p for p in (*self.pairs, *newer.pairs)}
        return replace(newer, device=device, entries=tuple(entries.values()),
                       skipped=tuple(skipped.values()), links=tuple(links.values()),
                       pairs=tuple(pairs.values()))

    def with_links(self, fits: Iterable[LinkFit]) -> CostTable:
        """This table with ``fits`` added (a fit of the same collective, backend and world
        size replaces the old one); entries, profile and device unchanged."""
        links = {f.key: f for f in (*self.links, *fits)}
        return replace(self, links=tuple(links.values()))

    @classmethod
    def from_profile(cls, profile: DeviceProfile = GENERIC_CPU, **device: Any) -> CostTable:
        """A table with no measurements: every estimate will be a roofline."""
        dev = {"name": profile.name, "kind": profile.kind, "origin": profile.origin,
               "notes": profile.notes, **device}
        return cls(device=dev, profile=profile)


def _entry_json(e: Entry) -> dict[str, Any]:
    out = asdict(e)
    if e.provenance == "microbenchmark":  # optional: tables written before it stay as they were
        out.pop("provenance")
    return out


def _link_json(fit: LinkFit) -> dict[str, Any]:
    out = asdict(fit)
    out["sizes"] = list(fit.sizes)
    return out


def _pair_json(p: PairTiming) -> dict[str, Any]:
    return {"a": list(p.a), "b": list(p.b), "a_us": p.a_us, "b_us": p.b_us,
            "together_us": p.together_us, "a_calls": p.a_calls, "b_calls": p.b_calls}


def _read_pair(v: _Validator, x: Any, f: str) -> PairTiming:
    v.mapping(x, f)

    def op(name: str) -> tuple[str, str]:
        key = v.sequence(v.get(x, name, f), f"{f}.{name}")
        if len(key) != 2:
            raise v.fail(f"{f}.{name}", f"must be [op, signature], got {key!r}")
        return (v.string(key[0], f"{f}.{name}[0]"), v.string(key[1], f"{f}.{name}[1]", empty=True))

    return PairTiming(
        a=op("a"), b=op("b"),
        a_us=v.positive(v.get(x, "a_us", f), f"{f}.a_us"),
        b_us=v.positive(v.get(x, "b_us", f), f"{f}.b_us"),
        together_us=v.positive(v.get(x, "together_us", f), f"{f}.together_us"),
        a_calls=int(v.time(x.get("a_calls", 0), f"{f}.a_calls")),
        b_calls=int(v.time(x.get("b_calls", 0), f"{f}.b_calls")),
    )


def _read_link(v: _Validator, x: Any, f: str) -> LinkFit:
    v.mapping(x, f)
    sizes = v.sequence(x.get("sizes", [0, 0]), f"{f}.sizes")
    if len(sizes) != 2:
        raise v.fail(f"{f}.sizes", f"must be [smallest, largest] message bytes, got {sizes!r}")
    return LinkFit(
        collective=v.choice(v.get(x, "collective", f), f"{f}.collective", COLLECTIVES),
        backend=v.string(v.get(x, "backend", f), f"{f}.backend"),
        world_size=int(v.positive(v.get(x, "world_size", f), f"{f}.world_size")),
        alpha_us=v.time(v.get(x, "alpha_us", f), f"{f}.alpha_us"),
        bandwidth=v.positive(v.get(x, "bandwidth", f), f"{f}.bandwidth"),
        share=v.unit(x.get("share", 0.0), f"{f}.share"),
        origin=v.choice(x.get("origin", "measured"), f"{f}.origin", ORIGINS),
        samples=int(v.time(x.get("samples", 0), f"{f}.samples")),
        sizes=(int(v.time(sizes[0], f"{f}.sizes[0]")), int(v.time(sizes[1], f"{f}.sizes[1]"))),
        max_error=v.time(x.get("max_error", 0.0), f"{f}.max_error"),
        provenance=dict(v.mapping(x.get("provenance", {}), f"{f}.provenance")),
    )


class _Validator:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, f: str, problem: str) -> TableError:
        return TableError(self.source, f, problem)

    def get(self, m: Mapping, key: str, parent: str) -> Any:
        if key not in m:
            raise self.fail(f"{parent}.{key}" if parent else key, "is missing")
        return m[key]

    def mapping(self, x: Any, f: str) -> Mapping:
        if not isinstance(x, Mapping):
            raise self.fail(f, f"must be a JSON object, got {type(x).__name__}")
        return x

    def sequence(self, x: Any, f: str) -> Iterable:
        if not isinstance(x, list):
            raise self.fail(f, f"must be a JSON list, got {type(x).__name__}")
        return x

    def string(self, x: Any, f: str, empty: bool = False) -> str:
        if not isinstance(x, str) or (not empty and not x):
            raise self.fail(f, f"must be a non-empty string, got {x!r}")
        return x

    def choice(self, x: Any, f: str, options: tuple[str, ...]) -> str:
        if x not in options:
            raise self.fail(f, f"is {x!r}; expected one of {', '.join(options)}")
        return x

    def number(self, x: Any, f: str) -> float:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise self.fail(f, f"must be a finite number, got {x!r}")
        return float(x)

    def time(self, x: Any, f: str) -> float:
        x = self.number(x, f)
        if x < 0:
            raise self.fail(f, f"is negative ({x}); times and counts must be >= 0")
        return x

    def positive(self, x: Any, f: str) -> float:
        x = self.number(x, f)
        if x <= 0:
            raise self.fail(f, f"must be > 0, got {x}")
        return x

    def unit(self, x: Any, f: str) -> float:
        x = self.number(x, f)
        if not 0.0 <= x <= 1.0:
            raise self.fail(f, f"is {x}; a device share lies in [0, 1]")
        return x


def median_table(tables: Sequence[CostTable]) -> CostTable:
    """One table from several calibrations of the same models: per entry and per profile
    field, the median of the measured numbers (samples add up).

    Calibrations run back to back on a shared machine can differ enough in op times
    and shares to flip a plan; the median of several runs is steadier.

    >>> t = CostTable.load(Path(__file__).parents[2] / "cost_models" / "cpu.json")
    >>> slow = replace(t, entries=tuple(replace(e, time_us=3 * e.time_us) for e in t.entries))
    >>> m = median_table([t, slow, t])
    >>> m.entries[0].time_us == t.entries[0].time_us, m.device["settings"]["runs"]
    (True, 3)
    """
    if not tables:
        raise ValueError("median_table needs at least one table")
    first = tables[0]
    kinds = {t.profile.kind for t in tables}
    if len(kinds) > 1:
        raise ValueError(f"tables for different device kinds {sorted(kinds)} cannot be combined")

    def med(values: Iterable[float | None]) -> float | None:
        xs = sorted(v for v in values if v is not None)
        return statistics.median(xs) if xs else None

    by_key: dict[tuple[str, str], list[Entry]] = {}
    for t in tables:
        for e in t.entries:
            by_key.setdefault(e.key, []).append(e)
    entries = []
    for group in by_key.values():
        numeric = {f: med(getattr(e, f) for e in group)
                   for f in ("median_us", "spread_us", "share", "slowdown", "split", "time_us",
                             "isolated_us")}
        entries.append(replace(group[0], samples=sum(e.samples for e in group), **numeric))
    profiles = [t.profile for t in tables]
    peaks = {k: med(p.peak_flops.get(k) for p in profiles) for k in first.profile.peak_flops}
    profile = replace(first.profile, peak_flops=peaks, **{
        f: med(getattr(p, f) for p in profiles)
        for f in ("bandwidth", "launch_overhead_us", "record_wait_us", "stream_switch_us",
                  "runtime_op_us", "runtime_call_us", "runtime_segment_us", "compile_call_us",
                  "link_bandwidth", "link_latency_us", "link_share", "graph_kernel_us",
                  "graph_sync_us", "graph_call_us")})
    device = dict(first.device)
    device["settings"] = {**device.get("settings", {}), "runs": len(tables)}
    skipped = {(s.op, s.signature): s for t in tables for s in t.skipped
               if (s.op, s.signature) not in by_key}
    pairs_by_key: dict[tuple[tuple[str, str], tuple[str, str]], list[PairTiming]] = {}
    for t in tables:
        for p in t.pairs:
            pairs_by_key.setdefault(p.key, []).append(p)
    pairs = tuple(replace(group[0], **{f: med(getattr(p, f) for p in group)
                                       for f in ("a_us", "b_us", "together_us")})
                  for group in pairs_by_key.values())
    return CostTable(device=device, profile=profile, entries=tuple(entries),
                     skipped=tuple(skipped.values()), links=first.links, pairs=pairs)
