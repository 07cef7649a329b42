"""The per-op table of a result as a Parquet file, for further analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.result import plug
from .columns import PathLike

__all__ = ["write_parquet"]

def write_parquet(result: Any, path: PathLike) -> Path:
    """Write the per-op table of a result to a Parquet file.

    The Arrow schema (including the dictionary-encoded ``kind`` column) is
    stored in the file, so :func:`pyarrow.parquet.read_table` returns a table
    equal to ``result.ops``.

    Parameters
    ----------
    result : object
        Simulation result with an ``ops`` :class:`pyarrow.Table`.
    path : str or os.PathLike
        Destination file. Its parent directory must exist.

    Returns
    -------
    pathlib.Path
        The Parquet file written, one row per op.

    Raises
    ------
    TypeError
        If ``result.ops`` is not a :class:`pyarrow.Table`.
    OSError
        If the file cannot be written.
    """
    ops = result.ops
    if not isinstance(ops, pa.Table):
        raise TypeError(f"result.ops must be a pyarrow.Table, got {type(ops).__name__}")
    out = Path(path)
    pq.write_table(ops, out)
    return out


# Result.write_parquet calls this (core cannot import up).
plug("write_parquet", write_parquet)
