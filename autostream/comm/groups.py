"""Process groups as the planner sees them: name, world size, backend.

Read from ``torch.distributed`` when it is initialised on this process; a graph
planned offline (no process group) knows a group by its name only, and a
collective whose group argument the pass cannot read has none.

>>> resolve_group(None)
GroupInfo(name=None, world_size=None, backend=None)
>>> resolve_group("tp", world_size=4).link
'link:tp'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupInfo:
    """What the pass knows of one process group (``None``: unknown)."""

    name: str | None
    world_size: int | None
    backend: str | None

    @property
    def link(self) -> str:
        """The lane of this group's transfers; collectives on unknown groups share one."""
        return f"link:{self.name if self.name is not None else '?'}"


def _distributed_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def resolve_group(name: str | None, world_size: int | None = None) -> GroupInfo:
    """The group named ``name`` on this process; ``world_size`` is the collective's own
    ``group_size`` argument where it has one (used when the group cannot be resolved)."""
    if name is None or not _distributed_ready():
        return GroupInfo(name, world_size, None)
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        group = _resolve_process_group(name)
    except Exception:  # noqa: BLE001 - a name this process does not know
        return GroupInfo(name, world_size, None)
    try:
        backend = str(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - groups without a named backend
        backend = None
    return GroupInfo(name, group.size(), backend)


def is_distributed() -> bool:
    """Whether ``torch.distributed`` runs here with more than one rank."""
    if not _distributed_ready():
        return False
    import torch.distributed as dist

    return dist.get_world_size() > 1
