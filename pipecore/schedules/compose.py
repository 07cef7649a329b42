"""Composed schedules: a placement, an order policy and a W rule, built by one kernel.

:func:`compose` turns the choices into a :class:`Schedule` through the list
scheduler of ``kernels/compose.py`` (unit-time steps; rules in
docs/composing.md). A family is a preset of the choices
(``presets()`` in this module); each preset is tested op for op against its family's
builder.
"""

from __future__ import annotations

import numpy as np

from ..core.ops import InputError, check_int
from ..core.schedule import Schedule, ScheduleError
from ..core.sizes import BYTES_PER_OP, MAX_OPS, OPS_RULE, check_size
from ..kernels import columns as _columns
from ..kernels import compose as _k
from ..kernels import rotate as _rot
from ..kernels import strict as _strict
from ..kernels.codes import BW, B, F
from . import orders as _orders
from . import placements as _placements
from .construct import column_buffers

__all__ = ["compose", "presets", "W_RULES"]

W_RULES = ("with", "late", "bubbles", "staggered")
# From this many ops on, the columns are written on all threads; below it,
# starting them costs more than the writing (explore times thousands of small
# compositions, and threads waking on a loaded machine take milliseconds).
PARALLEL_MIN_OPS = 1 << 18
# A count no device reaches: no cap on microbatches in flight, or a lag
# whose W's wait for the end (or for idle steps).
_NEVER = np.iinfo(np.int64).max // 4


def _interleaved(p, m, v, waves):
    warm = "all" if m == p else "fill"
    return _placements.looped(p, v), _orders.depth_first(group=p, warmup=warm), False, None


