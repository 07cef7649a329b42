"""The answer of a simulation (:class:`Result`) and the plug-ins of higher layers
that give it writers and analyses."""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pyarrow as pa

from ..kernels import listsched as _kernels
from ..kernels.codes import F_DROP
from ..kernels.memory import peak_memory
from . import tier
from .memtable import MemoryTable
from .ops import AR, BW, B, F, InputError, L, O, R, W  # noqa: E741 (kinds named by their letters)
from .schedule import KINDS

__all__ = ["Result", "plug", "bubble_ratio", "bubble_rate"]

_KIND_TYPE = pa.dictionary(pa.int8(), pa.string())
_KIND_DICT = pa.array(KINDS, type=pa.string())

# Result's writers and analyses live in higher layers (output/, analysis/);
# they register here when imported, so core never imports upward.
_PLUGINS: dict = {}


def bubble_ratio(busy_sum, devices, makespan):
    """Idle share of the whole run, ``1 - busy_sum / (devices * makespan)``, in [0, 1].

    The one formula of :attr:`Result.bubble_ratio`, the sweeps' column and
    explore's screened rows. Rounding can put the quotient an ulp past 1
    (a run with no idle time gives -2.2e-16); a ratio is clipped to its
    range. A makespan of 0 gives 0; NaN stays NaN.

    Parameters
    ----------
    busy_sum : float or numpy.ndarray
        Busy time summed over the devices.
    devices : int or numpy.ndarray
    makespan : float or numpy.ndarray

    Returns
    -------
    numpy.ndarray or numpy.float64
    """
    makespan = np.asarray(makespan, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ratio = np.where(makespan > 0, 1.0 - busy_sum / (devices * makespan), 0.0)
    return np.clip(ratio, 0.0, 1.0)


def bubble_rate(span, busy_max):
    """The zero-bubble papers' rate, ``(span - busy_max) / span``, in [0, 1].

    ``span`` is the longest per-device span, ``busy_max`` the largest
    per-device busy time; clipped to its range as :func:`bubble_ratio`.

    Parameters
    ----------
    span, busy_max : float or numpy.ndarray

    Returns
    -------
    numpy.ndarray or numpy.float64
    """
    span = np.asarray(span, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rate = np.where(span > 0, (span - busy_max) / span, 0.0)
    return np.clip(rate, 0.0, 1.0)


def plug(name: str, function) -> None:
    """Register the function behind a :class:`Result` method of a higher layer.

    Parameters
    ----------
    name : str
        One of ``"write_parquet"``, ``"write_trace"``, ``"write_gantt"``,
        ``"critical_path"`` (or a name a later layer adds).
    function : callable
        Called as ``function(result, *args, **kwargs)``.

    Returns
    -------
    None

    Raises
    ------
    ValueError
        If ``function`` is not callable.
    """
    if not callable(function):
        raise InputError(f"plug({name!r}, ...) needs a callable (got {type(function).__name__})")
    _PLUGINS[name] = function


def _plugin(name):
    # pipecore/__init__ imports the layers that register, so this is set for any Result.
    if name not in _PLUGINS:
        raise RuntimeError(f"no {name!r} registered: import pipecore fully (its package "
                           f"__init__ loads the output and analysis layers)")
    return _PLUGINS[name]


class Result:
    """The simulation of one schedule under one set of costs.

    Attributes
    ----------
    schedule : Schedule
    costs : Costs
    network : Network or None
    makespan : float
        Time from 0 to the last op's finish.
    start, finish : numpy.ndarray
        Per op, in the schedule's (device, slot) order. From
        ``pipecore.core.simulate.LAZY_MIN_OPS`` ops on they are computed on first use (the
        list scheduler runs again, with the same result bit for bit).
    """

    def __init__(self, schedule, costs, network, compiled, times, busy, dev_free, dev_first,
                 scale=None):
        self.stragglers = None  # what simulate was given, for what_if
        self.jitter = None
        self.draw = 0
        self.schedule = schedule
        self.costs = costs
        self.network = network
        self._c = compiled
        # The full pass's Run (start, finish, x_start, x_arrival), or None until asked for.
        self._times = times
        self._scale = scale  # the op factors to run with again (None: none)
        self._busy = busy
        self._dev_free = dev_free
        self._dev_first = dev_first
        # Finishes never decrease along a device's program, so its last
        # finish is its largest: the same number as finish.max().
        self.makespan = float(dev_free.max()) if compiled.op_kind.size else 0.0

    def __getstate__(self):
        # Cached views (the ops table, peak activation, ...) are rebuilt on first use, the
        # same bit for bit: a pickled Result (a Ray task's answer) leaves them out.
        cached = {k for cls in type(self).__mro__ for k, v in vars(cls).items()
                  if isinstance(v, cached_property)}
        return {k: v for k, v in self.__dict__.items() if k not in cached}

    def _all_times(self):
        if self._times is None:
            run = self._c.run(self._scale)
            if run.status != _kernels.STATUS_OK:  # the summary pass ran to the end
                raise RuntimeError("internal error: the full list-scheduler pass deadlocked "
                                   "where the summary pass did not")
            self._times = run
            self._scale = None
        return self._times

    @property
    def start(self) -> np.ndarray:
        """numpy.ndarray: each op's start, in (device, slot) order."""
        return self._all_times().start

    @start.setter
    def start(self, value):
        self._times = self._all_times()._replace(start=value)

    @property
    def finish(self) -> np.ndarray:
        """numpy.ndarray: each op's finish, in (device, slot) order."""
        return self._all_times().finish

    @finish.setter
    def finish(self, value):
        self._times = self._all_times()._replace(finish=value)

    @property
    def _x_start(self) -> np.ndarray:
        return self._all_times().x_start

    @property
    def _x_arrival(self) -> np.ndarray:
        return self._all_times().x_arrival

    # -- basic facts ----------------------------------------------------
    @property
    def name(self) -> str:
        """str: the schedule's name."""
        return self.schedule.name

    @property
    def devices(self) -> int:
        """int: number of devices."""
        return self.schedule.devices

    @cached_property
    def ops(self) -> pa.Table:
        """pyarrow.Table: the op table plus ``start`` and ``finish``."""
        return self.schedule.table.append_column("start", pa.array(self.start)) \
            .append_column("finish", pa.array(self.finish))

    @cached_property
    def transfers(self) -> pa.Table:
        """pyarrow.Table: one row per transfer.

        Columns ``src_device``, ``dst_device``, ``stage`` and ``microbatch``
        and ``kind`` of the sending op, ``ready`` (sender's finish),
        ``start`` (on the link), ``finish`` (link released), ``arrival``.
        An offload copy to host has the same source and destination; one to
        a partner device (``Schedule.offload_to``) goes from the offloading
        device to the partner (O) and back (L).
        """
        c = self._c
        dev = self.schedule._column("device")
        src = c.x_src
        src_dev, dst_dev = dev[src].astype(np.int32), dev[c.x_dst].astype(np.int32)
        if c.x_peer is not None and c.x_peer.size:
            # A copy to a partner device travels there and back: its route.
            peer = c.x_peer >= 0
            dst_dev = np.where(peer & (c.x_host == 1), c.x_peer, dst_dev).astype(np.int32)
            src_dev = np.where(peer & (c.x_host == 2), c.x_peer, src_dev).astype(np.int32)
        return pa.table({
            "src_device": pa.array(src_dev),
            "dst_device": pa.array(dst_dev),
            "stage": pa.array(c.op_stage[src]),
            "microbatch": pa.array(self.schedule._column("microbatch")[src].astype(np.int32)),
            "kind": pa.DictionaryArray.from_arrays(pa.array(c.op_kind[src]), _KIND_DICT),
            "ready": pa.array(self.finish[src]),
            "start": pa.array(self._x_start),
            "finish": pa.array(self._x_start + c.x_ser),
            "arrival": pa.array(self._x_arrival),
        })

    @property
    def busy(self) -> np.ndarray:
        """numpy.ndarray: compute time of each device (an F&B pair counts once),
        summed in program order."""
        return self._busy

    @cached_property
    def span(self) -> np.ndarray:
        """numpy.ndarray: last finish minus first start on each device (0 if idle)."""
        ptr = self._c.dev_ptr
        out = np.zeros(len(ptr) - 1)
        has = ptr[1:] > ptr[:-1]
        out[has] = self._dev_free[has] - self._dev_first[has]
        return out

    @property
    def bubble_ratio(self) -> float:
        """float: idle share of the whole run, ``1 - sum(busy) / (p * makespan)``, in [0, 1]."""
        return float(bubble_ratio(self.busy.sum(), self.devices, self.makespan))

    @property
    def bubble_rate(self) -> float:
        """float: the zero-bubble papers' rate, ``(cost - busy) / cost``.

        ``cost`` is the longest per-device span (last op end minus first op
        start) and ``busy`` the largest per-device compute time, which is
        ``m (T_F + T_B + T_W)`` when stages are equal. Recompute (R) time
        counts as busy, so compare recomputed schedules by makespan. In [0, 1]
        (rounding past either end is clipped).
        """
        cost = float(self.span.max()) if self.span.size else 0.0
        return float(bubble_rate(cost, self.busy.max() if self.busy.size else 0.0))

    # -- memory ----------------------------------------------------------
    @cached_property
    def peak_activation(self) -> np.ndarray:
        """numpy.ndarray: peak activation memory of each device, in units of M.

        With offload (O and L ops) memory moves at copy times, so the peak
        is taken over the timed events of :attr:`memory`; otherwise the
        running total in program order is the same curve. An activation
        offloaded to a partner device (``Schedule.offload_to``) counts on
        the partner while it is held there.
        """
        c = self._c
        peak = np.zeros(len(c.dev_ptr) - 1)
        if (c.x_host is not None and c.x_host.any()) or self._act_factor is not None:
            dev, _time, total = self._events()
            np.maximum.at(peak, dev, total)
            return peak
        tier.kernel(peak_memory, len(c.op_class))(c.dev_ptr, c.op_class, c.op_stage, c.act,
                                                   c.act_w, c.ckpt, peak)
        return peak

    def _row_events(self):
        """Each op row's change of its device's activation and when it
        happens: F, R and a recomputed F allocate at their start, B, W and
        BW free at their finish, the rest change nothing."""
        c = self._c
        kind = c.op_class
        s = c.op_stage
        delta = np.select(
            [kind == F, kind == B, kind == W, kind == BW, kind == R, kind == F_DROP],
            [c.act[s], -(c.act[s] - c.act_w[s]), -c.act_w[s], -c.act[s], c.act[s] - c.ckpt[s],
             c.ckpt[s]], default=0.0)
        if self._act_factor is not None:
            delta = delta * self._act_factor
        time = np.where((kind == F) | (kind == R) | (kind == F_DROP), self.start, self.finish)
        return delta, time

    def _events(self):
        """Memory events (device, time, running total), sorted per device by
        time; at equal times by program position, a copy standing at the
        row of the O or L that issued it (after that row's own event), so
        an activation is never freed before it is allocated."""
        c = self._c
        kind = c.op_class
        delta, time = self._row_events()
        dev = self.schedule._column("device").astype(np.int64)
        keep = (kind != AR) & (kind != O) & (kind != L)  # AR, O and L hold nothing themselves
        rows = np.flatnonzero(keep)
        host = c.x_host if c.x_host is not None else np.zeros(len(c.x_src), np.int8)
        out, back = np.flatnonzero(host == 1), np.flatnonzero(host == 2)
        amount = c.act[c.op_stage[c.x_src]]
        if self._act_factor is not None:
            amount = amount * self._act_factor[c.x_src]
        ev_dev = [dev[c.x_src[out]], dev[rows], dev[c.x_src[back]]]
        ev_time = [self._x_arrival[out], time[rows], self._x_start[back]]
        ev_delta = [-amount[out], delta[rows], amount[back]]
        position = [c.x_src[out], rows, c.x_src[back]]
        group = [np.ones(len(out)), np.zeros(len(rows)), np.ones(len(back))]
        peer = c.x_peer if c.x_peer is not None else np.empty(0, np.int32)
        if peer.size:
            # A partner device holds the activation from the start of the copy
            # to it to the end of the copy back. At equal times these events
            # come before the partner's own, a copy back's end before a copy's
            # start (the buffer is free for the next one).
            held_in = out[peer[out] >= 0]
            held_out = back[peer[back] >= 0]
            ev_dev += [peer[held_in].astype(np.int64), peer[held_out].astype(np.int64)]
            ev_time += [self._x_start[held_in], self._x_arrival[held_out]]
            ev_delta += [amount[held_in], -amount[held_out]]
            position += [np.full(len(held_in), -1), np.full(len(held_out), -1)]
            group += [np.ones(len(held_in)), np.zeros(len(held_out))]
        ev_dev, ev_time, ev_delta, position, group = (
            np.concatenate(x) for x in (ev_dev, ev_time, ev_delta, position, group))
        order = np.lexsort((group, position, ev_time, ev_dev))
        ev_dev, ev_time, ev_delta = ev_dev[order], ev_time[order], ev_delta[order]
        total = np.empty_like(ev_delta)
        bounds = np.searchsorted(ev_dev, np.arange(self.devices + 1))
        for d in range(self.devices):  # running sums, one device at a time
            a, b = bounds[d], bounds[d + 1]
            total[a:b] = np.cumsum(ev_delta[a:b])
        return ev_dev, ev_time, total

    @property
    def _act_factor(self):
        """The schedule's per-op activation factors, or None."""
        factors = getattr(self.schedule, "factors", None)
        return None if factors is None else factors.activation

    @cached_property
    def static_memory(self) -> np.ndarray:
        """numpy.ndarray: weight memory of each device (distinct stages it holds,
        a replicated stage counted on each of its devices, each stage once per
        weight version the schedule stashes: ``Schedule.weight_versions``)."""
        weights = self._c.stage_arrays["weights"] * self.schedule.weight_versions
        out = np.zeros(self.devices)
        for stage, devices in enumerate(self.schedule.stage_devices):
            for d in devices:  # each replica holds its own copy of the weights
                out[d] += weights[stage]
        return out

    @cached_property
    def memory(self) -> MemoryTable:
        """MemoryTable: activation timeline, columns ``device``, ``time``, ``activation``.

        One row per op that allocates or frees: F and R at their start, B,
        W and BW at their finish; ``activation`` is the device's activation
        after the event, in the unit of ``Costs.activation`` (M, one
        microbatch's activation on one stage, by default; bytes for the
        costs of :meth:`pipecore.Model.costs`), weights not included (see
        ``static_memory``). A recomputed F allocates only
        ``Costs.checkpoint`` and its R the rest of the activation. With
        offload, a copy to host frees the activation when it ends and a
        copy back allocates it when it starts; rows are then sorted by time
        on each device. A partner device that holds offloaded activations
        (``Schedule.offload_to``) has a row when a copy to it starts (it
        allocates) and when the copy back ends (it frees).

        The column was called ``bytes`` before; for one release that name
        still reads ``activation``, with a ``DeprecationWarning``, which is
        why this is a thin wrapper of the ``pyarrow.Table`` (``.table``)
        rather than the table itself (see ``pipecore.core.memtable``).
        """
        c = self._c
        if c.x_host is not None and c.x_host.any():
            dev, time, total = self._events()
            return MemoryTable(pa.table({"device": pa.array(dev.astype(np.int32)),
                                         "time": pa.array(time), "activation": pa.array(total)}))
        kind = c.op_class
        delta, time = self._row_events()
        dev = self.schedule._column("device")
        total = np.empty_like(delta)
        # Per-device running sums, in program order (a device is sequential).
        for d in range(len(c.dev_ptr) - 1):
            a, b = c.dev_ptr[d], c.dev_ptr[d + 1]
            total[a:b] = np.cumsum(delta[a:b])
        keep = kind != AR  # an all-reduce holds no activation and has no event
        return MemoryTable(pa.table({"device": pa.array(dev[keep].astype(np.int32)),
                                     "time": pa.array(time[keep]),
                                     "activation": pa.array(total[keep])}))

    def metrics(self) -> dict:
        """The headline numbers as plain Python values.

        Returns
        -------
        dict
            name, devices, microbatches, stages, makespan, bubble_ratio,
            bubble_rate, peak_activation (list), peak_activation_max/min,
            static_memory (list), busy (list).
        """
        peak = self.peak_activation
        return {
            "name": self.name,
            "devices": self.devices,
            "microbatches": self.schedule.microbatches,
            "stages": self.schedule.stages,
            "ops": self.schedule.num_ops,
            "transfers": int(self._c.x_dst.shape[0]),
            "makespan": self.makespan,
            "bubble_ratio": self.bubble_ratio,
            "bubble_rate": self.bubble_rate,
            "peak_activation": peak.tolist(),
            "peak_activation_max": float(peak.max()),
            "peak_activation_min": float(peak.min()),
            "static_memory": self.static_memory.tolist(),
            "busy": self.busy.tolist(),
        }

    def write_parquet(self, path):
        """Write the op table (with start and finish) to Parquet.

        Parameters
        ----------
        path : str or os.PathLike

        Returns
        -------
        pathlib.Path

        Raises
        ------
        OSError
            If the file cannot be written.
        """
        return _plugin("write_parquet")(self, path)

    def critical_path(self) -> pa.Table:
        """The chain of ops, transfers and latencies that sets the makespan.

        Returns
        -------
        pyarrow.Table
            One row per segment, in time order; see
            :func:`pipecore.critical_path`.

        Raises
        ------
        RuntimeError
            If the result's times were altered after the simulation.
        """
        return _plugin("critical_path")(self)

    def write_trace(self, path, time_scale: float = 1.0, critical: bool = False):
        """Write a Chrome trace JSON (ops, transfers, memory) for Perfetto.

        Parameters
        ----------
        path : str or os.PathLike
        time_scale : float, default 1.0
            Trace microseconds per time unit.
        critical : bool, default False
            Flag the critical path's events and add a track for it.

        Returns
        -------
        pathlib.Path

        Raises
        ------
        ValueError
            If ``time_scale`` is not a positive finite number.
        OSError
            If the file cannot be written.
        """
        return _plugin("write_trace")(self, path, time_scale=time_scale, critical=critical)

    def write_gantt(self, path, title=None, show_transfers: bool = False,
                    critical: bool = False):
        """Write a Gantt chart PNG (needs the ``plot`` extra).

        Parameters
        ----------
        path : str or os.PathLike
        title : str, optional
        show_transfers : bool, default False
        critical : bool, default False
            Outline the critical path's ops and draw its transfers.

        Returns
        -------
        pathlib.Path

        Raises
        ------
        pipecore.output.MissingDependencyError
            If matplotlib is not installed.
        OSError
            If the file cannot be written.
        """
        return _plugin("write_gantt")(self, path, title=title, show_transfers=show_transfers,
                           critical=critical)

    def __repr__(self) -> str:
        return (f"Result({self.name!r}, devices={self.devices}, makespan={self.makespan:g}, "
                f"bubble_ratio={self.bubble_ratio:.4f})")

    def _repr_html_(self) -> str:
        """Jupyter: a static SVG Gantt and the headline numbers (see ``pc.report``)."""
        return _plugin("result_html")(self)
