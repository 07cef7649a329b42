"""Large arrays for kernels to fill, with one page-size policy.

numpy asks the kernel for transparent huge pages (madvise) on every array
of 4 MB or more; a Numba kernel's own allocations get none, so large
outputs are allocated here and passed in. Measured on this project's
2-vCPU VM (2026-11-25, p=1024 m=8192, fresh processes): validating zb-v
faulted 536k times with the kernel's own arrays and 7.8k with these. Wall
clock followed less clearly: huge against 4 KB pages under this policy,
second calls, 1f1b built in 1.1 s against 1.8-2.2 s and simulated in
1.5-1.7 s against 2.0-2.4 s; against the previous code (kernel-allocated)
two more rounds were within noise (1f1b 1.4/2.6 s against 1.9/1.5 s, zb-v
4.9/6.4 s against 6.7/5.8 s). A fresh process's first touch of huge pages
costs 2-3 ns/B here, 0.2-0.3 ns/B once reused; 4 KB pages 0.8-1.5 ns/B.
``PIPECORE_HUGEPAGES=0`` leaves out the hint for hosts where a fresh
huge page costs more than it saves. :func:`populate` moves that first-touch
cost to the other CPU while a kernel writes the array.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np

from .ops import InputError

try:
    from numpy._core import multiarray as _ma
except ImportError:  # numpy < 2
    from numpy.core import multiarray as _ma

_SWITCH = getattr(_ma, "_set_madvise_hugepage", None)


def _huge() -> bool:
    return os.environ.get("PIPECORE_HUGEPAGES") != "0"


def _allocate(make, shape, dtype):
    """``make(shape, dtype)`` (np.empty or np.zeros): from the pool when
    large, else with numpy's huge-page switch set by this module's policy
    for the call, then put back."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes >= _POOL_MIN_BYTES and _POOL_OK and _pool_cap() > 0:
        out, fresh = _from_pool(nbytes)
        out = out.view(dtype).reshape(shape)
        if make is np.zeros and not fresh:
            out.fill(0)
        return out
    if _SWITCH is None or nbytes < (1 << 22):
        return make(shape, dtype=dtype)  # below numpy's hint threshold anyway
    before = _SWITCH(_huge())
    try:
        return make(shape, dtype=dtype)
    finally:
        _SWITCH(before)


# -- the pool ---------------------------------------------------------------
# A large array's memory goes back to the OS when the array dies, and the
# next build faults and zeroes it all again: 0.2-0.3 ns/B here for memory
# the process had before, 2-3 ns/B for memory the VM's host has not handed
# out yet (zb-v at p=1024 m=8192 allocates about 3 GB per build). With
# PIPECORE_POOL_BYTES set, arrays of _POOL_MIN_BYTES or more live in
# anonymous mappings that return to a pool when their last view dies (a
# finalizer on the buffer numpy holds); a later array of the same size
# reuses one, its pages still mapped. Pooled memory is marked MADV_FREE:
# the kernel may take it back under memory pressure (a reuse then faults in
# fresh zero pages), and it counts as available memory meanwhile. Off by
# default (it holds memory the process no longer uses): repeated builds of
# one family gain (zb-v 1.15-1.84 s against 1.9-2.6).
_POOL_MIN_BYTES = 1 << 25
_HUGE_PAGE = 1 << 21
_POOL_FIT = 1.0  # a pooled mapping serves requests down to 1/_POOL_FIT of its size
_POOL_OK = hasattr(mmap, "MAP_ANONYMOUS")  # POSIX: anonymous mappings
_pool_lock = threading.RLock()  # a finalizer may run inside _from_pool (GC)
_pool = []  # free mappings
_pool_bytes = 0


def _pool_cap() -> int:
    """Bytes the pool may hold: ``PIPECORE_POOL_BYTES`` (unset or 0: no
    pool)."""
    env = os.environ.get("PIPECORE_POOL_BYTES", "0")
    try:
        return max(0, int(env))
    except ValueError:
        raise InputError(f"PIPECORE_POOL_BYTES must be a number of bytes (got {env!r})") from None


