"""Compile a model the way a TorchAir user does, and keep what TorchAir made of each graph.

``torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config))``, or
torch-npu's ``npugraph_ex`` backend with the pass in ``options=``, run TorchAir 2.14's own
Python code end to end: its decompositions, ``aot_module_simplified`` with
``keep_inference_input_mutations``, its forward, backward and inference compilers, and the
pass called by ``_optimize_fx`` with TorchAir's graph and config.  Only the last step is
replaced: where TorchAir would hand the lowered program to the NPU runtime, the harness keeps
the program (:class:`experiments.torchair_real.Lowered`) and runs the graph the pass wrote
on the CPU instead, so that the compiled model's outputs can be compared.

``npugraph_ex`` is registered as torch-npu registers it (``torch_npu/dynamo/__init__.py``
``_exec``: a ``CompilerConfig`` of ``npugraph_ex``'s own package with ``mode =
"npugraph_ex"``, then its ``get_npu_backend``).  Importing TorchAir changes the process
(``torch.ops.air``), so this is for the conformance harness and its tests only.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from experiments.torchair_real import (
    Lowered,
    fetch_torchair,
    install_standin_converters,
    load_torchair,
)

#: the entries a user compiles through: TorchAir's ``get_npu_backend`` and torch-npu's
#: ``npugraph_ex`` backend (``options={"post_grad_custom_pre_pass": ...}``)
ENTRIES = ("get_npu_backend", "npugraph_ex")


@dataclasses.dataclass
class Compiled:
    """One graph TorchAir compiled: its phase (``forward`` or ``backward``; an inference
    graph is a ``forward``), the lowered program, the graph as the pass left it (what runs
    here), and the pass's report when the pass keeps one."""

    phase: str
    lowered: Lowered
    before_pass: torch.fx.GraphModule
    after_pass: torch.fx.GraphModule
    report: Any = None


@dataclasses.dataclass
class _Recording:
    """The custom pass TorchAir is given: runs ``inner``, keeps a copy of the graph it left."""

    inner: Any
    seen: list = dataclasses.field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any = None,
                 config: Any = None) -> None:
        from torch.utils._mode_utils import no_dispatch

        with no_dispatch():
            before = copy.deepcopy(gm)
        if self.inner is not None:
            self.inner(gm, example_inputs, config)
        with no_dispatch():
            self.seen.append((before, copy.deepcopy(gm), _report_of(self.inner)))


def _report_of(custom_pass: Any) -> Any:
    """The last report of an ``AutoStreamPass``, through any wrappers (``.inner``)."""
    while custom_pass is not None and not hasattr(custom_pass, "last_report"):
        custom_pass = getattr(custom_pass, "inner", None)
    return getattr(custom_pass, "last_report", None)


def _phase(gm: torch.fx.GraphModule) -> str:
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return "backward" if any(p.startswith("tangents") for p in placeholders) else "forward"


@contextlib.contextmanager
def ge_origins(origin: dict[str, str]) -> Iterator[None]:
    """While active, ``origin`` maps each GE op TorchAir emits to the FX node whose
    conversion emitted it."""
    from torchair._ge_concrete_graph.fx2ge_converter import GeConcreteGraph

    original = GeConcreteGraph.converter_context

    @contextlib.contextmanager
    def recording_context(self, *, node):
        before = len(self._graph.op)
        with original(self, node=node):
            yield
        for op in list(self._graph.op)[before:]:
            origin.setdefault(op.name, node.name)

    GeConcreteGraph.converter_context = recording_context
    try:
        yield
    finally:
        GeConcreteGraph.converter_context = original


def _lowered(concrete: Any, mode: str, origin: dict[str, str]) -> Lowered:
    if mode == "max-autotune":
        return Lowered(mode, concrete.fx_graph, ge_ops=list(concrete._graph.op),
                       ge_origin=dict(origin),
                       output_ref=dict(concrete._graph_output_ref_input or {}))
    return Lowered(mode, concrete.fx_graph, acl_gm=concrete.fx_graph,
                   acl_code=getattr(concrete, "fx_forward", ""))


