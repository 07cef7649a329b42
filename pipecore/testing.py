"""Hypothesis strategies for property-testing schedules, simulators and tuners.

Import requires ``hypothesis`` (``pip install 'pipecore[test]'``)::

    from hypothesis import given
    from pipecore.testing import schedules, costs

    @given(schedules(), costs())
    def test_my_tuner(sched, c): ...
"""

from __future__ import annotations

import numpy as np

try:
    from hypothesis import reject
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("pipecore.testing needs hypothesis: pip install 'pipecore[test]'") from exc

from .core.costs import Costs, Network
from .core.ops import InputError, O
from .core.schedule import Schedule, ScheduleError
from .core.simulate import validate
from .schedules.recompute import recompute as _recompute
from .schedules.registry import build, family
from .schedules.registry import schedules as _family_names

__all__ = ["random_programs", "schedules", "family_schedules", "costs", "networks", "times"]

# Small dyadic values make ties (equal ready times) common, which is where
# ordering bugs hide; arbitrary floats cover the rest.
_TIE_VALUES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)


def times(allow_zero: bool = True, max_value: float = 10.0):
    """Non-negative finite durations, often small dyadic values that tie.

    Parameters
    ----------
    allow_zero : bool
        Whether 0 may be drawn.
    max_value : float
        Largest value.

    Returns
    -------
    hypothesis.strategies.SearchStrategy of float
    """
    values = [v for v in _TIE_VALUES if (allow_zero or v > 0) and v <= max_value]
    # Keep drawn floats well above 0: a tiny serialisation time added to a
    # large clock rounds away, and the link order then hinges on rounding.
    return st.one_of(st.sampled_from(values),
                     st.floats(1e-3, max_value, allow_nan=False, allow_infinity=False))


