"""Schedules generated for given costs, rather than from a fixed pattern.

:func:`zbv_greedy` is the greedy V-shape scheduler that the Zero Bubble
paper's authors used for the ZB-V column of their bubble-rate table (arXiv
2401.10241v1, Table 8): it lays out ops one at a time on a V placement,
tracking each device's clock and activation memory, and tucks weight-gradient
(W) ops into the gaps where a device would otherwise wait. Its rules are
restated here from the paper's description and the authors' public
simulator; the code is pipecore's own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..core.costs import Costs
from ..core.cpus import local_cpus
from ..core.ops import InputError
from ..core.rules import _in_halves
from ..core.schedule import Schedule, ScheduleError, check_int
from ..core.simulate import validate
from ..kernels import greedy as _greedy
from ..kernels import zbv as _zbv
from ..kernels.codes import B as _B
from ..kernels.codes import F as _F
from ..kernels.codes import W as _W
from .registry import column_buffers

__all__ = ["zbv_greedy", "greedy", "memory_greedy", "warmup_search"]



class _VState:
    """The partial schedule: per device clock, memory, counts and pending W."""

    def __init__(self, p, m, cost, mem, comm, limit):
        self.p, self.m = p, m
        self.cost, self.mem_delta, self.comm, self.limit = cost, mem, comm, limit
        self.clock = [0] * p
        self.memory = [0] * p
        # count[d][(kind, chunk)]: ops of that kind and chunk placed on device d
        self.count = [{(k, c): 0 for k in (_F, _B, _W) for c in (0, 1)} for _ in range(p)]
        self.end = {}
        self.idle = [0] * p
        self.pending_w = [deque() for _ in range(p)]
        self.order = [[] for _ in range(p)]

    def source(self, kind, chunk, d, j):
        """The op on a neighbouring device this one waits for, or None.

        Index 0 runs down the devices (the model's chunk 0 forward, chunk 1
        backward), index 1 up. The turns (stage p-1 to p on device p-1, and
        the last stage's backward after its forward on device 0) stay on
        one device.
        """
        if kind == _W:
            return None
        prev = d - 1 if chunk == 0 else d + 1
        if not 0 <= prev < self.p:
            return None
        return (kind, chunk, prev, j)

    def gap(self, kind, chunk, d):
        """How long device d would wait for the input of its next such op."""
        src = self.source(kind, chunk, d, self.count[d][(kind, chunk)])
        if src is None or src not in self.end:
            return None
        return self.end[src] + self.comm - self.clock[d]

    def put(self, kind, chunk, d):
        j = self.count[d][(kind, chunk)]
        ready = self.clock[d]
        src = self.source(kind, chunk, d, j)
        if src is not None:
            ready = max(ready, self.end[src] + self.comm)
        if self.count[d][(_F, 0)] > 0:
            self.idle[d] += ready - self.clock[d]
        finish = ready + self.cost[kind]
        self.end[(kind, chunk, d, j)] = finish
        self.clock[d] = finish
        self.memory[d] += self.mem_delta[kind]
        self.order[d].append((kind, chunk, j))
        self.count[d][(kind, chunk)] = j + 1
        if kind == _B:
            self.pending_w[d].append(chunk)

    def put_w(self, d):
        self.put(_W, self.pending_w[d].popleft(), d)

    def done(self, kind, chunk, d, j):
        return (kind, chunk, d, j) in self.end


def _one_pass_python(p, m, cost, mem, comm, limit, fill_f, fill_b, allowance):
    """One greedy layout; ``allowance[d]`` is idle time device d may add freely.

    The plain-Python pass, which small shapes and amounts too wide for
    ``kernels.zbv`` take (:func:`_one_pass` decides); the tests compare the
    two."""
    st = _VState(p, m, cost, mem, comm, limit)
    most_allowed = max(allowance)

    def budget(d):
        # Idle time device d may still absorb without raising the worst device's.
        worst = max(max(st.idle), most_allowed - allowance[d])
        return worst - st.idle[d]

    def fill_and_put(kind, chunk, d, force_w):
        gap = st.gap(kind, chunk, d)
        # Run W while the input would not arrive before the W finishes.
        while st.pending_w[d] and gap is not None and gap >= cost[_W]:
            st.put_w(d)
            gap = st.gap(kind, chunk, d)
        if st.pending_w[d] and gap is not None and gap > budget(d) and force_w:
            st.put_w(d)
        st.put(kind, chunk, d)

    # Warm-up: the first forward everywhere, then chunk-0 forwards while they
    # fit before the chunk-1 forward coming back up, then even out the counts.
    for d in range(p):
        st.put(_F, 0, d)
    for d in range(p - 1, -1, -1):
        if d < p - 1:
            arrival = st.end[(_F, 1, d + 1, 0)] + comm
            while (st.memory[d] + mem[_F] * (2 + 2 * d) <= limit
                   and st.clock[d] + cost[_F] <= arrival and st.count[d][(_F, 0)] < m):
                for e in range(d + 1):
                    st.put(_F, 0, e)
        st.put(_F, 1, d)
    chunk = 0
    for d in range(1, p):
        while (st.count[d][(_F, 0)] + st.count[d][(_F, 1)]
               < st.count[d - 1][(_F, 0)] + st.count[d - 1][(_F, 1)]):
            for e in range(p - 1, d - 1, -1):
                if st.count[e][(_F, chunk)] < m:
                    st.put(_F, chunk, e)
            chunk = 1 - chunk

    for _ in range(2 * m):
        for d in range(p):
            while st.memory[d] + mem[_B] > limit:
                st.put_w(d)
        # Backward chunk per device: chunk 1 of the model is 'B' here (index 0),
        # chunk 0 is 'b' (index 1), following the order backwards arrive in.
        first, second = [], []
        for d in range(p):
            nb0, nb1 = st.count[d][(_B, 0)], st.count[d][(_B, 1)]
            if nb1 >= nb0:
                second.append((d, 0))
            elif d == p - 1 or st.done(_B, 1, d + 1, nb1) or nb0 >= m:
                first.append((d, 1))
            else:
                second.append((d, 0))
        for d, c in list(reversed(first)) + second:
            fill_and_put(_B, c, d, force_w=(c == 1) or fill_b)
        for d in range(p):
            nf0, nf1 = st.count[d][(_F, 0)], st.count[d][(_F, 1)]
            if nf1 >= m:
                continue
            if nf1 >= nf0:
                c = 0
            elif d == p - 1 or st.done(_F, 1, d + 1, nf1):
                c = 1
            elif nf0 < m and (d == 0 or st.done(_F, 0, d - 1, nf0)):
                c = 0
            else:
                continue
            while st.memory[d] + mem[_F] > limit:
                st.put_w(d)
            fill_and_put(_F, c, d, force_w=fill_f)
    for d in range(p):
        while st.pending_w[d]:
            st.put_w(d)
    return st


# The kernel holds amounts exactly up to about 2**94 (kernels/zbv.py); this
# many bits, with margin, bound what it is given. Wider ones (tiny or huge
# cost ratios) take the Python pass.
ZBV_KERNEL_MAX_BITS = 92
# Below this many ops (6 p m) the Python pass costs less than compiling the
# kernel once, so a fresh install tuning small shapes compiles nothing;
# above it the Python pass's time grows past the kernel's by far.
ZBV_KERNEL_MIN_OPS = 24_576
_MASK32 = (1 << 32) - 1


class _KernelPass:
    """A pass laid out by the kernel: ``idle`` as ints, the order as arrays."""

    def __init__(self, idle, kind, chunk, j, count):
        self.idle, self.kind, self.chunk, self.j, self.count = idle, kind, chunk, j, count


def _limbs(values):
    """Exact ints as the kernel's (hi, lo) pairs, hi * 2**32 + lo."""
    return np.array([(v >> 32, v & _MASK32) for v in values], dtype=np.int64).reshape(-1, 2)


def _one_pass(p, m, cost, mem, comm, limit, fill_f, fill_b, allowance):
    """:func:`_one_pass_python`'s layout, by the kernel when the amounts fit
    and the schedule has ZBV_KERNEL_MIN_OPS ops or more.

    Raises KeyError or IndexError where the Python pass would (the rules
    stall), so callers handle both alike.
    """
    # Every time is a sum of at most 6mp op costs plus comms, or a difference
    # of two such (gaps, idle, budgets); memory likewise of 6m deltas.
    span = 2 * m * p * (sum(abs(c) for c in cost) + 3 * abs(comm)) + abs(comm) + 2
    span += max(abs(a) for a in allowance)
    heap = 6 * m * sum(abs(x) for x in mem) + abs(limit) + 2 * (p + 1) * abs(mem[_F])
    if 6 * p * m < ZBV_KERNEL_MIN_OPS or max(4 * span, 4 * heap) >= 1 << ZBV_KERNEL_MAX_BITS:
        return _one_pass_python(p, m, cost, mem, comm, limit, fill_f, fill_b, allowance)
    times = _limbs(list(cost) + [comm])
    mems = _limbs(list(mem) + [limit - mem[_B], limit - mem[_F]])
    warm = _limbs([limit - mem[_F] * (2 + 2 * d) for d in range(p)])
    idle = np.zeros((p, 2), dtype=np.int64)
    order = np.zeros((3, p, 6 * m), dtype=np.int64)
    count = np.zeros(p, dtype=np.int64)
    status = _zbv.zbv_pass(p, m, times, mems, warm, bool(fill_f), bool(fill_b),
                           _limbs(allowance), idle, order, count)
    if status == _zbv.STALL:
        raise KeyError("the greedy rules stall")
    if status != _zbv.OK:
        return _one_pass_python(p, m, cost, mem, comm, limit, fill_f, fill_b, allowance)
    return _KernelPass([(int(h) << 32) + int(lo) for h, lo in idle], *order, count)


def zbv_greedy(devices: int, microbatches: int, costs: Costs | None = None,
               memory_limit: float | None = None) -> Schedule:
    """The greedy ZB-V schedule for given costs and a memory limit.

    Device d holds stages d and 2p-1-d. Ops are laid out one at a time:
    forwards of chunk 0 run ahead while they fit under the memory limit and
    before the chunk-1 forward returns; afterwards each round places one
    backward and one forward per device, and a pending W runs first when
    the device would otherwise wait for that op's input at least as long as
    the W takes, or when the wait would make this device the most idle one.
    Four variants (W forced before forwards and/or backwards or not), each
    refined once with the first pass's idle times as allowances, are tried;
    the one with the least idle time on its worst device wins.

    Parameters
    ----------
    devices : int
        p >= 1.
    microbatches : int
        m >= 1.
    costs : Costs, optional
        Scalar per-device-share costs (each chunk takes half); memory from
        ``activation`` (M_B) and ``activation_w`` (M_W). Defaults to
        ``Costs(f=1, b=1, w=1)``.
    memory_limit : float, optional
        Per-device activation limit in the units of ``costs.activation``
        (default and minimum ``p * activation``, 1F1B's peak).

    Returns
    -------
    Schedule
        Named ``"zb-v-greedy"``.

    Raises
    ------
    ValueError
        For bad shapes, m < 2p, per-stage (vector) costs, a limit below
        p * activation, or costs for which no variant of the rules yields a
        valid order (the message says so; ``zb-v`` always works).
    """
    p = check_int("devices", devices, minimum=1)
    m = check_int("microbatches", microbatches, minimum=1)
    costs = Costs(f=1.0, b=1.0, w=1.0) if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    for name in ("f", "b", "w", "comm", "activation", "activation_w"):
        if np.ndim(getattr(costs, name)) != 0:
            raise InputError(f"zbv_greedy needs scalar costs: Costs '{name}' is a vector")
    chunk_act = costs.activation / 2
    chunk_w = costs.activation_w / 2
    if m < 2 * p:
        raise InputError(f"zbv_greedy needs microbatches >= 2 * devices = {2 * p} (got {m}): its "
                         f"rules assume a full warm-up; use the handcrafted 'zb-v'")
    limit = p * costs.activation if memory_limit is None else float(memory_limit)
    if not np.isfinite(limit) or limit < p * costs.activation:
        raise InputError(f"'memory_limit' must be >= devices * activation = {p * costs.activation:g}, "
                         f"the V's steady-state peak (got {memory_limit})")
    # The greedy rules compare sums of times (and of memory) for equality;
    # floats would break those ties by rounding, so decide in exact integers.
    times = _exact_integers([costs.f / 2, costs.b / 2, costs.w / 2, costs.comm])
    mems = _exact_integers([chunk_act, chunk_w, limit])
    cost = tuple(times[:3])
    comm = times[3]
    mem = (mems[0], -(mems[0] - mems[1]), -mems[1])
    limit_int = mems[2]

    def refine(fill_f, fill_b, allowance):
        # Re-run with this pass's idle times as allowances while that helps.
        st = _one_pass(p, m, cost, mem, comm, limit_int, fill_f, fill_b, allowance)
        worst = max(st.idle)
        if max(allowance) < 0 or worst < max(allowance):
            again, again_worst = refine(fill_f, fill_b, list(st.idle))
            if again_worst < worst:
                return again, again_worst
        return st, worst

    best = None
    problems = []
    for fill_b in (True, False):
        for fill_f in (True, False):
            try:
                st, worst = refine(fill_f, fill_b, [-1] * p)
            except (KeyError, IndexError):
                # The rules ask for an op whose input is not placed yet, or for
                # a W when none is pending: they do not cover these costs.
                problems.append(f"fill_f={fill_f}, fill_b={fill_b}: the greedy rules stall")
                continue
            if best is not None and worst >= best[0]:
                continue
            try:
                sched = _to_schedule(st, p)
            except ScheduleError as exc:
                # The rules assume ties fall as in the paper's settings; a
                # variant that ends in an invalid order is dropped.
                problems.append(f"fill_f={fill_f}, fill_b={fill_b}: {exc.rule}")
                continue
            best = (worst, sched)
    if best is None:
        raise InputError("zbv_greedy found no valid order for these costs ("
                         + "; ".join(problems) + "); the handcrafted 'zb-v' always works")
    return best[1]


def _to_schedule(st, p):
    if isinstance(st, _KernelPass):
        keep = np.arange(st.kind.shape[1])[None, :] < st.count[:, None]
        kind, chunk = st.kind[keep], st.chunk[keep]
        device = np.repeat(np.arange(p, dtype=np.int64), st.count)
        slot = np.concatenate([np.arange(c, dtype=np.int64) for c in st.count])
        # Backward index 0 is the model's chunk 1 (its B flows down the devices).
        model_chunk = np.where(kind == _F, chunk, 1 - chunk)
        stage = np.where(model_chunk == 0, device, 2 * p - 1 - device)
        return validate(Schedule.from_arrays(device, slot, kind, stage, st.j[keep],
                                             name="zb-v-greedy", devices=p, copy=False))
    programs = []
    for d in range(p):
        stages = (d, 2 * p - 1 - d)
        prog = []
        for kind, c, j in st.order[d]:
            # Backward index 0 is the model's chunk 1 (its B flows down the devices).
            model_chunk = c if kind == _F else 1 - c
            prog.append(("FBW"[kind], stages[model_chunk], j))
        programs.append(prog)
    return validate(Schedule.from_programs(programs, name="zb-v-greedy", devices=p))


def _exact_integers(values):
    """Scale floats by one power of two so that all become exact integers."""
    ratios = [float(v).as_integer_ratio() for v in values]
    scale = max(den for _num, den in ratios)  # every denominator is a power of two
    return [num * (scale // den) for num, den in ratios]


def greedy(placement, microbatches: int, name: str = "greedy") -> Schedule:
    """Earliest-start list scheduling of fused F/BW ops on any placement.

    Every F and BW takes one time unit and communication is free. Ops are
    committed one at a time: the (device, op) that can start earliest,
    ties going to a backward first, then the lower microbatch, then the
    deeper stage. No cap is put on forwards in flight, so memory is not
    bounded; the order is what a device would run if it never waited by
    choice.

    Parameters
    ----------
    placement : sequence of int
        Device of each stage, stages in model order.
    microbatches : int
        m >= 1.
    name : str
        Label of the schedule.

    Returns
    -------
    Schedule

    Raises
    ------
    ValueError
        If the placement is empty or has a negative device, or m < 1.
    """
    placement = _check_placement(placement)
    m = check_int("microbatches", microbatches, minimum=1)
    S = len(placement)
    p = max(placement) + 1
    if 2 * S * m >= GREEDY_KERNEL_MIN_OPS and m < 2**21 and S < 2**21:  # the kernel's key packing
        cols = column_buffers(2 * S * m)
        status, dev_ptr = _greedy.earliest_first(np.asarray(placement, dtype=np.int64), m, p,
                                                 cols, GREEDY_SCAN_MAX)
        if status:  # pragma: no cover - the earliest-start rule never stalls
            raise RuntimeError("greedy: the kernel left ops unscheduled")
        two = 2 * S * m >= GREEDY_THREADS_MIN_OPS and p > 1 and local_cpus() >= 2
        _in_halves(_greedy.greedy_columns, two, p, dev_ptr, 2 * S, cols)
        return Schedule.from_arrays(*cols, name=name, devices=p, copy=False)
    return _greedy_python(placement, m, name)


# From this many ops on, greedy runs as a Numba kernel; smaller schedules
# (compare's hanayo at p=8) keep the Python loop and compile nothing.
GREEDY_KERNEL_MIN_OPS = 2_048
# Devices with at most this many F and BW queues (two per stage) pick their
# next op by a scan, not a heap: a scan of a few entries takes fewer
# branches than a heap's pops and pushes.
GREEDY_SCAN_MAX = 8
# From this many ops two threads write greedy's columns, half of the devices each.
GREEDY_THREADS_MIN_OPS = 1 << 22


def _greedy_python(placement, m, name):
    """The pure-Python :func:`greedy`, for schedules below GREEDY_KERNEL_MIN_OPS
    ops (the tests compare the kernel with it)."""
    import heapq

    S = len(placement)
    p = max(placement) + 1
    done = {}
    free = [0] * p
    programs = [[] for _ in range(p)]

    def producers(kind, s, j):
        if kind == "F":
            return [("F", s - 1, j)] if s > 0 else []
        return [("F", s, j)] + ([("BW", s + 1, j)] if s < S - 1 else [])

    def consumers(kind, s, j):
        if kind == "F":
            return [("F", s + 1, j)] if s < S - 1 else [("BW", s, j)]
        return [("BW", s - 1, j)] if s > 0 else []

    def key(op, t):
        kind, s, j = op
        return (t, 0 if kind == "BW" else 1, j, -s)

    heap = [key(("F", 0, j), 0) + (("F", 0, j),) for j in range(m)]
    heapq.heapify(heap)
    while heap:
        *k, op = heapq.heappop(heap)
        kind, s, j = op
        d = placement[s]
        t = max([free[d]] + [done[q] for q in producers(kind, s, j)])
        if t > k[0]:
            heapq.heappush(heap, key(op, t) + (op,))  # the device got busy meanwhile
            continue
        done[op] = t + 1
        free[d] = t + 1
        programs[d].append(op)
        for c in consumers(kind, s, j):
            need = producers(*c)
            if all(q in done for q in need):
                ready = max(done[q] for q in need)
                heapq.heappush(heap, key(c, max(ready, free[placement[c[1]]])) + (c,))
    return Schedule.from_programs(programs, name=name, devices=p)


def memory_greedy(placement, microbatches: int, costs: Costs | None = None,
                  memory_limit: float | None = None, warmup=None, w_fill: float = 1.0,
                  name: str = "memory-greedy") -> Schedule:
    """Memory-aware list scheduling with split backward, on any placement.

    A device, when free, runs in this order of preference: a backward (B)
    whose input has arrived; a forward (F) whose input has arrived, if its
    activation fits under the memory limit and the device has fewer than
    ``warmup[d]`` forwards waiting for their backward; a pending weight
    gradient (W), which fills time the device would otherwise spend idle;
    otherwise it waits for the earliest of those to become possible. Ops are
    committed one at a time, always the one that starts earliest across
    devices, so every choice sees the state of the pipeline at that time.
    Transfers take ``costs.comm`` (links are not contended here; simulate the
    result with a Network for that). This is the zero-bubble papers' rule of
    thumb (B first, W into the gaps, F by memory headroom) as a list
    scheduler; :func:`pipecore.tune` runs it over several warm-up depths.

    Parameters
    ----------
    placement : sequence of int
        Device of each stage, stages in model order (``range(p)`` for a
        linear pipeline, ``[0..p-1, p-1..0]`` for a V).
    microbatches : int
        m >= 1.
    costs : Costs, optional
        Scalars per device share or per-stage vectors (default
        ``Costs(f=1, b=1, w=1)``); memory from ``activation`` (held from F to
        B), ``activation_w`` (held from B to W) and ``weights``.
    memory_limit : float, optional
        Per-device limit on activation plus weights; none by default.
    warmup : int or sequence of int, optional
        Forwards a device may run ahead of its backwards (per device; an int
        applies to all); unlimited by default (the memory limit decides).
    w_fill : float, default 1.0
        How long a gap must be, in units of the W's duration, before a
        pending W fills it (0: any gap).
    name : str
        Label of the schedule.

    Returns
    -------
    Schedule

    Raises
    ------
    ValueError
        For a bad placement, costs or warm-up, or a limit below what one
        microbatch needs on some device (naming the device).
    """
    g = _greedy_setup(placement, microbatches, costs, memory_limit, warmup)
    m, p = g.m, g.p
    st_ptr = np.zeros(p + 1, dtype=np.int64)
    st_ptr[1:] = np.cumsum([len(x) for x in g.stages_of])
    width = 3 * m * max(len(x) for x in g.stages_of)
    out = _greedy.Programs(kind=np.empty((p, width), dtype=np.int64),
                           stage=np.empty((p, width), dtype=np.int64),
                           mb=np.empty((p, width), dtype=np.int64),
                           count=np.zeros(p, dtype=np.int64))
    status = _greedy.memory_greedy_kernel(
        _greedy.Layout(placement=np.asarray(g.placement, dtype=np.int64), st_ptr=st_ptr,
                       st_list=np.array([s for x in g.stages_of for s in x], dtype=np.int64),
                       m=m),
        _greedy.Rules(tf=g.tf, tb=g.tb, tw=g.tw, comm=g.comm, act=g.act, act_w=g.act_w,
                      static=np.asarray(g.static, dtype=np.float64),
                      reserve=np.asarray(g.reserve, dtype=np.float64),
                      limit_tol=g.limit * (1 + 1e-9), cap=np.asarray(g.cap, dtype=np.int64),
                      w_fill=float(w_fill)),
        out)
    if status != 0:
        raise InputError(f"memory_greedy cannot continue: devices {_waiting(g, out) or 'all'} "
                         f"wait on each other under memory_limit {g.limit:g} and warmup {g.cap}")
    keep = np.arange(width)[None, :] < out.count[:, None]
    device = np.repeat(np.arange(p, dtype=np.int64), out.count)
    slot = np.concatenate([np.arange(c, dtype=np.int64) for c in out.count])
    return Schedule.from_arrays(device, slot, out.kind[keep], out.stage[keep], out.mb[keep],
                                name=name, devices=p, copy=False)


def _waiting(g, out):
    """The devices with work left where memory_greedy's kernel stopped: a
    stage with backwards still to run, or a W pending (a B without its W)."""
    waiting = []
    for d in range(g.p):
        kind = out.kind[d, :out.count[d]]
        backwards = np.bincount(out.stage[d, :out.count[d]][kind == _B], minlength=g.S)
        if (any(backwards[s] < g.m for s in g.stages_of[d])
                or np.count_nonzero(kind == _B) > np.count_nonzero(kind == _W)):
            waiting.append(d)
    return waiting


@dataclass(frozen=True)
class _GreedyInputs:
    """The checked inputs of :func:`memory_greedy`: S stages on p devices."""

    placement: list  # device of each stage
    m: int
    tf: np.ndarray  # float64 (S,): F, B and W times per stage (Costs.stage_arrays)
    tb: np.ndarray
    tw: np.ndarray
    comm: np.ndarray  # float64 (S,): transfer time of stage s's output
    act: np.ndarray  # float64 (S,): activation an F holds until its B
    act_w: np.ndarray  # float64 (S,): activation a B holds until its W
    stages_of: list  # device d's stages, increasing
    static: list  # device d's weights
    limit: float  # per-device memory limit (inf: none)
    reserve: list  # per stage: the largest activation of a later stage on its device
    cap: list  # per device: the most forwards ahead of their backwards

    @property
    def S(self):
        """int: the stages."""
        return len(self.placement)

    @property
    def p(self):
        """int: the devices."""
        return len(self.stages_of)


def _check_placement(placement):
    """A placement as a list of ints; ValueError unless non-empty and >= 0."""
    placement = [int(d) for d in placement]
    if not placement or min(placement) < 0:
        raise InputError(f"'placement' needs a device >= 0 for each stage (got {placement})")
    return placement


def _greedy_setup(placement, microbatches, costs, memory_limit, warmup):
    """Checked inputs of :func:`memory_greedy` (:class:`_GreedyInputs`)."""
    placement = _check_placement(placement)
    m = check_int("microbatches", microbatches, minimum=1)
    costs = Costs(f=1.0, b=1.0, w=1.0) if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    S = len(placement)
    p = max(placement) + 1
    arr = costs.stage_arrays(S, p)
    act = arr["activation"]
    stages_of = [[s for s in range(S) if placement[s] == d] for d in range(p)]
    static = [sum(arr["weights"][s] for s in stages_of[d]) for d in range(p)]
    limit = np.inf if memory_limit is None else float(memory_limit)
    for d in range(p):
        need = static[d] + sum(act[s] for s in stages_of[d])
        if need > limit * (1 + 1e-9):
            raise InputError(f"memory_limit {limit:g} is below what device {d} needs for one "
                             f"microbatch on each of its stages ({need:g}: weights {static[d]:g} + "
                             f"activations)")
    reserve = [max((act[t] for t in stages_of[placement[s]] if t > s), default=0.0)
               for s in range(S)]
    if warmup is None:
        cap = [m * S] * p
    elif np.ndim(warmup) == 0:
        cap = [check_int("warmup", warmup, minimum=1)] * p
    else:
        cap = [check_int("warmup", x, minimum=1) for x in warmup]
        if len(cap) != p:
            raise InputError(f"'warmup' has {len(cap)} entries for {p} devices")
    return _GreedyInputs(placement=placement, m=m, tf=arr["f"], tb=arr["b"], tw=arr["w"],
                         comm=arr["comm"], act=act, act_w=arr["activation_w"],
                         stages_of=stages_of, static=static, limit=limit, reserve=reserve, cap=cap)


def warmup_search(placement, microbatches: int, costs: Costs | None = None,
                  memory_limit: float | None = None, network=None, max_evals: int = 200,
                  name: str = "memory-greedy") -> Schedule:
    """The fastest :func:`memory_greedy` schedule over warm-up depths, by
    coordinate descent.

    Starts from the uniform shifts ``max(1, p - d + k)`` (k from 1 - p to
    p) and each ``w_fill`` in (0, 0.5, 1), then moves one device's depth up
    or down by one while that makes the simulated makespan shorter and the
    schedule fits the limit. Warm-ups below 1F1B's ``p - d`` matter under
    tight limits: at p=4, m=8 they reach the proven MILP optimum in the
    cases where the fixed warm-ups fall 3-10% short.

    Parameters
    ----------
    placement : sequence of int
        Device of each stage (as :func:`memory_greedy`).
    microbatches : int
        m >= 1.
    costs : Costs, optional
        As :func:`memory_greedy`.
    memory_limit : float, optional
        Per-device limit on activation plus weights.
    network : Network, optional
        Links for the simulation that scores each schedule.
    max_evals : int, default 200
        Most schedules built and simulated.
    name : str
        Label of the schedule.

    Returns
    -------
    Schedule
        The best one found; its ``params`` hold ``warmup`` and ``w_fill``.

    Raises
    ------
    ValueError
        For bad arguments, or when no warm-up gives a schedule that fits.
    """
    import math

    from ..core.costs import fits
    from ..core.simulate import simulate

    max_evals = check_int("max_evals", max_evals, minimum=1)
    placement = [int(d) for d in placement]
    p = max(placement) + 1 if placement else 0
    limit = math.inf if memory_limit is None else float(memory_limit)
    seen = {}

    def score(warm, w_fill):
        key = (tuple(warm), w_fill)
        if key not in seen:
            try:
                sched = memory_greedy(placement, microbatches, costs, memory_limit, list(warm),
                                      w_fill, name=name)
                res = simulate(sched, costs, network)
                ok = fits(float((res.peak_activation + res.static_memory).max()), limit)
                seen[key] = (res.makespan if ok else math.inf, sched)
            except ValueError:
                seen[key] = (math.inf, None)
        return seen[key][0]

    fills = (0.0, 0.5, 1.0)
    best = (math.inf, None, None)
    for k in range(1 - p, p + 1):
        warm = tuple(max(1, p - d + k) for d in range(p))
        for w_fill in fills:
            if len(seen) < max_evals:
                value = score(warm, w_fill)
                if value < best[0]:
                    best = (value, warm, w_fill)
    improved = best[1] is not None
    while improved and len(seen) < max_evals:
        improved = False
        _value, warm, _fill = best
        for d in range(p):
            for step in (-1, 1):
                moved = list(warm)
                moved[d] += step
                if moved[d] < 1:
                    continue
                for w_fill in fills:
                    if len(seen) >= max_evals:
                        break
                    value = score(moved, w_fill)
                    if value < best[0] * (1 - 1e-12):
                        best = (value, tuple(moved), w_fill)
                        improved = True
    if best[1] is None:
        raise InputError(f"no warm-up gives a memory_greedy schedule within memory_limit "
                         f"{memory_limit!r}")
    sched = seen[(best[1], best[2])][1]
    sched.params.update(warmup=list(best[1]), w_fill=best[2])
    return sched
