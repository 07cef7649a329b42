"""The MILP of :func:`pipecore.search.milp.optimal`: its columns, its rows, and HiGHS.

The model is described in the docstring of :mod:`pipecore.search.milp`.
Columns are the op starts ``0..n-1``, the makespan ``n``, then one ordering
binary per free pair of ops on a device (``n + 1 + i`` for pair i; 1: its
first op runs first). Every row is ``sum(coef * col) >= lower``. The rows
are built in a fixed order (time, memory, transitivity, zero-time cycles)
and the solver runs with a fixed seed, so one instance always gives one
model and one answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..kernels.codes import F as _F


def _order_pairs(prob, win):
    """Same-device pairs: the orders known, and the pairs left to a binary.

    A pair's order is known from the known orders of ``win.after``
    (dependencies, microbatch order, memory), or from the time windows when
    only one order fits in them (the other would push an op past its latest
    start). Returns ``(known, pairs)``: a dict ``(u, v) -> True`` for "u runs
    before v", in the order the model's rows take them, and the list of free
    pairs ``(u, v)`` with ``u < v``.
    """
    n, dur, dev = prob.n, prob.dur, prob.device
    head, latest = win.head, win.latest
    known = {}
    for u in range(n):
        for v in win.after[u]:
            known[(u, v)] = True
    pairs = []
    for d in range(prob.p):
        on = [int(i) for i in np.flatnonzero(dev == d)]
        for a_i, u in enumerate(on):
            for v in on[a_i + 1:]:
                if (u, v) in known or (v, u) in known:
                    continue
                u_first = head[u] + dur[u] <= latest[v]
                v_first = head[v] + dur[v] <= latest[u]
                if u_first and v_first:
                    pairs.append((u, v))
                elif u_first:
                    known[(u, v)] = True
                else:
                    known[(v, u)] = True
    return known, pairs


def _check_known(prob, known, position):
    """Every known order holds in the warm start, a feasible schedule in
    microbatch order (``position``: each op's slot on its device); otherwise
    a derived order would be wrong and the model would cut off optima."""
    wrong = next(((u, v) for (u, v) in known if position[u] > position[v]), None)
    if wrong is not None:
        raise RuntimeError(f"internal error: derived order {prob.key(wrong[0])} before "
                           f"{prob.key(wrong[1])} is broken by a feasible schedule")


class _Order:
    """The order of two ops of one device as a linear expression of the binaries."""

    def __init__(self, n, known, pairs):
        self.known, self.pairs = known, pairs
        self.pair_col = {}
        for i, (u, v) in enumerate(pairs):
            self.pair_col[(u, v)] = (n + 1 + i, False)  # "u before v" is y
            self.pair_col[(v, u)] = (n + 1 + i, True)   # "v before u" is 1 - y

    def before(self, u, v):
        """[u runs before v] as (constant, {col: coef})."""
        if (u, v) in self.known:
            return 1.0, {}
        if (v, u) in self.known:
            return 0.0, {}
        col, flipped = self.pair_col[(u, v)]
        return (1.0, {col: -1.0}) if flipped else (0.0, {col: 1.0})


def _time_rows(prob, win, order):
    """Precedence across devices, one op at a time per device (known orders
    exactly, free pairs relaxed by a big M that the windows make valid), and
    ``C >= start(v) + tail(v)``."""
    n, dur, dev = prob.n, prob.dur, prob.device
    head, latest = win.head, win.latest
    rows = []
    for u, v, lag in prob.deps:
        if dev[u] != dev[v]:
            rows.append((dur[u] + lag, {v: 1.0, u: -1.0}))
    for (u, v) in order.known:
        rows.append((dur[u], {v: 1.0, u: -1.0}))
    for i, (u, v) in enumerate(order.pairs):
        y = n + 1 + i
        # y = 1: u first, so start(v) >= start(u) + dur(u) - big_uv * (1 - y).
        big_uv = latest[u] + dur[u] - head[v]
        rows.append((dur[u] - big_uv, {v: 1.0, u: -1.0, y: -big_uv}))
        big_vu = latest[v] + dur[v] - head[u]
        rows.append((dur[v], {u: 1.0, v: -1.0, y: big_vu}))
    for v in range(n):
        rows.append((win.tail[v], {n: 1.0, v: -1.0}))
    return rows


def _memory_rows(prob, order):
    """The memory limit at each F's start: weights, the F's activation, and
    what every op before it on the device allocated or freed ("before" read
    from the binaries) fit the limit. The program-order running total peaks
    right after an F, since B and W only free, so these rows suffice. An F
    that cannot exceed the limit in any order gets no row."""
    if prob.limit is None:
        return []
    dev, delta = prob.device, prob.delta
    cap = prob.limit * (1.0 + 1e-9)
    rows = []
    for v in np.flatnonzero(prob.kind == _F):
        d = dev[v]
        const = prob.static[d] + delta[v]
        coefs = {}
        for u in np.flatnonzero(dev == d):
            if u == v:
                continue
            c0, lin = order.before(int(u), int(v))
            const += c0 * delta[u]
            for col, a in lin.items():
                coefs[col] = coefs.get(col, 0.0) + a * delta[u]
        worst = const + sum(max(c, 0.0) for c in coefs.values())
        if worst <= cap:
            continue  # cannot exceed the limit whatever the order
        # const + sum(coef * col) <= cap, written as >=.
        rows.append((const - cap, {col: -c for col, c in coefs.items()}))
    return rows


def _transitivity_rows(win, order):
    """Transitivity through known orders, which the big-M rows only imply
    weakly: if u runs before v, so does everything known to precede u, and
    u runs before everything known to follow v. Immediate neighbours in the
    known order suffice (the rest follows by chaining)."""
    def immediate(lists):
        sets = [set(x) for x in lists]
        return [[x for x in lst if not any(x in sets[w] for w in lst)] for lst in lists]

    pred, succ = immediate(win.before), immediate(win.after)
    rows = []

    def implies(first, second):
        """Row for [first] <= [second], each an :meth:`_Order.before`."""
        (c1, l1), (c2, l2) = first, second
        if not l1 and not l2:
            return
        coefs = dict(l2)
        for col, a in l1.items():
            coefs[col] = coefs.get(col, 0.0) - a
        rows.append((c1 - c2, coefs))

    for u, v in order.pairs:
        for x, y in ((u, v), (v, u)):
            for w in pred[x]:
                implies(order.before(x, y), order.before(w, y))
            for w in succ[y]:
                implies(order.before(x, y), order.before(x, w))
    return rows


def _zero_time_rows(prob, order):
    """Zero-time ops (W with w = 0) can share a start time, so the time rows
    alone do not make the binaries a total order: forbid 3-cycles among the
    zero-time ops of each device."""
    dev = prob.device
    zero = [int(i) for i in np.flatnonzero(prob.dur == 0.0)]
    rows = []
    for d in range(prob.p):
        zs = [i for i in zero if dev[i] == d]
        for a_i in range(len(zs)):
            for b_i in range(a_i + 1, len(zs)):
                for c_i in range(b_i + 1, len(zs)):
                    a, b, c = zs[a_i], zs[b_i], zs[c_i]
                    for x, y, z in ((a, b, c), (a, c, b)):
                        exprs = [order.before(x, y), order.before(y, z), order.before(z, x)]
                        if not any(lin for _c0, lin in exprs):
                            continue
                        const = sum(c0 for c0, _lin in exprs)
                        coefs = {}
                        for _c0, lin in exprs:
                            for col, coef in lin.items():
                                coefs[col] = coefs.get(col, 0.0) + coef
                        rows.append((const - 2.0, {col: -coef for col, coef in coefs.items()}))
    return rows


@dataclass(frozen=True)
class _Model:
    """The MILP as HiGHS takes it: minimise ``cost @ x`` subject to ``rows``
    and ``col_lo <= x <= col_hi``; the first ``continuous`` columns are
    continuous, the rest binary. ``rows`` is a list of ``(lower, {col: coef})``,
    each meaning ``sum(coef * x[col]) >= lower``."""

    cost: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    rows: list
    continuous: int
    binaries: int


def _model(prob, win, order):
    """Columns with their bounds (each start in its window, the makespan
    between the static bound and the warm start's) and every row."""
    n, n_pairs = prob.n, len(order.pairs)
    cost = np.zeros(n + 1 + n_pairs)
    cost[n] = 1.0
    col_lo = np.concatenate([win.head, [win.lb], np.zeros(n_pairs)])
    col_hi = np.concatenate([win.latest, [win.H + win.eps], np.ones(n_pairs)])
    rows = (_time_rows(prob, win, order) + _memory_rows(prob, order)
            + _transitivity_rows(win, order) + _zero_time_rows(prob, order))
    return _Model(cost=cost, col_lo=col_lo, col_hi=col_hi, rows=rows, continuous=n + 1,
                  binaries=n_pairs)


def _warm_guess(model, order, H, warm_start, position):
    """The warm start as a point of the model: the heuristic's simulated
    starts (clipped into the windows against rounding), its makespan, and
    its program order read into the binaries."""
    n = model.continuous - 1
    return np.concatenate([np.clip(warm_start, model.col_lo[:n], model.col_hi[:n]), [H],
                           [1.0 if position[u] < position[v] else 0.0 for u, v in order.pairs]])


@dataclass(frozen=True)
class _Solved:
    """What HiGHS returned: its model status, whether it proved optimality,
    its dual bound (``nan`` when it has none), and its incumbent (``x`` and
    ``objective``; ``x`` is None when there is none)."""

    status_text: str
    proven: bool
    dual_bound: float
    x: np.ndarray | None
    objective: float


def _solve(highspy, model, guess, time_limit, threads):
    """Solve ``model`` with HiGHS from the point ``guess``.

    The options are fixed (no output, the time limit, gaps far below the
    1e-6 agreement with the simulation that the caller checks, seed 0) so
    that one model gives one answer.
    """
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    # Close the gap far below the 1e-6 agreement with the simulation checked later.
    h.setOptionValue("mip_rel_gap", 1e-7)
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.setOptionValue("random_seed", 0)
    if threads is not None:
        # HiGHS keeps one thread pool per process, sized by its first solve;
        # another size is refused unless the pool is rebuilt.
        highspy.Highs.resetGlobalScheduler(True)
        h.setOptionValue("threads", threads)
    rows = model.rows
    lp = highspy.HighsLp()
    lp.num_col_ = model.cost.size
    lp.num_row_ = len(rows)
    lp.col_cost_ = model.cost
    lp.col_lower_ = model.col_lo
    lp.col_upper_ = model.col_hi
    lp.row_lower_ = np.array([lo for lo, _c in rows])
    lp.row_upper_ = np.full(len(rows), highspy.kHighsInf)
    starts, index, value = [0], [], []
    for _lo, coefs in rows:
        for col, a in coefs.items():
            if a != 0.0:
                index.append(col)
                value.append(a)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value)
    lp.integrality_ = [highspy.HighsVarType.kContinuous] * model.continuous \
        + [highspy.HighsVarType.kInteger] * model.binaries
    h.passModel(lp)

    sol = highspy.HighsSolution()
    sol.col_value = list(guess)
    sol.value_valid = True
    h.setSolution(sol)

    run_status = h.run()
    if run_status == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS failed to solve the model: "
                           f"{h.modelStatusToString(h.getModelStatus())}")
    status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    dual = float(info.mip_dual_bound)
    return _Solved(status_text=h.modelStatusToString(status),
                   proven=status == highspy.HighsModelStatus.kOptimal,
                   dual_bound=dual if math.isfinite(dual) else math.nan,
                   x=np.asarray(h.getSolution().col_value) if has_solution else None,
                   objective=float(info.objective_function_value) if has_solution else math.nan)