def lower_as_it_stands(gm: torch.fx.GraphModule, args: list, mode: str) -> Lowered:
    """TorchAir's compiler on a graph as it stands (a hand-placed graph: no AOTAutograd, no
    pass), up to the program it would run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchair._utils.graph_transform_observer import GraphTransformObserver
    from torchair.configs.compiler_config import CompilerConfig
    from torchair.npu_fx_compiler import _NpuFxCompiler

    config = CompilerConfig()
    config.mode = mode
    install_standin_converters(gm)
    origin: dict[str, str] = {}
    fake_mode = FakeTensorMode()
    fake = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    with ge_origins(origin), fake_mode:
        concrete = _NpuFxCompiler(config)._gen_compiled_gm(
            gm, fake, GraphTransformObserver(gm, fake, config))
    return _lowered(concrete, mode, origin)


@contextlib.contextmanager
def _keeping_programs(package: Any, mode: str, recording: _Recording,
                      out: list[Compiled]) -> Iterator[None]:
    """Patch ``_NpuFxCompiler._gen_compiled_gm`` of ``package`` (TorchAir or npugraph_ex):
    run it as shipped, keep the program it made, return the post-pass graph to run."""
    compiler_cls = package.npu_fx_compiler._NpuFxCompiler
    original = compiler_cls._gen_compiled_gm
    ge = mode == "max-autotune"
    origin: dict[str, str] = {}

    def generate(self, gm, example_inputs, observer):
        if ge:
            install_standin_converters(gm)
        origin.clear()
        concrete = original(self, gm, example_inputs, observer)
        before, after, report = recording.seen[-1]
        out.append(Compiled(_phase(gm), _lowered(concrete, mode, origin), before, after,
                            report))
        after.recompile()
        return after

    compiler_cls._gen_compiled_gm = generate
    try:
        with ge_origins(origin) if ge else contextlib.nullcontext():
            yield
    finally:
        compiler_cls._gen_compiled_gm = original


def backend(mode: str, custom_pass: Any, entry: str = "get_npu_backend"
            ) -> tuple[Callable, dict[str, Any], Any, _Recording]:
    """``(backend, options, package, recording)`` for ``torch.compile(model, backend=...,
    options=...)`` as a user writes it for ``entry``."""
    if entry not in ENTRIES:
        raise ValueError(f"unknown TorchAir entry {entry!r}: one of {', '.join(ENTRIES)}")
    root = fetch_torchair()
    recording = _Recording(custom_pass)
    if entry == "npugraph_ex":
        if mode != "npugraph_ex":
            raise ValueError("the npugraph_ex backend compiles in mode 'npugraph_ex' only")
        npugraph_ex = load_torchair(root, "npugraph_ex")

        def npugraph_ex_backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
            config = npugraph_ex.CompilerConfig()
            config.mode = "npugraph_ex"
            return npugraph_ex.get_npu_backend(compiler_config=config)(
                gm, example_inputs, **kwargs)

        return npugraph_ex_backend, {"post_grad_custom_pre_pass": recording}, npugraph_ex, \
            recording
    torchair = load_torchair(root)
    config = torchair.CompilerConfig()
    config.mode = mode
    config.post_grad_custom_pre_pass = recording
    return torchair.get_npu_backend(compiler_config=config), {}, torchair, recording


@dataclasses.dataclass
class FrontDoorRun:
    """What one compiled run gave: every graph TorchAir compiled, and the run's results
    (outputs, then gradients of the parameters for a training step, then the model's
    buffers and the inputs, which a graph may write)."""

    graphs: list[Compiled]
    results: list[torch.Tensor]


def compile_and_run(model: torch.nn.Module, inputs: tuple | list[tuple], mode: str,
                    custom_pass: Any, entry: str = "get_npu_backend", train: bool = False,
                    dynamic: bool | None = None) -> FrontDoorRun:
    """Compile ``model`` through TorchAir's front door with ``custom_pass`` and run it on
    ``inputs`` (a list of input tuples: one call each, e.g. several lengths under
    ``dynamic=True``); a training step when ``train`` (the sum of the outputs, backward).

    ``model`` and ``inputs`` are copied first, so the caller's stay as they were."""
    calls = inputs if isinstance(inputs, list) else [inputs]
    model = copy.deepcopy(model)
    fn, options, package, recording = backend(mode, custom_pass, entry)
    graphs: list[Compiled] = []
    results: list[torch.Tensor] = []
    torch._dynamo.reset()
    with _keeping_programs(package, mode, recording, graphs):
        compiled = torch.compile(model, backend=fn, options=options or None, dynamic=dynamic)
        for call in calls:
            call = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in call)
            with contextlib.nullcontext() if train else torch.no_grad():
                outputs = compiled(*call)
                leaves = [t for t in torch.utils._pytree.tree_leaves(outputs)
                          if isinstance(t, torch.Tensor)]
                if train:
                    sum(t.float().sum() for t in leaves if t.requires_grad).backward()
            results += [t.detach() for t in leaves]
            if train:
                results += [p.grad.clone() for p in model.parameters() if p.grad is not None]
            results += [b.detach().clone() for b in model.buffers()]
            results += [a for a in call if isinstance(a, torch.Tensor)]
    return FrontDoorRun(graphs, results)


def same_results(a: FrontDoorRun, b: FrontDoorRun) -> tuple[int, list[str]]:
    """``(compared, differences)``: the two runs' results bit for bit."""
    if len(a.results) != len(b.results):
        return 0, [f"{len(a.results)} results against {len(b.results)}"]
    differences = [f"result {i}: {x.shape} {x.dtype} differs" for i, (x, y)
                   in enumerate(zip(a.results, b.results))
                   if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y)]
    return len(a.results), differences
