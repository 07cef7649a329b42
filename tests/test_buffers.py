"""core/buffers.py's pool (``PIPECORE_POOL_BYTES``, off by default): large
arrays hand their memory back for reuse when their last view dies, never
before, within a cap, and ``release`` returns it to the OS; ``arena`` puts
small tables side by side on huge pages."""

import gc
import threading

import numpy as np
import pytest

from pipecore.core import buffers


@pytest.fixture
def pool(monkeypatch):
    """An empty pool for arrays of 1 MB or more, capped at 64 MB."""
    buffers.release()
    monkeypatch.setattr(buffers, "_POOL_MIN_BYTES", 1 << 20)
    monkeypatch.setenv("PIPECORE_POOL_BYTES", str(64 << 20))
    yield buffers
    buffers.release()


def test_memory_returns_to_the_pool_when_the_last_view_dies(pool):
    a = pool.empty((1 << 18, 2), np.int32)  # 2 MB
    assert a.shape == (1 << 18, 2) and a.dtype == np.int32 and a.flags.writeable
    a[:] = 5
    view = a[10:20, 1]
    del a
    gc.collect()
    assert pool._pool_bytes == 0  # the view still holds the mapping
    assert (view == 5).all()
    del view
    assert pool._pool_bytes == 2 << 20
    b = pool.empty(1 << 19, np.int32)  # the same 2 MB again
    assert pool._pool_bytes == 0
    del b
    assert pool._pool_bytes == 2 << 20


def test_arrow_columns_keep_pooled_memory_alive(pool):
    pa = pytest.importorskip("pyarrow")
    a = pool.empty(1 << 20, np.int32)
    a[:] = np.arange(1 << 20, dtype=np.int32)
    col = pa.array(a)  # zero-copy: Arrow holds the array
    del a
    b = pool.empty(1 << 20, np.int32)  # must not get col's memory
    b[:] = -1
    assert col[12345].as_py() == 12345 and col[-1].as_py() == (1 << 20) - 1
    del b, col


def test_reused_memory_is_zeroed_by_zeros_and_sized_exactly(pool):
    a = pool.empty(3 << 20, np.uint8)  # a 4 MB mapping
    a[:] = 7
    small = pool.empty(1 << 20, np.uint8)  # a 2 MB mapping
    del a, small
    assert pool._pool_bytes == 6 << 20
    z = pool.zeros(1 << 20, np.uint8)  # fits both: takes the 2 MB one
    assert not z.any() and pool._pool_bytes == 4 << 20
    other = pool.empty(1 << 20, np.uint8)  # only a larger one left: a new mapping
    assert pool._pool_bytes == 4 << 20
    del other
    assert pool._pool_bytes == 6 << 20
    other = pool.empty(2 << 20, np.uint8)  # the 2 MB one back again
    z2 = pool.zeros((3 << 20) // 8, np.int64)  # the 4 MB one, written with 7s before
    assert not z2.any() and pool._pool_bytes == 0
    full = pool.full(1 << 18, -3, np.int32)  # a fresh mapping
    assert (full == -3).all()
    big = pool.empty(9 << 20, np.uint8)  # no pooled mapping is large enough
    del z, z2, full, big, other
    assert pool._pool_bytes == (2 + 4 + 2 + 10 + 2) << 20


def test_the_cap_keeps_the_newest_and_release_empties_it(pool, monkeypatch):
    monkeypatch.setenv("PIPECORE_POOL_BYTES", str(5 << 20))
    a, b = pool.empty(2 << 20, np.uint8), pool.empty(4 << 20, np.uint8)
    big = pool.empty(6 << 20, np.uint8)
    del a
    del b  # over the 5 MB cap: the older (a's 2 MB) goes back to the OS
    assert pool._pool_bytes == 4 << 20 and len(pool._pool) == 1
    del big  # larger than the cap: never pooled
    assert pool._pool_bytes == 4 << 20
    assert pool.release() == 4 << 20
    assert pool._pool_bytes == 0 and not pool._pool


@pytest.mark.parametrize("setting", [None, "0"])
def test_pooling_is_off_by_default_and_with_zero(pool, monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv("PIPECORE_POOL_BYTES")
    else:
        monkeypatch.setenv("PIPECORE_POOL_BYTES", setting)
    a = pool.empty(1 << 20, np.uint8)
    assert not isinstance(a.base, memoryview)  # numpy's own memory
    del a
    assert pool._pool_bytes == 0


def test_a_bad_pool_setting_is_named(pool, monkeypatch):
    monkeypatch.setenv("PIPECORE_POOL_BYTES", "lots")
    with pytest.raises(ValueError, match="PIPECORE_POOL_BYTES.*'lots'"):
        pool.empty(1 << 20, np.uint8)


def test_threads_never_share_a_mapping(pool):
    errors = []

    def work(tag):
        for _ in range(40):
            x = pool.empty(1 << 18, np.int32)
            x[:] = tag
            if not (x == tag).all():
                errors.append(tag)
            del x

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool._pool_bytes <= 4 * (2 << 20)  # at most one 2 MB mapping per thread came back


# -- arena: small tables together on huge pages ------------------------------

def test_arena_arrays_have_their_shapes_and_do_not_overlap(monkeypatch):
    monkeypatch.delenv("PIPECORE_HUGEPAGES", raising=False)
    specs = [((3, 5), np.int32), (0, np.float64), ((2,), np.int8), (7, np.int64),
             ((1024, 1160), np.int32)]
    arrays = buffers.arena(*specs)
    assert [a.shape for a in arrays] == [(3, 5), (0,), (2,), (7,), (1024, 1160)]
    assert [a.dtype for a in arrays] == [np.dtype(d) for _s, d in specs]
    for k, a in enumerate(arrays):
        assert a.flags.writeable and a.flags.c_contiguous
        assert a.ctypes.data % 64 == 0  # each on its own cache lines
        a[...] = k + 1
    for k, a in enumerate(arrays):  # no write reached another array
        assert (a == k + 1).all()
    for a in arrays:
        for b in arrays:
            assert a is b or not np.shares_memory(a, b)


def test_arena_falls_back_to_numpy_without_huge_pages(monkeypatch):
    monkeypatch.setenv("PIPECORE_HUGEPAGES", "0")
    a, b = buffers.arena(((4, 4), np.int32), (3, np.float64))
    assert a.shape == (4, 4) and b.shape == (3,)
    assert not np.shares_memory(a, b) and a.flags.owndata and b.flags.owndata


def test_arena_names_a_negative_shape():
    with pytest.raises(ValueError, match=r"negative dimensions.*\(-1, -2\)"):
        buffers.arena(((-1, -2), np.int32))


def _thp_eligible(address):
    """THPeligible of the mapping holding ``address`` (None: not readable)."""
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= address < hi
                elif inside and head == "THPeligible:":
                    return line.split()[1] == "1"
    except OSError:
        return None
    return None


def test_arena_asks_for_huge_pages(monkeypatch):
    monkeypatch.delenv("PIPECORE_HUGEPAGES", raising=False)
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        pytest.skip("this system reports no transparent huge pages")
    if "[never]" in mode or not buffers._POOL_OK:
        pytest.skip("transparent huge pages are off on this system")
    (a,) = buffers.arena(((256, 145), np.int32))  # smax's size at p=256: numpy would not hint it
    eligible = _thp_eligible(a.ctypes.data)
    if eligible is None:
        pytest.skip("/proc/self/smaps does not say THPeligible here")
    assert eligible
