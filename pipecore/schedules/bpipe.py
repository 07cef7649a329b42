"""BPipe (Kim et al., ICML 2023): 1F1B whose memory-heavy early devices keep
some activations in the memory of the light late devices.

In 1F1B device d holds up to k_d = min(p - d, m) activations, so device 0
needs p M while device p - 1 needs one. BPipe pairs device d with device
p - 1 - d: the first evicts activations to the second after their forward
(an O op whose copy travels on the link from d to its partner) and loads
them back before their backward (an L op, the copy back). The schedule
keeps 1F1B's order; :attr:`Schedule.offload_to` names each evictor's
partner, ``Costs.evict`` prices one copy.

pipecore's rule (the paper's body was not available to check it against):
an evictor with k_d resident activations and a partner with k_q sends
n = floor((k_d - k_q + 1) / 2) of every k_d consecutive microbatches (those
j with ``j mod k_d`` odd and below 2n), when n >= 2 (one eviction saves
nothing: see below). Each comes back right after the backward before its
own has freed its memory, so in the steady state the copy back runs beside
the next forward. A device also holds the activation it is producing and
the one coming back, so the evictor's peak is k_d - n + 1 and the
partner's k_q + n: every device holds at most floor((p + 3) / 2) M when
m > p, against p M on 1F1B's device 0.

Not a ``pc.compose`` preset: compose chooses placement, order and W rule,
none of which says where an activation waits; BPipe is 1F1B's placement
and order plus O/L ops and ``offload_to``. Not exportable to torch (no
action moves an activation off its rank), and refused by the batched
kernels (``simulate_many``), which keep memory in program order.
"""

from __future__ import annotations

import numpy as np

from ..core.schedule import Schedule
from ..kernels.codes import BW, F, L, O
from .onef1b import formula_1f1b
from .papers import BPIPE
from .registry import Family, register, with_builder_doc, with_formula_doc

__all__ = ["build_bpipe", "formula_bpipe", "evictions"]


