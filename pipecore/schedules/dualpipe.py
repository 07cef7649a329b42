"""DualPipeV (DeepSeek-V3 report; the DualPipe repository's V variant).

A V placement (device d holds stages d and 2p-1-d) whose steady phase runs
the forward of one chunk overlapped with the full backward of the other as a
single F&B unit. The per-device order follows the eight steps of PyTorch's
``ScheduleDualPipeV`` (torch 2.13), restated here and checked against a
fixture generated from torch.
"""

from __future__ import annotations

import numpy as np

from . import Family, _programs_to_schedule, register


class _Device:
    """One device's program with DualPipeV's counters.

    F, and the backward of each stage (B or BW), number microbatches in
    order; a B leaves its W pending, and W ops run oldest first.
    """

    def __init__(self):
        self.ops = []
        self.next = {}
        self.pending_w = []

    def _take(self, key):
        j = self.next.get(key, 0)
        self.next[key] = j + 1
        return j

    def op(self, kind, stage):
        if kind == "F":
            j = self._take(("F", stage))
        else:
            j = self._take(("back", stage))
            if kind == "B":
                self.pending_w.append((stage, j))
        self.ops.append((kind, stage, j))

    def overlap(self, f_stage, b_stage):
        f = ("F", f_stage, self._take(("F", f_stage)))
        b = ("BW", b_stage, self._take(("back", b_stage)))
        self.ops.append((f, b))

    def weight(self):
        if self.pending_w:
            stage, j = self.pending_w.pop(0)
            self.ops.append(("W", stage, j))


def build_dualpipev(devices, microbatches, chunks=2):
    """DualPipeV on device d (chunk 0 = stage d, chunk 1 = stage 2p-1-d).

    1. 2(p-d-1) forwards of chunk 0;
    2. d+1 pairs F(chunk 0), F(chunk 1);
    3. p-d-1 times: B(chunk 1), its pending W, F(chunk 1);
    4. m-2p+d+1 times: F(chunk 0)&BW(chunk 1) (on the last device the first
       one runs as F then BW, unoverlapped), then F(chunk 1)&BW(chunk 0);
    5. p-d-1 times: BW(chunk 1), then F(chunk 1)&BW(chunk 0);
    6. d+1 times a backward of chunk 1 then of chunk 0, fused BW in the
       first half and split B (W deferred) from the middle on (the switch
       falls between the two chunks on even devices and before them on odd);
    7. p-d-1 times: a pending W, then a backward of chunk 0;
    8. the d+1 remaining W.

    Raises
    ------
    ValueError
        If m < 2p (DualPipeV needs as many microbatches as stages).
    """
    p, m = devices, microbatches
    if m < 2 * p:
        raise ValueError(f"'dualpipev' needs microbatches >= 2 * devices = {2 * p} (got {m})")
    programs = []
    for d in range(p):
        c0, c1 = d, 2 * p - 1 - d
        dev = _Device()
        for _ in range(2 * (p - d - 1)):
            dev.op("F", c0)
        for _ in range(d + 1):
            dev.op("F", c0)
            dev.op("F", c1)
        for _ in range(p - d - 1):
            dev.op("B", c1)
            dev.weight()
            dev.op("F", c1)
        for i in range(m - 2 * p + d + 1):
            if i == 0 and d == p - 1:
                dev.op("F", c0)
                dev.op("BW", c1)
            else:
                dev.overlap(c0, c1)
            dev.overlap(c1, c0)
        for _ in range(p - d - 1):
            dev.op("BW", c1)
            dev.overlap(c1, c0)
        split = False
        half = (d + 1) // 2
        for i in range(d + 1):
            if i == half and d % 2 == 1:
                split = True
            dev.op("B" if split else "BW", c1)
            if i == half and d % 2 == 0:
                split = True
            dev.op("B" if split else "BW", c0)
        for _ in range(p - d - 1):
            dev.weight()
            dev.op("B" if split else "BW", c0)
        for _ in range(d + 1):
            dev.weight()
        programs.append(dev.ops)
    return _programs_to_schedule("dualpipev", programs, p)


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


register(Family("dualpipev", build_dualpipev, formula_dualpipev, chunks=True, default_chunks=2,
                split=True, fixed_chunks=2,
                summary="DualPipeV: V placement, overlapped F&B units"))