def _from_pool(nbytes):
    """A uint8 array of ``nbytes`` in a pooled mapping of its size (rounded
    up to 2 MB; else a new one), and whether that mapping is new (then it
    reads as zeros). Larger mappings are not lent out: when chimera's
    builds could take bitpipe's mappings up to twice their arrays' size,
    they measured 0.3-0.5 s slower (not yet explained); with exact sizes
    they did not."""
    global _pool_bytes
    want = -(-nbytes // _HUGE_PAGE) * _HUGE_PAGE
    mm = None
    with _pool_lock:
        fits = [i for i, m in enumerate(_pool) if want <= len(m) <= _POOL_FIT * want]
        if fits:
            mm = _pool.pop(min(fits, key=lambda i: len(_pool[i])))
            _pool_bytes -= len(mm)
    fresh = mm is None
    if fresh:
        mm = mmap.mmap(-1, want, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if _huge():
            _advise(mm, "MADV_HUGEPAGE")
    out = np.frombuffer(memoryview(mm)[:nbytes], dtype=np.uint8)
    # numpy keeps its own view of the mapping in ``out.base``; every array
    # made from ``out`` holds it, so it dies with the last of them.
    weakref.finalize(out.base, _to_pool, mm).atexit = False
    return out, fresh


def _to_pool(mm):
    global _pool_bytes
    with _pool_lock:
        cap = _pool_cap()
        if len(mm) > cap:
            mm.close()  # larger than the pool: back to the OS
            return
        _advise(mm, "MADV_FREE")
        _pool.append(mm)
        _pool_bytes += len(mm)
        while _pool_bytes > cap:  # the oldest go back to the OS: sizes follow the work
            old = _pool.pop(0)
            _pool_bytes -= len(old)
            old.close()


def _advise(mm, name):
    """``mm.madvise`` with the named advice where this system has it (a
    refused hint changes nothing but speed)."""
    advice = getattr(mmap, name, None)
    if advice is not None:
        try:
            mm.madvise(advice)
        except OSError:
            pass


def _reset_after_fork():
    global _pool_lock
    _pool_lock = threading.RLock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def release() -> int:
    """Give the memory pooled for reuse back to the OS.

    With ``PIPECORE_POOL_BYTES`` set (bytes; unset or 0: no pool), large
    arrays from this module (32 MB or more) return their memory to a pool
    of at most that size when they die (the oldest leave first), so the
    next large build or simulation reuses it instead of faulting in and
    zeroing fresh pages (about 0.7 s less per build of a 50M-op schedule
    on our VM). The kernel may reclaim pooled pages under memory pressure
    anyway.

    Returns
    -------
    int
        Bytes released.
    """
    global _pool_bytes
    with _pool_lock:
        freed = _pool_bytes
        for mm in _pool:
            mm.close()
        _pool.clear()
        _pool_bytes = 0
    return freed


def empty(shape, dtype=np.float64) -> np.ndarray:
    """An uninitialised array under the page-size policy of this module.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : numpy dtype, default float64

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    ValueError
        If ``shape`` is negative (numpy's error).
    """
    return _allocate(np.empty, shape, dtype)


def arena(*specs) -> list:
    """Several arrays in one anonymous mapping with transparent huge pages
    (numpy hints only arrays of 4 MB or more, and those seldom start on a
    2 MB boundary).

    For small per-device tables that a kernel reads device by device in
    turns (1,024 rows of a few KB each), where 4 KB pages would cost a TLB
    miss per row.

    Parameters
    ----------
    *specs : (shape, dtype) pairs
        One per array.

    Returns
    -------
    list of numpy.ndarray
        Uninitialised (they read as zeros when the mapping is fresh), each
        starting on a 64-byte boundary; the mapping is unmapped when the
        last of them dies. Plain ``np.empty`` arrays where there are no
        anonymous mappings or ``PIPECORE_HUGEPAGES=0``.

    Raises
    ------
    ValueError
        If a dimension of a shape is negative.
    """
    norm = []
    for shape, dtype in specs:
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(x) for x in shape)
        if min(shape, default=0) < 0:
            raise InputError(f"negative dimensions are not allowed (shape {shape})")
        norm.append((shape, np.dtype(dtype)))
    specs = norm
    if not (_POOL_OK and _huge()):
        return [np.empty(shape, dtype) for shape, dtype in specs]
    offsets, total = [], 0
    for shape, dtype in specs:
        offsets.append(total)
        total += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // 64) * 64
    mm = mmap.mmap(-1, max(_HUGE_PAGE, -(-total // _HUGE_PAGE) * _HUGE_PAGE),
                   flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _advise(mm, "MADV_HUGEPAGE")
    return [np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)),
                          offset=off).reshape(shape)
            for (shape, dtype), off in zip(specs, offsets)]


def zeros(shape, dtype=np.float64) -> np.ndarray:
    """A zeroed array under the page-size policy of this module.

    Large ones come zeroed from the OS (calloc of fresh pages), so no pass
    writes them here: each page is faulted in by its first writer.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : numpy dtype, default float64

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    ValueError
        If ``shape`` is negative (numpy's error).
    """
    return _allocate(np.zeros, shape, dtype)


def full(shape, value, dtype) -> np.ndarray:
    """:func:`empty` filled with ``value``.

    Parameters
    ----------
    shape : int or tuple of int
    value : scalar
    dtype : numpy dtype

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    ValueError
        If ``shape`` is negative (numpy's error).
    """
    out = empty(shape, dtype)
    out.fill(value)
    return out


# Linux's madvise(MADV_POPULATE_WRITE) (5.14+): fault pages in, writable,
# without touching their contents, so a kernel may write the same array
# meanwhile. None where unavailable (then populate() does nothing).
_MADV_POPULATE_WRITE = 23
_POPULATE_CHUNK = 1 << 24  # bytes per call, walked from the end backwards
_POPULATE_MIN_BYTES = 1 << 26


def _madvise():
    import ctypes
    import sys

    if not sys.platform.startswith("linux") or os.environ.get("PIPECORE_POPULATE") == "0":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def populate(*arrays) -> threading.Thread | None:
    """Fault the pages of large arrays in on another thread, last page first.

    A fresh array's first write costs 1-3 ns per byte on our 2-vCPU VM
    (page faults, zeroing, huge-page compaction); done by a second thread
    while this one's kernel writes the arrays from the front, that cost
    moves to the other CPU. The arrays' contents are never changed (the
    kernel may already be writing them); ctypes releases the GIL for each
    call. Does nothing off Linux, on kernels without MADV_POPULATE_WRITE,
    for arrays under 64 MB in all, or with ``PIPECORE_POPULATE=0``.

    Parameters
    ----------
    *arrays : numpy.ndarray
        Arrays this process owns (e.g. from :func:`empty`), in the order to
        populate them: those the caller writes last first.

    Returns
    -------
    threading.Thread or None
        The (daemon) thread, which holds the arrays until it ends (``join``
        it to wait for every page); None when nothing was started.
    """
    if _MADVISE is None or sum(a.nbytes for a in arrays) < _POPULATE_MIN_BYTES:
        return None
    spans = []
    for a in arrays:
        lo = a.ctypes.data & ~4095
        spans.append((lo, a.ctypes.data + a.nbytes))

    def run(keep=arrays):  # keep: the arrays stay alive while their pages are faulted
        for lo, hi in spans:
            top = hi
            while top > lo:
                start = max(lo, (top - _POPULATE_CHUNK) & ~4095)
                if _MADVISE(start, top - start, _MADV_POPULATE_WRITE) != 0:
                    return  # EINVAL on older kernels: leave the faults to the writer
                top = start

    thread = threading.Thread(target=run, name="pipecore-populate", daemon=True)
    thread.start()
    return thread


def available_bytes() -> int | None:
    """Memory the OS could give this process now, or None where unknown.

    Linux's ``MemAvailable`` plus free swap (from /proc/meminfo); None on
    other systems. Large arrays here are allocated lazily, so a table far
    larger than this would be killed by the OS while it is written, not
    refused at allocation: builders check their size against it first.

    Returns
    -------
    int or None
    """
    try:
        with open("/proc/meminfo") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        kib = int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return kib * 1024
