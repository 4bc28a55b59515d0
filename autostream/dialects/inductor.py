"""Inductor's own stream dialect: a plan as ``node.meta["custom"]["stream"]`` and
``torch.ops.streams.wait_stream``, for ``AutoStreamPass(inductor_streams=True)`` as
Inductor's ``post_grad_custom_post_pass``.

What Inductor reads (torch 2.13; ``docs/inductor.md`` has the file:line of each):

- a node's stream is the index of a Dynamo "graph-created object"; lowering tags every
  IR node with it and the scheduler maps it to ``stream<k>`` of the wrapper, which fetches
  the object with ``get_external_object_by_index``.  The pass registers its side streams
  with ``register_graph_created_object`` while the frame compiles; Dynamo then emits
  bytecode that rebuilds the table before every call.  The objects come from one
  persistent pool (:func:`pooled_stream`), so every call and every graph of a process
  runs on the same few streams.  Index 0 is the current stream (Dynamo registers it).
- a sync is ``wait_stream(waiting, waited_on)``: Inductor orders it after the waited-on
  stream's earlier nodes and before the waiting stream's later ones once it is wrapped in
  AOTAutograd's ``control_deps`` (``record_event``/``wait_event`` are not ordered against
  the consumers, so they are not used).  ``wait_stream`` waits for all earlier work of
  the waited-on stream, at least what the plan's event would: syncs are placed with
  vector clocks, so a stream never waits twice for the same work.
- a tensor read on a stream other than its producer's gets ``streams.record_stream(t,
  reader)`` (placed after the joins; Inductor's scheduler may move it earlier, which is
  still before the tensor is freed), so the caching allocator does not hand its memory
  to the producer's stream while the reader may still read it.  Inductor's own buffer
  reuse (``bufB = bufA; del bufA  # reuse``) ignores streams in torch 2.13, so the pass
  needs ``allow_buffer_reuse=False``.  :func:`wrapper_structure` lists every touch of a
  buffer on one stream after a touch on another with no wait between, in a generated
  wrapper: Inductor's allocation and fusion can still produce such touches (see
  ``docs/inductor.md``), which is why the option is off by default.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.fx

from autostream.dialects.rewrite import inputs_first
from autostream.scheduling.schedule import JOIN, Schedule, Sync
from autostream.scheduling.sync import group_waits

#: Dynamo registers the frame's current stream at this index on an accelerator
#: (``torch/_dynamo/variables/streams.py``, ``SymbolicStreamState``)
MAIN_INDEX = 0
#: the devices whose wrapper Inductor runs multi-stream (the CPU wrapper never defines the
#: streams it enters: it raises ``NameError: stream1``)
STREAM_DEVICES = ("cuda",)

# Streams must outlive every compiled frame that fetches them, and equal slots must give
# the same stream on every call: one process-wide pool, filled on first use.
_POOL: dict[tuple[str, int], torch.Stream] = {}


def pooled_stream(device: str, slot: int) -> torch.Stream:
    """The pool's stream ``slot`` of ``device`` (created once per process).

    >>> pooled_stream("cpu", 1) is pooled_stream("cpu", 1)
    True
    """
    key = (str(torch.device(device)), slot)
    if key not in _POOL:
        _POOL[key] = torch.Stream(device=torch.device(device))
    return _POOL[key]


def missing_support() -> tuple[str, ...]:
    """The pieces of Inductor's multi-stream support this torch lacks (empty: none).

    >>> isinstance(missing_support(), tuple)
    True
    """
    missing = []
    try:
        import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams)
    except ImportError:
        missing.append("torch._dynamo.variables.streams")
    for op in ("wait_stream", "record_stream"):
        if not hasattr(getattr(torch.ops, "streams", None), op):
            missing.append(f"torch.ops.streams.{op}")
    try:
        from torch._dynamo import graph_bytecode_inputs as gbi
        if not hasattr(gbi, "register_graph_created_object"):
            missing.append("graph_bytecode_inputs.register_graph_created_object")
    except ImportError:
        missing.append("torch._dynamo.graph_bytecode_inputs")
    from torch._inductor import scheduler
    if not hasattr(scheduler.Scheduler, "_populate_stream_assignments"):
        missing.append("Scheduler._populate_stream_assignments")
    try:
        from torch._functorch._aot_autograd import streams as aot_streams
        if not hasattr(aot_streams, "wrap_all_sync_nodes_with_control_deps"):
            missing.append("wrap_all_sync_nodes_with_control_deps")
    except ImportError:
        missing.append("torch._functorch._aot_autograd.streams")
    return tuple(missing)


def is_backward(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` is an AOTAutograd backward graph (it takes tangents)."""
    return any(n.name.startswith("tangents_") for n in graph.find_nodes(op="placeholder"))


