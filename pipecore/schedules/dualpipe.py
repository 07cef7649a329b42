"""DualPipeV (DeepSeek-V3 report; the DualPipe repository's V variant).

A V placement (device d holds stages d and 2p-1-d) whose steady phase runs
the forward of one chunk overlapped with the full backward of the other as a
single F&B unit. The per-device order follows the eight steps of PyTorch's
``ScheduleDualPipeV`` (torch 2.13), restated here and checked against a
fixture generated from torch.
"""

from __future__ import annotations

import numpy as np

from ..core.ops import InputError
from ..core.schedule import Schedule
from ..kernels.dualpipe import eight_steps
from .construct import column_buffers, programs_to_schedule
from .papers import DUALPIPE, DUALPIPE_V
from .registry import Family, register, with_builder_doc, with_formula_doc


class _Device:
    """One device's program with DualPipe's counters.

    Each phase is a (stage, first microbatch) pair: its forwards, and its
    backwards (B or BW), take microbatches first, first+1, ... in order; a
    B leaves its W pending, and W ops run oldest first.
    """

    def __init__(self):
        self.ops = []
        self.next = {}
        self.pending_w = []

    def _take(self, key, phase):
        j = self.next.get(key, 0)
        self.next[key] = j + 1
        return phase[1] + j

    def op(self, kind, phase):
        stage = phase[0]
        if kind == "F":
            j = self._take(("F", stage), phase)
        else:
            j = self._take(("back", stage), phase)
            if kind == "B":
                self.pending_w.append((stage, j))
        self.ops.append((kind, stage, j))

    def overlap(self, f_phase, b_phase):
        f = ("F", f_phase[0], self._take(("F", f_phase[0]), f_phase))
        b = ("BW", b_phase[0], self._take(("back", b_phase[0]), b_phase))
        self.ops.append((f, b))

    def weight(self):
        if self.pending_w:
            stage, j = self.pending_w.pop(0)
            self.ops.append(("W", stage, j))


def _eight_steps(P, h, M, ph0, ph1, split_first):
    """DualPipe's eight steps for a device at position h of P per direction,
    with M microbatches per phase; ``split_first`` runs the first main-step
    unit as F then BW instead of overlapped."""
    dev = _Device()
    for _ in range(2 * (P - h - 1)):
        dev.op("F", ph0)
    for _ in range(h + 1):
        dev.op("F", ph0)
        dev.op("F", ph1)
    for _ in range(P - h - 1):
        dev.op("B", ph1)
        dev.weight()
        dev.op("F", ph1)
    for i in range(M - 2 * P + h + 1):
        if i == 0 and split_first:
            dev.op("F", ph0)
            dev.op("BW", ph1)
        else:
            dev.overlap(ph0, ph1)
        dev.overlap(ph1, ph0)
    for _ in range(P - h - 1):
        dev.op("BW", ph1)
        dev.overlap(ph1, ph0)
    split = False
    half = (h + 1) // 2
    for i in range(h + 1):
        if i == half and h % 2 == 1:
            split = True
        dev.op("B" if split else "BW", ph1)
        if i == half and h % 2 == 0:
            split = True
        dev.op("B" if split else "BW", ph0)
    for _ in range(P - h - 1):
        dev.weight()
        dev.op("B" if split else "BW", ph0)
    for _ in range(h + 1):
        dev.weight()
    return dev.ops


@with_builder_doc
def build_dualpipev(devices, microbatches, chunks=2):
    """DualPipeV on device d (phase 0 = stage d, phase 1 = stage 2p-1-d).

    With P = p and h = d, the eight steps are:

    1. 2(P-h-1) forwards of phase 0;
    2. h+1 pairs F(phase 0), F(phase 1);
    3. P-h-1 times: B(phase 1), its pending W, F(phase 1);
    4. M-2P+h+1 times: F(phase 0)&BW(phase 1) (on the last device the first
       one runs as F then BW, unoverlapped), then F(phase 1)&BW(phase 0);
    5. P-h-1 times: BW(phase 1), then F(phase 1)&BW(phase 0);
    6. h+1 times a backward of phase 1 then of phase 0, fused BW in the
       first half and split B (W deferred) from the middle on (the switch
       falls between the two phases when h is even, before them when odd);
    7. P-h-1 times: a pending W, then a backward of phase 0;
    8. the h+1 remaining W.

    Raises
    ------
    ValueError
        If m < 2p (DualPipeV needs as many microbatches as stages).
    """
    p, m = devices, microbatches
    if m < 2 * p:
        raise InputError(f"'dualpipev' needs microbatches >= 2 * devices = {2 * p} (got {m})")
    if 6 * p * m < DUALPIPE_KERNEL_MIN_OPS:
        return _dualpipev_per_op(p, m)
    d = np.arange(p, dtype=np.int64)
    st = np.stack([d, 2 * p - 1 - d], axis=1)
    return _eight_steps_schedule("dualpipev", p, m, d, st, np.zeros_like(st), d == p - 1,
                                 with_ar=False)


