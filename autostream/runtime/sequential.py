"""Reference runtime: every op in launch order on the calling thread, stream ops as no-ops."""

from __future__ import annotations

from typing import Any

import torch.fx

from autostream.runtime.execute import bind_inputs, collect_outputs
from autostream.runtime.interpret import EnvHooks, interpret
from autostream.runtime.program import StreamProgram, parse_program


class SequentialRunner:
    """Run a rewritten GraphModule op by op in its linear order.

    >>> import torch, torch.fx
    >>> gm = torch.fx.symbolic_trace(lambda x: x.relu() + 1)
    >>> SequentialRunner(gm)(torch.tensor([-1.0, 2.0]))
    tensor([1., 3.])
    """

    kind = "sequential"

    def __init__(self, gm: torch.fx.GraphModule, program: StreamProgram | None = None):
        self.gm = gm
        self.program = program if program is not None else parse_program(gm)

    def __call__(self, *inputs: Any) -> Any:
        env = bind_inputs(self.gm, self.program, inputs)
        interpret(self.program.steps, EnvHooks(self.gm, env))
        return collect_outputs(self.gm, self.program, env)

    def close(self) -> None:
        """Nothing to release (present for a uniform runner interface)."""
