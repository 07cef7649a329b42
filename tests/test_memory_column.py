"""Result.memory's column is named for what it holds (issue 37, item 6):
``activation``, in the unit of Costs.activation; ``bytes`` still reads it
for one release, with a DeprecationWarning."""

import pickle
import warnings

import pyarrow as pa
import pytest

import pipecore as pc


@pytest.fixture(scope="module")
def res():
    # 1F1B, p=2, m=2, f=1, b=2 (fused BW = 2), activation 1. By hand: device 0
    # runs F0 [0,1], F1 [1,2], BW0 [4,6], BW1 [7,9]; device 1 runs F0 [1,2],
    # BW0 [2,4], F1 [4,5], BW1 [5,7]. F allocates 1 at its start, BW frees it
    # at its finish.
    return pc.simulate(pc.build("1f1b", 2, 2), pc.Costs(f=1.0, b=2.0, w=0.0))


def test_the_column_is_activation(res):
    mem = res.memory
    assert mem.column_names == ["device", "time", "activation"]
    rows = list(zip(*(mem[c].to_pylist() for c in mem.column_names)))
    assert rows == [(0, 0.0, 1.0), (0, 1.0, 2.0), (0, 6.0, 1.0), (0, 9.0, 0.0),
                    (1, 1.0, 1.0), (1, 4.0, 0.0), (1, 4.0, 1.0), (1, 7.0, 0.0)]


@pytest.mark.parametrize("read", [
    lambda m: m["bytes"],
    lambda m: m.column("bytes"),
    lambda m: m.select(["bytes"]).column(0),
    lambda m: pa.chunked_array([m.to_pydict()["bytes"]]),
], ids=["getitem", "column", "select", "to_pydict"])
def test_the_old_name_reads_activation_and_warns(res, read):
    with pytest.warns(DeprecationWarning, match="column 'bytes' is now 'activation'") as got:
        col = read(res.memory)
    assert col.to_pylist() == res.memory["activation"].to_pylist()
    # The warning points at the line that read the old name.
    assert got[0].filename == __file__


def test_the_new_name_and_plain_uses_do_not_warn(res, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mem = res.memory
        mem["activation"], mem.column("activation"), mem.to_pydict()["activation"]
        assert mem.num_rows == len(mem) == 8 and mem.schema.names == mem.column_names
        # The plain table for pyarrow functions that insist on one, the
        # Arrow stream for the rest; both equal the wrapper.
        assert isinstance(mem.table, pa.Table)
        assert pa.table(mem).equals(mem.table) and mem.equals(mem.table) and mem == mem
        assert pickle.loads(pickle.dumps(mem)).equals(mem)
        assert isinstance(mem.filter(pa.array([True] * 8)), pa.Table)
        assert repr(mem) == repr(mem.table)


def test_an_unknown_column_is_still_an_error(res):
    with pytest.raises(KeyError):
        res.memory["nope"]
    with pytest.raises(KeyError):
        res.memory.to_pydict()["nope"]