# From about this many ops on (6pm: an F, B and W per stage and microbatch)
# both families are written by the Numba kernel (kernels/dualpipe.py);
# smaller ones keep the per-op builders, quick there, and so compile
# nothing at a cold start (compiling the kernel takes seconds).
DUALPIPE_KERNEL_MIN_OPS = 16_384


def _dualpipev_per_op(devices, microbatches):
    """:func:`build_dualpipev` op by op (:func:`_eight_steps` per device): the
    builder of small shapes, and what the tests compare the kernel with."""
    p, m = devices, microbatches
    programs = [_eight_steps(p, d, m, (d, 0), (2 * p - 1 - d, 0), split_first=(d == p - 1))
                for d in range(p)]
    return programs_to_schedule("dualpipev", programs, p)


@with_builder_doc
def build_dualpipe(devices, microbatches, chunks=1):
    """DualPipe: two opposite pipelines over replicated stages, overlapped F&B.

    Microbatches 0..m/2-1 go down (stage s on device s), m/2..m-1 go up
    (stage s on device p-1-s). Device d at position h = min(d, p-1-d) runs
    the eight steps of ``build_dualpipev`` with P = p/2 and m/2
    microbatches per phase; on the first half of the devices phase 0 is the
    down pipeline, on the second half the up one, and the two middle
    devices run their first main-step unit unoverlapped. Each device ends
    with the gradient all-reduce (AR) of both its stages with their
    replicas on device p-1-d.

    Raises
    ------
    ValueError
        If p or m is odd, or m < 2p.
    """
    p, m = devices, microbatches
    if p % 2 or m % 2:
        raise InputError(f"'dualpipe' needs even devices and microbatches (got devices={p}, "
                         f"microbatches={m})")
    if m < 2 * p:
        raise InputError(f"'dualpipe' needs microbatches >= 2 * devices = {2 * p} (got {m})")
    if 6 * p * m < DUALPIPE_KERNEL_MIN_OPS:
        return _dualpipe_per_op(p, m)
    P, M = p // 2, m // 2
    d = np.arange(p, dtype=np.int64)
    h = np.minimum(d, p - 1 - d)
    # Phase 0 is the down pipeline (stage d, microbatches from 0) on the
    # first half of the devices, the up one (stage p-1-d, from M) on the rest.
    top = d < P
    st = np.stack([np.where(top, d, p - 1 - d), np.where(top, p - 1 - d, d)], axis=1)
    first = np.stack([np.where(top, 0, M), np.where(top, M, 0)], axis=1)
    return _eight_steps_schedule("dualpipe", P, M, h, st, first, h == P - 1, with_ar=True)


def _dualpipe_per_op(devices, microbatches):
    """:func:`build_dualpipe` op by op (:func:`_eight_steps` per device): the
    builder of small shapes, and what the tests compare the kernel with."""
    p, m = devices, microbatches
    P, M = p // 2, m // 2
    programs = []
    for d in range(p):
        h = min(d, p - 1 - d)
        down, up = (d, 0), (p - 1 - d, M)
        ph0, ph1 = (down, up) if d < P else (up, down)
        prog = _eight_steps(P, h, M, ph0, ph1, split_first=(h == P - 1))
        prog += [("AR", ph1[0], None), ("AR", ph0[0], None)]
        programs.append(prog)
    return Schedule.from_programs(programs, name="dualpipe", devices=p, replicated=True)


