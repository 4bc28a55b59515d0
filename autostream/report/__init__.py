"""Reports on plans: Gantt PNG, Perfetto/Chrome trace, DOT dump, solver comparison table.

May import: cost, memory, models, planning, scheduling.

Every report is a function of plain data (``SchedulingProblem``, ``Schedule``,
``list[Sync]``, optionally a ``Timeline``):

>>> import networkx as nx
>>> from autostream.scheduling.problem import SchedulingProblem
>>> g = nx.DiGraph([("a", "b"), ("a", "c")]); nx.set_node_attributes(g, 1.0, "duration")
>>> results = plan_solvers(SchedulingProblem(g, streams=2), ["single", "heft"])
>>> print(markdown_table(results).splitlines()[3][:40])
| heft | 2 | 2 | 2.0* | 2.0 | 0.0% | 1.5
"""

from autostream.report.compare import ReportFiles, parse_solvers, plan_solvers, write_reports
from autostream.report.dot import graph_dot, write_graph
from autostream.report.gantt import gantt_figure, gantt_png
from autostream.report.table import SolverResult, markdown_table
from autostream.report.trace import chrome_trace, write_trace

__all__ = [
    "ReportFiles",
    "SolverResult",
    "chrome_trace",
    "gantt_figure",
    "gantt_png",
    "graph_dot",
    "markdown_table",
    "parse_solvers",
    "plan_solvers",
    "write_graph",
    "write_reports",
    "write_trace",
]