def random_programs(rng, devices: int, stages: int, microbatches: int,
                    placement=None, split=0.5):
    """Random deadlock-free per-device programs.

    Draws a random topological order of all ops (every (stage,
    microbatch) gets F and either BW or B+W) and projects it onto the
    devices, which can never deadlock.

    Parameters
    ----------
    rng : random.Random or numpy.random.Generator
        Source of randomness (anything with ``random()``).
    devices, stages, microbatches : int
        Shape (each >= 1).
    placement : sequence, optional
        Device of each stage, or per stage a sequence giving the device of
        each microbatch (a replicated stage); random when None.
    split : float
        Probability that a (stage, microbatch) uses B+W instead of BW.

    Returns
    -------
    list of list of tuple
        ``programs[d]`` of ``(kind, stage, microbatch)``.

    Raises
    ------
    ValueError
        If a shape is < 1 or the placement does not fit.
    """
    for name, value in (("devices", devices), ("stages", stages), ("microbatches", microbatches)):
        if value < 1:
            raise InputError(f"'{name}' must be >= 1 (got {value})")
    rand = rng.random
    if placement is None:
        placement = [int(rand() * devices) for _ in range(stages)]
    S, m = stages, microbatches
    where = [list(x) if np.ndim(x) else [x] * m for x in placement]
    if len(where) != stages or any(len(row) != m or not all(0 <= d < devices for d in row)
                                   for row in where):
        raise InputError(f"'placement' must give a device in 0..{devices - 1} for each of "
                         f"{stages} stages (or each stage and microbatch); got {list(placement)}")
    split_of = [[rand() < split for _ in range(m)] for _ in range(S)]
    # Consumers and pending-producer counts of every op.
    waiting = {}
    consumers = {}

    def back(s, j):
        return ("B" if split_of[s][j] else "BW", s, j)

    for s in range(S):
        for j in range(m):
            fop = ("F", s, j)
            bop = back(s, j)
            waiting[fop] = 1 if s > 0 else 0
            waiting[bop] = 1 + (1 if s < S - 1 else 0)
            consumers.setdefault(fop, []).append(bop)
            if s < S - 1:
                consumers[fop].append(("F", s + 1, j))
            if s > 0:
                consumers.setdefault(bop, []).append(back(s - 1, j))
            if split_of[s][j]:
                wop = ("W", s, j)
                waiting[wop] = 1
                consumers.setdefault(bop, []).append(wop)
    ready = [op for op, k in waiting.items() if k == 0]
    programs = [[] for _ in range(devices)]
    while ready:
        i = int(rand() * len(ready))
        ready[i], ready[-1] = ready[-1], ready[i]
        op = ready.pop()
        programs[where[op[1]][op[2]]].append(op)
        for c in consumers.get(op, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    return programs


@st.composite
def schedules(draw, max_devices: int = 6, max_stages: int = 8, max_microbatches: int = 6,
              split: bool | None = None, overlap: bool = True, recompute: bool = True,
              offload: bool = True):
    """Random valid schedules with arbitrary placement and op order.

    Parameters
    ----------
    max_devices, max_stages, max_microbatches : int
        Upper bounds of the shape.
    split : bool, optional
        True: always B+W; False: always BW; None: mixed.
    overlap : bool, default True
        Sometimes run an F and the next B/BW of another microbatch as one
        overlapped F&B unit (kept only where that cannot deadlock).
    recompute : bool, default True
        Sometimes recompute random (stage, microbatch)s: an R op at a
        random place between the F and its backward on their device.
    offload : bool, default True
        Sometimes offload random (stage, microbatch)s not recomputed: an O
        and then an L at random places between the F and its backward.

    Returns
    -------
    hypothesis.strategies.SearchStrategy of Schedule
    """
    p = draw(st.integers(1, max_devices))
    S = draw(st.integers(1, max_stages))
    m = draw(st.integers(1, max_microbatches))
    rng = draw(st.randoms(use_true_random=False))
    layout = draw(st.sampled_from(["looped", "random", "replicated"]))
    if layout == "looped":
        placement = [s % p for s in range(S)]  # like interleaving
    elif layout == "random":
        placement = [draw(st.integers(0, p - 1)) for _ in range(S)]
    else:
        # Each stage on two devices, alternating microbatches (Chimera-like).
        pairs = [(draw(st.integers(0, p - 1)), draw(st.integers(0, p - 1))) for _ in range(S)]
        placement = [[pair[j % 2] for j in range(m)] for pair in pairs]
    prob = {True: 1.0, False: 0.0, None: draw(st.sampled_from([0.0, 0.5, 1.0]))}[split]
    programs = random_programs(rng, p, S, m, placement=placement, split=prob)
    replicated = layout == "replicated"
    if recompute and draw(st.booleans()):
        _insert_recompute(programs, rng, draw(st.sampled_from([0.3, 1.0])))
    if offload and draw(st.booleans()):
        _insert_offload(programs, rng, draw(st.sampled_from([0.3, 1.0])))
    if replicated and m > 1 and draw(st.booleans()):
        # End each replica pair with its gradient all-reduce.
        for stage, (a, b) in enumerate(pairs):
            if a != b:
                programs[a].append(("AR", stage, None))
                programs[b].append(("AR", stage, None))
    if overlap and draw(st.booleans()):
        fused = [_fuse_pairs(prog, rng) for prog in programs]
        try:
            return validate(Schedule.from_programs(fused, name="random", devices=p,
                                                   replicated=replicated))
        except ScheduleError:
            pass  # this fusion deadlocks; keep the plain programs
    return Schedule.from_programs(programs, name="random", devices=p, replicated=replicated)


def _insert_recompute(programs, rng, share):
    """Give a random share of the (stage, microbatch)s an R op somewhere
    after their F and before their backward (same device), in place."""
    for prog in programs:
        where = {}
        for i, (k, s, j) in enumerate(prog):
            where[(k, s, j)] = i
        picks = []
        for (k, s, j), i in where.items():
            if k == "F" and rng.random() < share:
                back = where.get(("B", s, j), where.get(("BW", s, j)))
                if back is not None:
                    picks.append((rng.randint(i + 1, back), s, j))
        # Insert from the back so earlier positions stay valid.
        for pos, s, j in sorted(picks, reverse=True):
            prog.insert(pos, ("R", s, j))


def _insert_offload(programs, rng, share):
    """Give a random share of the (stage, microbatch)s without an R an O and
    an L between their F and their backward (same device), in place."""
    for prog in programs:
        where = {op: i for i, op in enumerate(prog)}
        picks = []
        for (k, s, j), i in list(where.items()):
            if k != "F" or ("R", s, j) in where or rng.random() >= share:
                continue
            back = where.get(("B", s, j), where.get(("BW", s, j)))
            if back is None:
                continue
            o_at = rng.randint(i + 1, back)
            l_at = rng.randint(o_at, back)
            picks += [(o_at, 0, ("O", s, j)), (l_at, 1, ("L", s, j))]
        # Insert from the back; at one position the O lands before the L.
        for pos, _order, op in sorted(picks, reverse=True):
            prog.insert(pos, op)


def _fuse_pairs(program, rng):
    """Merge some adjacent (F, B/BW) of different microbatches into F&B units."""
    out = []
    i = 0
    while i < len(program):
        op = program[i]
        if (i + 1 < len(program) and op[0] == "F" and program[i + 1][0] in ("B", "BW")
                and program[i + 1][2] != op[2] and rng.random() < 0.5):
            out.append((op, program[i + 1]))
            i += 2
        else:
            out.append(op)
            i += 1
    return out


@st.composite
def family_schedules(draw, max_devices: int = 8, max_microbatches: int = 16,
                     max_chunks: int = 3, names=None, recompute: bool = False):
    """Schedules of the registered families with random shapes.

    Parameters
    ----------
    max_devices, max_microbatches, max_chunks : int
        Upper bounds of the shape.
    names : sequence of str, optional
        Families to draw from; all registered ones by default.
    recompute : bool, default False
        Sometimes recompute a random subset of stages
        (:func:`pipecore.recompute`).

    Returns
    -------
    hypothesis.strategies.SearchStrategy of Schedule
    """
    name = draw(st.sampled_from(sorted(names or _family_names())))
    fam = family(name)
    p = draw(st.integers(1, max_devices))
    v = fam.chunks_for(draw(st.integers(1, max_chunks)))
    if draw(st.booleans()):
        # Multiples of p suit every family; other counts test the rest.
        m = p * draw(st.integers(1, max(1, max_microbatches // p)))
    else:
        m = draw(st.integers(1, max_microbatches))
    try:
        sched = build(name, p, m, chunks=v)
    except ValueError:
        # This family does not take this shape (e.g. m not a multiple of p).
        reject()
    # A (stage, microbatch) is offloaded or recomputed, not both: a family
    # that offloads (bpipe) is left as built.
    if recompute and not (sched.kind_codes == O).any() and draw(st.booleans()):
        chosen = draw(st.lists(st.integers(0, sched.stages - 1), min_size=1, unique=True))
        sched = _recompute(sched, stages=chosen)
    return sched


@st.composite
def costs(draw, stages: int | None = None, comm: bool = True, op_times: bool = False):
    """Random :class:`~pipecore.Costs`; per-stage vectors when ``stages`` is given.

    Parameters
    ----------
    stages : int, optional
        When given, each time may be drawn as a vector of that length.
    comm : bool
        Whether to draw a non-zero communication latency.
    op_times : bool
        Whether to draw a fused-backward time ``bw`` and a per-op
        ``overhead`` too (left at their defaults otherwise, so strategies
        of callers that do not ask draw the same examples as before).

    Returns
    -------
    hypothesis.strategies.SearchStrategy of Costs
    """
    def value(allow_zero=True):
        if stages is not None and draw(st.booleans()):
            return np.array(draw(st.lists(times(allow_zero), min_size=stages, max_size=stages)))
        return draw(times(allow_zero))

    act = draw(times(allow_zero=False, max_value=4.0))
    extra = {}
    if op_times:
        extra = {"bw": draw(st.none()) if draw(st.booleans()) else value(),
                 "overhead": value()}
    return Costs(**extra, f=value(), b=value(), w=value(), comm=value() if comm else 0.0,
                 activation=act, activation_w=draw(st.floats(0.0, 1.0)) * act,
                 fb_factor=draw(st.sampled_from([1.0, 0.75, 0.5]) | st.floats(0.1, 1.0)),
                 r=draw(st.none() | times()), offload=draw(times()),
                 checkpoint=draw(st.sampled_from([0.0, 0.25, 1.0]) | st.floats(0.0, 1.0)) * act)


@st.composite
def networks(draw, devices: int = 8, allow_none: bool = True):
    """Random uniform or two-level :class:`~pipecore.Network` (or None).

    Parameters
    ----------
    devices : int
        Largest device count the network will serve (for node sizes).
    allow_none : bool
        Whether None (no network) may be drawn.

    Returns
    -------
    hypothesis.strategies.SearchStrategy of Network or None
    """
    kinds = ["uniform", "two-level"] + (["none"] if allow_none else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return None
    nbytes = draw(times(allow_zero=True, max_value=8.0))
    bandwidth = draw(st.sampled_from([0.5, 1.0, 2.0, 4.0, float("inf")]))
    latency = draw(times(max_value=2.0))
    grads = draw(times(allow_zero=True, max_value=8.0))
    if kind == "uniform":
        return Network(bytes=nbytes, bandwidth=bandwidth, latency=latency, grad_bytes=grads)
    return Network(bytes=nbytes, bandwidth=bandwidth, latency=latency,
                   devices_per_node=draw(st.integers(1, max(1, devices))),
                   inter_bandwidth=draw(st.sampled_from([0.25, 0.5, 1.0])),
                   inter_latency=draw(times(max_value=2.0)), grad_bytes=grads)
