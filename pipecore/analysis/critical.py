"""The critical path of a simulation: the chain of ops and transfers whose
times add up to the makespan.

Every start time in a simulation (docs/semantics.md) is a maximum: an op
(or overlapped F&B unit) starts at the latest of the previous unit's finish
on its device and the availability of its inputs; a transfer starts at the
latest of its producer's finish, the previous transfer's release of its
link and, for an offload's copy back, the end of its copy to host. The
critical path starts at the op that finishes last and follows, from every
element, the term of that maximum that equals its start (the *binding*
constraint), back to time 0. Since a maximum equals one of its terms
exactly, consecutive elements touch: each one starts exactly where the one
before it ends, and the durations add up to the makespan.

Ties (several terms equal to the start) are broken in a fixed order:

* an op or unit: the previous unit on its device, then the input transfer
  whose producer has the lowest row (then the lowest transfer id); a
  unit with neither starts the path (it starts at 0);
* a transfer: its producer (ready time), then the copy to host an offload's
  copy back waits for, then the previous transfer on its link (queueing).

A local producer never needs a term of its own: it runs earlier on the
same device, so it finishes no later than the previous unit, which wins
the tie.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..core.ops import InputError
from ..core.result import plug
from ..core.schedule import KINDS

__all__ = ["critical_path", "device_share"]

_ELEMENTS = ("op", "transfer", "latency")


def _parts(result):
    """The arrays of a :class:`pipecore.Result` the walk needs."""
    need = ("start", "finish", "_c", "_x_start", "_x_arrival", "schedule")
    missing = [a for a in need if not hasattr(result, a)]
    if missing:
        raise InputError(f"'result' must be a pipecore simulation Result (from pipecore.simulate); "
                         f"got {type(result).__name__} without {', '.join(missing)}")
    return result._c


def _link_predecessors(x_link, x_ser, ready):
    """Per transfer, the transfer its link served just before it, or -1.

    Only transfers with ``ser != 0`` occupy a link. A link serves them in
    order of (ready time, transfer id): on a link with one sender that is
    the sender's program order, which transfer ids follow; on a shared host
    link it is the issue order the kernel uses.
    """
    prev = np.full(x_link.shape[0], -1, dtype=np.int64)
    ids = np.flatnonzero(x_ser != 0.0)
    if ids.size == 0:
        return prev
    order = ids[np.lexsort((ids, ready[ids], x_link[ids]))]
    same = x_link[order[1:]] == x_link[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def critical_path(result) -> pa.Table:
    """The critical path of a simulation, one row per segment in time order.

    The path ends at the op that finishes last (the lowest row among ties)
    and walks back through the binding constraint of every start time (see
    the module docstring for the rule and its tie-breaks). A transfer on
    the path gives two segments: ``"transfer"``, the time it holds its link
    (``start`` to ``start + ser``, zero long without serialisation), then
    ``"latency"``, its flight to the receiver (left out when it takes no
    time). Each segment starts exactly where the previous one finishes,
    the first at 0 and the last at the makespan, so the durations add up
    to the makespan.

    Parameters
    ----------
    result : pipecore.Result
        A simulation from :func:`pipecore.simulate`.

    Returns
    -------
    pyarrow.Table
        Columns ``element`` (``"op"``, ``"transfer"`` or ``"latency"``),
        ``device`` (the op's device, or the transfer's sender),
        ``dst_device`` (the receiver; null for an op), ``kind``, ``stage``
        and ``microbatch`` (of the op, or of the op that sent the
        transfer), ``row`` (op row in the schedule's order, or transfer id
        as in ``result.transfers``), ``partner`` (the other row of an
        overlapped F&B unit, else -1), ``start``, ``finish`` and
        ``duration`` (``finish - start``). An F&B unit is one segment whose
        ``row`` is the op the path leaves it through (the sender of the
        next transfer on the path; the F row when the path goes on on the
        device or ends there).

    Raises
    ------
    ValueError
        If ``result`` is not a simulation Result.
    RuntimeError
        If a start time matches none of its constraints (the result's times
        were altered after the simulation).
    """
    c = _parts(result)
    start = np.asarray(result.start, dtype=np.float64)
    finish = np.asarray(result.finish, dtype=np.float64)
    x_start = np.asarray(result._x_start, dtype=np.float64)
    x_arrival = np.asarray(result._x_arrival, dtype=np.float64)
    sched = result.schedule
    n = start.shape[0]
    nx = x_start.shape[0]
    dev = sched._column("device").astype(np.int64)
    mb = sched._column("microbatch").astype(np.int64)
    kind = np.asarray(c.op_kind, dtype=np.int64)
    stage = np.asarray(c.op_stage, dtype=np.int64)
    paired = np.asarray(c.paired, dtype=bool)
    dev_ptr = np.asarray(c.dev_ptr, dtype=np.int64)
    xfer = np.asarray(c.xfer, dtype=np.int64)
    x_src = np.asarray(c.x_src, dtype=np.int64)
    x_dst = np.asarray(c.x_dst, dtype=np.int64)
    x_ser = np.asarray(c.x_ser, dtype=np.float64)
    x_after = (np.asarray(c.x_after, dtype=np.int64)
               if c.x_after is not None and len(c.x_after) else np.full(nx, -1, dtype=np.int64))
    x_end = x_start + x_ser  # the link's release, computed as the kernel does
    ready = finish[x_src]
    link_prev = _link_predecessors(np.asarray(c.x_link, dtype=np.int64), x_ser, ready)

    segs = []  # (element, device, dst_device, kind row, row, partner, start, finish), walked backwards
    # via: the op row the path leaves a unit through; queued: a transfer reached
    # from the next one on its link, which waited for its release, not its arrival.
    is_op, idx, via, queued = True, int(np.argmax(finish)), None, False
    for _ in range(n + 2 * nx + 1):  # every element is visited at most once
        if is_op:
            h = idx - 1 if paired[idx] else idx  # the unit's first (F) row
            rows = [h, h + 1] if h + 1 < n and paired[h + 1] else [h]
            out = via if via is not None else h
            partner = -1 if len(rows) == 1 else (rows[1] if out == h else h)
            segs.append(("op", dev[h], -1, out, out, partner, start[h], finish[h]))
            t = start[h]
            if h > dev_ptr[dev[h]] and finish[h - 1] == t:
                is_op, idx, via = True, h - 1, None
                continue
            inputs = [int(x) for r in rows for x in xfer[r] if x >= 0 and x_arrival[x] == t]
            if inputs:
                is_op, idx, queued = False, min(inputs, key=lambda x: (x_src[x], x)), False
                continue
            if t == 0.0:
                break
            raise RuntimeError(f"op row {h} starts at {t!r}, which matches neither its device's "
                               f"previous op nor any input: the result's times are inconsistent")
        x = idx
        src = int(x_src[x])
        if not queued and x_arrival[x] != x_end[x]:
            segs.append(("latency", dev[src], dev[x_dst[x]], src, x, -1, x_end[x], x_arrival[x]))
        segs.append(("transfer", dev[src], dev[x_dst[x]], src, x, -1, x_start[x], x_end[x]))
        s = x_start[x]
        y = x_after[x]
        if ready[x] == s:
            is_op, idx, via = True, src, src
        elif y >= 0 and x_arrival[y] == s:
            idx, queued = int(y), False
        elif link_prev[x] >= 0 and x_end[link_prev[x]] == s:
            idx, queued = int(link_prev[x]), True
        else:
            raise RuntimeError(f"transfer {x} starts at {s!r}, which matches neither its ready "
                               f"time, its copy to host nor its link's previous transfer: the "
                               f"result's times are inconsistent")
    else:
        raise RuntimeError("the critical path does not reach time 0: the result's times are "
                           "inconsistent")
    segs.reverse()
    element, device, dst, op_row, row, partner, seg_start, seg_finish = zip(*segs)
    op_row = np.asarray(op_row, dtype=np.int64)
    seg_start = np.asarray(seg_start, dtype=np.float64)
    seg_finish = np.asarray(seg_finish, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.int32)
    return pa.table({
        "element": pa.array(element, type=pa.string()),
        "device": pa.array(np.asarray(device, dtype=np.int32)),
        "dst_device": pa.array(dst, mask=dst < 0),
        "kind": pa.array([KINDS[k] for k in kind[op_row]], type=pa.string()),
        "stage": pa.array(stage[op_row].astype(np.int32)),
        "microbatch": pa.array(mb[op_row].astype(np.int32)),
        "row": pa.array(np.asarray(row, dtype=np.int64)),
        "partner": pa.array(np.asarray(partner, dtype=np.int64)),
        "start": pa.array(seg_start),
        "finish": pa.array(seg_finish),
        "duration": pa.array(seg_finish - seg_start),
    })


def device_share(path, devices: int | None = None) -> pa.Table:
    """Time on the critical path per device: its compute, and its transfers.

    Parameters
    ----------
    path : pyarrow.Table or pipecore.Result
        A table from :func:`critical_path`, or a simulation whose path is
        then computed (and whose device count is used when ``devices`` is
        None).
    devices : int, optional
        Number of devices to report (rows ``0..devices-1``); by default the
        simulation's, or one past the largest device on the path.

    Returns
    -------
    pyarrow.Table
        One row per device: ``device``, ``compute`` (op segments on it),
        ``transfer`` (time its outgoing transfers and host copies on the
        path hold their links), ``latency`` (their flight time), ``total``
        (the sum of the three) and ``share`` (``total`` over the path's
        length, 0 for a path of length 0). ``total`` sums to the makespan.

    Raises
    ------
    ValueError
        If ``path`` lacks a column of :func:`critical_path`'s table, has an
        unknown element, names a device outside ``0..devices-1``, or
        ``devices`` is not a non-negative int.
    """
    if not isinstance(path, pa.Table):
        if devices is None:
            devices = getattr(path, "devices", None)
        path = critical_path(path)
    missing = [col for col in ("element", "device", "duration") if col not in path.column_names]
    if missing:
        raise InputError(f"'path' must be a critical_path table; it lacks column(s) "
                         f"{', '.join(missing)}")
    element = np.asarray(path.column("element").to_pylist(), dtype=object)
    device = np.asarray(path.column("device").to_numpy(), dtype=np.int64)
    duration = np.asarray(path.column("duration").to_numpy(), dtype=np.float64)
    unknown = sorted({str(e) for e in element} - set(_ELEMENTS))
    if unknown:
        raise InputError(f"'path' has unknown element(s) {unknown}; expected {list(_ELEMENTS)}")
    if devices is None:
        devices = int(device.max()) + 1 if device.size else 0
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 0:
        raise InputError(f"'devices' must be an int >= 0 (got {devices!r})")
    devices = int(devices)
    if device.size and (device.min() < 0 or device.max() >= devices):
        raise InputError(f"'path' names device {int(device.max())}, outside 0..{devices - 1} "
                         f"('devices' = {devices})")
    parts = {}
    for name in _ELEMENTS:
        keep = element == name
        # astype: bincount of an empty selection is an int array
        parts[name] = np.bincount(device[keep], weights=duration[keep],
                                  minlength=devices).astype(np.float64)
    total = parts["op"] + parts["transfer"] + parts["latency"]
    length = float(duration.sum())
    return pa.table({
        "device": pa.array(np.arange(devices, dtype=np.int32)),
        "compute": pa.array(parts["op"]),
        "transfer": pa.array(parts["transfer"]),
        "latency": pa.array(parts["latency"]),
        "total": pa.array(total),
        "share": pa.array(total / length if length > 0 else np.zeros(devices)),
    })


plug("critical_path", critical_path)  # Result.critical_path calls it (core cannot import up)
