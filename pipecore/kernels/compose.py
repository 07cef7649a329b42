"""The construction kernel of composed schedules: a list scheduler at unit time.

Every op takes one step and transfers are free, so the construction is the
idealised table of time slots. Each step, every device picks one op by its
order policy from the state at the start of the step (what another device
picks in the same step is seen from the next step on), then all picks are
committed. Rules in docs/composing.md; the oracle is
tests/reference_compose.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .codes import BW, B, F, W

# Policies (Rules.policy).
ALTERNATE = 0
GREEDY = 1
# Warm-up kinds (Rules.fill).
COUNTED = 0
FILL = 1
# When a device may run a pending W that its lag does not force yet (Rules.w_fill).
FILL_AT_END = 0  # once all its backwards ran
FILL_IDLE = 1  # also in any step it would otherwise idle
# Statuses.
OK = 0
DEADLOCK = 1
WARM_DONE = 2  # compose_kernel(until_warm=True): every device has left its warm-up
# State.wait_kind of a device whose next forward would pass its inflight cap.
WAIT_CAP = -2
# State.want_f: in the warm-up, wanting a forward next, wanting a backward next.
WARM = 1
WANT_F = 2
WANT_B = 0


class Layout(NamedTuple):
    """The placement and the shape (inputs).

    Attributes
    ----------
    dev_ptr : int64 (p + 1,)
        Device d's stages are ``dev_stages[dev_ptr[d]:dev_ptr[d + 1]]``.
    dev_stages : int64 (S,)
        Stages grouped by device, increasing within a device.
    out_ptr : int64 (p + 1,)
        Device d's ops go to rows ``out_ptr[d]:out_ptr[d + 1]`` of the columns.
    m : int
        Microbatches.
    split : bool
        Backward split into B and W (else one BW op).
    chain : int
        Stages per pipeline: stage s is the first of its pipeline when
        ``s % chain == 0`` and the last when ``s % chain == chain - 1``
        (S for one pipeline; S / 2 for a bidirectional placement, whose
        second pipeline's stages are numbered after the first's).
    head, tail : bool (S,)
        Whether stage s is the first (last) of its pipeline: ``s % chain``
        is 0 (``chain - 1``), kept as arrays for the inner loops.
    first2 : int64 (p,)
        With two pipelines, each device's first stage of the second (-1
        if none, or with one pipeline): the cap counts each pipeline's
        microbatches in flight on the device from the forward of its first
        stage there.
    """

    dev_ptr: np.ndarray
    dev_stages: np.ndarray
    out_ptr: np.ndarray
    m: int
    split: bool
    chain: int
    head: np.ndarray
    tail: np.ndarray
    first2: np.ndarray


class Rules(NamedTuple):
    """The order policy and the W rule (inputs).

    Attributes
    ----------
    policy : int
        ALTERNATE or GREEDY.
    group : int
        ALTERNATE: microbatches per round of the forward stream (>= 1).
    lifo : bool
        ALTERNATE: the backward stream is the forward stream reversed (else
        the same rounds with chunks in decreasing order).
    dynamic : bool
        ALTERNATE: the next forward is the deepest stage's that is ready
        and the next backward the oldest microbatch's that is ready
        (deepest stage on ties), instead of the fixed streams.
    fill : bool
        ALTERNATE: the warm-up runs forwards until the first backward is
        ready (else ``warmup[d]`` forwards).
    strict : bool
        ALTERNATE: a device waits for the op it wants next (else, while it
        is not ready, it runs the other kind if that is ready).
    backward_first : bool
        GREEDY: a ready backward goes before a ready forward.
    warmup : int64 (p,)
        Forwards before the first backward (ALTERNATE, counted warm-up).
    cap : int64 (p,)
        Most microbatches in flight on a device: from the forward of its
        first stage to that stage's backward.
    lag : int64 (p,)
        A device runs its oldest pending W as soon as more than ``lag[d]``
        are pending.
    w_fill : int
        FILL_AT_END or FILL_IDLE.
    overlap : bool
        A device (ALTERNATE: past its warm-up) whose next forward and next
        backward, of different stages, are both ready runs them as one
        overlapped F&B unit: two rows sharing a slot, the F first (the
        kernel marks the second row's slot -1; ``kernels.columns.fill_rows_paired``
        numbers the slots).
    """

    policy: int
    group: int
    lifo: bool
    dynamic: bool
    fill: bool
    strict: bool
    backward_first: bool
    warmup: np.ndarray
    cap: np.ndarray
    lag: np.ndarray
    w_fill: int
    overlap: bool


class State(NamedTuple):
    """Scratch of the construction (``schedules.compose._state`` makes it).

    Attributes
    ----------
    nf, nb : int64 (S,)
        Forwards and backwards (B or BW) of each stage run so far. Every
        order runs a stage's forwards in microbatch order and its backwards
        in microbatch order (in reverse with a "lifo" stream), so these
        counts say which have run.
    last_f, last_b : int64 (S,)
        Step of each stage's latest forward and backward (-1 before the
        first): an op run in this step is not yet visible to other devices.
    kf, kb, kw : int64 (p,)
        Forwards, backwards and W's each device ran.
    want_f : int64 (p,)
        ALTERNATE: 1 while the device is in its warm-up, 2 when its next op
        is a forward, 0 when it is a backward.
    limit : int64 (p,)
        Most microbatches in flight on the device: the cap, lowered at the
        end of a not-strict warm-up to what the warm-up brought in.
    head_fs, head_fj, head_bs, head_bj : int64 (p,)
        ALTERNATE with fixed streams: stage and microbatch of the device's
        next forward and next backward (worked out once per op, not per step).
    w_src : int64 (p,)
        Row of the output from which to look for the B of device d's next
        W (W's run in the order of their B's, so each row is passed once).
    pick_kind, pick_stage, pick_mb : int64 (p,)
        The op each device picked in the current step (kind -1: none); when
        it picked none, ``wait_kind`` (F, B; WAIT_CAP for a forward the cap
        holds back; -1 if none in particular) with ``pick_stage`` and
        ``pick_mb`` name the op it waits for.
    wait_kind : int64 (p,)
        See ``pick_kind``.
    """

    nf: np.ndarray
    nb: np.ndarray
    last_f: np.ndarray
    last_b: np.ndarray
    kf: np.ndarray
    kb: np.ndarray
    kw: np.ndarray
    want_f: np.ndarray
    limit: np.ndarray
    head_fs: np.ndarray
    head_fj: np.ndarray
    head_bs: np.ndarray
    head_bj: np.ndarray
    w_src: np.ndarray
    pick_kind: np.ndarray
    pick_stage: np.ndarray
    pick_mb: np.ndarray
    wait_kind: np.ndarray


class Timing(NamedTuple):
    """Costs to time the ops as they are committed, and what that gives.

    With ``on`` the construction is also a simulation: an op starts when its
    device is free and its input has arrived, takes its stage's duration,
    and sends its output over the directed link to the next (forward) or
    previous (backward) stage's device, one transfer at a time per link, as
    ``pipecore.simulate`` does (docs/semantics.md); memory is the running
    total in program order.

    Attributes
    ----------
    on : bool
        Time the ops (else nothing below is read or written).
    dur : float64 (4, S)
        Input: duration of F, B, W and BW (rows by kind code) per stage.
    ser, lat : float64 (2, 2, S)
        Input: serialisation and latency of stage s's output, ``[0]`` sent
        forward and ``[1]`` backward, ``[.., 0]`` within a node and
        ``[.., 1]`` across nodes.
    per_node : int
        Input: devices per node (0: one node).
    fb_factor : float
        Input: an overlapped F&B unit takes ``fb_factor`` times its two
        ops' durations summed (``Costs.fb_factor``).
    act, act_w : float64 (S,)
        Input: a forward's whole activation, and the part its W frees.
    rec_dur, rec_mem : float64 (S,)
        Input: per stage, the duration of a recompute (R) op run right
        before each backward (B or BW) and the activation it allocates
        (activation - checkpoint); zeros for a stage not recomputed. An F
        allocates ``act - rec_mem``. With R right before its backward in
        the device's program, R starts when the device is free (its F ran
        earlier on the same device) and the backward when R is done and its
        input has arrived, as ``pipecore.simulate`` times the schedule of
        ``pipecore.recompute``.
    device_of : int64 (S,)
        Input: the device of each stage.
    arr_f, arr_b : float64 (m * S,)
        Scratch: at ``s * m + j``, when F(s, j)'s output reaches stage
        s+1's device, and B(s, j)'s reaches stage s-1's.
    free : float64 (p,)
        Scratch: when each device's latest op finishes.
    link_free : float64 (p * p,)
        Scratch: when each directed link (src * p + dst) is next free.
    mem, peak : float64 (p,)
        Output: activation held, and its largest value, per device.
    begin, busy : float64 (p,)
        Output: each device's first start (inf before) and summed op time.
    end : float64 (1,)
        Output: the makespan.
    """

    on: bool
    dur: np.ndarray
    ser: np.ndarray
    lat: np.ndarray
    per_node: int
    fb_factor: float
    act: np.ndarray
    act_w: np.ndarray
    rec_dur: np.ndarray
    rec_mem: np.ndarray
    device_of: np.ndarray
    arr_f: np.ndarray
    arr_b: np.ndarray
    free: np.ndarray
    link_free: np.ndarray
    mem: np.ndarray
    peak: np.ndarray
    begin: np.ndarray
    busy: np.ndarray
    end: np.ndarray


@njit(cache=True)
def time_op(d, kind, s, j, m, tm):
    """Time device d's op (kind, stage s, microbatch j), committed after
    every op it depends on and after the device's earlier ops."""
    S = tm.act.shape[0]
    start = tm.free[d]
    if kind == F and s > 0:
        start = max(start, tm.arr_f[(s - 1) * m + j])
    elif kind == B or kind == BW:
        # A recompute runs first, from when the device is free.
        start += tm.rec_dur[s]
        tm.busy[d] += tm.rec_dur[s]
        tm.mem[d] += tm.rec_mem[s]
        tm.peak[d] = max(tm.peak[d], tm.mem[d])
        if s < S - 1:
            start = max(start, tm.arr_b[(s + 1) * m + j])
    finish = start + tm.dur[kind, s]
    tm.free[d] = finish
    tm.begin[d] = min(tm.begin[d], start)
    tm.busy[d] += tm.dur[kind, s]
    tm.end[0] = max(tm.end[0], finish)
    if kind == F:
        tm.mem[d] += tm.act[s] - tm.rec_mem[s]
        tm.peak[d] = max(tm.peak[d], tm.mem[d])
    elif kind == B:
        tm.mem[d] -= tm.act[s] - tm.act_w[s]
    elif kind == W:
        tm.mem[d] -= tm.act_w[s]
    else:
        tm.mem[d] -= tm.act[s]
    if kind == W or (kind == F and s == S - 1) or (kind != F and s == 0):
        return
    back = 0 if kind == F else 1
    dst = tm.device_of[s + 1] if kind == F else tm.device_of[s - 1]
    arrival = finish
    if dst != d:
        cross = 1 if tm.per_node > 0 and d // tm.per_node != dst // tm.per_node else 0
        ser = tm.ser[back, cross, s]
        go = finish
        if ser > 0:
            link = d * tm.free.shape[0] + dst
            go = max(finish, tm.link_free[link])
            tm.link_free[link] = go + ser
        arrival = go + ser + tm.lat[back, cross, s]
    if kind == F:
        tm.arr_f[s * m + j] = arrival
    else:
        tm.arr_b[s * m + j] = arrival


