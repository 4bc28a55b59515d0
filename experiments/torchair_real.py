"""TorchAir's real Python source, from the torch-npu wheel, importable on a CPU-only machine.

The wheel (``torch-npu==2.14.0``, about 44 MB) is fetched once with ``pip download`` into a
cache folder and only ``torch_npu/dynamo/torchair`` is unpacked.  What cannot run here is
replaced, and nothing else:

- the native modules ``torchair.core._torchair`` and friends, ``torch_npu`` and ``torch.npu``
  become stub modules whose every attribute is a harmless callable stand-in;
- the pattern-fusion replacements (``patterns/pattern_util.py``) search for sequences of
  ``torch_npu``'s fused ops (``npu.npu_add_rms_norm`` ...), whose schemas live in
  ``torch_npu``'s native library; their registration is skipped (an ATen graph from autostream
  contains none of those ops, so no replacement could fire) while the pass itself still runs;
- ATen ops that have no GE converter on Ascend (CPU-only kernels such as
  ``_scaled_dot_product_flash_attention_for_cpu``), or whose converter is "not implemented",
  get a stand-in converter emitting one GE op ``StandIn_<op>`` over the op's tensor inputs.

Importing TorchAir mutates the process (it registers ``torch.ops.air``), so the loader is
meant for the conformance harness and its tests, never for the library.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

WHEEL_SPEC = "torch-npu==2.14.0"
#: where the wheel and its unpacked TorchAir are cached (override with AUTOSTREAM_TORCHAIR_CACHE)
CACHE_ENV = "AUTOSTREAM_TORCHAIR_CACHE"
_PACKAGE = "torch_npu/dynamo/torchair/"
#: torch-npu's ``npugraph_ex`` backend: a package of its own (ACL graph only), imported as
#: the top-level ``npugraph_ex`` (``torch_npu/dynamo/__init__.py:_exec``)
_NPUGRAPH_EX = "torch_npu/dynamo/npugraph_ex/"
_NATIVE = ("torchair.core._torchair", "torchair.core._npu_graph_executor",
           "torchair.core._npu_utils", "torchair.core._abi_compat_ge_apis")


class TorchAirUnavailable(RuntimeError):
    """The wheel could not be fetched or TorchAir could not be imported from it."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "autostream" / "torchair"
    return Path(os.environ.get(CACHE_ENV, default))