def refusal(graph: torch.fx.Graph, device_type: str) -> str | None:
    """Why the pass must leave this Inductor graph unchanged, or ``None``."""
    missing = missing_support()
    if missing:
        return (f"this torch ({torch.__version__}) has no multi-stream Inductor (missing: "
                f"{', '.join(missing)}); it is there from torch 2.13")
    from torch._inductor import config
    if config.cpp_wrapper:
        return ("Inductor's cpp_wrapper does not fetch the pass's streams; compile with "
                "the Python wrapper (cpp_wrapper=False) to get streams")
    if config.allow_buffer_reuse:
        return ("Inductor's wrapper reuses a buffer freed on one stream for another stream "
                "without a sync (torch 2.13); compile with options={'allow_buffer_reuse': "
                "False} to get streams (the caching allocator still recycles memory, "
                "stream-safely)")
    if device_type not in STREAM_DEVICES:
        return (f"the graph runs on {device_type}, which has no streams in Inductor's "
                f"wrapper (only {', '.join(STREAM_DEVICES)})")
    if is_backward(graph):
        return ("a backward graph compiles lazily, after the frame's bytecode that "
                "rebuilds the streams exists, so streams registered then are lost; "
                "forward and inference graphs are planned")
    return None


def _constructor(device: str, slot: int):
    """Bytecode (Dynamo's ``PyCodegen``) that pushes ``pooled_stream(device, slot)``."""

    def construct(index: int, cg) -> None:
        from torch._dynamo.bytecode_transformation import create_call_function

        cg.add_push_null(lambda: cg.load_import_from(__name__, "pooled_stream"))
        cg.extend_output([cg.create_load_const(device), cg.create_load_const(slot)])
        cg.extend_output(create_call_function(2, False))

    return construct


def register_streams(device: torch.device, side_streams: int) -> dict[int, int]:
    """Plan stream -> Dynamo object index: 0 -> the current stream, and ``side_streams``
    pool streams registered with ``register_graph_created_object`` (call it while the
    frame compiles).  Raises ``RuntimeError`` when index 0 is not a stream."""
    from torch._dynamo import graph_bytecode_inputs as gbi

    dev = str(device)
    ref = gbi.index_to_external_object_weakref.get(MAIN_INDEX)
    if ref is None and not gbi.index_to_bytecode_constructor:
        # Dynamo registers the current stream only when an accelerator is available
        if device.type == "cpu":  # the CPU structure checks: a stand-in for it
            main = gbi.register_graph_created_object(pooled_stream(dev, 0),
                                                     _constructor(dev, 0))
        else:  # the current stream, fetched by Dynamo's bytecode on every call
            from torch._dynamo.variables.streams import get_current_stream

            main = get_current_stream(device)
    else:
        main = MAIN_INDEX
    obj = gbi.index_to_external_object_weakref[main]()
    if main != MAIN_INDEX or not isinstance(obj, torch.Stream):
        raise RuntimeError(f"Dynamo's object {MAIN_INDEX} is {obj!r}, not the current "
                           f"stream")
    indices = {0: MAIN_INDEX}
    for slot in range(1, side_streams + 1):
        indices[slot] = gbi.register_graph_created_object(pooled_stream(dev, slot),
                                                          _constructor(dev, slot))
    return indices


@dataclass(frozen=True)
class InductorRewrite:
    """What :func:`rewrite_for_inductor` put in the graph."""

    #: plan stream -> Dynamo object index
    stream_index: dict[int, int]
    waits: tuple[tuple[int, int], ...]  # (waiting, waited_on) object indices, in order
    recorded: tuple[str, ...]  # nodes given record_stream for a stream that reads them
    annotated: int = 0  # nodes given a side stream

    def summary(self) -> str:
        n = len(self.waits)
        return (f"{len(self.stream_index)} streams (objects "
                f"{sorted(self.stream_index.values())}), {n} wait_stream{'s' * (n != 1)}, "
                f"record_stream for {len(self.recorded)} cross-stream tensor"
                f"{'s' * (len(self.recorded) != 1)}")


def _set_stream(node: torch.fx.Node, index: int | None) -> None:
    if index is None:
        return
    custom = node.meta.setdefault("custom", {})
    custom["stream"] = index


