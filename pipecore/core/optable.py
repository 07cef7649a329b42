"""The op table's columns checked and normalised (types, nulls, kinds, row
order), and a schedule's programs rendered as text for error messages."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from ..kernels.structure import rows_sorted
from .ops import _KIND_DICTIONARY, KIND_CODE, KINDS, SCHEMA, InputError, ScheduleError, op_label
from .rules import FAST_MIN_OPS


def _column_array(name, values):
    """``np.asarray`` of a column, or an error naming it (a scalar, ragged input)."""
    try:
        arr = None if isinstance(values, (str, bytes, Mapping)) else np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise InputError(f"column '{name}' is not a flat sequence of values ({exc})") from None
    if arr is None or arr.ndim == 0:
        raise InputError(f"column '{name}' must be a sequence, one value per op "
                         f"(got {type(values).__name__})")
    return arr


def _int_array(name, values, copy=True):
    arr = _column_array(name, values)
    if arr.size == 0:
        return np.zeros(0, np.int32)
    if arr.dtype.kind not in "iu":
        raise InputError(f"column '{name}' must hold integers (got dtype {arr.dtype})")
    if arr.ndim != 1:
        raise InputError(f"column '{name}' must be one-dimensional (got shape {arr.shape})")
    if arr.dtype != np.int32 and (arr.min() < np.iinfo(np.int32).min
                                  or arr.max() > np.iinfo(np.int32).max):
        row = int(np.flatnonzero((arr < np.iinfo(np.int32).min)
                                 | (arr > np.iinfo(np.int32).max))[0])
        raise InputError(f"column '{name}' row {row}: {int(arr[row])} is outside int32, the op "
                         f"table's type")
    return np.ascontiguousarray(arr.astype(np.int32, copy=copy))


def _normalise_table(table: pa.Table) -> pa.Table:
    if not isinstance(table, pa.Table):
        raise InputError(f"expected a pyarrow.Table (got {type(table).__name__})")
    missing = [c for c in SCHEMA.names if c not in table.column_names]
    if missing:
        raise InputError(f"op table is missing column(s): {', '.join(missing)}")
    cols = {}
    for name in ("device", "slot", "stage", "microbatch"):
        col = table.column(name)
        if not pa.types.is_integer(col.type):
            raise InputError(f"column '{name}' must be an integer type (got {col.type})")
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(f"column '{name}' row {row}: null is not a value (every op needs "
                             f"a {name})")
        try:
            cols[name] = col.cast(pa.int32())
        except pa.ArrowInvalid:
            values = col.to_numpy()
            row = int(np.flatnonzero((values < np.iinfo(np.int32).min)
                                     | (values > np.iinfo(np.int32).max))[0])
            raise InputError(f"column '{name}' row {row}: {int(values[row])} is outside int32, "
                             f"the op table's type") from None
    kind = table.column("kind")
    if kind.null_count:
        row = int(np.flatnonzero(kind.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"column 'kind' row {row}: null is not a kind; kinds are "
                         f"{', '.join(KINDS)}")
    kind = kind.chunks[0] if kind.num_chunks == 1 else kind.combine_chunks()  # no copy of one
    codes = _own_codes(kind)  # in range when not None
    checked = codes is not None
    if codes is None:
        if pa.types.is_dictionary(kind.type):
            kind = kind.dictionary_decode()
        if not (pa.types.is_string(kind.type) or pa.types.is_large_string(kind.type)):
            raise InputError(f"column 'kind' must hold strings (got {kind.type})")
        names = kind.to_numpy(zero_copy_only=False)
        codes = np.full(len(names), -1, dtype=np.int8)
        for k, c in KIND_CODE.items():
            codes[names == k] = c
    if not checked and (codes < 0).any():
        i = int(np.flatnonzero(codes < 0)[0])
        dev = cols["device"].to_numpy()[i]
        slot = cols["slot"].to_numpy()[i]
        raise ScheduleError(
            f"kind: device {dev} slot {slot} has kind {names[i]!r}; kinds are "
            f"{', '.join(KINDS)}", rule="kind", device=int(dev), slot=int(slot))
    # Every code is in range (above): arrow need not check each index again.
    cols["kind"] = pa.DictionaryArray.from_arrays(pa.array(codes), _KIND_DICTIONARY, safe=False)
    out = pa.table({n: cols[n] for n in SCHEMA.names}, schema=SCHEMA)
    dev = cols["device"].to_numpy()
    slot = cols["slot"].to_numpy()
    # Within a slot (an overlapped F&B pair) the F row comes first. Builders
    # emit rows in order; checking that is one pass, sorting is not.
    if len(codes) >= FAST_MIN_OPS and rows_sorted(dev, slot, codes):
        return out
    order = np.lexsort((codes, slot, dev))
    if not np.array_equal(order, np.arange(len(order))):
        out = out.take(pa.array(order))
    return out


def _own_codes(kind):
    """The int8 codes of a kind column that already uses pipecore's own
    dictionary (no nulls), without decoding millions of strings; else None."""
    if (not pa.types.is_dictionary(kind.type) or kind.type.index_type != pa.int8()
            or kind.null_count or not kind.dictionary.equals(_KIND_DICTIONARY)):
        return None
    codes = kind.indices.to_numpy(zero_copy_only=False).astype(np.int8, copy=False)
    if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(KINDS)):
        return None
    return codes


def _render(schedule, mark: list[int], width: int) -> str:
    """A pipecore.Schedule's programs as text, the ops of ``mark`` between >> <<."""
    dev = schedule._column("device")
    kinds = schedule.kind_codes
    stage = schedule._column("stage")
    mb = schedule._column("microbatch")
    p = schedule.devices
    ptr = np.searchsorted(dev, np.arange(p + 1))
    marked = set(int(i) for i in mark)
    # Window around the first marked slot so large schedules stay readable.
    lo = 0
    if marked:
        slots = [int(i - ptr[dev[i]]) for i in marked]
        lo = max(0, min(slots) - width // 2)
    lines = []
    for d in range(p):
        a, b = int(ptr[d]), int(ptr[d + 1])
        n = b - a
        start = lo if n > width else 0
        end = min(n, start + width) if n > width else n
        cells = []
        if start > 0:
            cells.append("...")
        slot = schedule._column("slot")
        for j in range(a + start, a + end):
            text = op_label(kinds[j], stage[j], mb[j])
            text = f">>{text}<<" if j in marked else text
            if j > a + start and slot[j] == slot[j - 1]:
                cells[-1] += "&" + text  # an overlapped F&B pair shares a slot
            else:
                cells.append(text)
        if end < n:
            cells.append("...")
        lines.append(f"  device {d:>3}: " + " ".join(cells) if cells else f"  device {d:>3}: (idle)")
    return "\n".join(lines)