def fetch_torchair(cache: Path | None = None, timeout: float = 300.0) -> Path:
    """The folder holding the unpacked ``torchair`` package (downloading the wheel once).

    Raises :class:`TorchAirUnavailable` saying why when the package index cannot be reached.
    """
    cache = cache or cache_dir()
    root = cache / "unpacked"
    if (root / "torchair" / "__init__.py").exists() \
            and (root / "npugraph_ex" / "__init__.py").exists():
        return root
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("torch_npu-2.14.0-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64",
               WHEEL_SPEC, "-d", str(wheels), "-q"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TorchAirUnavailable(f"pip download {WHEEL_SPEC} failed: {exc}") from None
        found = sorted(wheels.glob("torch_npu-2.14.0-*.whl"))
        if done.returncode != 0 or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise TorchAirUnavailable(f"pip download {WHEEL_SPEC} failed (is the package index "
                                      f"reachable?): {tail[0]}")
    partial = cache / "unpacking"
    with zipfile.ZipFile(found[0]) as wheel:
        for prefix, package in ((_PACKAGE, "torchair"), (_NPUGRAPH_EX, "npugraph_ex")):
            for name in wheel.namelist():
                if name.startswith(prefix) and name.endswith(".py"):
                    target = partial / package / name[len(prefix):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(name))
    if root.exists():  # an older cache without npugraph_ex
        import shutil

        shutil.rmtree(root)
    partial.rename(root)
    return root


class _Anything:
    """Any attribute, any call: what a stubbed native function returns."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return _Anything(f"{self._name}.{key}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything(f"{self._name}()")

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (_StubBase,)


class _StubBase:
    """Base class for TorchAir's subclasses of native classes (``TorchNpuGraphBase`` ...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return _Anything(f"{type(self).__name__}.{key}")


class _StubModule(types.ModuleType):
    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        value = _Anything(f"{self.__name__}.{key}")
        setattr(self, key, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in _NATIVE or name == "torch_npu" or name.startswith("torch_npu."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        return None


def _stream_limit_standins(npu: types.ModuleType) -> None:
    """Named functions for what the ACL graph's ``replace_core_limit_nodes`` puts in the
    graph (``torch.npu.current_stream``, ``get_stream_limit``, ``set_stream_limit``): FX
    names a node by its target's ``__name__``, which a stub has not."""

    def current_stream() -> types.SimpleNamespace:
        # what ``replace_stream_event_pass`` reads of the current stream
        return types.SimpleNamespace(stream_id=0, device_index=0, device_type=20)

    def get_stream_limit(stream: Any) -> dict[str, int]:
        return {"cube_core_num": 0, "vector_core_num": 0}

    def set_stream_limit(stream: Any, cube_core_num: int, vector_core_num: int) -> None:
        return None

    for fn in (current_stream, get_stream_limit, set_stream_limit):
        setattr(npu, fn.__name__, fn)


def load_torchair(root: Path, package: str = "torchair") -> types.ModuleType:
    """Import ``torchair`` (or torch-npu's ``npugraph_ex``) from ``root`` with only its native
    parts stubbed (idempotent)."""
    if package in sys.modules:
        return sys.modules[package]
    import torch

    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
    if not hasattr(torch, "npu"):
        torch.npu = _StubModule("torch.npu")
        sys.modules["torch.npu"] = torch.npu
        _stream_limit_standins(torch.npu)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    # TorchAir's ~1,100 modules are compiled from source at every import where bytecode is
    # not written (PYTHONDONTWRITEBYTECODE, common in CI): keep theirs beside the source
    bytecode = sys.dont_write_bytecode, sys.pycache_prefix
    sys.dont_write_bytecode, sys.pycache_prefix = False, str(root.parent / "pycache")
    try:
        module = importlib.import_module(package)
        importlib.import_module(f"{package}.scope")
        pattern_util = importlib.import_module(f"{package}.patterns.pattern_util")
    except Exception as exc:
        raise TorchAirUnavailable(f"importing {package} from {root} failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
    finally:
        sys.dont_write_bytecode, sys.pycache_prefix = bytecode
    for name in dir(pattern_util):
        if name.startswith("_register_") and "pattern" in name:
            setattr(pattern_util, name, lambda *args, **kwargs: None)
    return module


def torchair_or_reason() -> tuple[types.ModuleType | None, str]:
    """TorchAir, loaded, or ``None`` and why not."""
    try:
        return load_torchair(fetch_torchair()), ""
    except TorchAirUnavailable as exc:
        return None, str(exc)


def _standin_converter(target: Any):
    """A GE converter emitting one ``StandIn_<op>`` over the tensor inputs (its outputs
    counted from the op's meta outputs)."""
    import torch.utils._pytree as pytree
    from torchair._ge_concrete_graph.compat_ir import _custom_op
    from torchair.ge._ge_graph import Tensor as GeTensor

    op_type = "StandIn_" + target.name().replace("::", "_").replace(".", "_")

    def convert(*args: Any, meta_outputs: Any = None, **kwargs: Any) -> Any:
        inputs = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, GeTensor)]
        n = len(meta_outputs) if isinstance(meta_outputs, (list, tuple)) else 1
        return _custom_op(op_type, inputs={f"x{i}": t for i, t in enumerate(inputs)},
                          outputs=[f"y{j}" for j in range(n)])

    return convert


def install_standin_converters(gm: Any) -> list[str]:
    """Stand-in GE converters for the graph's ATen ops that have none (or an unimplemented
    one); returns the ops given a stand-in."""
    import torch
    from torchair._ge_concrete_graph import fx2ge_converter as f2g

    added = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) \
                or target.namespace == "air":
            continue
        original = getattr(target, "_ge_converter", None) or f2g._CONVERTERS.get(target)
        if original is None:
            f2g.register_fx_node_ge_converter(target)(_standin_converter(target))
            added.append(str(target))
        elif not getattr(original, "_autostream_fallback", False):
            def fallback(*args: Any, _original=original, _target=target, **kwargs: Any) -> Any:
                try:
                    return _original(*args, **kwargs)
                except NotImplementedError:
                    return _standin_converter(_target)(*args, **kwargs)

            fallback.require_meta = getattr(original, "require_meta", True)
            fallback._autostream_fallback = True
            target._ge_converter = fallback
    return added


@dataclasses.dataclass
class Lowered:
    """What TorchAir made of one graph: the FX graph its lowering started from (after
    ``_optimize_fx`` and ``_valid_graph``), and per mode the final program.

    ACL graph (``reduce-overhead``): ``acl_gm`` is the FX graph after
    ``optimize_graph_without_runtime`` (event closure, records, DCE, reinplace), which
    ``codegen`` prints one line per node; ``acl_code`` is that generated code.
    GE (``max-autotune``): ``ge_ops`` are the GE ops after ``optimize_graph_without_runtime``,
    ``ge_origin`` names the FX node whose conversion emitted each GE op, and
    ``output_ref`` is TorchAir's output-to-input ref mapping (output ``i`` is written into
    input ``j``'s memory).
    """

    mode: str
    fx: Any
    acl_gm: Any = None
    acl_code: str = ""
    ge_ops: list = dataclasses.field(default_factory=list)
    ge_origin: dict = dataclasses.field(default_factory=dict)
    output_ref: dict = dataclasses.field(default_factory=dict)