def rewrite_for_inductor(gm: torch.fx.GraphModule, schedule: Schedule, syncs: Sequence[Sync],
                         stream_index: dict[int, int]) -> InductorRewrite:
    """Reorder ``gm.graph`` to the schedule's launch order, tag side-stream nodes, insert
    the ``wait_stream`` syncs and the ``record_stream`` calls, and wrap the syncs
    in ``control_deps``.  Main-stream nodes stay untagged (Inductor's default stream)."""
    from torch._functorch._aot_autograd.streams import wrap_all_sync_nodes_with_control_deps

    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    launched = [n for n in schedule.order if schedule.stream_of[n] >= 0]
    if any(schedule.stream_of[n] < 0 for n in schedule.order):
        raise ValueError("the schedule has lane tasks (transfers); Inductor streams take "
                         "graphs without collectives")
    streams = sorted({schedule.stream_of[n] for n in launched})
    tag = {s: (None if s == 0 else stream_index[s]) for s in streams}
    waits_for = group_waits(syncs)

    output, cursor = inputs_first(graph)

    pos: dict[str, int] = {}
    # covered[s][t]: the last launch position on stream t that stream s has waited for
    covered = {s: dict.fromkeys(streams, -1) for s in streams}
    last_on = dict.fromkeys(streams, -1)
    waits: list[tuple[int, int]] = []

    def wait(s: int, t: int, at: int) -> None:
        nonlocal cursor
        with graph.inserting_after(cursor):
            w = graph.call_function(torch.ops.streams.wait_stream.default,
                                    (stream_index[s], stream_index[t]))
        _set_stream(w, tag[s])
        cursor = w
        waits.append((stream_index[s], stream_index[t]))
        for u in streams:
            covered[s][u] = max(covered[s][u], covered[t][u])
        covered[s][t] = at

    started: set[int] = set()
    for i, name in enumerate(launched):
        s = schedule.stream_of[name]
        if s != 0 and s not in started:  # a side stream forks from the current one:
            wait(s, 0, i)                # inputs come from work launched before the graph
        started.add(s)
        for p in waits_for.get(name, ()):
            t = schedule.stream_of[p]
            if t != s and covered[s][t] < pos[p]:
                wait(s, t, i)
        node = by_name[name]
        _set_stream(node, tag[s])
        cursor.append(node)
        cursor = node
        pos[name] = last_on[s] = i
    end = len(launched)
    for t in streams:  # join: the main stream waits for every side stream's last op
        if t != 0 and covered[0][t] < last_on[t]:
            wait(0, t, end)
    kept = _keep_alive(graph, schedule, stream_index, by_name, launched, cursor)
    cursor = kept[-1] if kept else cursor
    cursor.append(output)
    graph.lint()
    if waits:
        wrap_all_sync_nodes_with_control_deps(gm)
    gm.recompile()
    annotated = sum(1 for n in launched if schedule.stream_of[n] != 0)
    return InductorRewrite(dict(stream_index), tuple(waits),
                           tuple(dict.fromkeys(n.args[0].name for n in kept)), annotated)


def _keep_alive(graph: torch.fx.Graph, schedule: Schedule, stream_index: dict[int, int],
                by_name: dict[str, torch.fx.Node], launched: list[str],
                cursor: torch.fx.Node) -> list[torch.fx.Node]:
    """``record_stream(t, s)`` after the joins for each tensor ``t`` a stream ``s`` reads
    that did not produce it (graph inputs count as the main stream's)."""
    stream_of = {n: schedule.stream_of[n] for n in launched}
    added = []
    for node in list(graph.nodes):
        if node.op not in ("placeholder", "call_function") or node.name == JOIN:
            continue
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        own = stream_of.get(node.name, 0)
        readers = sorted({stream_of[u.name] for u in node.users if u.name in stream_of}
                         - {own})
        for s in readers:
            with graph.inserting_after(cursor):
                r = graph.call_function(torch.ops.streams.record_stream.default,
                                        (node, stream_index[s]))
            cursor = r
            added.append(r)
    return added


# -- checking the generated Python wrapper ---------------------------------------------

_WITH = re.compile(r"^\s*with (default_stream|stream\d+):\s*$")
_WAIT = re.compile(r"torch\.ops\.streams\.wait_stream\.default\((\d+), (\d+)\)")
_REUSE = re.compile(r"^\s*(buf\d+) = (buf\d+); del \2\s+# reuse")
_ALIAS = re.compile(r"^\s*(buf\d+) = reinterpret_tensor\((buf\d+),")
_BUF = re.compile(r"\bbuf\d+\b")
_FETCH = re.compile(r"(stream\d+) = get_external_object_by_index\((\d+)\)")


