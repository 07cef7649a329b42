"""The memory timeline of a Result, with its renamed column kept for one release.

``Result.memory``'s column ``bytes`` was renamed ``activation``: it holds
activation in the unit of ``Costs.activation`` (M, one microbatch's
activation on one stage, by default), not bytes. A ``pyarrow.Table`` can
be neither subclassed nor told to warn when a column is read, so for one
release ``Result.memory`` is a :class:`MemoryTable`: the plain table
behind ``.table``, every attribute and method of it passed through, and
the old name still answering, with a ``DeprecationWarning``, where it is
read by name (``t["bytes"]``, ``t.column("bytes")``, ``t.select([...])``,
``t.to_pydict()["bytes"]``). The release after that returns the plain
table.
"""

from __future__ import annotations

import warnings

import pyarrow as pa

from .ops import InputError

__all__ = ["MemoryTable", "RENAMED"]

#: Old column name -> new one.
RENAMED = {"bytes": "activation"}


def _warn(old: str, level: int) -> str:
    new = RENAMED[old]
    # ``level``: frames up to the user's line that read the column.
    warnings.warn(
        f"Result.memory's column {old!r} is now {new!r}: it holds activation in the unit of "
        f"Costs.activation (M, one microbatch's activation, by default), not bytes. "
        f"{old!r} still works in this release and will be removed in the next; read {new!r}.",
        DeprecationWarning, stacklevel=level)
    return new


def _name(key):
    # Called by a MemoryTable method called by the user: three frames up.
    return _warn(key, 4) if isinstance(key, str) and key in RENAMED else key


def _plain(other):
    return other.table if isinstance(other, MemoryTable) else other


class _RenamedDict(dict):
    """A ``to_pydict()`` answer that still finds the old column name (warning)."""

    def __missing__(self, key):
        if isinstance(key, str) and key in RENAMED:
            return self[_warn(key, 3)]  # dict's [] calls this directly
        raise KeyError(key)


class MemoryTable:
    """``Result.memory``: a ``pyarrow.Table`` of ``device``, ``time``, ``activation``.

    Behaves as the table it wraps (``.table``): every attribute and method
    passes through, and methods that return a table return a plain
    ``pyarrow.Table``. Functions that insist on a real ``pyarrow.Table``
    (``pyarrow.parquet.write_table``, ``pyarrow.concat_tables``) take
    ``.table``; ``pyarrow.table(t)``, polars and other readers of the Arrow
    stream take it as it is.

    Parameters
    ----------
    table : pyarrow.Table
        The timeline, with the current column names.

    Raises
    ------
    ValueError
        If ``table`` is not a pyarrow Table.
    """

    __slots__ = ("table",)

    def __init__(self, table: pa.Table):
        if not isinstance(table, pa.Table):
            raise InputError(f"MemoryTable wraps a pyarrow.Table (got {type(table).__name__})")
        object.__setattr__(self, "table", table)

    def __getattr__(self, name):
        return getattr(self.table, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"MemoryTable is read-only (tried to set {name!r})")

    def __dir__(self):
        return sorted(set(dir(self.table)) | {"table"})

    def column(self, i):
        """Column by name or index; the old name ``bytes`` warns and reads ``activation``.

        Parameters
        ----------
        i : str or int

        Returns
        -------
        pyarrow.ChunkedArray

        Raises
        ------
        KeyError
            For an unknown name.
        """
        return self.table.column(_name(i))

    def __getitem__(self, key):
        return self.table[_name(key)]

    def select(self, columns):
        """The named or numbered columns, as a plain ``pyarrow.Table``.

        Parameters
        ----------
        columns : sequence of str or int

        Returns
        -------
        pyarrow.Table

        Raises
        ------
        KeyError
            For an unknown name.
        """
        return self.table.select(list(map(_name, columns)))  # no comprehension frame

    def to_pydict(self, *args, **kwargs) -> dict:
        """The columns as lists, by name (``["bytes"]`` warns and reads ``activation``).

        Parameters
        ----------
        *args, **kwargs
            As ``pyarrow.Table.to_pydict``.

        Returns
        -------
        dict
        """
        return _RenamedDict(self.table.to_pydict(*args, **kwargs))

    def equals(self, other, check_metadata: bool = False) -> bool:
        """Whether two timelines hold the same columns and values.

        Parameters
        ----------
        other : MemoryTable or pyarrow.Table
        check_metadata : bool, default False

        Returns
        -------
        bool

        Raises
        ------
        TypeError
            If ``other`` is not a table.
        """
        return self.table.equals(_plain(other), check_metadata=check_metadata)

    def __eq__(self, other):
        try:
            return self.equals(other)
        except TypeError:
            return NotImplemented

    __hash__ = None

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return repr(self.table)

    def __str__(self) -> str:
        return str(self.table)

    def __reduce__(self):
        return (MemoryTable, (self.table,))

    def __arrow_c_stream__(self, requested_schema=None):
        return self.table.__arrow_c_stream__(requested_schema)

    def __dataframe__(self, *args, **kwargs):
        return self.table.__dataframe__(*args, **kwargs)