@njit(cache=True, inline="always")
def _stream(k, n, m, g):
    """(chunk, microbatch) of the k-th op of a forward stream: rounds of g
    microbatches, each round visiting the n chunks in order."""
    if n == 1:  # one chunk: no divisions (most placements)
        return 0, k
    G = min(g, m)
    full = m // G
    if k < full * G * n:
        r = k // (G * n)
        q = k - r * G * n
        return q // G, r * G + q % G
    rem = m - full * G
    q = k - full * G * n
    return q // rem, full * G + q % rem


@njit(cache=True, inline="always")
def _seen(count, last, t):
    """How many of a stage's ops (``count`` so far, the latest in step
    ``last``) ran before step t."""
    return count - 1 if last == t else count


@njit(cache=True, inline="always")
def _b_stream(k, n, m, g, lifo):
    """(chunk, microbatch) of the k-th op of a backward stream."""
    if lifo:
        return _stream(n * m - 1 - k, n, m, g)
    c, j = _stream(k, n, m, g)
    return n - 1 - c, j


@njit(cache=True)
def compose_kernel(layout, rules, st, out, tm, until_warm=False):
    """Run the construction; write every device's program into ``out``.

    One function body on purpose: passing the carriers' arrays into helper
    functions costs a reference count per array and call, which at a few
    calls per device and step made the construction several times slower.

    Parameters
    ----------
    layout : Layout
    rules : Rules
    st : State
        Scratch (``schedules.compose._state``).
    out : Columns
        Output: one row per op, device d's program in rows
        ``layout.out_ptr[d]:layout.out_ptr[d + 1]``: the kernel writes
        ``kind``, ``stage`` and ``microbatch``; the caller fills ``device``
        and ``slot``, which follow from ``out_ptr`` (contiguous writes, not
        one scattered write per op and column).
    tm : Timing
        With ``tm.on``, the ops are also timed (see :class:`Timing`).
    until_warm : bool, default False
        Stop (status WARM_DONE) after the first step at whose end no device
        with ops left is in its warm-up: :func:`strict_kernel` continues.

    Returns
    -------
    status : int
        OK, WARM_DONE, or DEADLOCK when a step passed in which no device
        could run an op while ops remained (the state shows where each
        device stopped).
    steps : int
        Steps taken.
    """
    dev_ptr = layout.dev_ptr
    stages = layout.dev_stages
    out_ptr = layout.out_ptr
    m = layout.m
    split = layout.split
    head = layout.head
    tail = layout.tail
    first2 = layout.first2
    p = dev_ptr.shape[0] - 1
    S = stages.shape[0]
    alternate = rules.policy == ALTERNATE
    group = rules.group
    lifo = rules.lifo
    dynamic = rules.dynamic
    fill = rules.fill
    strict = rules.strict
    b_first = rules.backward_first
    warmup = rules.warmup
    lag = rules.lag
    fill_idle = rules.w_fill == FILL_IDLE
    overlap = rules.overlap
    nf = st.nf
    nb = st.nb
    last_f = st.last_f
    last_b = st.last_b
    kf_of = st.kf
    kb_of = st.kb
    kw_of = st.kw
    want = st.want_f
    limit = st.limit
    w_src = st.w_src
    head_fs = st.head_fs
    head_fj = st.head_fj
    head_bs = st.head_bs
    head_bj = st.head_bj
    pick_kind = st.pick_kind
    pick_stage = st.pick_stage
    pick_mb = st.pick_mb
    wait_kind = st.wait_kind
    o_kind = out.kind
    o_stage = out.stage
    o_mb = out.microbatch
    o_slot = out.slot
    timed = tm.on
    t_dur = tm.dur
    t_ser = tm.ser
    t_lat = tm.lat
    per_node = tm.per_node
    fb_factor = tm.fb_factor
    t_act = tm.act
    t_act_w = tm.act_w
    t_rec_dur = tm.rec_dur
    t_rec_mem = tm.rec_mem
    t_dev_of = tm.device_of
    t_arr_f = tm.arr_f
    t_arr_b = tm.arr_b
    t_free = tm.free
    t_link = tm.link_free
    t_mem = tm.mem
    t_peak = tm.peak
    t_begin = tm.begin
    t_busy = tm.busy
    t_end = tm.end
    remaining = S * m * (3 if split else 2)
    if alternate and not dynamic:
        for d in range(p):
            n = dev_ptr[d + 1] - dev_ptr[d]
            c, head_fj[d] = _stream(0, n, m, group)
            head_fs[d] = stages[dev_ptr[d] + c]
            c, head_bj[d] = _b_stream(0, n, m, group, lifo)
            head_bs[d] = stages[dev_ptr[d] + c]
    t = 0
    while remaining > 0:
        moved = 0
        for d in range(p):
            pick_kind[d] = -1
            wait_kind[d] = -1
            lo = dev_ptr[d]
            hi = dev_ptr[d + 1]
            n = hi - lo
            total = n * m
            kf = kf_of[d]
            kb = kb_of[d]
            pending = kb - kw_of[d]
            c0 = stages[lo]
            c1 = first2[d]
            # Microbatches in flight, per pipeline: forwards of the device's
            # first stage of it whose backward has not run.
            h0 = nf[c0] - nb[c0]
            h1 = nf[c1] - nb[c1] if c1 >= 0 else 0
            held = max(h0, h1)
            if alternate and want[d] == WARM and not fill and kf >= warmup[d]:
                want[d] = WANT_B
                if not strict:
                    limit[d] = min(limit[d], held)
            what = -1  # 0: F, 1: B
            pair = False
            if split and pending > lag[d]:
                what = 2  # a forced W
            elif alternate:
                # The next forward: f_code 1 ready, 0 input missing, -1 held
                # by the cap, -2 none left.
                f_code = -2
                fs = -1
                fj = 0
                if not dynamic:
                    if kf < total:
                        fs = head_fs[d]
                        fj = head_fj[d]
                        if (fs == c0 and h0 >= limit[d]) or (fs == c1 and h1 >= limit[d]):
                            f_code = -1
                        elif head[fs] or _seen(nf[fs - 1], last_f[fs - 1], t) > fj:
                            f_code = 1
                        else:
                            f_code = 0
                else:  # the deepest stage whose next forward is ready
                    for i in range(hi - 1, lo - 1, -1):
                        s = stages[i]
                        j = nf[s]
                        if j >= m:
                            continue
                        if (s == c0 and h0 >= limit[d]) or (s == c1 and h1 >= limit[d]):
                            if f_code == -2:
                                fs, fj, f_code = s, j, -1
                            continue
                        if head[s] or _seen(nf[s - 1], last_f[s - 1], t) > j:
                            fs, fj, f_code = s, j, 1
                            break
                        if f_code < 0:
                            fs, fj, f_code = s, j, 0
                # The next backward: b_code 1 ready, 0 not, -2 none left.
                b_code = -2
                bs = -1
                bj = 0
                if not dynamic:
                    if kb < total:
                        bs = head_bs[d]
                        bj = head_bj[d]
                        b_code = 1 if (_seen(nf[bs], last_f[bs], t) > bj and (
                            tail[bs] or _seen(nb[bs + 1], last_b[bs + 1], t)
                            > (m - 1 - bj if lifo else bj))) else 0
                else:  # the oldest microbatch whose backward is ready, deepest first
                    for i in range(hi - 1, lo - 1, -1):
                        s = stages[i]
                        j = nb[s]
                        if j >= m:
                            continue
                        if _seen(nf[s], last_f[s], t) > j and (
                                tail[s] or _seen(nb[s + 1], last_b[s + 1], t) > j):
                            if b_code < 1 or j < bj:
                                bs, bj, b_code = s, j, 1
                        elif b_code == -2:
                            bs, bj, b_code = s, j, 0
                # Decide; a device that idles notes what it waits for.
                wait = -1
                if want[d] == WARM:
                    if fill:
                        if b_code == 1:
                            want[d] = WANT_B
                            if not strict:
                                limit[d] = min(limit[d], held)
                            what = 1
                        elif f_code == 1:
                            what = 0
                        elif f_code != -2:
                            wait = F if f_code == 0 else WAIT_CAP
                        else:
                            wait = B
                    elif f_code == 1:
                        what = 0
                    elif f_code == 0 and (strict or b_code != 1):
                        wait = F
                    else:
                        # The cap stops the warm-up, or (not strict) a
                        # backward arrived first: the warm-up is over.
                        want[d] = WANT_B
                        if not strict:
                            limit[d] = min(limit[d], held)
                if what < 0 and wait < 0 and want[d] != WARM:
                    if want[d] == WANT_F and f_code != -2:
                        if f_code == 1:
                            what = 0
                        elif not strict and b_code == 1:
                            what = 1
                        else:
                            wait = F if f_code == 0 else WAIT_CAP
                    elif b_code != -2:
                        if b_code == 1:
                            what = 1
                        elif not strict and f_code == 1:
                            what = 0
                        else:
                            wait = B
                if overlap and dynamic and what == 1 and f_code == 1 and (
                        (fs == c0 and h0 >= limit[d]) or (fs == c1 and h1 >= limit[d])):
                    # The limit fell in this step's decision: the forward to
                    # overlap is the deepest ready one under it, as now picked.
                    f_code = 0
                    for i in range(hi - 1, lo - 1, -1):
                        s = stages[i]
                        j = nf[s]
                        if j >= m or (s == c0 and h0 >= limit[d]) or (
                                s == c1 and h1 >= limit[d]):
                            continue
                        if head[s] or _seen(nf[s - 1], last_f[s - 1], t) > j:
                            fs, fj, f_code = s, j, 1
                            break
                if overlap and want[d] != WARM and fs != bs and (
                        (what == 0 and b_code == 1) or (what == 1 and f_code == 1
                                                        and (fs != c0 or h0 < limit[d])
                                                        and (fs != c1 or h1 < limit[d]))):
                    pair = True
                    what = 0
                if what == 0:
                    pick_stage[d] = fs
                    pick_mb[d] = fj
                elif what == 1:
                    pick_stage[d] = bs
                    pick_mb[d] = bj
                elif wait >= 0 or wait == WAIT_CAP:
                    wait_kind[d] = wait
                    pick_stage[d] = bs if wait == B else fs
                    pick_mb[d] = bj if wait == B else fj
            else:
                # Greedy: the kind ranked first if one is ready, else the
                # other; of a kind, the lower microbatch, then the deeper stage.
                bs = -1
                bj = 0
                fs = -1
                fj = 0
                for i in range(lo, hi):
                    s = stages[i]
                    j = nb[s]
                    if j < m and _seen(nf[s], last_f[s], t) > j and (
                            tail[s] or _seen(nb[s + 1], last_b[s + 1], t) > j):
                        if bs < 0 or j < bj or (j == bj and s > bs):
                            bs, bj = s, j
                    j = nf[s]
                    if (j < m and (head[s] or _seen(nf[s - 1], last_f[s - 1], t) > j)
                            and (s != c0 or h0 < limit[d]) and (s != c1 or h1 < limit[d])):
                        if fs < 0 or j < fj or (j == fj and s > fs):
                            fs, fj = s, j
                if bs >= 0 and (b_first or fs < 0):
                    what = 1
                    pick_stage[d] = bs
                    pick_mb[d] = bj
                elif fs >= 0:
                    what = 0
                    pick_stage[d] = fs
                    pick_mb[d] = fj
                if overlap and fs >= 0 and bs >= 0 and fs != bs:
                    pair = True
                    what = 0
                    pick_stage[d] = fs
                    pick_mb[d] = fj
            # Commit at once: another device sees it from the next step on,
            # as every readiness test asks for a step before t.
            if what == 0:
                kind = F
            elif what == 1:
                kind = B if split else BW
            elif what == 2 or (split and pending > 0 and (fill_idle or kb == total)):
                kind = W
            else:
                continue
            pick_kind[d] = kind
            row = out_ptr[d] + kf + kb + kw_of[d]
            finish = 0.0
            bk = B if split else BW
            for unit in range(2 if pair else 1):
                moved += 1
                if unit == 1:
                    kind = bk
                    pick_stage[d] = bs
                    pick_mb[d] = bj
                    row += 1
                if kind == W:
                    src = w_src[d]
                    while o_kind[src] != B:
                        src += 1
                    w_src[d] = src + 1
                    s = o_stage[src]
                    j = o_mb[src]
                    kw_of[d] += 1
                else:
                    s = pick_stage[d]
                    j = pick_mb[d]
                    if kind == F:
                        last_f[s] = t
                        nf[s] += 1
                        kf_of[d] = kf + 1
                        if want[d] == WANT_F:
                            want[d] = WANT_B
                        if alternate and not dynamic and kf + 1 < total:
                            c, head_fj[d] = _stream(kf + 1, n, m, group)
                            head_fs[d] = stages[lo + c]
                    else:
                        last_b[s] = t
                        nb[s] += 1
                        kb_of[d] = kb + 1
                        want[d] = WANT_F
                        if alternate and not dynamic and kb + 1 < total:
                            c, head_bj[d] = _b_stream(kb + 1, n, m, group, lifo)
                            head_bs[d] = stages[lo + c]
                if timed:  # time_op, written out: a call per op costs its arrays' reference counts
                    if unit == 0:  # an overlapped unit starts and ends as one
                        start = t_free[d]
                        if pair or kind == B or kind == BW:
                            rs = bs if pair else s  # the backward, after its recompute (Timing)
                            start += t_rec_dur[rs]
                            t_busy[d] += t_rec_dur[rs]
                            t_mem[d] += t_rec_mem[rs]
                            t_peak[d] = max(t_peak[d], t_mem[d])
                            if not tail[rs]:
                                start = max(start, t_arr_b[(rs + 1) * m + (bj if pair else j)])
                        if kind == F and not head[s]:
                            start = max(start, t_arr_f[(s - 1) * m + j])
                        took = t_dur[kind, s]
                        if pair:
                            took = (took + t_dur[bk, bs]) * fb_factor
                        finish = start + took
                        t_free[d] = finish
                        t_begin[d] = min(t_begin[d], start)
                        t_busy[d] += took
                        if finish > t_end[0]:
                            t_end[0] = finish
                    if kind == F:
                        t_mem[d] += t_act[s] - t_rec_mem[s]
                        t_peak[d] = max(t_peak[d], t_mem[d])
                    elif kind == B:
                        t_mem[d] -= t_act[s] - t_act_w[s]
                    elif kind == W:
                        t_mem[d] -= t_act_w[s]
                    else:
                        t_mem[d] -= t_act[s]
                    if not (kind == W or (kind == F and tail[s]) or (kind != F and head[s])):
                        dst = t_dev_of[s + 1] if kind == F else t_dev_of[s - 1]
                        arrival = finish
                        if dst != d:
                            back = 0 if kind == F else 1
                            cross = 1 if per_node > 0 and d // per_node != dst // per_node else 0
                            ser = t_ser[back, cross, s]
                            go = finish
                            if ser > 0:
                                go = max(finish, t_link[d * p + dst])
                                t_link[d * p + dst] = go + ser
                            arrival = go + ser + t_lat[back, cross, s]
                        if kind == F:
                            t_arr_f[s * m + j] = arrival
                        else:
                            t_arr_b[s * m + j] = arrival
                o_kind[row] = kind
                o_stage[row] = s
                o_mb[row] = j
                if overlap:
                    o_slot[row] = -1 if unit == 1 else 0
        remaining -= moved
        if moved == 0:
            return DEADLOCK, t
        t += 1
        if until_warm and remaining > 0:
            warm = False
            for d in range(p):
                if want[d] == WARM and kf_of[d] + kb_of[d] + kw_of[d] < (
                        out_ptr[d + 1] - out_ptr[d]):
                    warm = True
                    break
            if not warm:
                return WARM_DONE, t
    return OK, t
