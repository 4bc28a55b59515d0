"""``import autostream`` and ``autostream --help`` load none of the heavy modules (torch,
Dynamo, Inductor, OR-Tools, matplotlib, networkx, transformers): they are imported when a
name or a command needs them.  Checked in a fresh interpreter by what ``sys.modules`` holds,
not by timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torch._dynamo", "torch._inductor", "ortools", "matplotlib", "networkx",
         "transformers")


def _loaded_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\nimport json\n"
             f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import autostream",
    "import autostream; autostream.__version__",
    "from autostream.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
    "from autostream.cli import main\ntry:\n    main(['check', '--help'])\nexcept SystemExit:\n"
    "    pass",
])
def test_nothing_heavy_is_imported(code):
    assert _loaded_after(code) == []


def test_a_public_name_imports_its_module_on_first_use():
    assert "torch._inductor" in _loaded_after("import autostream; autostream.AutoStreamPass")
    import autostream

    assert autostream.PlanOptions.__module__ == "autostream.planning.plan"
    assert set(autostream.__all__) <= set(dir(autostream))
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        autostream.nosuch  # noqa: B018


def test_backend_stays_the_function_after_its_module_is_imported():
    # torch.compile(backend="autostream") imports autostream.backend through the entry point
    code = ("import autostream, importlib; importlib.import_module('autostream.backend'); "
            "print(type(autostream.backend).__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "function"


def test_importing_autostream_registers_no_air_ops_until_asked():
    """The op registry is the process's: importing autostream (and its pass) defines no
    ``torch.ops.air`` op; ``air_ops()`` does where TorchAir is absent (docs/hand-placements.md)."""
    code = ("import torch, autostream, importlib\n"
            "importlib.import_module('autostream.passes')\n"
            "before = hasattr(torch.ops.air, 'scope_enter')\n"
            "from autostream.dialects.torchair import air_ops, wait_tensor_op\n"
            "ops = air_ops(); wait_tensor_op()\n"
            "x = torch.ones(2)\n"
            "torch.ops.air.scope_enter(['_user_stream_label'], ['s1'])\n"
            "y = torch.ops.air.wait_tensor(x * 2, x)\n"
            "torch.ops.air.scope_exit()\n"
            "print(before, ops.from_torchair, y.tolist())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    before, from_torchair, values = out.strip().split(" ", 2)
    if from_torchair == "True":
        pytest.skip("TorchAir is importable here: its own ops are registered")
    assert before == "False" and values == "[2.0, 2.0]"
