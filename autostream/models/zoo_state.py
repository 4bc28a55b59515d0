"""Models whose graphs write their own state, and a small MLP for training steps.

Compiled for inference with input mutations kept (TorchAir's default,
``keep_inference_input_mutations=True``), each graph ends with ``copy_(buffer, new)``, and
other ops read the buffer's old value: the order a compiler that writes ``new`` straight
into the buffer (TorchAir GE's output refs, the ACL graph's input reinplacing) must keep.
Not in ``ZOO``: each call changes the model.

>>> model, (x,) = buffer_update_model()
>>> before = model.total.clone(); _ = model(x)
>>> bool((model.total - before).abs().sum() > 0)
True
"""

from __future__ import annotations

import torch
from torch import nn


class BatchNormTrain(nn.Module):
    """A batch norm in train mode (it updates its running statistics) beside a branch that
    reads the running mean."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, width)
        self.side = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        centred = self.side(x) - self.norm.running_mean
        return self.norm(torch.relu(self.up(x))), torch.tanh(centred)


class BufferUpdate(nn.Module):
    """Reads its own buffer in two branches and updates it with ``add_``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.register_buffer("total", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = self.a(x) * self.total
        shifted = torch.sigmoid(self.b(x)) + self.total
        self.total.add_(x.mean(0))
        return scaled, shifted


class MLP(nn.Module):
    """Two parallel MLP towers summed: independent work in forward and backward."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        self.right = nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


def batchnorm_train_model(rows: int = 32, width: int = 256
                          ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A train-mode batch norm whose running mean a branch reads."""
    torch.manual_seed(11)
    return BatchNormTrain(width).train(), (torch.randn(rows, width),)


def buffer_update_model(rows: int = 32, width: int = 256
                        ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A module reading and updating its own buffer."""
    torch.manual_seed(12)
    model = BufferUpdate(width)
    model.total.normal_()
    return model, (torch.randn(rows, width),)


def mlp_model(rows: int = 64, width: int = 256, hidden: int = 512
              ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Two MLP towers, for a training step (forward and backward graphs)."""
    torch.manual_seed(13)
    return MLP(width, hidden), (torch.randn(rows, width),)
