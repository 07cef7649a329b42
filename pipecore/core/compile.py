"""Compile a schedule with costs into the list scheduler's inputs (:class:`Compiled`).

The cost-independent part (units, transfer classes) is derived once per
schedule and kept in its structure's ``memo``; the cost rows are built per call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..kernels import listsched as _kernels
from ..kernels.carriers import OpCosts, Times, TransferCosts, Units
from ..kernels.codes import F_DROP, N_CLASSES, X_CLASSES
from . import tier
from .costs import Costs, Network, per_stage_direct
from .ops import AR, BW, B, F, InputError, L, O, R, W, check_type  # noqa: E741 (kinds named by their letters)
from .schedule import Schedule, refuse_factors

__all__ = ["compile_schedule", "make_units", "Compiled", "Run"]


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
    x_peer: np.ndarray | None = None  # Structure.x_peer: the partner holding each copy, or empty
    units: Units | None = None  # make_units' carrier, shared by every compile of a schedule
    op_code: np.ndarray | None = None  # op_class * stages + op_stage (no pairs), or empty
    _x_times: tuple | None = None
    _inputs: tuple | None = None  # run()'s unscaled input carriers, as plain tuples

    @property
    def shared_links(self) -> bool:
        """bool: some link has several senders (host links shared by devices)."""
        return self.units is not None and bool(self.units.link_shared.any())

    # Transfer times are kept per class (see kernels.codes.X_CLASSES); the
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
            buf = np.empty(2 * n + 2 * nx)
            start, finish = buf[:n], buf[n:2 * n]
            x_start, x_arrival = buf[2 * n:2 * n + nx], buf[2 * n + nx:]
        else:
            if self.shared_links:
                raise InputError("the summary pass (keep=False) needs a schedule without "
                                 "shared host links")
            x_arrival = np.empty(nx)
            start = finish = x_start = np.empty(0)
        head = np.empty(p, dtype=np.int64)
        if self.units is None:
            self.units = make_units(self.dev_ptr, self.xfer, self.out_ptr, self.paired, self.x_link,
                                    self.x_after, np.zeros(max(self.n_links, 1), dtype=np.uint8),
                                    self.n_links)
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
                                    self.stage_cost.reshape(-1), self.stage_cost.shape[1],
                                    self.fb_factor)),
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


def make_units(dev_ptr, xfer, out_ptr, paired, x_link, x_after, link_shared, n_links) -> Units:
    """The cost-independent :class:`~pipecore.kernels.carriers.Units` of a
    schedule, made once and reused by every simulation of it.

    Without overlapped pairs unit u is row u: the carrier then holds
    ``xfer`` and ``out_ptr`` themselves and empty unit arrays, so nothing of
    the schedule's size is allocated or copied (and no kernel compiles);
    with pairs :func:`~pipecore.kernels.listsched.program_units` cuts the
    programs into units.

    Parameters
    ----------
    dev_ptr, xfer, out_ptr, paired : numpy.ndarray
        The structure's arrays (:class:`~pipecore.core.structure.Structure`).
    x_link : numpy.ndarray
        int32 (nx): the link each transfer takes.
    x_after : numpy.ndarray
        int32 (nx) or empty: a transfer that transfer x cannot start before
        the arrival of (-1 for none).
    link_shared : numpy.ndarray
        uint8 (>= n_links): a link with several senders (a host link shared
        by devices), served in issue order (see ``listsched.list_units``).
    n_links : int

    Returns
    -------
    Units
    """
    n = xfer.shape[0]
    # Indices are never negative: the unsigned views let Numba drop its
    # negative-index fix-up without a copy.
    dev_units = dev_ptr.astype(np.uint32)
    x_link32 = x_link.view(np.uint32)
    if not paired.any():
        none = np.empty(0, dtype=np.uint32)
        return Units(n, dev_units, np.empty(0, dtype=np.int64), none, none, none, x_link32,
                     x_after, link_shared, n_links, xfer, out_ptr)
    unit_rows = np.empty(n + 1, dtype=np.int64)
    unit_sends = np.empty(n + 1, dtype=np.uint32)
    wait_ptr = np.empty(n + 1, dtype=np.uint32)
    waits = np.empty(x_link.shape[0], dtype=np.uint32)
    nu = tier.kernel(_kernels.program_units, n)(dev_ptr, xfer, out_ptr, paired, dev_units,
                                                unit_rows, unit_sends, wait_ptr, waits)
    return Units(int(nu), dev_units, unit_rows, unit_sends, wait_ptr, waits, x_link32, x_after,
                 link_shared, n_links, xfer[:0], out_ptr[:0])


def _check_costs(costs):
    if costs is None:
        return Costs()
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    return costs


def compile_schedule(schedule: Schedule, costs: Costs | None = None,
                     network: Network | None = None, factors: bool = False) -> Compiled:
    """Turn a schedule, costs and network into flat kernel arrays.

    Parameters
    ----------
    schedule : Schedule
        A validated schedule.
    costs : Costs, optional
        Defaults to ``Costs()``.
    network : Network, optional
        Without one, transfers take ``costs.comm`` and never contend.
    factors : bool, default False
        Whether the caller applies the schedule's per-op work factors
        (:meth:`Schedule.with_factors`) itself; the arrays here leave them out.

    Returns
    -------
    Compiled

    Raises
    ------
    ValueError
        If costs or network do not fit the schedule (vector lengths), or the
        schedule carries work factors and ``factors`` is False.
    """
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    if not factors:
        refuse_factors(schedule, "this path (compile_schedule)")
    costs = _check_costs(costs)
    if network is not None and not isinstance(network, Network):
        raise InputError(f"'network' must be a pipecore.Network (got {type(network).__name__})")
    st = schedule._info()
    S = st.stages
    p = schedule.devices
    arrays = costs.stage_arrays(S, p)
    if getattr(schedule, "frozen", ()):
        arrays = frozen_memory(arrays, schedule.frozen)
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
    to_host = _host_copies(st)
    if to_host.any() and arrays.get("offload") is None:
        raise InputError("the schedule offloads activations (O and L ops): set Costs.offload, "
                         "the time of one activation copy over a host link")
    x_cls, x_table = _transfer_arrays(st, network, S, arrays["comm"], arrays.get("offload"),
                                      arrays["evict"])
    x_link, n_links, units_key = st.x_link, st.n_links, "units"
    group = int(costs.host_link_devices)
    if to_host.any() and group > 1:
        x_link, n_links, shared = _shared_host_links(st, schedule.devices, group)
        units_key = f"units_shared_{group}"
    else:
        shared = np.zeros(max(n_links, 1), dtype=np.uint8)
    if units_key not in st.memo:  # cost-independent: once per schedule (and host sharing)
        st.memo[units_key] = make_units(st.dev_ptr, st.xfer, st.out_ptr, st.paired, x_link,
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
        x_peer=st.x_peer,
        units=st.memo[units_key],
        op_code=st.op_code,
    )


def frozen_memory(arrays, frozen):
    """The per-stage memory arrays of a schedule with frozen stages.

    Autograd keeps, for each op, only what the gradients it must compute
    need. A frozen stage computes no weight gradient, so its F keeps
    ``activation - activation_w`` (the part B needs) and nothing is left
    for a W; a frozen stage below the lowest trainable one runs no
    backward, so its F keeps nothing. Times are untouched: the schedule
    itself has no W (and no backward) for those stages.

    Parameters
    ----------
    arrays : dict
        :meth:`Costs.stage_arrays`' output.
    frozen : tuple of int
        The schedule's frozen stages (valid: at least one stage trains).

    Returns
    -------
    dict
        A copy of ``arrays`` with ``activation``, ``activation_w`` and
        ``checkpoint`` changed on the frozen stages.
    """
    out = dict(arrays)
    act = arrays["activation"].copy()
    act_w = arrays["activation_w"].copy()
    ckpt = arrays["checkpoint"].copy()
    is_frozen = np.zeros(act.shape[0], dtype=bool)
    is_frozen[list(frozen)] = True
    dead = np.arange(act.shape[0]) < int(np.argmin(is_frozen))
    act[is_frozen] -= act_w[is_frozen]
    act_w[is_frozen] = 0.0
    act[dead] = 0.0
    np.minimum(ckpt, act, out=ckpt)
    out.update(activation=act, activation_w=act_w, checkpoint=ckpt)
    return out


def _shared_host_links(st, p, group):
    """Link ids with the host links of each group of ``group`` devices
    merged (one per direction), and which links have several senders."""
    host = np.where(_host_copies(st), st.x_host, 0)  # copies to a partner keep their links
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


def _host_copies(st):
    """(nx,) bool: the transfers that are offload copies over a host link
    (not to a partner device)."""
    if st.x_peer.size:
        return (st.x_host > 0) & (st.x_peer < 0)
    return st.x_host > 0


def _transfer_arrays(st, network, stages, comm, offload, evict):
    """Every transfer's class (cached per schedule and node size) and the
    table of serialisation and latency per class: ``(x_cls, (ser, lat))``.
    Same arithmetic as per transfer: ``bytes / bandwidth`` and
    ``comm + link latency``; an offload copy takes ``offload`` (``evict`` to
    a partner device) and no latency."""
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
        st.memo[key] = _transfer_classes(st, per_node)
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
    ser[:, 5] = evict
    return st.memo[key], (ser.reshape(-1), x_lat.reshape(-1))


def _transfer_classes(st, per_node):
    """Every transfer's class, ``stage of its producer * X_CLASSES + k`` (uint32);
    k: 0 an activation within a node, 1 between nodes (``device //
    per_node`` differs, with ``per_node`` > 0), 2 and 3 the same for a
    gradient feeding an all-reduce, 4 an offload copy over a host link, 5 an
    offload copy to or from a partner device.
    Numpy, a few passes over the transfers: no kernel to compile."""
    stage = st.op_stage.view(np.uint32)  # stages are >= 0
    x_cls = stage[st.x_src]  # one array of the transfers' size, scaled in place
    x_cls *= np.uint32(X_CLASSES)
    if st.x_is_ar.any():
        x_cls += st.x_is_ar.astype(np.uint32) * np.uint32(2)
    if per_node > 0:
        # Source devices are read only across nodes (Structure.x_src_dev
        # gathers them on first use).
        x_cls += (st.x_src_dev // per_node != st.x_dst_dev // per_node).astype(np.uint32)
    host = np.flatnonzero(st.x_host > 0)
    if host.size:
        kind = np.uint32(4) if not st.x_peer.size else \
            np.where(st.x_peer[host] >= 0, 5, 4).astype(np.uint32)
        x_cls[host] = stage[st.x_src[host]] * np.uint32(X_CLASSES) + kind
    return x_cls