def evictions(devices: int, microbatches: int):
    """Who evicts to whom, and how many of every k_d microbatches.

    Parameters
    ----------
    devices : int
        Pipeline devices p.
    microbatches : int
        Microbatches m.

    Returns
    -------
    partner : numpy.ndarray
        int64 (p,): the device holding device d's evicted activations, -1
        for a device that evicts none.
    resident : numpy.ndarray
        int64 (p,): k_d = min(p - d, m), the activations device d holds in
        1F1B.
    count : numpy.ndarray
        int64 (p,): n_d, how many of every k_d consecutive microbatches
        device d evicts (0 for none).
    """
    p, m = int(devices), int(microbatches)
    d = np.arange(p)
    resident = np.minimum(p - d, m)
    partner = np.full(p, -1, dtype=np.int64)
    count = np.zeros(p, dtype=np.int64)
    first = d[: p // 2]
    n = (resident[first] - resident[p - 1 - first] + 1) // 2
    use = n >= 2  # one eviction moves one activation and adds the one coming back
    partner[first[use]] = p - 1 - first[use]
    count[first[use]] = n[use]
    return partner, resident.astype(np.int64), count


def _evicted(resident, count, microbatches):
    """(p, m) bool: microbatch j of device d is evicted (``j mod k_d`` odd and below 2 n_d)."""
    j = np.arange(microbatches)[None, :]
    r = j % resident[:, None]
    return (r % 2 == 1) & (r < 2 * count[:, None])


@with_builder_doc
def build_bpipe(devices, microbatches, chunks=1):
    """1F1B with activation balancing: device d evicts n_d of every k_d
    microbatches to device p - 1 - d (an O right after the F) and loads
    each back (an L) right after the backward before its own.
    """
    p, m = devices, microbatches
    partner, k, n = evictions(p, m)
    # int32 throughout (slots stay below 4m): at p=1024, m=8192 each (p, 2m)
    # temporary is 64 MiB instead of 128, and fresh memory is much of the cost.
    kk = k[:, None].astype(np.int32)
    j = np.arange(m, dtype=np.int32)[None, :]
    # 1F1B's closed-form slots (onef1b._one_f_one_b_slots).
    f_slot = np.where(j < kk, j, 2 * j - kk + 1)
    b_slot = np.where(j < m - kk, kk + 2 * j, m + j)
    ev = _evicted(k, n, m)
    # One op goes after each evicted F (its O) and after the backward before
    # each evicted microbatch's (its L); every later op moves down by the
    # number inserted before it.
    rows = np.broadcast_to(np.arange(p)[:, None], (p, m))
    ins = np.zeros((p, 2 * m), dtype=np.int32)
    ins[rows[ev], f_slot[ev]] = 1
    load_after = np.zeros_like(ev)
    load_after[:, :-1] = ev[:, 1:]  # L(i) after BW(i - 1); microbatch 0 is never evicted
    ins[rows[load_after], b_slot[load_after]] = 1
    before = np.cumsum(ins, axis=1, dtype=np.int32)
    before -= ins
    f_new = f_slot + np.take_along_axis(before, f_slot, axis=1)
    b_new = b_slot + np.take_along_axis(before, b_slot, axis=1)
    length = 2 * m + 2 * ev.sum(axis=1)
    start = np.concatenate([[0], np.cumsum(length)[:-1]])[:, None]
    total = int(length.sum())
    device = np.repeat(np.arange(p, dtype=np.int32), length)
    slot = np.arange(total, dtype=np.int32)  # total < 2**31 at the sizes tables hold
    slot -= np.repeat(start[:, 0].astype(np.int32), length)
    kind = np.empty(total, dtype=np.int8)
    stage = device.copy()  # stage d on device d
    mb = np.empty(total, dtype=np.int32)
    jj = np.broadcast_to(j, (p, m))
    for code, at, which in ((F, f_new, None), (BW, b_new, None), (O, f_new + 1, ev),
                            (L, b_new + 1, load_after)):
        if which is None:
            kind[(start + at).ravel()] = code
            mb[(start + at).ravel()] = jj.ravel()
        else:
            # L after BW(i - 1) loads microbatch i.
            target = (start + at)[which]
            kind[target] = code
            mb[target] = (jj + (code == L))[which]
    return Schedule.from_arrays(device, slot, kind, stage, mb, name="bpipe", devices=p,
                                offload_to=[int(q) for q in partner], copy=False)


@with_formula_doc
def formula_bpipe(p, m, v, c):
    """1F1B's makespan when a copy back fits beside a forward (``evict <= f``);
    evictor d peaks at k_d - n_d + 1, its partner at k_q + n_d.

    The +1 on the evictor (the activation being produced or the one coming
    back) is there once a steady state exists (m > k_d) or every other
    microbatch is evicted (2 n_d = k_d; 2 n_d >= k_d - 1 when a copy takes
    time, as the copy out of the last eviction then overlaps the next F). Past ``evict > f`` the copies
    back delay backwards and copies overlap longer: the makespan then adds
    ``evict - f`` per evicted microbatch of device 0 and the peaks keep
    their ``evict <= f`` values, both estimates (``exact`` False).
    """
    out = formula_1f1b(p, m, v, c)
    partner, k, n = evictions(p, m)
    peak = k.astype(np.float64)
    for d in np.flatnonzero(partner >= 0):
        q = int(partner[d])
        # Without a steady state the +1 needs every other microbatch evicted
        # (or, while a copy takes time, the one after the last eviction).
        edge = k[d] - (1 if c.evict > 0 else 0)
        bump = 1 if (m > k[d] or 2 * n[d] >= edge) else 0
        peak[d] = k[d] - n[d] + bump
        peak[q] = k[q] + n[d]
    out["peak_activation"] = peak * c.activation
    late = max(0.0, float(c.evict) - float(c.f))
    if late > 0 and partner[0] >= 0:
        out["makespan"] += late * int(_evicted(k[:1], n[:1], m).sum())
        out["exact"] = False
    return out


register(Family("bpipe", build_bpipe, formula_bpipe,
                summary="1F1B evicting early devices' activations to device p-1-d; peak ~(p+3)/2 M",
                paper=BPIPE))
