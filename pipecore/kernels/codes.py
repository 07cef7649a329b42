"""The integer codes every layer shares: op kinds, cost classes, parameter and output rows.

Defined once here, at the bottom layer, so that kernels, builders, rules,
writers, the MILP and the scans read the same names instead of literals.
Cached kernels freeze the globals they read when they are compiled: a
changed value here needs the Numba caches (``__pycache__/*.nbi``, ``*.nbc``)
removed.
"""

from __future__ import annotations

#: Op kinds, in the order of their integer codes. R recomputes a forward
#: whose activations were dropped; O offloads a forward's activations to
#: host memory (or a partner device's) and L loads them back before the backward.
KINDS: tuple[str, ...] = ("F", "B", "W", "BW", "AR", "R", "O", "L")
F, B, W, BW, AR, R, O, L = range(8)  # noqa: E741 (the kinds are named by their letters)

#: Cost-and-memory class of an op as the kernels see it: its kind code,
#: except an F whose activations are dropped (its (stage, microbatch) has an
#: R), which is class F_DROP: it takes F's time and keeps only the checkpoint.
F_DROP = 8
N_CLASSES = 9

#: Transfer classes: per sending stage s, class ``s * X_CLASSES + k`` with k:
#: 0 an activation within a node, 1 an activation between nodes, 2 and 3 the
#: same for a gradient feeding an all-reduce, 4 an offload copy over a host
#: link, 5 an offload copy to or from a partner device (``Schedule.offload_to``).
#: A table of X_CLASSES entries per stage gives serialisation and latency, so
#: times are computed once per class, not once per transfer.
X_CLASSES = 6

#: Rows of the per-configuration parameter matrix (float64, one column per
#: configuration) of the batched kernels: op costs, memory costs, network.
P_F, P_B, P_W, P_COMM, P_FB, P_ACT, P_ACTW, P_WEIGHTS = range(8)
P_BYTES, P_GRAD, P_BW, P_LAT, P_IBW, P_ILAT = range(8, 14)
P_R, P_CKPT = 14, 15  # recompute time and checkpoint memory (Costs.r, Costs.checkpoint)
N_PARAMS = 16

#: Rows of the batched kernels' output matrix (float64, one column per configuration).
O_MAKESPAN, O_BUSY_SUM, O_BUSY_MAX, O_SPAN_MAX, O_PEAK_ACT, O_PEAK_TOTAL = range(6)
N_OUT = 6

#: Status of the list scheduler's kernels.
STATUS_OK = 0
STATUS_DEADLOCK = 1
