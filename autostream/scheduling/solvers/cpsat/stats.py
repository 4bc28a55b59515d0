"""What a ``cpsat`` solve reports about how it found its plan."""

from __future__ import annotations

from dataclasses import dataclass

from autostream.scheduling.schedule import SolverStats


@dataclass(frozen=True)
class CpsatStats(SolverStats):
    """The figures of one ``cpsat`` solve (``Schedule.stats``)."""

    source: str  # the plan returned: "cpsat" (the pieces' plans stitched) or a baseline's name
    status: str  # the worst CP-SAT status over all searches ("REUSED": none ran)
    bound: float  # the reported lower bound, us (``Schedule.lower_bound``)
    gap: float  # makespan / bound - 1
    proven: bool  # CP-SAT proved every distinct piece's bound optimal
    deterministic: bool  # no search was cut by the wall clock: the same inputs give this plan
    pieces: int  # pieces the graph was cut into (1: not cut)
    pieces_solved: int  # distinct pieces planned; the others are copies
    piece_sources: tuple[str, ...]  # the candidates the distinct pieces kept
    tasks: int  # CP-SAT tasks of the largest model solved
    windows: int  # CP-SAT windows over the distinct pieces
    windows_reused: int  # windows identical to an earlier one, which took its solution
    windows_greedy: int  # windows that kept their greedy plan: the time ran out
    cross_edges: int  # reduced dependences whose ends run on different streams
    single_stream_us: float  # the makespan on one stream
    heft_us: float  # HEFT's makespan (CP-SAT's warm start)
    solve_seconds: float  # CP-SAT's wall time, all searches
    deterministic_time: float  # CP-SAT's deterministic time, all searches
    plan_seconds: float  # the whole solve, wall clock
    cache_hit: bool = False  # the plan came from the persistent plan cache
