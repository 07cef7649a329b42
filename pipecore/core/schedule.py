"""The schedule: one Arrow table of compute ops, and its compact action form."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from .ops import (  # noqa: F401  (re-exported: the codes and helpers schedules use)
    _KIND_DICTIONARY,
    _KIND_TYPE,
    AR,
    BW,
    KIND_CODE,
    KINDS,
    SCHEMA,
    Action,
    B,
    F,
    InputError,
    L,
    O,
    R,
    ScheduleError,
    W,
    check_int,
    op_label,
)
from .optable import _column_array, _int_array, _normalise_table, _render  # noqa: F401
from .rules import structure

__all__ = ["KINDS", "Action", "Schedule", "ScheduleError", "DeviceGapWarning", "from_actions",
           "op_label", "WorkFactors", "refuse_factors"]


#: Devices a schedule may have beyond its op count (idle ones): enough for any real
#: cluster's idle ranks, few enough that per-device arrays stay small.
_FREE_DEVICES = 4096


class WorkFactors(NamedTuple):
    """Per-op factors a schedule carries (:meth:`Schedule.with_factors`)."""

    time: np.ndarray | None
    """One factor per op row on its time, or None (all 1)."""
    activation: np.ndarray | None
    """One factor per op row on its activation, or None (all 1)."""


def refuse_factors(schedule, what: str) -> None:
    """Raise if ``schedule`` carries work factors that ``what`` would not apply.

    Parameters
    ----------
    schedule : Schedule
    what : str
        The path that does not apply them, named in the error.

    Raises
    ------
    ValueError
        If the schedule carries factors.
    """
    if getattr(schedule, "factors", None) is not None:
        raise InputError(f"schedule {schedule.name!r} carries per-op work factors "
                         f"(Schedule.with_factors), which {what} would ignore; use "
                         f"pipecore.simulate, which applies them")


class DeviceGapWarning(UserWarning):
    """Device numbers with a gap: the devices in it become idle devices of the schedule."""


class Schedule:
    """A pipeline schedule: one row per compute op, in an Arrow table.

    Columns: ``device`` (int32), ``slot`` (int32, position in the device's
    program), ``kind`` (dictionary: F, B, W, BW, AR, R, O, L), ``stage`` (int32),
    ``microbatch`` (int32). Rows are kept sorted by ``(device, slot)``.
    Placement and dependencies are derived from the table. Build one with
    :func:`pipecore.build`, :func:`pipecore.from_actions` or
    :meth:`Schedule.from_arrays`; construction validates it.

    Parameters
    ----------
    table : pyarrow.Table
        The op table (columns as above; ``kind`` may be a string or
        dictionary column).
    name : str, optional
        A label, e.g. the family name.
    devices : int, optional
        Number of devices; defaults to the largest device index + 1.
    params : mapping, optional
        Build parameters to keep with the schedule (family, chunks, ...).
    validate : bool, default True
        Check every rule now (see :func:`pipecore.validate`).
    replicated : bool, default False
        Allow a stage to run on several devices (each replica serving its
        own microbatches), as Chimera and DualPipe do; weights then count
        once per replica. Without it a stage split across devices is an
        error.
    offload_to : sequence of int, optional
        Where each device's offloaded activations (its O and L ops) wait
        for their backward: entry d is another device, whose memory holds
        them (BPipe's activation balancing), or -1 for host memory. None
        (the default): every device offloads to host.
    frozen : iterable of int, default ()
        Stages whose weights are frozen (take no gradient): such a stage has
        no W (its backward is a B alone), and a frozen stage below the
        lowest trainable one has no backward at all (F alone). See
        :func:`pipecore.freeze`, which makes such schedules.

    Raises
    ------
    ScheduleError
        If the table breaks a schedule rule.
    ValueError
        If columns are missing or of the wrong type, or ``offload_to`` is
        not one entry per device, each -1 or another device.
    """

    def __init__(self, table: pa.Table, *, name: str = "custom",
                 devices: int | None = None, params: Mapping | None = None,
                 validate: bool = True, replicated: bool = False, frozen=(),
                 offload_to: Sequence[int] | None = None):
        table = _normalise_table(table)
        n = table.num_rows
        device = table.column("device").to_numpy()
        if n and int(device.min()) < 0:
            bad = int(np.flatnonzero(device < 0)[0])
            raise ScheduleError(
                f"range: op {bad} has device {int(device[bad])}; devices are >= 0",
                rule="range", device=int(device[bad]))
        inferred = int(device.max()) + 1 if n else 0
        if devices is None:
            if n == 0:  # no device to count: say what is wrong, not that devices=0
                raise ScheduleError("missing-op: the schedule has no ops (every column is "
                                    "empty); a schedule needs at least one op",
                                    rule="missing-op")
            devices = inferred
        devices = check_int("devices", devices, minimum=1)
        # Per-device arrays are sized by the device count: bound it by the
        # input before anything (validation, an error's rendering) allocates.
        if devices > max(n, _FREE_DEVICES):
            where = (f"device index {inferred - 1} (row {int(np.argmax(device))})"
                     if inferred == devices else f"devices={devices}")
            raise ScheduleError(
                f"range: {where} asks for {devices} devices but the schedule has {n} ops: a "
                f"schedule may have at most max(ops, {_FREE_DEVICES}) devices; number devices "
                f"from 0 without gaps",
                rule="range")
        if inferred > devices:
            bad = int(np.flatnonzero(device >= devices)[0])
            raise ScheduleError(
                f"range: op at row {bad} runs on device {int(device[bad])} but the "
                f"schedule has devices={devices} (0..{devices - 1})",
                rule="range", device=int(device[bad]))
        self._table = table
        self.name = str(name)
        self.devices = devices
        self.params = dict(params or {})
        self.replicated = bool(replicated)
        self.frozen = _frozen_stages(frozen)
        self.offload_to = _offload_targets(offload_to, devices)
        self._structure = None
        self._own = {}  # see from_arrays
        self.factors = None  # per-op work factors (with_factors), None: every op as Costs says
        if validate:
            self._structure = structure(self)

    # -- construction -------------------------------------------------
    @classmethod
    def from_arrays(cls, device, slot, kind, stage, microbatch, *, copy: bool = True,
                    **kwargs) -> Schedule:
        """Build a schedule from column arrays.

        Parameters
        ----------
        device, slot, stage, microbatch : array_like of int
            One entry per op.
        kind : array_like of str or int
            Kind names (``"F"``, ...) or codes (0=F, 1=B, 2=W, 3=BW, 4=AR, 5=R,
            6=O, 7=L).
        copy : bool, default True
            Copy the arrays. With False the schedule may keep the caller's
            memory (int32 columns, int8 codes) instead of a copy: saves
            a copy of every column at millions of ops, and the caller must
            not modify the arrays afterwards (the schedule would silently
            change under its validation).
        **kwargs
            Passed to :class:`Schedule` (``name``, ``devices``, ``params``,
            ``validate``, ``replicated``, ``frozen``).

        Returns
        -------
        Schedule
            One row per op, in the order given.

        Raises
        ------
        ScheduleError, ValueError
            As :class:`Schedule`.
        """
        kind = _column_array("kind", kind)
        if kind.ndim != 1:
            raise InputError(f"column 'kind' must be one-dimensional (got shape {kind.shape})")
        own = {}
        if kind.dtype.kind in "iu":
            codes = kind
            out_of_range = int(codes.min(initial=0)) < 0 or int(codes.max(initial=0)) >= len(KINDS)
            bad = np.flatnonzero((codes < 0) | (codes >= len(KINDS))) if out_of_range else []
            if len(bad):
                raise ScheduleError(
                    f"kind: op {int(bad[0])} has kind code {int(codes[bad[0]])}; "
                    f"codes are 0..{len(KINDS) - 1} for {', '.join(KINDS)}",
                    rule="kind")
            own["kind"] = codes.astype(np.int8, copy=copy)
            # In range (checked above): arrow need not check every index again.
            kind_arr = pa.DictionaryArray.from_arrays(pa.array(own["kind"]), _KIND_DICTIONARY,
                                                      safe=False)
        else:
            kind_arr = pa.array([str(k) for k in kind], type=pa.string())
        for name, values in (("device", device), ("slot", slot), ("stage", stage),
                             ("microbatch", microbatch)):
            own[name] = _int_array(name, values, copy)
        lengths = {"kind": len(kind), **{k: len(v) for k, v in own.items() if k != "kind"}}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{k} {n}" for k, n in lengths.items())
            raise InputError(f"columns differ in length ({shown}): every op needs a device, "
                             f"slot, kind, stage and microbatch")
        # pa.array shares an int32 array's memory: hence the copy above.
        table = pa.table({name: (kind_arr if name == "kind" else pa.array(own[name]))
                          for name in SCHEMA.names})
        validate = kwargs.pop("validate", True)
        schedule = cls(table, validate=False, **kwargs)
        # Writable arrays backing the table: the structure reuses them (when
        # normalising did not reorder the rows) instead of copying columns.
        schedule._own = own
        if validate:
            schedule._structure = structure(schedule)
        return schedule

    @classmethod
    def from_programs(cls, programs: Sequence[Sequence[tuple]], **kwargs) -> Schedule:
        """Build from per-device lists of ``(kind, stage, microbatch)`` tuples.

        Parameters
        ----------
        programs : sequence of sequences
            ``programs[d]`` is device d's program in execution order. An
            entry may also be a pair ``(("F", s1, j1), ("B" or "BW", s2, j2))``:
            an overlapped F&B unit that runs both ops together in one slot.
        **kwargs
            Passed to :class:`Schedule`.

        Returns
        -------
        Schedule
            Each op's slot is its position in its device's program.

        Raises
        ------
        ScheduleError, ValueError
            As :class:`Schedule`.
        """
        kwargs.setdefault("devices", max(len(programs), 1))
        fast = _programs_fast(programs)
        if fast is not None:
            return cls.from_arrays(*fast, copy=False, **kwargs)
        device, slot, flat = [], [], []
        for d, prog in enumerate(programs):
            for j, entry in enumerate(prog):
                ops = _unit_ops(entry, d, j)
                for op in ops:
                    device.append(d)
                    slot.append(j)
                    flat.append(op)
        device = np.array(device, dtype=np.int32)
        slot = np.array(slot, dtype=np.int32)
        if flat:
            kinds, stages, mbs = zip(*flat)
            # An all-reduce has no microbatch; the table stores -1.
            mbs = tuple(-1 if k == "AR" and mb is None else mb for k, mb in zip(kinds, mbs))
        else:
            kinds, stages, mbs = (), (), ()
        codes = np.array([KIND_CODE.get(k, -1) if isinstance(k, str) else k for k in kinds],
                         dtype=np.int64)
        if codes.size and codes.min() < 0:
            i = int(np.flatnonzero(codes < 0)[0])
            raise ScheduleError(
                f"kind: device {int(device[i])} slot {int(slot[i])} has kind "
                f"{kinds[i]!r}; kinds are {', '.join(KINDS)}",
                rule="kind", device=int(device[i]), slot=int(slot[i]))
        return cls.from_arrays(device, slot, codes, np.array(stages, dtype=np.int64),
                               np.array(mbs, dtype=np.int64), copy=False, **kwargs)

    def with_factors(self, time=None, activation=None) -> Schedule:
        """This schedule with per-op work factors on the costs.

        Op row i (in the table's (device, slot) order) takes ``time[i]``
        times its kind's cost for its stage, and its activation (what an F
        allocates and its B, W or BW frees) is ``activation[i]`` times the
        stage's. A family whose ops do unequal work (Seq1F1B's sequence
        chunks under causal attention) describes it so.
        :func:`pipecore.simulate` applies both (times with any straggler
        or jitter factors, memory in :attr:`Result.memory` and the peaks);
        the batched, tuned, ideal-table and transform paths refuse a
        schedule that carries them rather than ignore them.

        Parameters
        ----------
        time, activation : array_like of float, optional
            One finite factor > 0 per op row; None keeps every op at 1. The
            activation factors of an op's F and of its B, W or BW must be
            equal (what is allocated is what is freed).

        Returns
        -------
        Schedule
            A new schedule sharing this one's table and checks.

        Raises
        ------
        ValueError
            For a wrong length or a factor that is not a finite number > 0
            (naming the op row), or an op whose F and backward activation
            factors differ.
        """
        n = self.num_ops
        arrays = {}
        for name, values in (("time", time), ("activation", activation)):
            if values is None:
                continue
            arr = np.asarray(values, dtype=np.float64)
            if arr.shape != (n,):
                raise InputError(f"'{name}' factors need one entry per op ({n}); got shape "
                                 f"{arr.shape}")
            bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
            if bad.size:
                i = int(bad[0])
                raise InputError(f"'{name}' factor of op row {i} ({self._label(i)}) must be a "
                                 f"finite number > 0 (got {arr[i]})")
            arrays[name] = np.ascontiguousarray(arr)
        if "activation" in arrays:
            self._check_activation(arrays["activation"])
        out = Schedule.__new__(Schedule)
        out.__dict__.update(self.__dict__)
        out.params = dict(self.params)
        out.factors = WorkFactors(arrays.get("time"), arrays.get("activation")) if arrays else None
        return out

    def _label(self, i):
        return (f"device {int(self._column('device')[i])} slot {int(self._column('slot')[i])} "
                f"{op_label(self.kind_codes[i], self._column('stage')[i], self._column('microbatch')[i])}")

    def _check_activation(self, act):
        """The F of (stage, microbatch) and its B, W or BW free what it allocated."""
        kinds = self.kind_codes
        key = self._column("stage").astype(np.int64) * (self.microbatches + 1) \
            + self._column("microbatch")
        fwd = np.flatnonzero(kinds == KIND_CODE["F"])
        back = np.flatnonzero(np.isin(kinds, [KIND_CODE[k] for k in ("B", "W", "BW", "R")]))
        order = np.argsort(key[fwd])
        pos = np.searchsorted(key[fwd][order], key[back])
        pos = np.minimum(pos, max(len(fwd) - 1, 0))
        owner = fwd[order][pos] if len(fwd) else back
        bad = np.flatnonzero(act[back] != act[owner])
        if bad.size:
            r, q = int(back[bad[0]]), int(owner[bad[0]])
            raise InputError(f"'activation' factor of op row {r} ({self._label(r)}) is "
                             f"{act[r]} but its forward's (row {q}) is {act[q]}: an op frees "
                             f"what its forward allocated, so the factors must be equal")

    # -- views ---------------------------------------------------------
    @property
    def table(self) -> pa.Table:
        """pyarrow.Table: the op table, sorted by (device, slot), with metadata."""
        meta = {b"pipecore.name": self.name.encode(),
                b"pipecore.devices": str(self.devices).encode()}
        return self._table.replace_schema_metadata(meta)

    @property
    def num_ops(self) -> int:
        """int: number of compute ops."""
        return self._table.num_rows

    def _column(self, name):
        return self._table.column(name).to_numpy()

    def __getstate__(self):
        # The own arrays share the table's memory here but would be pickled
        # as a second copy; an unpickled schedule copies where it needs to.
        state = dict(self.__dict__)
        state["_own"] = {}
        return state

    def _writable(self, name, column):
        """The schedule's own writable array that backs ``column`` (a
        column of its table as numpy, kind codes for "kind"), or None."""
        arr = self._own.get(name)
        if (arr is None or arr.shape != column.shape or arr.dtype != column.dtype
                or arr.ctypes.data != column.ctypes.data):
            return None
        return arr

    @property
    def kind_codes(self) -> np.ndarray:
        """numpy.ndarray of int8: kind codes (0=F, 1=B, 2=W, 3=BW, 4=AR, 5=R, 6=O, 7=L) per op."""
        col = self._table.column("kind")
        # combine_chunks copies even a single chunk: a copy per call at scale.
        arr = col.chunks[0] if col.num_chunks == 1 else col.combine_chunks()
        return np.asarray(arr.indices.to_numpy(zero_copy_only=False), dtype=np.int8)

    @property
    def stages(self) -> int:
        """int: number of model stages S."""
        return self._info().stages

    @property
    def microbatches(self) -> int:
        """int: number of microbatches m."""
        return self._info().microbatches

    @property
    def chunks(self) -> float:
        """float: stages per device, S / p (an int for the regular families)."""
        v = self.stages / self.devices
        return int(v) if v == int(v) else v

    @property
    def placement(self) -> np.ndarray:
        """numpy.ndarray: the device of each stage, derived from the table.

        For a replicated stage, the device that runs its microbatch 0; see
        :attr:`stage_devices` for all replicas.
        """
        return self._info().placement

    @property
    def stage_devices(self) -> list[tuple[int, ...]]:
        """list of tuple: the devices each stage runs on (two for a replica pair)."""
        return self._info().stage_devices

    @property
    def weight_versions(self) -> np.ndarray:
        """numpy.ndarray: copies of each stage's weights that a device running
        it holds (int64, one per stage): 1, unless ``params['weight_versions']``
        declares more, as the asynchronous families do for the versions they
        stash. Static memory (``Result.static_memory``) counts each copy.

        Raises
        ------
        ValueError
            If the declared list does not hold one int >= 1 per stage.
        """
        declared = self.params.get("weight_versions")
        if declared is None:
            return np.ones(self.stages, dtype=np.int64)
        arr = np.asarray(declared)
        if arr.shape != (self.stages,) or arr.dtype.kind not in "iu" or (arr < 1).any():
            raise InputError(f"schedule {self.name!r}: params['weight_versions'] must hold one "
                             f"int >= 1 per stage ({self.stages}) (got {declared!r:.80})")
        return arr.astype(np.int64)

    def _info(self):
        """The schedule's :class:`~pipecore.core.structure.Structure`,
        validated and derived on first use, then kept."""
        if self._structure is None:
            self._structure = structure(self)
        return self._structure

    def to_actions(self) -> dict[int, list[str]]:
        """The per-device programs in compact form.

        Returns
        -------
        dict of int to list of str
            ``{device: ["0F0", "0F1", ...]}``, every device present; an
            overlapped F&B unit reads ``"0F7&7B3"``.
        """
        return {d: ["&".join(op_label(k, s, mb) for k, s, mb in _as_ops(u)) for u in prog]
                for d, prog in enumerate(self.programs())}

    def programs(self) -> list[list[tuple]]:
        """The per-device programs as ``(kind, stage, microbatch)`` tuples.

        Returns
        -------
        list of list of tuple
            An overlapped F&B unit is a pair of such tuples, F first.
        """
        out = [[] for _ in range(self.devices)]
        kinds = self.kind_codes
        last = (-1, -1)
        for d, sl, k, s, mb in zip(self._column("device"), self._column("slot"), kinds,
                                   self._column("stage"), self._column("microbatch")):
            op = (KINDS[k], int(s), None if KINDS[k] == "AR" else int(mb))
            if (d, sl) == last:
                out[int(d)][-1] = (out[int(d)][-1], op)
            else:
                out[int(d)].append(op)
            last = (d, sl)
        return out

    def render(self, mark: Iterable[int] = (), width: int = 24) -> str:
        """Render the per-device programs, one line per device.

        Parameters
        ----------
        mark : iterable of int
            Row indices (in (device, slot) order) to mark with ``>>..<<``.
        width : int
            Longest program shown whole; longer ones are windowed around
            the marked ops.

        Returns
        -------
        str
        """
        return _render(self, list(mark), width)

    def __repr__(self) -> str:
        return (f"Schedule(name={self.name!r}, devices={self.devices}, "
                f"ops={self.num_ops})")

    # Set by pipecore.output.report when it is imported (core cannot import up).
    _html_view = None

    def _repr_html_(self) -> str:
        """Jupyter: the device programs as a compact grid (see ``pc.report``)."""
        view = type(self)._html_view
        return view(self) if view is not None else f"<pre>{self!r}</pre>"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return (self.devices == other.devices and self.replicated == other.replicated
                and self.frozen == other.frozen
                and getattr(self, "offload_to", None) == getattr(other, "offload_to", None)
                and self._table.equals(other._table)
                and _same_factors(getattr(self, "factors", None), getattr(other, "factors", None)))

    __hash__ = None


def from_actions(programs, *, name: str = "custom", devices: int | None = None,
                 replicated: bool = False, frozen=(),
                 offload_to: Sequence[int] | None = None) -> Schedule:
    """Build a schedule from hand-written per-device action lists.

    Parameters
    ----------
    programs : mapping of int to list, or list of lists
        Per device, actions as strings (``"0F3"``) or :class:`Action`
        values; ``"0F7&7B3"`` is an overlapped F&B unit (a forward and a
        backward run together); ``None`` entries (idle steps, as in
        PyTorch's ``pipeline_order``) are skipped. Keys may also be
        decimal strings (``"0"``), as a JSON file of
        :meth:`Schedule.to_actions` has them.
    name : str
        Label of the schedule.
    devices : int, optional
        Number of devices; defaults to the number of programs given.
    replicated : bool, default False
        Allow stages on several devices (see :class:`Schedule`).
    frozen : iterable of int, default ()
        Stages whose weights are frozen (see :class:`Schedule`).
    offload_to : sequence of int, optional
        Where each device's O and L copies go (see :class:`Schedule`);
        actions do not carry it.

    Returns
    -------
    Schedule
        The actions as an op table, each op's slot its step on its device.

    Raises
    ------
    ValueError
        If an action cannot be parsed, a device key is not an int >= 0, or
        ``offload_to`` is not one entry per device, each -1 or another device.
    ScheduleError
        If the schedule breaks a rule.
    """
    if devices is not None:
        devices = check_int("devices", devices, minimum=1)

    def _program(d, prog):
        if isinstance(prog, (str, bytes, Mapping)) or not isinstance(prog, Iterable):
            raise InputError(f"device {d}'s program must be a list of actions such as '0F3' "
                             f"(got {type(prog).__name__}: {prog!r:.60})")
        return list(prog)

    if not isinstance(programs, Mapping) and (isinstance(programs, (str, bytes))
                                              or not isinstance(programs, Iterable)):
        raise InputError(f"'programs' must be a dict of device -> list of actions, or a list of "
                         f"such lists (got {type(programs).__name__}: {programs!r:.60})")
    if isinstance(programs, Mapping):
        # JSON's keys ("0", "1", ...); ASCII only: "¹".isdigit() is True but int() refuses it.
        if all(isinstance(k, str) and k.isascii() and k.isdigit() and str(int(k)) == k
               for k in programs):
            programs = {int(k): v for k, v in programs.items()}
        keys = list(programs)
        for k in keys:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
                raise InputError(f"device keys must be ints >= 0 (got {k!r})")
        programs = {int(k): _program(k, v) for k, v in programs.items()}
        count = (max(keys) + 1) if keys else 0
        entries = sum(len(p) for p in programs.values())
        if count > max(entries, _FREE_DEVICES):  # before a list per device is made
            raise ScheduleError(
                f"range: device key {count - 1} asks for {count} devices but the programs hold "
                f"{entries} actions: a schedule may have at most max(actions, {_FREE_DEVICES}) "
                f"devices; number devices from 0 without gaps", rule="range")
        missing = sorted(set(range(count)) - {int(k) for k in keys})
        lists = [programs.get(d, []) for d in range(count)]
    else:
        lists = [_program(d, prog) for d, prog in enumerate(programs)]
        missing = []
    parsed = []
    for d, prog in enumerate(lists):
        row = []
        for j, a in enumerate(prog):
            if a is None:
                continue
            try:
                parts = [a] if isinstance(a, Action) else [Action.parse(t) for t in str(a).split("&")]
            except ValueError as exc:
                raise InputError(f"device {d}, entry {j}: {exc}") from None
            ops = [(x.kind, x.stage, x.microbatch) for x in parts]
            row.append(ops[0] if len(ops) == 1 else tuple(ops))
        parsed.append(row)
    if missing:
        stages = 1 + max((op[1] for prog in parsed for entry in prog
                          for op in (entry if isinstance(entry[0], tuple) else (entry,))),
                         default=0)
        count = len(parsed) if devices is None else max(devices, len(parsed))
        warnings.warn(
            f"from_actions: no program for device(s) {', '.join(map(str, missing[:10]))}"
            f"{' ...' if len(missing) > 10 else ''} (keys go up to {len(parsed) - 1}): they "
            f"become idle devices, so the schedule has {count} devices for {stages} stages; "
            f"Costs are per device share (1/{count} of the model), so each op takes "
            f"{count}/{stages} of a share's time. Number the devices 0..n-1 without gaps "
            f"unless you mean idle devices", DeviceGapWarning, stacklevel=2)
    if devices is None:
        devices = max(len(parsed), 1)
    ops = sum(len(p) for p in parsed)
    if devices > max(ops, _FREE_DEVICES):  # before a list per device is made
        raise ScheduleError(
            f"range: devices={devices} but the programs hold {ops} actions: a schedule may have "
            f"at most max(actions, {_FREE_DEVICES}) devices", rule="range")
    while len(parsed) < devices:
        parsed.append([])
    return Schedule.from_programs(parsed, name=name, devices=devices, replicated=replicated,
                                  frozen=frozen, offload_to=offload_to)


def _same_factors(a, b):
    if a is None or b is None:
        return a is b
    return all((x is None and y is None) or (x is not None and y is not None
                                             and np.array_equal(x, y)) for x, y in zip(a, b))


def _programs_fast(programs):
    """Column arrays for programs made only of plain ``(kind, stage, mb)``
    tuples with string kinds and int stage/microbatch, or None (then the
    entry-by-entry path checks and reports). Large schedules are built in
    C-speed passes here instead of a Python loop per op."""
    device, slot, kinds, stages, mbs = [], [], [], [], []
    for d, prog in enumerate(programs):
        if not len(prog):
            continue
        if not set(map(type, prog)) <= {tuple, list}:
            return None
        try:
            cols = list(zip(*prog))
        except TypeError:
            return None
        n = len(prog)
        if len(cols) != 3 or any(len(c) != n for c in cols):
            return None
        kind_names, stage_col, mb_col = cols
        distinct = set(kind_names)
        if not all(isinstance(k, str) and k in KIND_CODE for k in distinct) or "AR" in distinct:
            return None
        st = np.array(stage_col)
        mb = np.array(mb_col)
        # Only genuine integers (numpy would quietly parse "3" or take True).
        if st.ndim != 1 or mb.ndim != 1 or st.dtype.kind not in "iu" or mb.dtype.kind not in "iu":
            return None
        names = np.array(kind_names)
        codes = np.empty(n, dtype=np.int64)
        for k in distinct:
            codes[names == k] = KIND_CODE[k]
        device.append(np.full(n, d, dtype=np.int32))
        slot.append(np.arange(n, dtype=np.int32))
        kinds.append(codes)
        stages.append(st.astype(np.int64))
        mbs.append(mb.astype(np.int64))
    if not device:
        return None
    return (np.concatenate(device), np.concatenate(slot), np.concatenate(kinds),
            np.concatenate(stages), np.concatenate(mbs))


def _offload_targets(offload_to, devices):
    """``offload_to`` checked: a tuple of ``devices`` ints, or None when every
    entry is -1 (host), so a schedule that offloads only to host compares
    equal to one built without the argument."""
    if offload_to is None:
        return None
    if isinstance(offload_to, (str, bytes)) or not isinstance(offload_to, Iterable):
        raise InputError(f"'offload_to' must be a sequence of {devices} ints, one per device "
                         f"(got {offload_to!r})")
    out = []
    for d, q in enumerate(offload_to):
        if isinstance(q, (bool, np.bool_)) or not isinstance(q, (int, np.integer)) \
                or not -1 <= q < devices or q == d:
            raise InputError(f"'offload_to' entry {d} must be -1 (host) or another device in "
                             f"0..{devices - 1} (got {q!r})")
        out.append(int(q))
    if len(out) != devices:
        raise InputError(f"'offload_to' has {len(out)} entries; the schedule has {devices} "
                         f"devices (one entry per device)")
    return None if all(q < 0 for q in out) else tuple(out)


def _as_ops(unit):
    """The ops of one program entry: one tuple, or the two of an F&B pair."""
    return unit if unit and isinstance(unit[0], (tuple, list)) else (unit,)


def _unit_ops(entry, device, index):
    """Validate one program entry's shape and return its op tuples."""
    ops = _as_ops(entry)
    if any(not isinstance(op, (tuple, list)) or len(op) != 3 for op in ops):
        raise InputError(f"device {device}, entry {index}: expected (kind, stage, microbatch) or a "
                         f"pair of them (got {entry!r})")
    if len(ops) == 2:
        kinds = (ops[0][0], ops[1][0])
        if kinds[0] != "F" or kinds[1] not in ("B", "BW"):
            raise ScheduleError(
                f"overlap: device {device} entry {index} pairs {kinds[0]} with {kinds[1]}; an "
                f"overlapped unit is one F and one B or BW, F first", rule="overlap",
                device=device, slot=index)
    elif len(ops) != 1:
        raise InputError(f"device {device}, entry {index}: a unit holds one op or an F&B pair "
                         f"(got {len(ops)} ops)")
    return [tuple(op) for op in ops]




def _frozen_stages(frozen) -> tuple:
    """``frozen`` as a sorted tuple of distinct stage ints >= 0 (the upper
    bound, the stage count, is checked with the other rules)."""
    if frozen is None:
        return ()
    if isinstance(frozen, (str, bytes)) or not isinstance(frozen, Iterable):
        raise InputError(f"'frozen' must be an iterable of stage ints (got {frozen!r:.60})")
    out = set()
    for s in frozen:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 0:
            raise InputError(f"'frozen' entries must be stage ints >= 0 (got {s!r})")
        out.add(int(s))
    return tuple(sorted(out))
