"""The space :func:`pipecore.explore` searches: compositions, the default
space of them, and its size before it is made."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.ops import check_int
from ..core.sizes import check_size
from ..schedules import orders as _orders
from ..schedules import placements as _placements

__all__ = ["Composition", "default_space", "space_size"]


@dataclass(frozen=True)
class Composition:
    """One point of the space: what :func:`pipecore.compose` takes.

    Attributes
    ----------
    placement : Placement
    order : Order
    split_backward : bool
    w : str, int, tuple or None
        The W rule (None without split backward, or with the rotate order).
    """

    placement: _placements.Placement
    order: _orders.Order
    split_backward: bool
    w: object

    @property
    def label(self) -> str:
        """str: a short description, e.g. ``v/one_f_one_b(short, inflight=3)/w=bubbles``."""
        pl = self.placement
        where = pl.name if pl.name != "looped" else f"looped{pl.stages // pl.devices}"
        if pl.name == "wave":
            where = f"wave{pl.stages // (2 * pl.devices)}"
        od = self.order
        parts = [od.policy]
        if od.policy == "alternate":
            parts.append(_label_group(od.group) if od.group != "ready" else "ready")
            parts.append(f"warmup={od.warmup}")
            if od.strict:
                parts.append("strict")
        elif od.policy == "greedy":
            parts.append(f"{od.first} first")
        if od.inflight is not None:
            parts.append(f"inflight={od.inflight}")
        if od.overlap:
            parts.append("overlap")
        w = "fused" if not self.split_backward else ("visit" if self.w is None else
                                                      f"w={_w_text(self.w)}")
        return f"{where}/{' '.join(parts)}/{w}"


def _label_group(group):
    return "group=p" if group is None else f"group={group}"


def _w_text(w):
    return "lag " + ",".join(map(str, w)) if isinstance(w, tuple) else str(w)


def default_space(devices: int, microbatches: int, overlap: bool = False) -> list[Composition]:
    """The compositions :func:`explore` tries by default.

    Placements: linear, looped with 2, 3, 4, 5, 6 and 8 chunks, the V, and
    waves of 2 and 3. Orders: 1F1B (ready streams, warm-up "short" or
    "fill") and greedy (backward or forward first) with no cap or a cap of
    1 to 2p microbatches in flight; the families' strict 1F1B over fixed
    streams (warm-up "fill" is Megatron's depth-first) and breadth-first;
    the rotation with no cap or a cap of 1 to 2p. W: fused, or split with
    W "with" its B, "staggered", "late", in the "bubbles", a uniform lag of
    1 to p, or ZB-H2's lag 2d (the rotation: fused or in its visit).

    Also Chimera's two pipelines (``bidirectional``) with the 1F1B and
    greedy orders (no cap or a cap of 1 to p; fused, or W with, staggered,
    late or in the bubbles), which :func:`explore` builds and simulates in
    full rather than timing them in the construction.

    With ``overlap``, also the 1F1B and greedy orders with overlapped F&B
    units (``overlap=True``, each cap) on the placements with several
    stages per device (one stage per device has no unit to form: its F and
    B are of one stage) and on the two pipelines (DualPipe's combination),
    fused or with W "with", "staggered", "late" or in the "bubbles".

    Parameters
    ----------
    devices, microbatches : int
        p and m.
    overlap : bool, default False
        Add the compositions with overlapped F&B units (worth it when
        ``Costs.fb_factor`` < 1: a unit then takes less than its two ops).

    Returns
    -------
    list of Composition

    Raises
    ------
    ValueError
        If devices or microbatches < 1.
    MemoryError
        (:class:`~pipecore.CapacityError`) if the compositions
        (:func:`space_size`) would not fit in the memory available.
    """
    p = check_int("devices", devices, minimum=1)
    m = check_int("microbatches", microbatches, minimum=1)
    check_size(f"default_space(devices={p}, microbatches={m}, overlap={bool(overlap)})",
               space_size(p, overlap), "compositions", bytes_each=_BYTES_PER_COMPOSITION,
               purpose="to enumerate")
    places = [_placements.linear(p)]
    places += [_placements.looped(p, v) for v in (2, 3, 4, 5, 6, 8)]
    places += [_placements.v(p), _placements.wave(p, 2), _placements.wave(p, 3)]
    caps = [None] + list(range(1, 2 * p + 1))
    alternate = [_orders.one_f_one_b(warmup=w, inflight=k) for w in ("short", "fill")
                 for k in caps]
    alternate += [_orders.one_f_one_b(warmup=w, group=None, strict=True)
                  for w in ("short", "fill")]
    alternate += [_orders.breadth_first(), _orders.breadth_first("fifo")]
    alternate += [_orders.greedy(first=f, inflight=k) for f in ("backward", "forward")
                  for k in caps]
    rotations = [_orders.rotate(inflight=k) for k in caps]
    w_rules = ["with", "staggered", "late", "bubbles"] + list(range(1, p + 1))
    w_rules.append(tuple(2 * d for d in range(p)))
    out = []
    for pl in places:
        for od in alternate:
            out.append(Composition(pl, od, False, None))
            out += [Composition(pl, od, True, w) for w in w_rules]
        for od in rotations:
            out += [Composition(pl, od, False, None), Composition(pl, od, True, None)]
    two = _placements.bidirectional(p)

    def each_w(pl, orders):
        for od in orders:
            out.append(Composition(pl, od, False, None))
            out.extend(Composition(pl, od, True, w)
                       for w in ("with", "staggered", "late", "bubbles"))

    def ready(caps):
        return ([_orders.one_f_one_b(warmup=w, inflight=k) for w in ("short", "fill")
                 for k in caps]
                + [_orders.greedy(first=f, inflight=k) for f in ("backward", "forward")
                   for k in caps])

    # Each pipeline holds one stage per device: caps above p change little, and
    # each of these compositions is simulated in full.
    few = [None] + list(range(1, p + 1))
    each_w(two, ready(few))
    if overlap:
        for pl in places:
            if pl.stages > pl.devices:
                each_w(pl, [dataclasses.replace(od, overlap=True) for od in ready(caps)])
        each_w(two, [dataclasses.replace(od, overlap=True) for od in ready(few)])
    return out


# Bytes a Composition of the default space takes (its dataclass; the orders
# and placements are shared): the size guard's estimate.
_BYTES_PER_COMPOSITION = 110


def space_size(devices: int, overlap: bool = False) -> int:
    """How many compositions :func:`default_space` holds, without making them.

    With p devices and caps of none or 1..2p (2p + 1 in all) on the ten
    one-pipeline placements: 8p + 8 alternate orders (1F1B with two
    warm-ups and greedy with two firsts, each per cap; two strict 1F1B; two
    breadth-first), each fused or with one of p + 5 W rules, and 2p + 1
    rotations, fused or split; then the two pipelines' 4(p + 1) ready
    orders with 5 W choices each. ``overlap`` adds the overlapped ready
    orders: 4(2p + 1) on each of the nine placements with several stages
    per device and 4(p + 1) on the two pipelines, 5 W choices each.

    Parameters
    ----------
    devices : int
        p >= 1.
    overlap : bool, default False
        As :func:`default_space`.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If devices < 1.
    """
    p = check_int("devices", devices, minimum=1)
    caps, few = 2 * p + 1, p + 1
    one = (8 * p + 8) * (1 + p + 5) + 2 * caps
    n = 10 * one + 5 * 4 * few
    if overlap:
        n += 9 * 5 * 4 * caps + 5 * 4 * few
    return n