@dataclass
class WrapperStructure:
    """The stream structure of an Inductor Python wrapper's ``call``, as written.

    ``blocks``: (stream, lines) per ``with <stream>:`` block, in order; ``waits``:
    (block's stream, waiting object, waited-on object); ``reuses``: (new, old, new's
    stream, streams that touched old); ``fetched``: wrapper stream -> Dynamo object index;
    ``hazards``: (buffer, stream, line, other stream, its line) for each touch of a buffer
    (its storage: reuses and ``reinterpret_tensor`` aliases included) on one stream after
    a touch on another with no ``wait_stream`` between (a wait waits transitively);
    ``checked``: cross-stream touch pairs checked.
    """

    blocks: list[tuple[str, list[str]]] = field(default_factory=list)
    waits: list[tuple[str, int, int]] = field(default_factory=list)
    reuses: list[tuple[str, str, str, tuple[str, ...]]] = field(default_factory=list)
    fetched: dict[str, int] = field(default_factory=dict)
    hazards: list[tuple[str, str, int, str, int]] = field(default_factory=list)
    checked: int = 0

    @property
    def switches(self) -> int:
        """Stream context entries after the first."""
        return max(len(self.blocks) - 1, 0)

    def kernels_per_stream(self) -> dict[str, int]:
        """Kernel launches (calls that are not allocations, syncs or frees) per stream."""
        out: dict[str, int] = {}
        for stream, lines in self.blocks:
            out[stream] = out.get(stream, 0) + sum(1 for ln in lines if _is_launch(ln))
        return out


def _is_launch(line: str) -> bool:
    s = line.strip()
    if s.startswith(("#", "del ", "return", "torch.ops.streams", "assert_")):
        return False
    return bool(re.match(r"^[\w.]+\(", s))


def wrapper_structure(code: str, objects: dict[int, str] | None = None) -> WrapperStructure:
    """Parse an Inductor Python wrapper for its stream blocks, waits, reuses and hazards.

    ``objects``: Dynamo object index -> wrapper stream name, where the wrapper does not
    fetch its streams itself (the CPU wrapper; the scheduler's
    ``stream_idx_to_user_obj_idx`` has them); index 0 is ``default_stream``.

    >>> src = ("with default_stream:\\n    buf0 = f()\\nwith stream1:\\n"
    ...        "    torch.ops.streams.wait_stream.default(1, 0)\\n    k(buf0)\\n")
    >>> s = wrapper_structure(src, {1: "stream1"})
    >>> (s.switches, s.waits, s.kernels_per_stream(), s.hazards, s.checked)
    (1, [('stream1', 1, 0)], {'default_stream': 0, 'stream1': 1}, [], 1)
    """
    out = WrapperStructure()
    names = {0: "default_stream", **(objects or {})}
    for m in _FETCH.finditer(code):
        out.fetched[m.group(1)] = int(m.group(2))
        names[int(m.group(2))] = m.group(1)
    root: dict[str, str] = {}
    touched: dict[str, dict[str, int]] = {}  # storage -> stream -> last line touching it
    seen: dict[str, dict[str, int]] = {}  # stream -> stream -> last line waited for
    stream = None

    def storage(buf: str) -> str:
        while buf in root:
            buf = root[buf]
        return buf

    for lineno, line in enumerate(code.splitlines()):
        w = _WITH.match(line)
        if w:
            stream = w.group(1)
            out.blocks.append((stream, []))
            continue
        if stream is None or not line.strip() or line.strip().startswith(("#", "del ")):
            continue
        out.blocks[-1][1].append(line)
        m = _WAIT.search(line)
        if m:
            waiting, waited = int(m.group(1)), int(m.group(2))
            out.waits.append((stream, waiting, waited))
            a, b = names.get(waiting, stream), names.get(waited, f"object{waited}")
            mine = seen.setdefault(a, {})
            for u, at in seen.get(b, {}).items():
                mine[u] = max(mine.get(u, -1), at)
            mine[b] = lineno
            continue
        if line.strip().startswith(("torch.ops.streams", "return")):
            continue  # record_stream and the return touch no memory on a stream
        r = _REUSE.match(line) or _ALIAS.match(line)
        if r:
            root[r.group(1)] = r.group(2)
            if _REUSE.match(line):
                out.reuses.append((r.group(1), r.group(2), stream,
                                   tuple(sorted(touched.get(storage(r.group(2)), {})))))
        for buf in dict.fromkeys(_BUF.findall(line)):
            where = touched.setdefault(storage(buf), {})
            for other, at in where.items():
                if other == stream:
                    continue
                out.checked += 1
                if seen.get(stream, {}).get(other, -1) < at:
                    out.hazards.append((buf, stream, lineno, other, at))
            where[stream] = lineno
    return out
