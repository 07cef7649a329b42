"""Bad inputs named in issue 38, one row each: every one gets pipecore's own error
naming the input and the rule (or a warning, where the input is legal but
probably not meant), never a crash, a hang or an infinite answer.

Each row: a call, the exception (or warning) class, and text the message must
hold (the column, row, file, field or value it names and the rule)."""

import math
import warnings

import numpy as np
import pyarrow as pa
import pytest

import pipecore as pc

S = pc.build("1f1b", devices=4, microbatches=8)


def _table(**over):
    cols = {"device": pa.array([0, 0], pa.int32()), "slot": [0, 1], "kind": ["F", "BW"],
            "stage": [0, 0], "microbatch": [0, 0]}
    cols.update(over)
    return pa.table(cols)


CASES = [
    # -- no non-finite result presented as an answer
    ("simulate overflowing costs", lambda: pc.simulate(S, pc.Costs(f=1e308, b=1e308)),
     ValueError, ["overflow float64", "f=1e+308"]),
    ("simulate overflowing network",
     lambda: pc.simulate(S, pc.Costs(), pc.Network.uniform(bytes=1e308, bandwidth=1e-308)),
     ValueError, ["transfer's time overflows", "bandwidth 1e-308"]),
    ("grid with f = inf",
     lambda: pc.Grid.from_dict({"schedules": ["1f1b"], "devices": [2], "microbatches": [2],
                                "f": [math.inf]}),
     pc.ScanError, ["grid 'f'", "not a finite number"]),
    # -- sizes bounded by the input
    ("device index 2**31-1",
     lambda: pc.Schedule.from_arrays([2**31 - 1] * 2, [0, 1], ["F", "BW"], [0, 0], [0, 0]),
     pc.ScheduleError, ["device index 2147483647", "2 ops"]),
    ("devices=2**31-1 for two ops",
     lambda: pc.Schedule.from_arrays([0, 0], [0, 1], ["F", "BW"], [0, 0], [0, 0],
                                     devices=2**31 - 1),
     pc.ScheduleError, ["devices=2147483647", "2 ops"]),
    ("from_actions device key 2**28", lambda: pc.from_actions({2**28: ["0F0", "0BW0"]}),
     pc.ScheduleError, ["device key 268435456", "2 actions"]),
    ("from_actions devices=2**30",
     lambda: pc.from_actions({0: ["0F0", "0BW0"]}, devices=2**30),
     pc.ScheduleError, ["devices=1073741824", "2 actions"]),
    ("ideal_table of 33M ops",
     lambda: pc.ideal_table(pc.build("gpipe", devices=4096, microbatches=1024)),
     ValueError, ["8,388,608 ops", "max_ops=4,000,000", "max_ops=None"]),
    # -- messages that name the input
    ("simulate_many string column", lambda: pc.simulate_many(S, {"f": [1.0, "a"]}),
     ValueError, ["column 'f' row 1", "'a' is not a real number"]),
    ("product string column", lambda: pc.product(f=["a"]),
     ValueError, ["column 'f' row 0", "'a' is not a real number"]),
    ("simulate_many bool column", lambda: pc.simulate_many(S, {"f": [True]}),
     ValueError, ["column 'f' row 0", "True is not a real number"]),
    ("simulate_many complex column", lambda: pc.simulate_many(S, {"b": [1.0, 1 + 2j]}),
     ValueError, ["column 'b' row 1", "is not a real number (complex)"]),
    ("simulate_many arrow string column",
     lambda: pc.simulate_many(S, pa.table({"f": ["1"]})),
     ValueError, ["column 'f'", "type string"]),
    ("simulate_many arrow null",
     lambda: pc.simulate_many(S, pa.table({"f": pa.array([1.0, None])})),
     ValueError, ["column 'f' row 1", "null"]),
    ("null device in a table", lambda: pc.Schedule(_table(device=pa.array([0, None], pa.int32()))),
     ValueError, ["column 'device' row 1", "null"]),
    ("null kind in a table", lambda: pc.Schedule(_table(kind=pa.array(["F", None]))),
     ValueError, ["column 'kind' row 1", "null"]),
    ("int64 beyond int32 in a table", lambda: pc.Schedule(_table(device=pa.array([0, 2**40]))),
     ValueError, ["column 'device' row 1", "1099511627776", "int32"]),
    ("int64 beyond int32 in arrays",
     lambda: pc.Schedule.from_arrays([0, 0], [0, 2**40], ["F", "BW"], [0, 0], [0, 0]),
     ValueError, ["column 'slot' row 1", "int32"]),
    ("2-D kind in from_arrays",
     lambda: pc.Schedule.from_arrays([0, 0], [0, 1], np.array([["F"], ["BW"]]), [0, 0], [0, 0]),
     ValueError, ["column 'kind'", "one-dimensional", "(2, 1)"]),
    ("simulate draw=-1",
     lambda: pc.simulate(S, pc.Costs(), jitter=pc.Jitter.lognormal(0.05, seed=1), draw=-1),
     ValueError, ["'draw'", "-1", ">= 0"]),
    ("straggler factor a string", lambda: pc.simulate(S, stragglers={0: "x"}),
     ValueError, ["straggler factor of device 0", "'x'"]),
    ("monte carlo draws beyond any memory",  # 8e13 bytes: more than any machine here has
     lambda: pc.monte_carlo(S, pc.Costs(), pc.Jitter.lognormal(0.1, seed=1), draws=10**13),
     MemoryError, ["draws=10,000,000,000,000", "GB"]),
    ("building block offsets as a list", lambda: pc.blocks.BuildingBlock([0, 1], [0, 1], 1),
     ValueError, ["'offsets' must map (kind, stage)", "got list"]),
    ("from_actions key that is a digit only to Unicode",  # '¹'.isdigit() is True
     lambda: pc.from_actions({"\u00b9": ["0F0", "0BW0"]}),
     ValueError, ["device keys must be ints >= 0", "'\u00b9'"]),
    # Found by the garbage fuzz: sizes a grid multiplies into before anything is made.
    ("grid of 1,001,000 shapes",  # 1 family x 1,000 device counts x 1,001 microbatch counts
     lambda: pc.Grid.from_dict({"schedules": ["1f1b"], "devices": list(range(2, 1002)),
                                "microbatches": list(range(1, 1002))}),
     pc.ScanError, ["1,001,000 shapes", "at most 1,000,000"]),
    ("grid of 1e20 points",  # four cost axes of 100,000 values: 1e20 > 2**63 configurations
     lambda: pc.Grid.from_dict({"schedules": ["1f1b"], "devices": [2], "microbatches": [2],
                                **{k: {"min": 1, "max": 2, "num": 100_000}
                                   for k in ("f", "b", "w", "comm")}}),
     pc.ScanError, ["1e+20 points", "int64"]),
    ("grid of more than 10,000,000 parts",  # 1e10 rows at part_size 1: 1e10 parts
     lambda: pc.Grid.from_dict({"schedules": ["1f1b"], "devices": [2], "microbatches": [2],
                                "part_size": 1,
                                **{k: {"min": 1, "max": 2, "num": 100_000} for k in ("f", "b")}}),
     pc.ScanError, ["10,000,000,000 parts", "raise 'part_size'"]),
    ("bad hanayo option in a grid",
     lambda: pc.Grid.from_dict({"schedules": ["hanayo"], "devices": [4], "microbatches": [8],
                                "options": {"hanayo": {"waves": "two"}}}),
     pc.ScanError, ["[options.hanayo]", "'waves'", "'two'"]),
    ("bad chimera option in a grid",
     lambda: pc.Grid.from_dict({"schedules": ["chimera"], "devices": [4], "microbatches": [8],
                                "options": {"chimera": {"variant": "sideways"}}}),
     pc.ScanError, ["[options.chimera]", "'sideways'"]),
]


