"""What the writers read from a result: its tables' columns as numpy
arrays, each table checked for the columns a writer needs, and the rows
of a critical path.

A result here is any object exposing ``ops``, ``transfers`` and ``memory``
(:class:`pyarrow.Table`; memory's columns are ``device``, ``time`` and
``activation``), ``makespan``, ``devices`` and ``name``; the writers take
tables made by hand as well as a simulation :class:`~pipecore.Result`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple, Union

import numpy as np
import pyarrow as pa

from ..core.ops import InputError

__all__ = ["PathLike", "OPS_COLUMNS", "TRANSFER_COLUMNS", "MEMORY_COLUMNS", "require_columns",
           "floats", "ints", "strings", "device_count", "critical_table", "critical_rows",
           "OpArrays", "op_arrays"]

#: Where a writer writes: a path as a string or an os.PathLike.
PathLike = Union[str, "os.PathLike[str]"]

OPS_COLUMNS = ("device", "slot", "kind", "stage", "microbatch", "start", "finish")
TRANSFER_COLUMNS = (
    "src_device",
    "dst_device",
    "stage",
    "microbatch",
    "kind",
    "ready",
    "start",
    "finish",
    "arrival",
)
MEMORY_COLUMNS = ("device", "time", "activation")


def require_columns(table: pa.Table, columns: Sequence[str], what: str) -> None:
    """Raise ``ValueError`` naming any of *columns* missing from *table*."""
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(f"{what} table is missing column(s): {', '.join(missing)}")


def floats(table: pa.Table, name: str) -> np.ndarray:
    """Column *name* as a float64 numpy array (copying if chunked)."""
    return np.asarray(table.column(name).to_numpy(), dtype=np.float64)


def ints(table: pa.Table, name: str) -> np.ndarray:
    """Column *name* as an int64 numpy array."""
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


def strings(table: pa.Table, name: str) -> np.ndarray:
    """Column *name* (plain or dictionary-encoded string) as an object array."""
    col = table.column(name)
    # Casting decodes dictionaries chunk by chunk without a Python loop.
    if not pa.types.is_string(col.type):
        col = col.cast(pa.string())
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)


class OpArrays(NamedTuple):
    """A result's op table as numpy arrays, one per column of :data:`OPS_COLUMNS`."""

    device: np.ndarray
    slot: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    start: np.ndarray
    finish: np.ndarray


def op_arrays(result: Any) -> tuple[OpArrays, int]:
    """The op table of *result* as arrays, after checking its columns, and the
    number of devices to draw (see :func:`device_count`)."""
    ops = result.ops
    require_columns(ops, OPS_COLUMNS, "ops")
    arrays = OpArrays(ints(ops, "device"), ints(ops, "slot"), strings(ops, "kind"),
                      ints(ops, "stage"), ints(ops, "microbatch"), floats(ops, "start"),
                      floats(ops, "finish"))
    return arrays, device_count(result, arrays.device)


def device_count(result: Any, device: np.ndarray) -> int:
    """Devices to draw a row or track for: the result's count, or more if an
    op names a higher device, so that no device's row is silently missing."""
    n_dev = int(getattr(result, "devices", 0) or 0)
    if device.size:
        n_dev = max(n_dev, int(device.max()) + 1)
    return n_dev


def critical_table(result: Any) -> pa.Table:
    """The critical path of *result*, with a clear error for a non-Result."""
    from ..analysis.critical import critical_path

    return critical_path(result)


def critical_rows(path_table: pa.Table | None) -> tuple[set[int], set[int]]:
    """Op rows (both rows of an F&B unit) and transfer ids on a critical path."""
    if path_table is None:
        return set(), set()
    d = path_table.select(["element", "row", "partner"]).to_pydict()
    ops = {r for e, r in zip(d["element"], d["row"]) if e == "op"}
    ops |= {q for e, q in zip(d["element"], d["partner"]) if e == "op" and q >= 0}
    transfers = {r for e, r in zip(d["element"], d["row"]) if e != "op"}
    return ops, transfers
