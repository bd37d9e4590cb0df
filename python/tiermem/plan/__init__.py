"""The planner (AutoTM, thesis ch. 3): a training step's graph, integer programs that decide
where every tensor lives and when it moves under a fast-memory limit, solved with HiGHS from a
greedy incumbent, laid out in the fast heap (offsets, and the limit reduction that makes
them fit), and plans the ``planned`` tiered-tensor variant executes."""

from .fit import FIT_TRIES, fit
from .generate import autotm_graph
from .graph import FORMAT, Device, Graph, GraphError, Kernel, Operand, Tensor
from .offsets import Offsets, Residency, assign, residencies
from .plan import PLAN_FORMAT, Cost, Moves, Overlap, Plan, at_home, evaluate, moves, recorded
from .report import residency_by_kind, tensor_residency
from .sensitivity import gains, recommend_traits
from .solve import DEFAULT_FORMULATION, FORMULATIONS, greedy, solve

__all__ = [
    "FORMAT",
    "PLAN_FORMAT",
    "FORMULATIONS",
    "DEFAULT_FORMULATION",
    "FIT_TRIES",
    "Cost",
    "Device",
    "Graph",
    "GraphError",
    "Kernel",
    "Moves",
    "Offsets",
    "Operand",
    "Overlap",
    "Plan",
    "Residency",
    "Tensor",
    "assign",
    "at_home",
    "autotm_graph",
    "evaluate",
    "fit",
    "gains",
    "greedy",
    "recommend_traits",
    "moves",
    "recorded",
    "residencies",
    "residency_by_kind",
    "solve",
    "tensor_residency",
]
