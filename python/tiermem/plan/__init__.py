"""The planner (AutoTM, thesis ch. 3): a training step's graph, integer programs that decide
where every tensor lives and when it moves under a fast-memory limit, solved with HiGHS from a
greedy incumbent, and plans the ``planned`` tiered-tensor variant executes."""

from .generate import autotm_graph
from .graph import FORMAT, Device, Graph, GraphError, Kernel, Operand, Tensor
from .plan import PLAN_FORMAT, Cost, Plan, evaluate, moves
from .solve import FORMULATIONS, greedy, solve

__all__ = [
    "FORMAT",
    "PLAN_FORMAT",
    "FORMULATIONS",
    "Cost",
    "Device",
    "Graph",
    "GraphError",
    "Kernel",
    "Operand",
    "Plan",
    "Tensor",
    "autotm_graph",
    "evaluate",
    "greedy",
    "moves",
    "solve",
]
