"""The planner on PyTorch models: a training step recorded as a graph, and a plan followed
as the step runs.

* :func:`capture` records any :class:`~tiermem.torch.tensors.TrainStep` (the user's model,
  optimizer, loss and inputs) all-fast and all-slow into a :class:`~tiermem.plan.Graph`;
  :func:`record_policy` prices what a runtime variant did; :func:`run_planned` trains under
  a plan and :func:`run_variant` under a runtime variant at the same sizes (see
  :mod:`.capture`); :func:`~.script.load_script` reads a step from a user's Python file.
* :class:`Recorder` and :class:`Executor` are the two
  :class:`~tiermem.torch.tensors.Observer` objects behind them; :func:`planned` is a
  ``planned`` :class:`~tiermem.torch.tensors.Tiering` that follows a plan.

Importing this package imports torch; :mod:`tiermem.plan` itself does not.
"""

from .capture import DEFAULT_SLOW, RECORDED, capture, record_policy, run_planned, run_variant
from .contention import copy_contention
from .execute import Executor, PlanMismatchWarning, planned
from .kernel_profiles import KernelProfiles, default_profiles_path, setup_key
from .profile import graph_from_recordings
from .record import Recorder

__all__ = [
    "capture",
    "record_policy",
    "run_planned",
    "run_variant",
    "planned",
    "Executor",
    "Recorder",
    "PlanMismatchWarning",
    "KernelProfiles",
    "graph_from_recordings",
    "copy_contention",
    "default_profiles_path",
    "setup_key",
    "RECORDED",
    "DEFAULT_SLOW",
]
