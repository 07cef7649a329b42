"""Chimera (Li and Hoefler, SC'21): two pipelines in opposite directions.

The down pipeline runs stage i on device i, the up pipeline runs it on
device p-1-i, so every device holds two stage replicas (twice the weights).
Each unit of p microbatches sends its first p/2 down and the rest up; each
pipeline runs its share 1F1B-style. The per-device order is the authors'
(the runtime of github.com/Shigangli/Chimera, branch ChimeraBk, and the slot
generator on its main branch agree), restated in docs/research/bidirectional.md.

More microbatches than devices (m = K p, K units) are joined as the paper
does it: direct concatenation of units, which leaves (p - 2) ``|T_BW - T_F|``
idle at every join, or forward doubling, which runs two units per step with
their forwards in pairs: no idle time at the joins when T_F <= T_BW <= 2 T_F,
at about twice the activation memory. The paper introduces forward doubling
for the usual T_BW ~ 2 T_F and the authors ran it at scale
(main_with_runtime_forward_doubling.py and its job scripts on ChimeraBk), so
it is the default from m = 2p on; ``variant="direct"`` keeps the other join.
Both closed forms below are exact for any T_F and T_BW.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..core.ops import InputError
from ..core.schedule import KIND_CODE, Schedule
from ..kernels import bidirectional as _kernel
from .construct import column_buffers
from .papers import CHIMERA
from .registry import Family, register, with_builder_doc


class PlacementWarning(UserWarning):
    """A Chimera placement that puts two stages of one pipeline on one device."""


def _check_down(down, m):
    if down is None:
        return m // 2
    if isinstance(down, bool) or not isinstance(down, (int, np.integer)):
        raise InputError(f"'chimera' down must be an int (got {down!r})")
    if not 1 <= down <= m - 1:
        raise InputError(f"'chimera' down must satisfy 1 <= down <= microbatches - 1 = {m - 1}, "
                         f"so that each pipeline carries at least one microbatch (got down={down})")
    return int(down)


def _check_up_placement(up_placement, p):
    default = list(range(p - 1, -1, -1))
    if up_placement is None:
        return default
    try:
        devs = list(up_placement)
    except TypeError:
        raise InputError(f"'chimera' up_placement must be a sequence of {p} device indices "
                         f"(got {up_placement!r})") from None
    if len(devs) != p:
        raise InputError(f"'chimera' up_placement must give a device for each of the {p} up-pipeline "
                         f"stages (got {len(devs)} entries: {devs!r})")
    for i, x in enumerate(devs):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x < p:
            raise InputError(f"'chimera' up_placement[{i}] must be a device index in 0..{p - 1} "
                             f"(got {x!r})")
    devs = [int(x) for x in devs]
    if len(set(devs)) < p:
        shared = sorted({d for d in devs if devs.count(d) > 1})
        d = shared[0]
        stages = [i for i, x in enumerate(devs) if x == d]
        empty = sorted(set(range(p)) - set(devs))
        warnings.warn(f"chimera up_placement={devs} puts up-pipeline stages {stages} on device {d}"
                      f"{' (and more on devices ' + str(shared[1:]) + ')' if len(shared) > 1 else ''}"
                      f": it is no longer one stage per pipeline per device; devices {empty} hold "
                      f"no up-pipeline stage", PlacementWarning, stacklevel=4)
    return devs


def _check_layers(name, layers, p):
    if layers is None:
        return None
    try:
        counts = list(layers)
    except TypeError:
        raise InputError(f"'chimera' {name} must be a sequence of {p} ints (got {layers!r})") from None
    if len(counts) != p:
        raise InputError(f"'chimera' {name} must give the share of each of the {p} stages "
                         f"(got {len(counts)} entries: {counts!r})")
    for i, c in enumerate(counts):
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
            raise InputError(f"'chimera' {name}[{i}] must be an int >= 1: every stage holds part "
                             f"of the model (got {c!r})")
    return [int(c) for c in counts]


def _segments(down_layers, up_layers, p):
    """Split the model into equal segments that both pipelines' stage bounds fall on.

    Returns the segment size in layers, the number of segments, and the
    segment ranges of each stage of each pipeline."""
    if down_layers is None and up_layers is None:
        return None, p, {pipe: [(i, i + 1) for i in range(p)] for pipe in ("down", "up")}
    down_layers = up_layers if down_layers is None else down_layers
    up_layers = down_layers if up_layers is None else up_layers
    if sum(down_layers) != sum(up_layers):
        raise InputError(f"'chimera' down_layers and up_layers split one model: their sums must "
                         f"be equal (got {sum(down_layers)} for down_layers={down_layers} and "
                         f"{sum(up_layers)} for up_layers={up_layers})")
    g = math.gcd(*down_layers, *up_layers)
    ranges = {}
    for pipe, counts in (("down", down_layers), ("up", up_layers)):
        ends = np.cumsum(counts) // g
        ranges[pipe] = [(int(e - c // g), int(e)) for c, e in zip(counts, ends)]
    return g, sum(down_layers) // g, ranges


def _greedy_programs(p, k, m, up_placement, ranges):
    """Each stage replica runs its pipeline's microbatches 1F1B-style (fused
    backward); each device interleaves the replicas it holds by list
    scheduling at F = share, BW = 2 share and free transfers (the op that
    can start first; on a tie a backward, then the later stage, then the
    down pipeline: this matches Chimera's makespan at m = p, F = 1, BW = 2).
    The order comes from an execution, so no costs can deadlock it."""
    size = {pipe: [(hi - lo) * p / ranges[pipe][-1][1] for lo, hi in ranges[pipe]]
            for pipe in ("down", "up")}
    place = {"down": list(range(p)), "up": list(up_placement)}
    mbs = {"down": list(range(k)), "up": list(range(k, m))}
    queues = []  # (pipe, stage, [(kind, j), ...])
    for pipe in ("down", "up"):
        n = len(mbs[pipe])
        for i in range(p):
            warm = min(n, p - i)
            q = [("F", j) for j in range(warm)]
            for j in range(n - warm):
                q += [("BW", j), ("F", warm + j)]
            q += [("BW", j) for j in range(n - warm, n)]
            queues.append((pipe, i, q))
    index = {(pipe, i): qi for qi, (pipe, i, _q) in enumerate(queues)}
    device = [place[pipe][i] for pipe, i, _q in queues]
    by_dev = [[qi for qi in range(len(queues)) if device[qi] == d] for d in range(p)]
    pos = [0] * len(queues)
    done = {}  # (kind, pipe, stage, local j) -> finish
    free = [0.0] * p
    order = [[] for _ in range(p)]

    waits = (math.inf,)  # sorts after every candidate

    def rank(qi):
        # The queue's next op as a candidate (``waits`` when empty or waiting).
        pipe, i, q = queues[qi]
        if pos[qi] == len(q):
            return waits
        kind, j = q[pos[qi]]
        if kind == "F":
            need = ("F", pipe, i - 1, j) if i > 0 else None
        else:
            need = ("BW", pipe, i + 1, j) if i < p - 1 else ("F", pipe, i, j)
        if need is None:
            ready = 0.0
        else:
            ready = done.get(need)
            if ready is None:
                return waits
        d = device[qi]
        # Unique per queue (its stage, pipeline and device), so the smallest
        # is the one a scan of every queue would pick.
        return (max(free[d], ready), kind != "BW", -i, pipe != "down", d, qi)

    ranks = [rank(qi) for qi in range(len(queues))]
    left = sum(len(q) for _p, _i, q in queues)
    while left:
        begin, _bw, _i, _up, d, qi = min(ranks)
        pipe, i, q = queues[qi]
        kind, j = q[pos[qi]]
        pos[qi] += 1
        left -= 1
        dur = size[pipe][i] * (1.0 if kind == "F" else 2.0)
        free[d] = begin + dur
        done[(kind, pipe, i, j)] = free[d]
        order[d].append((kind, pipe, i, mbs[pipe][j]))
        # Only these candidates change: the queues on device d (its free
        # time), and the neighbouring stages that may wait on this op.
        for other in by_dev[d]:
            ranks[other] = rank(other)
        for ni in (i - 1, i + 1):
            if 0 <= ni < p:
                nq = index[(pipe, ni)]
                ranks[nq] = rank(nq)
    return order, done


def _expand(ops, ranges):
    """Pipeline-stage ops -> segment ops: a forward runs its segments in model
    order, a backward in reverse."""
    out = []
    for kind, pipe, i, mb in ops:
        lo, hi = ranges[pipe][i]
        segs = range(lo, hi) if kind == "F" else range(hi - 1, lo - 1, -1)
        out += [(kind, s, mb) for s in segs]
    return out


@with_builder_doc(devices="Pipeline devices p (even).",
                  microbatches="Microbatches m (a multiple of p).")
def build_chimera(devices, microbatches, chunks=1, variant=None, down=None,
                  up_placement=None, down_layers=None, up_layers=None, order=None):
    """Chimera: units of p microbatches, how they join, and its placement space.

    With h = p/2, device d runs "own" and "other" pipelines: for d < h own is
    down (stage d) and other is up (stage p-1-d), with a = h-d, b = d; for
    d >= h own is up (stage p-1-d), other is down (stage d), a = d-h+1,
    b = h-a. A unit is a x [own F], b x [other F, own F], a x [other F,
    other BW], b x [own BW, other BW], a x [own BW]; in every unit after the
    first, its a x [own F] becomes a x [own BW of the previous unit, own F]
    and the last a x [own BW] runs once at the end. Each stage's two
    replicas (devices d and p-1-d) end with a gradient all-reduce (AR): the
    other pipeline's just before the final a x [own BW] (after it on the two
    middle devices), the own pipeline's last. With a network, the exchange
    costs ``grad_bytes / bandwidth + latency``.

    With ``variant="forward-doubling"`` (the paper's answer to a backward
    twice as long as a forward) each step covers two units and runs
    forwards in pairs: a x [own F, own F] (a x [own BW, own F, own F] after
    the first step), b x [other F, other F, own F, own F], a x [other F,
    other F, other BW], (b + p/2) x [own BW, other BW], and after the last
    step a x [own BW]. It needs m >= 2p and holds p more microbatches'
    activations per device (about twice). The authors' runtime takes an
    even number of units; with an odd number pipecore runs the first unit
    alone (the basic unit above) and the others in doubling steps.

    The four placement knobs below span asymmetric Chimera-style
    placements (docs/research/tabular.md). Left at their defaults they give
    the schedule above op for op. ``down_layers`` and ``up_layers`` alone,
    when equal, keep that order and only resize stages. Any other setting
    orders ops by list scheduling: each stage replica runs its pipeline's
    microbatches 1F1B-style (p - i forwards in flight at stage i, fused
    backward), a device interleaves the replicas it holds by taking the
    op that can start first in an execution at F = 1, BW = 2 per stage
    share and free transfers (on a tie a backward first, then the op of
    the later stage, then the down pipeline), and every all-reduce moves to the end of its device's
    program, which keeps every setting free of deadlock.

    Parameters
    ----------
    variant : {None, "direct", "forward-doubling"}
        How units of p microbatches are joined. None (default) is
        ``"forward-doubling"`` for the published Chimera (knobs below at
        their defaults) from m = 2p on, and ``"direct"`` otherwise; the
        knobs below need ``"direct"``. The paper's backward halving is the
        forward-doubling order on microbatches of half the size: build it
        with twice the microbatches and half the costs per microbatch.
    down : int, optional
        Microbatches the down pipeline carries; the up pipeline carries the
        other ``m - down``. Default m/2 (the paper's even split). Any
        ``1 <= down <= m - 1``; with a value other than m/2, microbatches
        ``0..down-1`` go down and the rest up.
    up_placement : sequence of int, optional
        ``up_placement[i]`` is the device that runs stage i of the up
        pipeline (the down pipeline always runs stage i on device i).
        Default ``[p-1, ..., 0]``, Chimera's reversal. Any permutation is a
        valid two-pipeline placement; a mapping that sends two up stages to
        one device is accepted too, with a :class:`PlacementWarning`: that
        device then holds three stage replicas and some device only one,
        so it is no longer one stage per pipeline per device. Where a
        device holds both replicas of the same layers it keeps one copy of
        their weights and needs no all-reduce for them.
    down_layers, up_layers : sequence of int, optional
        The share of the model each stage of the down (up) pipeline holds,
        as p positive ints in any unit (e.g. layers): stage i holds
        ``down_layers[i] / sum(down_layers)`` of the model, and both lists
        must have the same sum. One given alone is used for both pipelines
        (the two replicas of a stage stay equal). They change each stage's
        F, B, W time, activation and weights in proportion to its share: the
        schedule's stages become equal segments of ``g`` units, g the
        greatest common divisor of all the counts, and a pipeline stage
        runs its segments back to back on its device (forwards in model
        order, backwards in reverse), so a scalar :class:`~pipecore.Costs`
        value, the time or memory of 1/p of the model, is spread by share.
        ``schedule.params["stage_layers"]`` lists the units per schedule
        stage, for :meth:`pipecore.Model.costs`. Weights are counted per
        segment replica a device holds; each segment held on two devices
        has its own gradient all-reduce between them.
    order : {None, "chimera", "list"}, optional
        How ops are ordered on each device. ``"chimera"`` is the authors'
        order above and holds only settings whose two replicas of a stage
        are equal and on devices i and p-1-i with an even microbatch split;
        ``"list"`` is the list-scheduling order described above, for any
        setting (with the defaults it gives a symmetric Chimera placement
        in that order, the baseline that separates an order's gain from an
        asymmetry's). None (default) picks ``"chimera"`` where it holds and
        ``"list"`` otherwise.

    Returns
    -------
    Schedule
        Replicated (each stage on up to two devices).

    Raises
    ------
    ValueError
        If p is odd, m is not a multiple of p (or below 2p with forward
        doubling), the variant is unknown, or a knob breaks its rule above
        (the message names the value and the rule).
    """
    p, m = devices, microbatches
    _check_variant(variant)
    if variant == "forward-doubling" and (m % p or m < 2 * p or p % 2):
        raise InputError(f"'chimera' forward doubling needs an even number of devices and "
                         f"microbatches a multiple of devices and at least 2 * devices = {2 * p} "
                         f"(got devices={p}, microbatches={m})")
    if p % 2:
        raise InputError(f"'chimera' needs an even number of devices (got devices={p})")
    if m % p:
        raise InputError(f"'chimera' needs microbatches to be a multiple of devices "
                         f"(got microbatches={m}, devices={p})")
    k = _check_down(down, m)
    placement = _check_up_placement(up_placement, p)
    dl = _check_layers("down_layers", down_layers, p)
    ul = _check_layers("up_layers", up_layers, p)
    g, S, ranges = _segments(dl, ul, p)
    symmetric = (k == m // 2 and placement == list(range(p - 1, -1, -1))
                 and ranges["down"] == ranges["up"])
    if order not in (None, "chimera", "list"):
        raise InputError(f"'chimera' order must be None, 'chimera' or 'list' (got {order!r})")
    if order == "chimera" and not symmetric:
        raise InputError("'chimera' order='chimera' holds only an even microbatch split (down = "
                         f"microbatches / 2 = {m // 2}), the reversed up_placement and equal "
                         "down_layers and up_layers; use order='list' (or None) for this setting")
    if order == "list" and variant not in (None, "direct"):
        raise InputError("'chimera' order='list' needs variant='direct'")
    symmetric = symmetric and order != "list"
    variant = _resolve_variant(variant, p, m, symmetric and g is None)
    if variant != "direct" and not (symmetric and g is None):
        raise InputError("'chimera' forward doubling takes only the default placement: leave "
                         "down, up_placement, down_layers and up_layers unset (or use "
                         "variant='direct')")
    if symmetric:
        if g is None and p * (2 * m + 2) >= CHIMERA_KERNEL_MIN_OPS:
            ok, cols = _kernel.chimera_columns(p, m, variant == "forward-doubling",
                                               column_buffers(p * (2 * m + 2)))
            if not ok:
                raise RuntimeError("internal error: the chimera kernel's programs came out "
                                   f"at a length other than 2m + 2 (p={p}, m={m})")
            sched = Schedule.from_arrays(*cols, name="chimera", devices=p, replicated=True,
                                         copy=False)
            sched.params["variant"] = variant
            return sched
        base = _chimera_programs(p, m, variant)
        if g is None:
            sched = _from_programs(base, p)
            sched.params["variant"] = variant
            return sched
        programs = []
        for prog in base:
            out = []
            for kind, stage, mb in prog:
                lo, hi = ranges["down"][stage]
                if kind == "AR":  # both replicas of every segment of the stage
                    out += [("AR", s, None) for s in range(hi - 1, lo - 1, -1)]
                else:
                    segs = range(lo, hi) if kind == "F" else range(hi - 1, lo - 1, -1)
                    out += [(kind, s, mb) for s in segs]
            programs.append(out)
    else:
        order, done = _greedy_programs(p, k, m, placement, ranges)
        programs = [_expand(ops, ranges) for ops in order]
        # Where each segment's replicas live, and when each replica's last
        # backward ends in the list-scheduling run (to order the ARs).
        holder = {}
        for pipe in ("down", "up"):
            for i, (lo, hi) in enumerate(ranges[pipe]):
                d = i if pipe == "down" else placement[i]
                n = k if pipe == "down" else m - k
                for s in range(lo, hi):
                    holder.setdefault(s, {})[pipe] = (d, done[("BW", pipe, i, n - 1)])
        for d in range(p):
            ars = []
            for s, reps in holder.items():
                (dd, td), (du, tu) = reps["down"], reps["up"]
                if dd == du:
                    continue
                if d == dd:
                    ars.append((tu, -s))
                elif d == du:
                    ars.append((td, -s))
            programs[d] += [("AR", -ns, None) for _t, ns in sorted(ars)]
    sched = _from_programs(programs, p)
    if g is not None:
        sched.params["stage_layers"] = [g] * S
    if symmetric:  # units of p microbatches, joined by this variant
        sched.params["variant"] = variant
    return sched


def _from_programs(programs, p):
    """``Schedule.from_programs(programs, name="chimera", devices=p,
    replicated=True)`` for programs of plain ``(kind, stage, microbatch)``
    tuples with all-reduces (microbatch None), which that method takes op by
    op: the same columns, made a device at a time."""
    device, slot, kind, stage, mb = [], [], [], [], []
    for d, prog in enumerate(programs):
        n = len(prog)
        if not n:
            continue
        kinds, stages, mbs = zip(*prog)
        device.append(np.full(n, d, dtype=np.int32))
        slot.append(np.arange(n, dtype=np.int32))
        kind.append(np.array([KIND_CODE[x] for x in kinds], dtype=np.int64))
        stage.append(np.array(stages, dtype=np.int64))
        mb.append(np.array([-1 if x is None else x for x in mbs], dtype=np.int64))
    cols = [np.concatenate(c) if c else np.zeros(0, dtype=t)
            for c, t in ((device, np.int32), (slot, np.int32), (kind, np.int64),
                         (stage, np.int64), (mb, np.int64))]
    return Schedule.from_arrays(*cols, copy=False, name="chimera", devices=p, replicated=True)


# The joins of units build_chimera takes (None: its pick).
VARIANTS = (None, "direct", "forward-doubling")

# From this many ops on, symmetric Chimera is written by a Numba kernel
# (kernels/bidirectional.py); smaller ones keep the per-op builder below and so
# compile nothing (compare's p=8 chimera among them).
CHIMERA_KERNEL_MIN_OPS = 16_384


def _check_variant(variant):
    if variant not in VARIANTS:
        raise InputError(f"'chimera' variant must be None, 'direct' or 'forward-doubling' "
                         f"(got {variant!r})")


def _resolve_variant(variant, p, m, published):
    """The join a build uses: ``variant``, or for None forward doubling where
    it applies (the published placement, m >= 2p) and direct otherwise."""
    if variant is not None:
        return variant
    return "forward-doubling" if published and m >= 2 * p and m % p == 0 else "direct"


def _plan(units, doubling):
    """Microbatch units per step: 1 (a unit alone) or 2 (a doubling step).
    Forward doubling pairs the units; an odd one out runs first, alone."""
    if not doubling:
        return [1] * units
    return [1] * (units % 2) + [2] * (units // 2)


def _chimera_programs(p, m, variant):
    """Today's Chimera programs over (kind, stage, microbatch); checks done by the caller."""
    h = p // 2
    units = m // p
    plan = _plan(units, variant == "forward-doubling")
    down = [k * p + j for k in range(units) for j in range(h)]
    up = [k * p + h + j for k in range(units) for j in range(h)]
    programs = []
    for d in range(p):
        if d < h:
            own, other = ("down", d), ("up", p - 1 - d)
            a, b = h - d, d
        else:
            own, other = ("up", p - 1 - d), ("down", d)
            a, b = d - h + 1, h - (d - h + 1)
        queues = {"down": down, "up": up}
        nxt = {}

        def op(kind, pipe, nxt=nxt, queues=queues):
            name, stage = pipe
            key = (kind, name)
            k = nxt.get(key, 0)
            nxt[key] = k + 1
            return ("F" if kind == "F" else "BW", stage, queues[name][k])

        prog = []
        middle = d in (h - 1, h)
        for step, x in enumerate(plan):
            # x forwards where the basic unit runs one; a doubling step
            # drains h more backward pairs.
            for _ in range(a):
                if step > 0:
                    prog.append(op("B", own))
                prog += [op("F", own) for _ in range(x)]
            for _ in range(b):
                prog += [op("F", other) for _ in range(x)] + [op("F", own) for _ in range(x)]
            for _ in range(a):
                prog += [op("F", other) for _ in range(x)] + [op("B", other)]
            for _ in range(b + (h if x == 2 else 0)):
                prog += [op("B", own), op("B", other)]
        # Gradient all-reduce with the replica on device p-1-d: the other
        # pipeline's stage is done before the tail and syncs eagerly (the
        # authors' runtime), except on the two middle devices.
        if not middle:
            prog.append(("AR", other[1], None))
        prog += [op("B", own) for _ in range(a)]
        if middle:
            prog.append(("AR", other[1], None))
        prog.append(("AR", own[1], None))
        programs.append(prog)
    return programs



def formula_chimera(p, m, v, c, variant=None, down=None, up_placement=None,
                    down_layers=None, up_layers=None, order=None):
    """Makespan and peak of the order ``build_chimera`` builds, for any
    T_F and T_BW = T_B + T_W (K = m / p units, hi and lo the larger and the
    smaller of T_F and T_BW).

    Each device is busy m (T_F + T_BW). Its idle time is, with direct
    concatenation, (p - 2) hi in the basic unit (p/2 - 1 idle forward and
    p/2 - 1 idle backward slots, each as long as the longer op) plus
    (p - 2)(hi - lo) at each of the K - 1 joins, where the next unit's
    forwards pair with this unit's backwards. With forward doubling,
    (p - 2)/2 (T_F + hi + max(0, T_BW - 3 T_F)) in the first doubling step
    and (p - 2)(max(0, T_BW - 2 T_F) + max(0, T_F - T_BW)) at each later
    join: two forwards fill a backward slot when T_F <= T_BW <= 2 T_F; an
    odd unit out runs first as a basic unit ((p - 2) hi) and joins the
    steps the same way. At T_F = T_BW both give the paper's bubble ratio
    (p-2)/(2m+p-2) (its unit slots). Peak p/2 + 1 + min(d, p-1-d)
    microbatches on device d, plus p more with forward doubling.

    Parameters
    ----------
    p, m, v : int
        Devices, microbatches, chunks.
    c : Costs
        Scalar costs.
    variant : {None, "direct", "forward-doubling"}
        As ``build_chimera`` (None: the join it picks).
    down, up_placement, down_layers, up_layers, order
        ``build_chimera``'s placement knobs; the closed form exists only
        for their symmetric values (the published Chimera).

    Returns
    -------
    dict
        ``makespan``, ``bubble_time``, ``peak_activation``, ``exact``
        (True where m is a multiple of p: the shapes the builder takes).

    Raises
    ------
    ValueError
        For an asymmetric setting or the list order, which have no closed form.
    """
    layers = [list(x) for x in (down_layers, up_layers) if x is not None]
    even = all(x == [x[0]] * len(x) for x in layers) and all(x == layers[0] for x in layers)
    reversal = up_placement is None or list(up_placement) == list(range(p - 1, -1, -1))
    if down not in (None, m // 2) or order == "list" or not even or not reversal:
        raise InputError("'chimera' has a closed form only for the symmetric placement (down = "
                         "microbatches / 2, reversed up_placement, equal layer shares, Chimera's "
                         "order); simulate this setting instead")
    variant = _resolve_variant(variant, p, m, not layers)
    f, bw = c.f, c.b + c.w
    hi, lo = max(f, bw), min(f, bw)
    units = m // p
    plan = _plan(units, variant == "forward-doubling")
    if variant == "direct":
        bubble = (p - 2) * (hi + (units - 1) * (hi - lo))
    else:
        join = (p - 2) * (max(0.0, bw - 2 * f) + max(0.0, f - bw))
        first = ((p - 2) * hi if plan[0] == 1
                 else (p - 2) / 2 * (f + hi + max(0.0, bw - 3 * f)))
        bubble = first + (len(plan) - 1) * join
    d = np.arange(p)
    doubling = variant == "forward-doubling"
    peak = (p // 2 + 1 + np.minimum(d, p - 1 - d) + (p if doubling else 0)).astype(float)
    peak = np.minimum(peak, m) * c.activation
    return {"makespan": m * (f + bw) + bubble, "bubble_time": bubble,
            "peak_activation": peak, "exact": bool(m % p == 0 and m >= p)}


def _check_options(options):
    """The option checks that hold at every shape (the rest need p and m)."""
    _check_variant(options.get("variant"))
    if options.get("order") not in (None, "chimera", "list"):
        raise InputError(f"'chimera' order must be None, 'chimera' or 'list' "
                         f"(got {options.get('order')!r})")
    down = options.get("down")
    if down is not None and (isinstance(down, bool) or not isinstance(down, (int, np.integer))
                             or down < 1):
        raise InputError(f"'chimera' down must be an int >= 1 (got {down!r})")
    for name in ("up_placement", "down_layers", "up_layers"):
        value = options.get(name)
        if value is None:
            continue
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise InputError(f"'chimera' {name} must be a list of ints (got {value!r})")
        low = 0 if name == "up_placement" else 1
        for i, x in enumerate(value):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < low:
                raise InputError(f"'chimera' {name}[{i}] must be an int >= {low} (got {x!r})")


register(Family("chimera", build_chimera, formula_chimera, check=_check_options,
                options=("variant", "down", "up_placement", "down_layers", "up_layers", "order"),
                tune_options={"variant": ("direct", "forward-doubling")},
                summary="bidirectional pipelines, stages replicated (2x weights)",
                paper=CHIMERA))
