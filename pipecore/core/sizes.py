"""The size guard: a count an input asks for, refused before anything proportional to it exists.

Building a schedule, composing one, laying out a placement, enumerating an
explore space and listing a model's layers all allocate in proportion to a
number the caller gives. Each of them asks :func:`check_size` first, so a
typo such as ``layers=10**8`` gets one kind of message, naming the argument,
the value, the limit and what it would take, at once, instead of a
MemoryError (or the OS killing the process) minutes later: large arrays are
allocated lazily, so a table too big for the machine is not refused when it
is allocated but when it is written.
"""

from __future__ import annotations

from . import hostmem
from .ops import CapacityError, InputError

__all__ = ["MAX_INT32", "MAX_OPS", "BYTES_PER_OP", "OPS_RULE", "check_size", "size_text"]

#: Op tables store devices, slots, stages and microbatches as int32.
MAX_INT32 = 2**31 - 1
#: Rows an op table can hold (its rows and slots are int32 indices).
MAX_OPS = MAX_INT32
#: Bytes per F and B (or BW) pair of a schedule that building and validating
#: it hold at their peak: the five columns (17 bytes an op), the structure's
#: paired, dep, xfer and out_ptr (25) and the builders' temporaries. Set at or
#: above what every family measures with tracemalloc at 64 x 4096 (the
#: CHANGELOG has the figures): below the peak, a shape that passes would be
#: killed by the OS while it is written.
BYTES_PER_OP = 96
#: The op table's limit, as the rule a refusal states.
OPS_RULE = f"an op table holds at most {MAX_OPS:,} ops (int32 rows)"


def size_text(nbytes: float) -> str:
    """A byte count for a message: MiB, GiB from 1 GiB, TiB from 1 TiB, PiB from 1 PiB.

    Parameters
    ----------
    nbytes : float
        A size in bytes.

    Returns
    -------
    str
        E.g. "42.8 GiB".
    """
    for unit, power in (("PiB", 50), ("TiB", 40), ("GiB", 30)):
        if nbytes >= 2**power:
            return f"{nbytes / 2**power:,.1f} {unit}"
    return f"{nbytes / 2**20:.0f} MiB"


def check_size(what: str, count: int, unit: str, *, limit: int | None = None,
               rule: str | None = None, bytes_each: float = 0, least: int | None = None,
               purpose: str = "to build", exact: bool = True, extra_bytes: float = 0,
               extra: str | None = None) -> None:
    """Refuse a size before anything proportional to it is allocated.

    Two rules: ``count`` must not exceed ``limit`` (a hard bound, such as
    the int32 rows of an op table, whatever the machine), and ``least``
    items at ``bytes_each`` must fit in the memory the OS has available
    now (:func:`pipecore.core.hostmem.available_bytes`; not checked where
    that is unknown).

    Parameters
    ----------
    what : str
        The argument(s) and value(s) asking for the size, as the user wrote
        them: ``"Model.transformer 'layers'=100000000"``.
    count : int
        Items the input asks for (at most this many with ``exact=False``).
    unit : str
        Plural noun of an item: ``"ops"``, ``"stages"``, ``"layers"``.
    limit : int, optional
        Most items allowed; ``rule`` says why.
    rule : str, optional
        The reason for ``limit``, stated as a rule
        (``"an op table holds at most 2,147,483,647 ops (int32 rows)"``).
    bytes_each : float, default 0
        Bytes one item takes while it is built (an estimate at or above the
        measured peak, so that what passes fits).
    least : int, optional
        Items surely allocated, for the memory rule (default ``count``):
        ``bytes_each`` is per one of these.
    purpose : str, default "to build"
        What the memory is for, in the message.
    exact : bool, default True
        Whether ``count`` is exact ("would have") or a bound ("may have").
    extra_bytes : float, default 0
        More bytes allocated beside the items, which ``extra`` describes
        (``"100,000,000 link free times"``).
    extra : str, optional
        What ``extra_bytes`` are, for the message.

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) if ``count`` exceeds ``limit``.
    MemoryError
        (:class:`~pipecore.CapacityError`) if the items need more memory
        than is available.
    """
    verb = "would have" if exact else "may have"
    if limit is not None and count > limit:
        raise InputError(f"{what} {verb} {count:,} {unit}; {rule or f'at most {limit:,} are allowed'}")
    least = count if least is None else least
    need = least * bytes_each + extra_bytes
    if need <= 0:
        return
    free = hostmem.available_bytes()
    if free is not None and need > free:
        more = "" if exact and least == count else " or more"
        also = f", and {extra} ({size_text(extra_bytes)})" if extra_bytes >= 2**20 else ""
        raise CapacityError(f"{what} needs about {size_text(need)} {purpose} ({least:,} {unit}"
                            f"{more} at {bytes_each:g} bytes each{also}); {size_text(free)} is "
                            f"available")
