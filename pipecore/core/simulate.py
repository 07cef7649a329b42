"""Compile a schedule with costs into kernel arrays, run the list scheduler,
and wrap the answer in a :class:`Result`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ..kernels import listsched as _kernels
from ..kernels.carriers import OpCosts, Times, TransferCosts, Units
from ..kernels.codes import F_DROP, N_CLASSES
from ..kernels.memory import peak_memory
from ..kernels.network import X_CLASSES, transfer_classes
from . import buffers, tier
from .costs import Costs, Network, per_stage_direct
from .memtable import MemoryTable
from .ops import AR, BW, B, F, InputError, L, O, R, W  # noqa: E741 (kinds named by their letters)
from .schedule import KINDS, Schedule, ScheduleError, op_label

# From this many ops on, simulate() runs the list scheduler's summary pass
# and leaves each op's start and finish for the first use (Result.start).
LAZY_MIN_OPS = 1 << 20

__all__ = ["simulate", "validate", "compile_schedule", "Result", "Compiled"]

_KIND_TYPE = pa.dictionary(pa.int8(), pa.string())
_KIND_DICT = pa.array(KINDS, type=pa.string())

# Result's writers and analyses live in higher layers (output/, analysis/);
# they register here when imported, so core never imports upward.
_PLUGINS: dict = {}


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


class Run(NamedTuple):
    """What :meth:`Compiled.run` returns; a tuple, so it also unpacks in this order."""

    status: int  # kernels.codes.STATUS_OK, or STATUS_DEADLOCK
    start: np.ndarray  # each op's start (empty from the summary pass)
    finish: np.ndarray  # each op's finish (empty from the summary pass)
    x_start: np.ndarray  # each transfer's start on its link (empty from the summary pass)
    x_arrival: np.ndarray  # each transfer's arrival
    head: np.ndarray  # per device, the row of its first op that did not run
    busy: np.ndarray  # per device, busy time
    dev_free: np.ndarray  # per device, last finish
    dev_first: np.ndarray  # per device, first start


@dataclass
class Compiled:
    """Flat, C-contiguous kernel inputs for one schedule and one cost set.

    Attributes hold what the list scheduler (:mod:`pipecore.kernels.listsched`)
    takes; see :func:`compile_schedule`.
    """

    dev_ptr: np.ndarray
    op_kind: np.ndarray
    op_stage: np.ndarray
    dep: np.ndarray
    xfer: np.ndarray
    out_ptr: np.ndarray
    x_dst: np.ndarray
    x_dst_dev: np.ndarray
    x_link: np.ndarray
    x_cls: np.ndarray
    x_table: np.ndarray
    stage_cost: np.ndarray
    n_links: int
    act: np.ndarray
    act_w: np.ndarray
    ckpt: np.ndarray
    op_class: np.ndarray
    stage_arrays: dict
    x_src: np.ndarray
    paired: np.ndarray
    fb_factor: float
    x_after: np.ndarray | None = None
    x_host: np.ndarray | None = None
    units: Units | None = None  # make_units' carrier, shared by every compile of a schedule
    op_code: np.ndarray | None = None  # op_class * stages + op_stage (no pairs), or empty
    _x_times: tuple | None = None
    _inputs: tuple | None = None  # run()'s unscaled input carriers, as plain tuples

    @property
    def shared_links(self) -> bool:
        """bool: some link has several senders (host links shared by devices)."""
        return self.units is not None and bool(self.units.link_shared.any())

    # Transfer times are kept per class (see kernels.network.X_CLASSES); the
    # per-transfer arrays are made only when something asks for them.
    @property
    def x_ser(self) -> np.ndarray:
        """Serialisation time of every transfer (made on first use)."""
        return self._per_transfer()[0]

    @property
    def x_lat(self) -> np.ndarray:
        """Latency (comm plus link) of every transfer (made on first use)."""
        return self._per_transfer()[1]

    def _per_transfer(self):
        if self._x_times is None:
            self._x_times = (np.ascontiguousarray(self.x_table[0][self.x_cls]),
                             np.ascontiguousarray(self.x_table[1][self.x_cls]))
        return self._x_times

    def run(self, op_scale=None, keep=True):
        """Run the list scheduler.

        Parameters
        ----------
        op_scale : numpy.ndarray, optional
            A factor per op row on its time (stragglers, jitter).
        keep : bool, default True
            Write every op's start and finish and every transfer's start.
            False runs the summary pass (per-device sums, first starts and
            last finishes only; start, finish and x_start come back empty);
            it needs a schedule without shared host links.

        Returns
        -------
        Run
            ``(status, start, finish, x_start, x_arrival, head, busy,
            dev_free, dev_first)``, a named tuple; the last four per device.

        Raises
        ------
        ValueError
            If ``op_scale`` has the wrong shape, or ``keep`` is false for a
            schedule with shared host links.
        """
        n = self.op_kind.shape[0]
        nx = self.x_dst.shape[0]
        p = self.dev_ptr.shape[0] - 1
        if keep:
            # One buffer for the four outputs (views keep the same Numba type);
            # np.empty: the kernel writes every entry of an op or transfer that
            # runs, and entries of ops stuck in a deadlock are never read.
            buf = buffers.empty(2 * n + 2 * nx)  # page-size policy: core/buffers.py
            buffers.populate(buf)  # faulted in on the other CPU meanwhile
            start, finish = buf[:n], buf[n:2 * n]
            x_start, x_arrival = buf[2 * n:2 * n + nx], buf[2 * n + nx:]
        else:
            if self.shared_links:
                raise InputError("the summary pass (keep=False) needs a schedule without "
                                 "shared host links")
            x_arrival = buffers.empty(nx)
            start = finish = x_start = np.empty(0)
        head = np.empty(p, dtype=np.int64)
        if self.units is None:
            self.units = tier.kernel(_kernels.make_units, n)(
                self.dev_ptr, self.xfer, self.out_ptr, self.paired, self.x_link, self.x_dst_dev,
                self.x_after, np.zeros(max(self.n_links, 1), dtype=np.uint8), self.n_links)
        if op_scale is not None:
            op_scale = np.ascontiguousarray(op_scale, dtype=np.float64)
            if op_scale.shape != (n,):  # the kernel does not bounds-check
                raise InputError(f"op_scale has shape {op_scale.shape}; expected ({n},)")
        # The carriers go as plain tuples (tuple(carrier)), which Numba's
        # dispatcher types faster; run_units names them again. The inputs
        # are the same at every unscaled run: made once.
        if self._inputs is None or op_scale is not None:
            op_code = self.op_code if self.op_code is not None else np.empty(0, dtype=np.uint32)
            inputs = (tuple(self.units),
                      tuple(OpCosts(self.op_class, self.op_stage, op_code,
                                    np.empty(0) if op_scale is None else op_scale,  # empty: none
                                    self.stage_cost, self.fb_factor)),
                      tuple(TransferCosts(self.x_cls, self.x_table[0], self.x_table[1])))
            if op_scale is None:
                self._inputs = inputs
        else:
            inputs = self._inputs
        busy, dev_free, dev_first = np.empty(p), np.empty(p), np.zeros(p)
        status = tier.kernel(_kernels.run_units, n)(
            *inputs, tuple(Times(start, finish, x_start, x_arrival, head, busy, dev_free,
                                 dev_first)), keep)
        return Run(status, start, finish, x_start, x_arrival, head, busy, dev_free, dev_first)


def _check_costs(costs):
    if costs is None:
        return Costs()
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    return costs


def compile_schedule(schedule: Schedule, costs: Costs | None = None,
                     network: Network | None = None) -> Compiled:
    """Turn a schedule, costs and network into flat kernel arrays.

    Parameters
    ----------
    schedule : Schedule
        A validated schedule.
    costs : Costs, optional
        Defaults to ``Costs()``.
    network : Network, optional
        Without one, transfers take ``costs.comm`` and never contend.

    Returns
    -------
    Compiled

    Raises
    ------
    ValueError
        If costs or network do not fit the schedule (vector lengths).
    """
    if not isinstance(schedule, Schedule):
        raise InputError(f"'schedule' must be a pipecore.Schedule (got {type(schedule).__name__})")
    costs = _check_costs(costs)
    if network is not None and not isinstance(network, Network):
        raise InputError(f"'network' must be a pipecore.Network (got {type(network).__name__})")
    st = schedule._info()
    S = st.stages
    p = schedule.devices
    arrays = costs.stage_arrays(S, p)
    # Rows by cost class (core.rules.op_class): the kinds, then a dropped F.
    # Compute classes take their time plus the per-op overhead (x + 0.0 == x,
    # so the default leaves every time bit-identical).
    o = arrays["overhead"]
    stage_cost = np.empty((N_CLASSES, S), dtype=np.float64)
    stage_cost[F] = arrays["f"] + o
    stage_cost[B] = arrays["b"] + o
    stage_cost[W] = arrays["w"] + o
    stage_cost[BW] = arrays["bw"] + o
    stage_cost[AR] = 0.0  # an all-reduce's cost is its gradient transfer
    stage_cost[R] = arrays["r"] + o
    stage_cost[O] = 0.0  # O and L only issue copies on the host link
    stage_cost[L] = 0.0
    stage_cost[F_DROP] = arrays["f"] + o

    x_src = st.x_src
    if st.x_host.any() and arrays.get("offload") is None:
        raise InputError("the schedule offloads activations (O and L ops): set Costs.offload, "
                         "the time of one activation copy over a host link")
    x_cls, x_table = _transfer_arrays(st, network, S, arrays["comm"], arrays.get("offload"))
    x_link, n_links, units_key = st.x_link, st.n_links, "units"
    group = int(costs.host_link_devices)
    if st.x_host.any() and group > 1:
        x_link, n_links, shared = _shared_host_links(st, schedule.devices, group)
        units_key = f"units_shared_{group}"
    else:
        shared = np.zeros(max(n_links, 1), dtype=np.uint8)
    if units_key not in st.memo:  # cost-independent: once per schedule (and host sharing)
        st.memo[units_key] = tier.kernel(_kernels.make_units, len(st.op_stage))(
            st.dev_ptr, st.xfer, st.out_ptr, st.paired, x_link, st.x_dst_dev,
            st.x_after, shared, n_links)
    return Compiled(
        dev_ptr=st.dev_ptr,
        op_kind=st.op_kind,
        op_stage=st.op_stage,
        dep=st.dep,
        xfer=st.xfer,
        out_ptr=st.out_ptr,
        x_dst=st.x_dst,
        x_dst_dev=st.x_dst_dev,
        x_link=x_link,
        x_cls=x_cls,
        x_table=x_table,
        stage_cost=stage_cost,
        n_links=n_links,
        act=arrays["activation"],
        act_w=arrays["activation_w"],
        ckpt=arrays["checkpoint"],
        op_class=st.op_class,
        stage_arrays=arrays,
        x_src=x_src,
        paired=st.paired,
        fb_factor=float(costs.fb_factor),
        x_after=st.x_after,
        x_host=st.x_host,
        units=st.memo[units_key],
        op_code=st.op_code,
    )


def _shared_host_links(st, p, group):
    """Link ids with the host links of each group of ``group`` devices
    merged (one per direction), and which links have several senders."""
    host = st.x_host
    src = st.x_src_dev
    key = np.where(host == 0, st.x_link.astype(np.int64),
                   st.n_links + 2 * (src // group) + host - 1)
    _, x_link = np.unique(key, return_inverse=True)
    x_link = np.ascontiguousarray(x_link.reshape(-1).astype(np.int32))
    n_links = int(x_link.max()) + 1 if x_link.size else 0
    senders = np.zeros((max(n_links, 1), p), dtype=bool)
    senders[x_link, src] = True
    shared = (senders.sum(axis=1) > 1).astype(np.uint8)
    return x_link, n_links, shared


def _transfer_arrays(st, network, stages, comm, offload):
    """Every transfer's class (cached per schedule and node size) and the
    table of serialisation and latency per class: ``(x_cls, (ser, lat))``.
    Same arithmetic as per transfer: ``bytes / bandwidth`` and
    ``comm + link latency``; an offload copy takes ``offload`` and no latency."""
    if network is not None and not isinstance(network, Network):
        raise InputError(f"'network' must be a pipecore.Network (got {type(network).__name__})")
    if network is None:  # free links: 0 / 1.0 serialisation, no link latency
        nbytes = grads = np.zeros(stages)
        bw, lat, ibw, ilat, per_node = 1.0, 0.0, 1.0, 0.0, 0
    else:
        nbytes = per_stage_direct("Network", "bytes", network.bytes, stages)
        grads = per_stage_direct("Network", "grad_bytes", network.grad_bytes, stages)
        bw, lat = float(network.bandwidth), float(network.latency)
        per_node = int(network.devices_per_node or 0)
        ibw = float(network.inter_bandwidth) if per_node else bw
        ilat = float(network.inter_latency) if per_node else lat
    key = f"x_cls_{per_node}"
    if key not in st.memo:
        x_cls = np.empty(len(st.x_src), dtype=np.uint32)
        # Source devices are read only across nodes (Structure.x_src_dev
        # gathers them on first use).
        src_dev = st.x_src_dev if per_node else st.x_dst_dev
        tier.kernel(transfer_classes, len(x_cls))(
            st.x_src, st.op_stage, st.x_is_ar, st.x_host, src_dev, st.x_dst_dev,
            per_node, x_cls)
        st.memo[key] = x_cls
    nbytes = np.asarray(nbytes, dtype=np.float64)
    grads = np.asarray(grads, dtype=np.float64)
    comm = np.asarray(comm, dtype=np.float64)
    ser = np.zeros((stages, X_CLASSES))
    x_lat = np.zeros((stages, X_CLASSES))
    with np.errstate(over="ignore"):
        ser[:, 0], x_lat[:, 0] = nbytes / bw, comm + lat
        ser[:, 1], x_lat[:, 1] = nbytes / ibw, comm + ilat
        ser[:, 2], x_lat[:, 2] = grads / bw, comm + lat
        ser[:, 3], x_lat[:, 3] = grads / ibw, comm + ilat
    if not (np.isfinite(ser).all() and np.isfinite(x_lat).all()):
        raise InputError(f"a transfer's time overflows float64: bytes / bandwidth = "
                         f"{float(np.max(ser)):g} (bytes up to {float(np.max(nbytes)):g}, grad_bytes "
                         f"up to {float(np.max(grads)):g}, bandwidth {min(bw, ibw):g}) and "
                         f"latency {float(np.max(x_lat)):g}; use larger units")
    if offload is not None:
        ser[:, 4] = offload
    return st.memo[key], (ser.reshape(-1), x_lat.reshape(-1))


def _deadlock_error(schedule, head):
    dev_ptr = schedule._info().dev_ptr
    blocked = [int(head[d]) for d in range(schedule.devices) if head[d] < dev_ptr[d + 1]]
    kinds = schedule.kind_codes
    stage = schedule._column("stage")
    mb = schedule._column("microbatch")
    dev = schedule._column("device")
    slot = schedule._column("slot")
    parts = [f"device {int(dev[r])} slot {int(slot[r])} waits at "
             f"{op_label(kinds[r], int(stage[r]), int(mb[r]))}" for r in blocked]
    r0 = blocked[0]
    msg = ("deadlock: every blocked device waits on an op that can never run; "
           + "; ".join(parts)
           + "\nper-device programs (stuck ops marked >>..<<):\n" + schedule.render(blocked))
    err = ScheduleError(msg, rule="deadlock", device=int(dev[r0]), slot=int(slot[r0]),
                        stage=int(stage[r0]), microbatch=int(mb[r0]), kind=KINDS[kinds[r0]])
    err.blocked = [(int(dev[r]), int(slot[r])) for r in blocked]
    return err


def validate(schedule: Schedule) -> Schedule:
    """Check every rule of a schedule, including freedom from deadlock.

    Parameters
    ----------
    schedule : Schedule

    Returns
    -------
    Schedule
        The same schedule, for chaining.

    Raises
    ------
    ScheduleError
        For a missing or duplicate op, an op before its producer on the
        same device, stages split across devices, or a deadlock (naming the
        stuck op at the head of every blocked device).
    """
    compiled = compile_schedule(schedule, Costs(f=1.0, b=1.0, w=1.0, comm=0.0, offload=1.0))
    # Only the status and the heads matter here: the summary pass will do.
    run = compiled.run(keep=compiled.shared_links)
    if run.status == _kernels.STATUS_DEADLOCK:
        raise _deadlock_error(schedule, run.head)
    return schedule


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
        :data:`LAZY_MIN_OPS` ops on they are computed on first use (the
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
        """
        c = self._c
        dev = self.schedule._column("device")
        src = c.x_src
        return pa.table({
            "src_device": pa.array(dev[src].astype(np.int32)),
            "dst_device": pa.array(dev[c.x_dst].astype(np.int32)),
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
        """float: idle share of the whole run, ``1 - sum(busy) / (p * makespan)``."""
        if self.makespan == 0:
            return 0.0
        return float(1.0 - self.busy.sum() / (self.devices * self.makespan))

    @property
    def bubble_rate(self) -> float:
        """float: the zero-bubble papers' rate, ``(cost - busy) / cost``.

        ``cost`` is the longest per-device span (last op end minus first op
        start) and ``busy`` the largest per-device compute time, which is
        ``m (T_F + T_B + T_W)`` when stages are equal. Recompute (R) time
        counts as busy, so compare recomputed schedules by makespan.
        """
        cost = float(self.span.max()) if self.span.size else 0.0
        if cost == 0:
            return 0.0
        return float((cost - self.busy.max()) / cost)

    # -- memory ----------------------------------------------------------
    @cached_property
    def peak_activation(self) -> np.ndarray:
        """numpy.ndarray: peak activation memory of each device, in units of M.

        With offload (O and L ops) memory moves at copy times, so the peak
        is taken over the timed events of :attr:`memory`; otherwise the
        running total in program order is the same curve.
        """
        c = self._c
        peak = np.zeros(len(c.dev_ptr) - 1)
        if c.x_host is not None and c.x_host.any():
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
        ev_dev = np.concatenate([dev[c.x_src[out]], dev[rows], dev[c.x_src[back]]])
        ev_time = np.concatenate([self._x_arrival[out], time[rows], self._x_start[back]])
        ev_delta = np.concatenate([-amount[out], delta[rows], amount[back]])
        position = np.concatenate([c.x_src[out], rows, c.x_src[back]])
        group = np.concatenate([np.ones(len(out)), np.zeros(len(rows)), np.ones(len(back))])
        order = np.lexsort((group, position, ev_time, ev_dev))
        ev_dev, ev_time, ev_delta = ev_dev[order], ev_time[order], ev_delta[order]
        total = np.empty_like(ev_delta)
        bounds = np.searchsorted(ev_dev, np.arange(self.devices + 1))
        for d in range(self.devices):  # running sums, one device at a time
            a, b = bounds[d], bounds[d + 1]
            total[a:b] = np.cumsum(ev_delta[a:b])
        return ev_dev, ev_time, total

    @cached_property
    def static_memory(self) -> np.ndarray:
        """numpy.ndarray: weight memory of each device (distinct stages it holds,
        a replicated stage counted on each of its devices)."""
        weights = self._c.stage_arrays["weights"]
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
        on each device.

        The column was called ``bytes`` before; for one release that name
        still reads ``activation``, with a ``DeprecationWarning``, which is
        why this is a thin wrapper of the ``pyarrow.Table`` (``.table``)
        rather than the table itself (see :mod:`pipecore.core.memtable`).
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


def straggler_scale(schedule: Schedule, stragglers) -> np.ndarray:
    """Per-op time factors from a straggler description.

    Parameters
    ----------
    schedule : Schedule
    stragglers : mapping of int to float, or array_like, or None
        ``{device: factor}`` slows every op of a device (factor > 0, e.g.
        1.3 for 30% slower); an array gives one factor per op row.

    Returns
    -------
    numpy.ndarray
        One factor per op row (ones for None).

    Raises
    ------
    ValueError
        Naming a device out of range or a factor that is not a finite
        number > 0, or an array of the wrong length.
    """
    n = schedule.num_ops
    if stragglers is None:
        return np.ones(n)
    if isinstance(stragglers, Mapping):
        per_dev = np.ones(schedule.devices)
        for d, factor in stragglers.items():
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) \
                    or not 0 <= d < schedule.devices:
                raise InputError(f"straggler device {d!r} is not one of 0..{schedule.devices - 1}")
            if isinstance(factor, (bool, np.bool_)) or not isinstance(
                    factor, (int, float, np.integer, np.floating)):
                raise InputError(f"straggler factor of device {d} must be a finite number > 0 "
                                 f"(got {factor!r})")
            f = float(factor)
            if not math.isfinite(f) or f <= 0:
                raise InputError(f"straggler factor of device {d} must be a finite number > 0 "
                                 f"(got {factor!r})")
            per_dev[d] = f
        return per_dev[schedule._column("device")]
    arr = np.asarray(stragglers, dtype=np.float64)
    if arr.shape != (n,):
        raise InputError(f"per-op straggler factors need one entry per op ({n}); got shape "
                         f"{arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
        raise InputError(f"straggler factor of op {int(bad[0])} must be a finite number > 0 "
                         f"(got {arr[bad[0]]})")
    return arr


def simulate(schedule: Schedule, costs: Costs | None = None,
             network: Network | None = None, stragglers=None, jitter=None,
             draw: int = 0) -> Result:
    """Simulate a schedule: every op's start and finish, transfers, memory.

    Parameters
    ----------
    schedule : Schedule
        From :func:`pipecore.build` or :func:`pipecore.from_actions`.
    costs : Costs, optional
        Op times and memory; defaults to ``Costs()``.
    network : Network, optional
        Bandwidth-limited links with contention. Without one, each
        transfer takes ``costs.comm`` and links never contend.
    stragglers : mapping of int to float, or array_like, optional
        Slow devices, ``{device: factor}`` (1.3: every op 30% slower), or
        one factor per op row (:func:`straggler_scale`).
    jitter : Jitter, optional
        Random factors on op times (:class:`pipecore.Jitter`); this
        simulation uses draw number ``draw``.
    draw : int, default 0
        Which draw of ``jitter`` (the same as :func:`pipecore.monte_carlo`'s
        draw of that index).

    Returns
    -------
    Result

    Raises
    ------
    ScheduleError
        If the schedule deadlocks (naming the stuck op on every blocked
        device).
    ValueError
        If costs, network, stragglers or jitter are invalid or do not fit
        the schedule, or the times overflow float64 (no infinite makespan
        is returned as an answer).
    """
    if isinstance(draw, bool) or not isinstance(draw, (int, np.integer)) or draw < 0:
        raise InputError(f"'draw' must be an int >= 0, the index of a jitter draw (got {draw!r})")
    compiled = compile_schedule(schedule, costs, network)
    scale = None
    if stragglers is not None or jitter is not None:
        scale = straggler_scale(schedule, stragglers)
        if jitter is not None:
            # Duck-typed: pipecore.Jitter lives in analysis/, above this layer.
            if not callable(getattr(jitter, "draw", None)):
                raise InputError(f"'jitter' must be a pipecore.Jitter (got {type(jitter).__name__})")
            scale = scale * jitter.draw(schedule, 1, draw)[:, 0]
    # Large schedules run the summary pass now and the per-op times when
    # something asks for them (the summary pass writes no per-op array: less
    # memory to fill when only the makespan, busy times, spans and peaks are wanted).
    keep = compiled.op_kind.shape[0] < LAZY_MIN_OPS or compiled.shared_links
    with np.errstate(over="ignore", invalid="ignore"):  # checked below, with a message
        run = compiled.run(scale, keep=keep)
    busy, dev_free = run.busy, run.dev_free
    if run.status == _kernels.STATUS_DEADLOCK:
        raise _deadlock_error(schedule, run.head)
    if not (np.isfinite(dev_free).all() and np.isfinite(busy).all()):
        c = _check_costs(costs)
        raise InputError(
            f"the simulated times of {schedule.name!r} overflow float64 (makespan "
            f"{float(np.max(dev_free)):g}): an op time, a transfer time or their sum along the "
            f"schedule exceeds 1.8e308 (costs f={np.max(c.f):g}, b={np.max(c.b):g}, "
            f"w={np.max(c.w):g}, comm={np.max(c.comm):g}"
            + ("" if scale is None else f"; straggler/jitter factors up to {np.max(scale):g}")
            + "); express the costs in a larger unit")
    res = Result(schedule, _check_costs(costs), network, compiled, run if keep else None, busy,
                 dev_free, run.dev_first, scale=None if keep else scale)
    # A copy: what_if replays these, and the caller may reuse their own.
    if isinstance(stragglers, Mapping):
        stragglers = dict(stragglers)
    elif stragglers is not None:
        stragglers = np.array(stragglers, dtype=np.float64)
    res.stragglers, res.jitter, res.draw = stragglers, jitter, draw
    return res