def _eight_steps_schedule(name, P, M, h, st, first, split_first, with_ar):
    """The schedule of :func:`_eight_steps` on every device, from the kernel.

    ``h``, ``split_first`` (per device) and ``st``, ``first`` (per device
    and phase: stage and first microbatch) are :func:`_eight_steps`'s
    arguments as arrays. A device runs 2M forwards, 2M backwards and one W
    per B: P-h-1 in step 3, h+1 in step 6 and P-h-1 in step 7, so 2P-h-1.
    """
    p = len(h)
    rows = 4 * M + 2 * P - h - 1 + (2 if with_ar else 0)
    offset = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(rows, out=offset[1:])
    n = int(offset[-1])
    cols = column_buffers(n)
    if not eight_steps(P, M, np.ascontiguousarray(h, dtype=np.int64),
                       np.ascontiguousarray(st, dtype=np.int64),
                       np.ascontiguousarray(first, dtype=np.int64),
                       np.ascontiguousarray(split_first, dtype=np.bool_), with_ar, offset, cols):
        raise RuntimeError(f"internal error: the {name} kernel's op count is off")
    return Schedule.from_arrays(*cols, name=name, devices=p, replicated=with_ar, copy=False)


@with_formula_doc
def formula_dualpipev(p, m, v, c):
    """The DualPipe repository's bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2p.

    F, W and B (the *full* backward) are per chunk, F&B is
    ``fb_factor * (F + B)``. The README's bubble is the idle time of the
    worst device over the whole step (makespan minus its busy time); the
    least busy device is one with the most F&B units (2m - 2p - 1), so the
    makespan is its busy time plus the bubble. Activation: PP + 1 chunks, (2p+1)/2
    microbatches, when W holds the whole activation. The makespan and the
    worst device's idle time match the simulation when a chunk's F, input
    backward and W take equal times, F&B >= F + input backward, p >= 2 and
    m >= 2p (tested; the repository states the formula without
    conditions). It is reported as exact only with fb_factor 1, where the
    span-based bubble rate agrees too.
    """
    f, b_in, w = c.f / 2, c.b / 2, c.w / 2  # per chunk
    full = b_in + w
    fb = (f + full) * c.fb_factor
    bubble = (p - 1) * (fb + full - 3 * w)
    pairs = max(0, 2 * m - 2 * p - 1) if p > 1 else 2 * m - 1
    least_busy = 2 * m * (f + full) - pairs * (f + full - fb)
    peak = np.full(p, min(2 * p + 1, 2 * m) / 2) * c.activation
    equal = f == b_in == w
    return {"makespan": least_busy + bubble, "bubble_time": bubble,
            "peak_activation": peak,
            "exact": bool(equal and c.fb_factor == 1.0 and m >= 2 * p
                          and c.activation_w == c.activation)}


@with_formula_doc
def formula_dualpipe(p, m, v, c):
    """The DualPipe README's bubble (PP/2 - 1)(F&B + B - 3W) with PP = p and
    its activation PP + 1 stage activations; see ``formula_dualpipev``
    for the conditions. The makespan m (F + B) + bubble holds with
    fb_factor 1, where every device is equally busy.
    """
    f, b_in, w = c.f, c.b, c.w  # per stage: a device share is one stage
    full = b_in + w
    fb = (f + full) * c.fb_factor
    bubble = (p // 2 - 1) * (fb + full - 3 * w)
    peak = np.full(p, float(min(p + 1, m))) * c.activation
    equal = f == b_in == w
    return {"makespan": m * (f + full) + bubble, "bubble_time": bubble, "peak_activation": peak,
            "exact": bool(equal and c.fb_factor == 1.0 and m >= 2 * p
                          and c.activation_w == c.activation)}


register(Family("dualpipe", build_dualpipe, formula_dualpipe,
                split=True, summary="DualPipe: two opposite pipelines, F&B overlap, 2x weights",
                paper=DUALPIPE))
register(Family("dualpipev", build_dualpipev, formula_dualpipev, chunks=True, default_chunks=2,
                split=True, fixed_chunks=2,
                summary="DualPipeV: V placement, overlapped F&B units",
                paper=DUALPIPE_V))