@pytest.mark.parametrize("call,error,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_an_error_naming_it(call, error, needles):
    with pytest.raises(error) as info:
        call()
    # One hierarchy: a library user catches pipecore's refusals without catching bugs.
    assert isinstance(info.value, pc.PipecoreError), type(info.value).__mro__
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)


def test_device_key_gap_warns_and_says_what_it_costs():
    with pytest.warns(pc.DeviceGapWarning) as caught:
        sched = pc.from_actions({0: ["0F0", "0BW0"], 5: ["1F0", "1BW0"]})
    message = str(caught[0].message)
    assert "device(s) 1, 2, 3, 4" in message and "6 devices for 2 stages" in message
    assert sched.devices == 6
    with warnings.catch_warnings():  # contiguous keys: no warning
        warnings.simplefilter("error", pc.DeviceGapWarning)
        pc.from_actions({0: ["0F0", "0BW0"], 1: ["1F0", "1BW0"]})


def test_overflowing_rows_of_a_sweep_are_flagged_not_answered():
    table = pc.simulate_many(S, {"f": [1.0, 1e308], "b": [2.0, 1e308]})
    rows = table.to_pylist()
    # Row 0: 1F1B at p=4, m=8, f=1, b=2: (m + p - 1)(f + b) = 33 (FIELD.md's bubble formula).
    assert rows[0]["makespan"] == 33.0 and rows[0]["error"] is None
    assert rows[1]["makespan"] is None and rows[1]["bubble_ratio"] is None
    assert rows[1]["throughput"] is None and "overflow" in rows[1]["error"]
    for name in ("makespan", "bubble_ratio", "bubble_rate", "throughput"):
        values = table.column(name).drop_null().to_numpy()
        assert np.isfinite(values).all()


def test_a_scan_with_an_overflowing_row_says_so(tmp_path, capsys):
    from pipecore.cli import main

    grid = tmp_path / "g.toml"
    grid.write_text('schedules = ["1f1b"]\ndevices = [2]\nmicrobatches = [4]\nf = [1.0, 1e308]\n'
                    'b = [1.0]\n')
    assert main(["scan", str(grid), "--out", str(tmp_path / "r"), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "1 rows written now have no answer" in out
    table = pa.Table.from_batches(list(pc.scan(str(grid))))
    assert table.column("error").null_count == 1
    assert table.column("makespan").null_count == 1


def test_one_error_hierarchy(monkeypatch):
    from pipecore.output import MissingDependencyError

    for cls in (pc.ScheduleError, pc.ScanError, pc.TuneError, pc.PartitionError, pc.InputError):
        assert issubclass(cls, pc.PipecoreError) and issubclass(cls, ValueError), cls
    assert issubclass(pc.CapacityError, pc.PipecoreError) and issubclass(pc.CapacityError,
                                                                          MemoryError)
    assert issubclass(MissingDependencyError, pc.PipecoreError)
    assert issubclass(MissingDependencyError, ImportError)
    assert not issubclass(RuntimeError, pc.PipecoreError)  # internal errors stay bugs
    # Plain bad values across layers: costs, builders, the registry, networks.
    for call in (lambda: pc.Costs(f=-1), lambda: pc.build("1f1b", devices=0, microbatches=4),
                 lambda: pc.build("nope", 2, 2), lambda: pc.Network.uniform(1.0, -2.0)):
        with pytest.raises(pc.InputError):
            call()
    from pipecore.core import hostmem

    monkeypatch.setattr(hostmem, "available_bytes", lambda: 10**6)  # a machine with 1 MB free
    with pytest.raises(pc.CapacityError, match="needs at"):
        pc.build("1f1b", devices=64, microbatches=1024)
