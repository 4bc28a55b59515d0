"""Each op's real inputs, recorded from one run of its graph on the graph's real arguments.

An op's time can depend on its data: a grouped matmul's on its group offsets (random
integer inputs are zeros: every group empty, no work), ``masked_fill``'s on its mask.
Running each graph once and keeping the arguments of the first node of each op signature
lets calibration time ops on what they will see.  Arguments an op writes in place are
copied (timing it must not change the graph's data); the others are kept by reference.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x, o: torch.zeros(3).index_add(0, o, x))(torch.ones(2), torch.tensor([0, 2]))
>>> found, notes = recorded_inputs([gm], [(torch.ones(2), torch.tensor([0, 2]))], torch.device("cpu"))
>>> [args[2].tolist() for (op, _), (args, _) in found.items() if op == "aten.index_add.default"]
[[0, 2]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from autostream.cost.calibrate import _first_line, op_keys
from autostream.cost.incontext import own_inputs

__all__ = ["recorded_inputs"]

OpKey = tuple[str, str]
Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def _written(target: Any) -> tuple[set[int], set[str]]:
    """Positions and names of the arguments ``target``'s schema writes in place."""
    schema = getattr(target, "_schema", None)
    positions, names = set(), set()
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.alias_info is not None and arg.alias_info.is_write:
            positions.add(i)
            names.add(arg.name)
    return positions, names


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, wanted: dict[str, OpKey],
                 found: dict[OpKey, Inputs]) -> None:
        super().__init__(gm)
        self.wanted, self.found = wanted, found

    def run_node(self, n: torch.fx.Node) -> Any:
        key = self.wanted.get(n.name)
        if key is not None and key not in self.found:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            positions, names = _written(n.target)
            self.found[key] = (tuple(_clone(a) if i in positions else a for i, a in enumerate(args)),
                               {k: _clone(v) if k in names else v for k, v in kwargs.items()})
        return super().run_node(n)


def recorded_inputs(graphs: Sequence[torch.fx.GraphModule],
                    graph_args: Sequence[Sequence[Any] | None], device: torch.device
                    ) -> tuple[dict[OpKey, Inputs], list[str]]:
    """``(op, signature) -> (args, kwargs)`` of the first node of each signature in
    ``graphs`` run on their real arguments (``None``: that graph is not run), and a note
    for each graph that could not run."""
    found: dict[OpKey, Inputs] = {}
    notes: list[str] = []
    for gi, gm in enumerate(graphs):
        real = graph_args[gi] if gi < len(graph_args) else None
        if real is None:
            continue
        wanted = op_keys(gm)
        try:
            with torch.no_grad():
                _Recorder(gm, wanted, found).run(*own_inputs(gm, real, device))
        except Exception as exc:  # noqa: BLE001 - e.g. a graph that needs its own runtime
            notes.append(f"graph {gi} could not run on its real arguments "
                         f"({_first_line(exc)}); its ops run on random inputs")
    return found, notes
