"""pipecore: build, validate and simulate pipeline-parallel training schedules.

>>> import pipecore as pc
>>> sched = pc.build("1f1b", devices=4, microbatches=8)
>>> pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.0)).makespan
33.0
"""

from . import adaptive, blocks, generate, milp, search  # noqa: E402  (pc.milp.optimal, ...)
from ._schedule import KINDS, Action, Schedule, ScheduleError, from_actions
from .batch import simulate_many
from .compare import compare
from .costs import Costs, Network
from .critical import critical_path, device_share
from .formulas import formula
from .model import Hardware, Layer, Model
from .offload import offload
from .partition import PartitionError, Plan, partition
from .recompute import recompute
from .scans import Grid, ScanError, scan, write_scan
from .schedules import Family, build, family, register, schedules
from .simulate import Result, compile_schedule, simulate, validate
from .table import IdealTable, ideal_table
from .tune import Tuned, TuneError, tune
from .variation import Jitter, MonteCarlo, WhatIf, monte_carlo, what_if

__version__ = "0.1.0"

__all__ = [
    "KINDS", "Action", "Schedule", "ScheduleError", "from_actions",
    "Costs", "Network",
    "Family", "build", "family", "register", "schedules",
    "Result", "compile_schedule", "simulate", "validate", "simulate_many",
    "formula", "IdealTable", "ideal_table", "compare", "blocks", "generate", "milp", "search",
    "adaptive", "recompute", "offload",
    "Grid", "ScanError", "scan", "write_scan", "tune", "Tuned", "TuneError",
    "Jitter", "MonteCarlo", "WhatIf", "monte_carlo", "what_if",
    "Model", "Layer", "Hardware", "partition", "Plan", "PartitionError",
    "critical_path", "device_share",
]
