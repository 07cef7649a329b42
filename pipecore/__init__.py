"""pipecore: build, validate and simulate pipeline-parallel training schedules.

>>> import pipecore as pc
>>> sched = pc.build("1f1b", devices=4, microbatches=8)
>>> pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.0)).makespan
33.0

The package is layered (docs/architecture.md); imports only go down:
kernels < core < schedules < analysis < output < scan < search < this file,
cli and testing.
"""

import importlib as _importlib
import os as _os
import sys as _sys

# Numba's OpenMP threads spin while they wait by default. On a busy machine
# (pytest -n, torch ranks, a scan beside other work) the spinning threads take
# the cores from the one doing the work, and every parallel kernel on a small
# input stalls; waiting threads that sleep cost a wake-up instead. Before
# anything loads OpenMP, and only when the user has not chosen.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from . import output as _output  # noqa: F401  (its writers register Result.write_trace, ...)
from . import search  # pc.search: the package, whose local_search is the entry point
from .analysis import critical as _critical  # noqa: F401  (registers Result.critical_path)
from .analysis.architecture import Architecture
from .analysis.compare import compare
from .analysis.critical import critical_path, device_share
from .analysis.formulas import formula
from .analysis.model import Hardware, Layer, Model
from .analysis.steady import SteadyState, steady_state
from .analysis.swarm import Swarm, swarm
from .analysis.table import IdealTable, ideal_table
from .analysis.variation import Jitter, MonteCarlo, WhatIf, monte_carlo, what_if
from .core.costs import Costs, Network
from .core.ops import CapacityError, InputError, PipecoreError
from .core.schedule import KINDS, Action, DeviceGapWarning, Schedule, ScheduleError, from_actions
from .core.simulate import Result, compile_schedule, simulate, validate
from .output.report import report
from .plan import calibrate as _calibrate  # noqa: F401  (adds GPU.calibrate, Cluster.calibrate and .from_file)
from .plan.estimate import Estimate, estimate
from .plan.hardware import GPU, Cluster
from .plan.search import Strategies, strategies
from .plan.strategy import Strategy
from .scan.batch import product, simulate_many
from .scan.scans import Grid, ScanError, ScanWarning, scan, verify_scan, write_scan
from .schedules import adaptive, blocks, generate, orders, placements
from .schedules.compose import compose
from .schedules.freeze import freeze
from .schedules.offload import offload
from .schedules.recompute import recompute
from .schedules.registry import Family, Paper, build, family, register, schedules
from .search import milp
from .search.explore import explore
from .search.partition import PartitionError, Plan, partition
from .search.tune import Tuned, TuneError, tune

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = [
    "PipecoreError", "InputError", "CapacityError",
    "KINDS", "Action", "Schedule", "ScheduleError", "DeviceGapWarning", "from_actions",
    "Costs", "Network",
    "Family", "Paper", "build", "family", "register", "schedules",
    "Result", "compile_schedule", "simulate", "validate", "simulate_many",
    "formula", "IdealTable", "ideal_table", "compare", "blocks", "generate", "milp", "search",
    "adaptive", "recompute", "offload", "freeze",
    "Grid", "ScanError", "ScanWarning", "scan", "write_scan", "verify_scan", "tune", "Tuned", "TuneError",
    "Jitter", "MonteCarlo", "WhatIf", "monte_carlo", "what_if", "Swarm", "swarm",
    "Model", "Layer", "Hardware", "partition", "Plan", "PartitionError",
    "critical_path", "device_share", "report", "product",
    "compose", "orders", "placements", "explore",
    "Architecture", "Strategy", "Estimate", "estimate", "GPU", "Cluster", "Strategies", "strategies",
    "SteadyState", "steady_state",
]

# The flat module paths of before the layers (pipecore.costs, pipecore.study,
# ...) keep importing: each names the module that now holds its code.
_FORMER = {
    "costs": "core.costs", "simulate": "core.simulate", "batch": "scan.batch",
    "scans": "scan.scans", "blocks": "schedules.blocks", "generate": "schedules.generate",
    "adaptive": "schedules.adaptive", "recompute": "schedules.recompute",
    "offload": "schedules.offload", "formulas": "analysis.formulas", "table": "analysis.table",
    "compare": "analysis.compare", "study": "analysis.study", "critical": "analysis.critical",
    "variation": "analysis.variation", "model": "analysis.model", "tune": "search.tune",
    "milp": "search.milp", "partition": "search.partition",
}
# pc.orders and pc.placements are importable by those paths too.
_FORMER.update({"orders": "schedules.orders", "placements": "schedules.placements"})
for _old, _new in _FORMER.items():
    _sys.modules.setdefault(f"{__name__}.{_old}", _importlib.import_module(f"{__name__}.{_new}"))
del _old, _new