def _interleaved_zb(p, m, v, waves):
    rounds = max(1, m // p)
    return (_placements.looped(p, v), _orders.one_f_one_b(group=m // rounds, strict=True), True,
            "staggered")


# The families' 1F1B: fixed streams, each device waits for the op it wants.
_STRICT = _orders.one_f_one_b(group=None, strict=True)
_STRICT_FILL = _orders.one_f_one_b("fill", group=None, strict=True)

def _vocab_order(p, m, extra):
    return _orders.one_f_one_b([min(p - d + extra, m) for d in range(p)], group=None, strict=True)


# name -> (p, m, chunks, waves) -> (placement, order, split_backward, w)
_PRESETS = {
    "gpipe": lambda p, m, v, w: (_placements.linear(p), _orders.breadth_first("fifo"),
                                 False, None),
    "1f1b": lambda p, m, v, w: (_placements.linear(p), _STRICT, False, None),
    "eager-1f1b": lambda p, m, v, w: (_placements.linear(p), _STRICT_FILL, False, None),
    "interleaved-1f1b": _interleaved,
    "looped-bfs": lambda p, m, v, w: (_placements.looped(p, v), _orders.breadth_first(),
                                      False, None),
    "zb-h1": lambda p, m, v, w: (_placements.linear(p), _STRICT, True, "staggered"),
    "zb-h2": lambda p, m, v, w: (_placements.linear(p), _STRICT_FILL, True,
                                 [2 * d for d in range(p)]),
    "interleaved-zb": _interleaved_zb,
    "hanayo": lambda p, m, v, w: (_placements.wave(p, w), _orders.greedy(), False, None),
    "zb-v": lambda p, m, v, w: (_placements.v(p), _orders.rotate(warmup=2 * p - 1), True, None),
    # Vocabulary Parallelism: 1F1B with 2 (vocab-1) or 1 (vocab-2) more warm-up forwards.
    "vocab-1": lambda p, m, v, w: (_placements.linear(p), _vocab_order(p, m, 2), False, None),
    "vocab-2": lambda p, m, v, w: (_placements.linear(p), _vocab_order(p, m, 1), False, None),
}
# Presets whose family takes chunks (default 2); hanayo takes waves = chunks / 2.
_CHUNKED = {"interleaved-1f1b", "looped-bfs", "interleaved-zb", "hanayo"}


def presets() -> list[str]:
    """The family names :func:`compose` takes as a preset.

    Returns
    -------
    list of str
        Sorted; each composes op for op equal to ``pipecore.build(name, ...)``.
    """
    return sorted(_PRESETS)


def compose(preset: str | None = None, devices: int | None = None,
            microbatches: int | None = None, *, placement=None, chunks: int | None = None,
            waves: int | None = None, order: _orders.Order | None = None,
            split_backward: bool | None = None, w=None, name: str | None = None) -> Schedule:
    """Build a schedule from a placement, an order policy and a W rule.

    Either name a family (a preset of the three choices, ``pipecore.schedules.compose.presets()``)
    or give the choices; with a preset, the choices given replace the
    preset's.

    Parameters
    ----------
    preset : str, optional
        A family name of ``presets()``.
    devices : int, optional
        p; needed with a named placement or a preset.
    microbatches : int
        m >= 1.
    placement : str, sequence of int or Placement, optional
        ``"linear"`` (default), ``"looped"`` (with ``chunks``), ``"v"``,
        ``"wave"`` (with ``waves``), ``"bidirectional"`` (two pipelines,
        replicated stages; ``microbatches`` even), or the device of each
        stage (a :class:`~pipecore.placements.Placement` with ``chains=2``
        for any two pipelines).
    chunks : int, optional
        Stages per device of ``looped`` (and of chunked presets; default 2).
    waves : int, optional
        Waves of ``wave`` (hanayo's preset: chunks / 2).
    order : Order, optional
        From :mod:`pipecore.orders`; default ``one_f_one_b()``.
    split_backward : bool, optional
        Split each backward into B (input gradient) and W (weight
        gradient); default: True when ``w`` is given.
    w : str, int or sequence of int, optional
        Where W ops go (with ``split_backward``): ``"with"`` (right after
        their B), ``"staggered"`` (device d runs a W once d are pending, as
        ZB-H1; the default), ``"late"`` (after the device's last B),
        ``"bubbles"`` (in steps the device would idle, the rest at the end),
        or a lag: a device runs its oldest pending W once more than ``lag``
        are pending (an int, or one per device). Not with the ``rotate``
        order, whose visits place each W after its B.
    name : str, optional
        The schedule's name (default: the preset, else ``"composed"``).

    Returns
    -------
    Schedule
        Validated; ``params["composition"]`` records the placement, the
        order and the W rule. A preset taken as it is also records its
        ``family`` and ``chunks``, as ``pipecore.build`` does (the family's
        closed formula applies: the op table is the same).

    Raises
    ------
    ValueError
        For an unknown preset, placement or W rule, options that do not fit
        together, or an order that deadlocks on this placement (the error
        names where each device waits).
    CapacityError
        If the schedule's table would not fit in the memory available.
    """
    if microbatches is None:
        raise InputError("compose needs 'microbatches'")
    m = check_int("microbatches", microbatches, minimum=1)
    given = {"placement": placement, "order": order, "split_backward": split_backward, "w": w}
    if preset is not None:
        key = str(preset).lower()
        if key not in _PRESETS:
            from .registry import schedules

            if key in schedules():
                raise InputError(
                    f"{key!r} is not a preset of compose: no placement, order and W rule "
                    f"reproduce its order op for op yet (pipecore.build({key!r}, ...) builds "
                    f"it). Presets: {', '.join(presets())}. Near a V family: "
                    f"compose(placement='v', devices=..., microbatches=..., "
                    f"order=pc.orders.one_f_one_b(), w='bubbles')")
            raise InputError(f"unknown preset {preset!r}; presets: {', '.join(presets())}")
        if devices is None:
            raise InputError(f"preset {key!r} needs 'devices'")
        p = check_int("devices", devices, minimum=1)
        v = 1 if key not in _CHUNKED else check_int("chunks", 2 if chunks is None else chunks,
                                                     minimum=1)
        if key == "hanayo":
            if waves is not None:
                v = 2 * check_int("waves", waves, minimum=1)
            elif v % 2:
                raise InputError(f"preset 'hanayo' places 2 stages per device and wave: "
                                 f"'chunks' must be even (got {v})")
        elif key not in _CHUNKED and chunks not in (None, 1):
            raise InputError(f"preset {key!r} has one stage per device: 'chunks' must be 1 "
                             f"(got {chunks})")
        elif waves is not None:
            raise InputError(f"preset {key!r} takes no 'waves' (only 'hanayo' does)")
        pl, od, sp, wr = _PRESETS[key](p, m, v, v // 2)
        chosen = {"placement": pl, "order": od, "split_backward": sp, "w": wr}
        chosen.update({k: x for k, x in given.items() if x is not None})
        if given["split_backward"] is False and given["w"] is None:
            chosen["w"] = None
        pl = _placements.resolve(chosen["placement"], p)
        label = key if name is None else name
        overridden = sorted(k for k, x in given.items() if x is not None)
    else:
        pl = _placements.resolve("linear" if placement is None else placement, devices,
                                 chunks, waves)
        chosen = {"order": order, "split_backward": split_backward, "w": w}
        label = "composed" if name is None else name
        overridden = []
    od = _orders.one_f_one_b() if chosen["order"] is None else chosen["order"]
    if not isinstance(od, _orders.Order):
        raise InputError(f"'order' must be a pipecore.orders.Order, e.g. "
                         f"pc.orders.one_f_one_b() (got {type(od).__name__})")
    if pl.chains > 1:
        if od.policy == "rotate":
            raise InputError("the rotate order visits the chunks of one pipeline; a "
                             "placement of two pipelines takes the alternate or greedy "
                             "policies")
        if m % pl.chains:
            raise InputError(f"a placement of {pl.chains} pipelines splits the microbatches "
                             f"evenly between them: 'microbatches' must be a multiple of "
                             f"{pl.chains} (got {m})")
    if od.policy == "rotate":
        if chosen["w"] is not None:
            raise InputError(f"'w'={chosen['w']!r} does not apply to the rotate order: each "
                             f"visit runs its backward's W")
        split, w_rule = bool(chosen["split_backward"]), None
    else:
        split, w_rule = _split_and_w(chosen["split_backward"], chosen["w"])
    # ZB-V's pattern assumes a full warm-up: with fewer microbatches the
    # family lays out 2p-1 and drops the rest, keeping the order.
    full = max(m, 2 * pl.devices - 1) if preset is not None and key == "zb-v" else m
    sched = _build(pl, full, od, split, w_rule, label)
    if full != m:
        sched = _drop_microbatches(sched, m, label)
    if preset is not None and not overridden:
        # Op for op the family's schedule: its formula and views apply.
        sched.params.update({"family": key, "chunks": pl.stages // pl.devices})
    sched.params.update({
        "devices": pl.devices, "microbatches": m,
        "composition": {"preset": None if preset is None else str(preset).lower(),
                        "overridden": overridden, "placement": pl.name,
                        "device_of": list(pl.device_of), "chains": pl.chains,
                        "order": od.describe(),
                        "split_backward": split, "w": _plain(w_rule)}})
    return sched


def _drop_microbatches(sched, m, label):
    """The schedule without the ops of microbatches >= m, each device's order kept."""
    cols = {c: sched.table.column(c).to_numpy() for c in ("device", "stage", "microbatch")}
    keep = cols["microbatch"] < m
    device = cols["device"][keep]
    starts = np.searchsorted(device, np.arange(sched.devices))
    slot = np.arange(len(device), dtype=np.int32) - starts[device].astype(np.int32)
    return Schedule.from_arrays(device, slot, sched.kind_codes[keep], cols["stage"][keep],
                                cols["microbatch"][keep], name=label, devices=sched.devices)


def _plain(x):
    return list(x) if isinstance(x, (tuple, np.ndarray)) else x


def _split_and_w(split, w):
    """(split, w rule) after checking they agree; the W rule defaults to staggered."""
    if split is None:
        split = w is not None
    if not isinstance(split, (bool, np.bool_)):
        raise InputError(f"'split_backward' must be True or False (got {split!r})")
    if not split:
        if w is not None:
            raise InputError(f"'w'={w!r} places W ops, which exist only with "
                             f"split_backward=True")
        return False, None
    if w is None:
        return True, "staggered"
    if isinstance(w, str):
        if w not in W_RULES:
            raise InputError(f"unknown W rule {w!r}; rules: {', '.join(W_RULES)}, or a lag "
                             f"(an int >= 0, or one per device)")
        return True, w
    if np.ndim(w) == 0:
        return True, check_int("w", w, minimum=0)
    return True, tuple(check_int(f"w[{d}]", x, minimum=0) for d, x in enumerate(w))


def _per_device(name, value, p, default):
    """A per-device int64 array from an int, a sequence or None (``default``)."""
    if value is None:
        return np.full(p, default, dtype=np.int64)
    if np.ndim(value) == 0:
        return np.full(p, int(value), dtype=np.int64)
    if len(value) != p:
        raise InputError(f"{name} has {len(value)} entries for {p} devices")
    return np.asarray([int(x) for x in value], dtype=np.int64)


def _layout(pl, m, split):
    dev = pl.as_array()
    p = pl.devices
    order = np.argsort(dev, kind="stable")
    counts = np.bincount(dev, minlength=p)
    dev_ptr = np.zeros(p + 1, dtype=np.int64)
    dev_ptr[1:] = np.cumsum(counts)
    out_ptr = dev_ptr * m * (3 if split else 2)
    C = len(pl) // pl.chains
    first2 = np.full(p, -1, dtype=np.int64)
    for s in range(len(pl) - 1, C - 1, -1):  # the lowest second-chain stage of each device
        first2[dev[s]] = s
    pos = np.arange(len(pl)) % C
    return _k.Layout(dev_ptr=dev_ptr, dev_stages=order.astype(np.int64), out_ptr=out_ptr, m=m,
                     split=bool(split), chain=C, head=pos == 0, tail=pos == C - 1,
                     first2=first2)


def _short_warmup(pl, m, group, lifo, layout):
    """Forwards before the first backward under warmup="short", per device."""
    p, C = pl.devices, layout.chain
    out = np.empty(p, dtype=np.int64)
    for d in range(p):
        lo, hi = int(layout.dev_ptr[d]), int(layout.dev_ptr[d + 1])
        total = (hi - lo) * m
        if group is None:  # dynamic streams: one forward per stage from the first on
            out[d] = min(C - int(layout.dev_stages[lo]) % C, total)
        elif lifo:
            out[d] = total
        else:
            # The backward stream opens with the last chunk's first microbatch,
            # whose forward is at position (n-1) * min(group, m) of the forward stream.
            first = int(layout.dev_stages[hi - 1]) % C
            out[d] = min((hi - lo - 1) * min(group, m) + (C - 1 - first) + 1, total)
    return out


def _rules(pl, m, od, split, w_rule, layout):
    p = pl.devices
    totals = np.diff(layout.dev_ptr) * m
    dynamic = od.group == "ready"
    group = None if dynamic else p if od.group is None else m if od.group == "all" else od.group
    cap = _per_device("order 'inflight'", od.inflight, p, _NEVER)
    warm = od.warmup
    if od.policy == "rotate" and warm is None:
        warmup = np.minimum(np.full(p, pl.stages - 1, dtype=np.int64), totals)
    elif warm == "short":
        warmup = _short_warmup(pl, m, group, od.backward == "lifo", layout)
    elif warm in ("all", "fill"):
        warmup = totals.copy()
    else:
        warmup = np.minimum(_per_device("order 'warmup'", warm, p, 0), totals)
    if w_rule == "with":
        lag = np.zeros(p, dtype=np.int64)
    elif w_rule in ("late", "bubbles", None):
        lag = np.full(p, _NEVER, dtype=np.int64)
    elif w_rule == "staggered":
        lag = np.arange(p, dtype=np.int64)
    else:
        lag = _per_device("'w'", w_rule, p, 0)
    return _k.Rules(policy=_k.ALTERNATE if od.policy == "alternate" else _k.GREEDY,
                    group=1 if group is None else int(group), lifo=od.backward == "lifo",
                    dynamic=dynamic, fill=warm == "fill", strict=bool(od.strict),
                    backward_first=od.first == "backward", warmup=warmup, cap=cap, lag=lag,
                    w_fill=_k.FILL_IDLE if w_rule == "bubbles" else _k.FILL_AT_END,
                    overlap=bool(od.overlap))


def _state(p, stages, m, out_ptr, cap):
    """Fresh scratch for ``kernels.compose.compose_kernel``.

    Parameters
    ----------
    p, stages, m : int
        Devices, stages and microbatches.
    out_ptr : numpy.ndarray
        As ``Layout.out_ptr``.
    cap : numpy.ndarray
        As ``Rules.cap``.

    Returns
    -------
    kernels.compose.State
    """
    i64 = np.int64
    return _k.State(nf=np.zeros(stages, i64), nb=np.zeros(stages, i64),
                    last_f=np.full(stages, -1, i64), last_b=np.full(stages, -1, i64),
                    kf=np.zeros(p, i64), kb=np.zeros(p, i64), kw=np.zeros(p, i64),
                    want_f=np.ones(p, i64), limit=cap.astype(i64),
                    head_fs=np.zeros(p, i64), head_fj=np.zeros(p, i64),
                    head_bs=np.zeros(p, i64), head_bj=np.zeros(p, i64),
                    w_src=out_ptr[:-1].astype(i64), pick_kind=np.full(p, -1, i64),
                    pick_stage=np.zeros(p, i64), pick_mb=np.zeros(p, i64),
                    wait_kind=np.full(p, -1, i64))


def _visits(p, stages):
    """Fresh :class:`Visits` for p devices and S stages.

    Parameters
    ----------
    p, stages : int
        Devices and stages.

    Returns
    -------
    kernels.rotate.Visits
    """
    i64 = np.int64
    return _rot.Visits(chunk=np.full(p, -1, i64), phase=np.full(p, -1, i64),
                  last=np.full(p, -1, i64), after_b=np.zeros(p, i64),
                  joined=np.zeros(stages, i64), nw=np.zeros(stages, i64))


def _build(pl, m, od, split, w_rule, label):
    _check_ops(_composing(pl, m), pl.stages, pl.devices, m, split)
    p = pl.devices
    cols, _tm = _run(pl, m // pl.chains, od, split, w_rule, _untimed())
    if pl.chains > 1:
        return Schedule.from_arrays(*_join_chains(cols, pl, m // pl.chains), name=label,
                                    devices=p, replicated=True)
    return Schedule.from_arrays(*cols, name=label, devices=p, copy=False)


def _check_ops(what, stages, devices, m, split, timed=False):
    """Refuse a composition of ``stages`` stages (per chain) on ``devices``
    devices whose op table cannot be indexed or held, before its columns
    are allocated (the shared guard, core/sizes.py); ``timed``: the timing's
    arrays too (two arrival times per stage and microbatch, a free time per
    device pair's link)."""
    n = stages * m * (3 if split else 2)  # two chains: 2S chain stages x m/2
    links = devices * devices if timed else 0
    each = BYTES_PER_OP + (16 / (3 if split else 2) if timed else 0)  # + arrival times
    check_size(what, n, "ops", limit=MAX_OPS, rule=OPS_RULE, bytes_each=round(each),
               purpose="to time" if timed else "to build", extra_bytes=8 * links,
               extra=f"{links:,} link free times, one per device pair")


def _composing(pl, m):
    return f"composing placement {pl.name!r} ({len(pl)} stages on {pl.devices} devices) with microbatches={m}"


def _join_chains(cols, pl, per):
    """Columns of a two-chain construction as the model's stages and
    microbatches (chain c's stage s is stage s, its microbatch j is c * per
    + j), with each device's all-reduces appended: one per stage it shares
    with another device, in stage order (so both replicas meet them in the
    same order)."""
    from ..kernels.codes import AR

    C = len(pl) // pl.chains
    device = np.asarray(cols.device)
    kind = np.asarray(cols.kind)
    v = np.asarray(cols.stage).astype(np.int64)
    stage = v % C
    mb = np.asarray(cols.microbatch).astype(np.int64) + (v // C) * per
    slot = np.asarray(cols.slot).astype(np.int64)
    holders = {}
    for i, d in enumerate(pl.device_of):
        holders.setdefault(i % C, set()).add(int(d))
    parts = {c: [] for c in ("device", "slot", "kind", "stage", "microbatch")}
    ends = np.searchsorted(device, np.arange(pl.devices + 1))
    for d in range(pl.devices):
        lo, hi = int(ends[d]), int(ends[d + 1])
        shared = sorted(s_ for s_, ds in holders.items() if d in ds and len(ds) > 1)
        nxt = int(slot[hi - 1]) + 1 if hi > lo else 0
        parts["device"] += [device[lo:hi], np.full(len(shared), d)]
        parts["slot"] += [slot[lo:hi], np.arange(nxt, nxt + len(shared))]
        parts["kind"] += [kind[lo:hi], np.full(len(shared), AR)]
        parts["stage"] += [stage[lo:hi], np.asarray(shared, dtype=np.int64)]
        parts["microbatch"] += [mb[lo:hi], np.full(len(shared), -1)]
    out = {c: np.concatenate(x) for c, x in parts.items()}
    return (out["device"].astype(np.int32), out["slot"].astype(np.int32),
            out["kind"].astype(kind.dtype), out["stage"].astype(np.int32),
            out["microbatch"].astype(np.int32))


def _stepless(rules, timed, chains=1):
    """Whether ``kernels.strict`` writes the same programs as stepping
    through unit time (``kernels.compose.compose_kernel``) for these rules:
    when every device's next op follows from its own ops so far. That is
    the alternate policy over fixed streams, strict (a device waits for the
    op it wants, so readiness only delays it), W's not put into idle steps,
    and nothing timed or overlapped (a unit forms when two ops are ready at
    once, which depends on the other devices). A "fill" warm-up ends when a
    backward is first ready, which depends on the other devices: the
    stepping runs until every device has left it."""
    return (rules.policy == _k.ALTERNATE and not rules.dynamic and rules.strict
            and rules.w_fill != _k.FILL_IDLE and not timed and not rules.overlap
            and chains == 1)


def _streams(layout, rules):
    """The forward streams as tables (``kernels.strict.Streams``): the k-th
    forward of a device with n stages, in rounds of G microbatches visiting
    the n chunks in order (``kernels.compose._stream``, vectorised)."""
    m = layout.m
    per = np.diff(layout.dev_ptr)
    sizes = np.unique(per)
    chunk = np.zeros((len(sizes), int(sizes.max()) * m), np.int32)
    mb = np.zeros_like(chunk)
    G = min(int(rules.group), m)
    full = m // G
    rem = m - full * G
    for row, n in enumerate(sizes):
        k = np.arange(int(n) * m)
        r, q = np.divmod(k, G * n)
        c, j = q // G, r * G + q % G
        tail = k >= full * G * n
        if tail.any():
            q = k[tail] - full * G * n
            c[tail], j[tail] = q // rem, full * G + q % rem
        chunk[row, :len(k)], mb[row, :len(k)] = c, j
    return _strict.Streams(chunk=chunk, mb=mb, of=np.searchsorted(sizes, per).astype(np.int64))


def _run(pl, m, od, split, w_rule, tm, stepless=True):
    """Columns of the composed schedule (and ``tm`` filled when it is on):
    ``m`` microbatches per chain, stages numbered over the chains.

    ``stepless=False`` always steps through unit time (the tests compare)."""
    S, p = len(pl), pl.devices
    layout = _layout(pl, m, split)
    rules = _rules(pl, m, od, split, w_rule, layout)
    st = _state(p, S, m, layout.out_ptr, rules.cap)
    cols = column_buffers(S * m * (3 if split else 2))
    if od.policy == "rotate":
        status, steps = _rot.rotate_kernel(layout, rules, st, _visits(p, S), cols, tm)
    elif stepless and _stepless(rules, tm.on, pl.chains):
        # Strict fixed streams: step only through a "fill" warm-up, then check
        # with counts that the rest runs to the end and write the devices'
        # programs (beside the check on large tables; the same programs as
        # stepping, tested).
        status, steps = _k.OK, 0
        if rules.fill:
            status, steps = _k.compose_kernel(layout, rules, st, cols, tm, True)
        if status == _k.WARM_DONE or (status == _k.OK and not rules.fill):
            start = _k.State(*(a.copy() for a in st))  # the check changes st; the writer starts here
            streams = _streams(layout, rules)
            if len(cols.kind) >= PARALLEL_MIN_OPS:  # the check on one core, the writing on the other
                status = _strict.check_beside_write(layout, rules, streams, st, start, cols)
            else:
                status = _strict.strict_kernel(layout, rules, streams, st)
                if status == _k.OK:
                    _strict.strict_write_serial(layout, rules, streams, start, cols)
            if status == _k.OK:
                return cols, tm
        if status != _k.OK:  # step through it all to say where it stops
            return _run(pl, m, od, split, w_rule, tm, stepless=False)
    else:
        status, steps = _k.compose_kernel(layout, rules, st, cols, tm)
    if status != _k.OK:
        raise ScheduleError(_deadlock_message(pl, m, od, layout, st, steps), rule="deadlock")
    if rules.overlap:
        fill = _columns.fill_rows_paired
    else:
        fill = (_columns.fill_rows if len(cols.kind) >= PARALLEL_MIN_OPS
                else _columns.fill_rows_serial)
    fill(layout.out_ptr, cols.device, cols.slot)
    return cols, tm


def fresh(tm):
    """``tm`` with its scratch and outputs reset, its inputs shared: one
    :func:`timing` serves every composition on a placement.

    Parameters
    ----------
    tm : kernels.compose.Timing

    Returns
    -------
    kernels.compose.Timing
    """
    return tm._replace(arr_f=np.zeros_like(tm.arr_f), arr_b=np.zeros_like(tm.arr_b),
                       free=np.zeros_like(tm.free), link_free=np.zeros_like(tm.link_free),
                       mem=np.zeros_like(tm.mem), peak=np.zeros_like(tm.peak),
                       begin=np.full_like(tm.begin, np.inf), busy=np.zeros_like(tm.busy),
                       end=np.zeros(1))


def _untimed():
    z1 = np.zeros(1)
    z3 = np.zeros((2, 2, 1))
    return _k.Timing(on=False, dur=np.zeros((4, 1)), ser=z3, lat=z3, per_node=0, fb_factor=1.0,
                     act=z1,
                     act_w=z1, rec_dur=z1, rec_mem=z1, device_of=np.zeros(1, np.int64), arr_f=z1,
                     arr_b=z1, free=z1, link_free=z1, mem=z1, peak=z1, begin=z1, busy=z1, end=z1)


def timing(placement, microbatches, costs, network=None, recompute=None):
    """A :class:`kernels.compose.Timing` that makes the construction a simulation.

    Parameters
    ----------
    placement : Placement
    microbatches : int
    costs : Costs
        Per-stage or per-device-share times and memory (``Costs.stage_arrays``).
    network : Network, optional
        Bytes, bandwidth and latency of the links (default: transfers take
        ``costs.comm`` and never wait for a link).
    recompute : sequence of bool, optional
        Per stage, whether its activations are recomputed: the timing is
        then that of ``pipecore.recompute(schedule, stages=...)`` of the
        composed schedule (an R op of ``costs.r`` right before each of
        the stage's backwards; its F keeps ``costs.checkpoint``). Default:
        no stage.

    Returns
    -------
    kernels.compose.Timing

    Raises
    ------
    ValueError
        For costs or a network the timing cannot take (offload, a bad type),
        a placement of two pipelines (no all-reduce in the timing),
        a ``recompute`` without one entry per stage, or more ops than an
        op table holds.
    CapacityError
        If the composition's columns and timing arrays would not fit in
        the memory available.
    """
    from ..core.costs import Costs, Network

    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    if placement.chains > 1:
        raise InputError("the construction's timing has no all-reduce for replicated stages: "
                         "compose the schedule and time it with pipecore.simulate")
    if network is not None and not isinstance(network, Network):
        raise InputError(f"'network' must be a pipecore.Network (got {type(network).__name__})")
    S, p, m = placement.stages, placement.devices, microbatches
    _check_ops(_composing(placement, m), S, p, m, True, timed=True)
    arr = costs.stage_arrays(S, p)
    o = arr["overhead"]
    dur = np.empty((4, S))
    dur[F] = arr["f"] + o
    dur[B] = arr["b"] + o
    dur[2] = arr["w"] + o
    dur[BW] = arr["bw"] + o
    comm = np.asarray(arr["comm"], dtype=np.float64)
    ser = np.zeros((2, 2, S))
    lat = np.zeros((2, 2, S))
    per_node = 0
    if network is None:
        lat[:, :] = comm
    else:
        from ..core.costs import per_stage_direct

        nbytes = np.asarray(per_stage_direct("Network", "bytes", network.bytes, S), float)
        bw, ln = float(network.bandwidth), float(network.latency)
        per_node = int(network.devices_per_node or 0)
        ibw = float(network.inter_bandwidth) if per_node else bw
        ilat = float(network.inter_latency) if per_node else ln
        with np.errstate(over="ignore"):
            ser[:, 0], lat[:, 0] = nbytes / bw, comm + ln
            ser[:, 1], lat[:, 1] = nbytes / ibw, comm + ilat
    zeros = np.zeros(p)
    act = np.asarray(arr["activation"], float)
    rec_dur, rec_mem = np.zeros(S), np.zeros(S)
    if recompute is not None:
        chosen = np.asarray(recompute, dtype=bool)
        if chosen.shape != (S,):
            raise InputError(f"'recompute' needs one entry per stage ({S}); got shape "
                             f"{chosen.shape}")
        rec_dur[chosen] = (np.asarray(arr["r"], float) + o)[chosen]
        rec_mem[chosen] = (act - np.asarray(arr["checkpoint"], float))[chosen]
    return _k.Timing(on=True, dur=dur, ser=ser, lat=lat, per_node=per_node,
                     fb_factor=float(costs.fb_factor), act=act, act_w=np.asarray(arr["activation_w"], float),
                     rec_dur=rec_dur, rec_mem=rec_mem,
                     device_of=placement.as_array(), arr_f=np.zeros(m * S),
                     arr_b=np.zeros(m * S), free=zeros.copy(), link_free=np.zeros(p * p),
                     mem=zeros.copy(), peak=zeros.copy(), begin=np.full(p, np.inf),
                     busy=zeros.copy(), end=np.zeros(1))


def _deadlock_message(pl, m, od, layout, st, step):
    """Where each unfinished device waits when no device can run an op
    (``m`` microbatches per chain; ops named by the model's stages)."""
    lines = []
    kinds = {F: "F", B: "B", BW: "B"}
    C = layout.chain

    def op(s, j):
        return f"stage {s % C}, microbatch {j + (s // C) * m}"

    for d in range(pl.devices):
        total = int(layout.dev_ptr[d + 1] - layout.dev_ptr[d]) * m
        if st.kf[d] == total and st.kb[d] == total:
            continue
        k = int(st.wait_kind[d])
        if k == _k.WAIT_CAP:
            held = int(st.limit[d])
            lines.append(f"  device {d} has {held} microbatch{'es' if held != 1 else ''} in "
                         f"flight, its inflight cap, and waits for one to finish before "
                         f"F({op(int(st.pick_stage[d]), int(st.pick_mb[d]))})")
            continue
        if k < 0:
            lines.append(f"  device {d}: no op ready ({int(st.kf[d])} forwards and "
                         f"{int(st.kb[d])} backwards of {total} run; inflight cap reached "
                         f"or inputs missing)")
            continue
        s, j = int(st.pick_stage[d]), int(st.pick_mb[d])
        if k == F:
            need = f"F({op(s - 1, j)}) on device {pl.device_of[s - 1]}"
        elif s % C == C - 1 or st.nf[s] <= j:
            need = f"its own F({op(s, j)})"
        else:
            need = f"B({op(s + 1, j)}) on device {pl.device_of[s + 1]}"
        lines.append(f"  device {d} waits for {kinds[k]}({op(s, j)}), which needs {need}")
    return (f"deadlock: the order {od.describe()} on placement {list(pl.device_of)} stops at "
            f"step {step}: no device can run an op\n" + "\n".join(lines)
            + "\nA longer warm-up or a higher inflight cap lets devices run ahead.")
