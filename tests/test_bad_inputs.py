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
    with pytest.raises(pc.CapacityError, match="needs about"):
        pc.build("1f1b", devices=64, microbatches=1024)


# -- issue 52, part 13: the audit's bad inputs ---------------------------------------------

# A model whose forward takes 1e9 FLOPs per layer: on 1e-300 FLOP/s that is 1e309 s,
# beyond float64 (1.8e308), so the roofline overflows in the first layer.
_SLOW_HW = pc.Hardware(flops=1e-300, memory_bandwidth=math.inf, link_bandwidth=1e10,
                       link_latency=0.0)


def _explore(*args, **kw):
    return pc.explore(*args, progress=False, **kw)


AUDIT = [
    # Sizes refused at once, naming the argument, the value and the rule.
    ("compose placement with device 2**31",
     lambda: pc.compose(placement=[0, 2**31], microbatches=4),
     pc.InputError, ["stage 1 has device 2147483648", "2 stages fill at most devices 0..1",
                     "number the devices from 0 without gaps"]),
    ("Placement with device 2**40", lambda: pc.placements.Placement((0, 2**40)),
     pc.InputError, ["stage 1 has device 1099511627776", "2 stages fill at most devices 0..1"]),
    ("explore(10**6, 10**6)", lambda: _explore(10**6, 10**6),
     pc.InputError, ["explore(devices=1000000, microbatches=1000000)", "at least 1000000 stages",
                     "2,000,000,000,000 ops", "at most 2,147,483,647 ops (int32 rows)"]),
    ("linear placement of 2**40 devices", lambda: pc.placements.linear(2**40),
     pc.InputError, ["placements.linear(devices=1099511627776)", "1,099,511,627,776 stages",
                     "int32"]),
    ("looped placement beyond int32", lambda: pc.placements.looped(2**30, 4),
     pc.InputError, ["placements.looped(devices=1073741824, chunks=4)", "4,294,967,296 stages",
                     "int32"]),
    ("compose of 2e10 ops",
     lambda: pc.compose(placement="linear", devices=10**5, microbatches=10**5),
     pc.InputError, ["microbatches=100000", "20,000,000,000 ops", "at most 2,147,483,647 ops"]),
    # Unclear before: now each names what the user gave.
    ("explore on hardware of 1e-300 FLOP/s",
     lambda: _explore(4, 8, pc.Model.uniform(8, f=1e9), hardware=_SLOW_HW),
     pc.InputError, ["Hardware flops=1e-300", "layer 'block 0'", "forward (F)",
                     "overflows float64", "FLOP/s"]),
    ("partition on hardware of 1e-300 FLOP/s",
     lambda: pc.partition(pc.Model.uniform(8, f=1e9), 4, hardware=_SLOW_HW),
     pc.InputError, ["Hardware flops=1e-300", "layer 'block 0'", "overflows float64"]),
    ("explore of an empty space", lambda: _explore(4, 8, space=[], include_tune=False),
     pc.InputError, ["'space' is empty", "no composition to try"]),
    ("explore with 3-entry cost vectors on 4 devices",
     lambda: _explore(4, 8, pc.Costs(f=[1.0, 1.0, 1.0], b=[2.0, 2.0, 2.0]), include_tune=False),
     pc.InputError, ["Costs 'f' has 3 entries (one per stage)",
                     "compositions on devices=4 have 4, 8, 12, 16, 20, 24, 32 stages"]),
    ("explore of a 2-layer model on 8 devices",
     lambda: _explore(8, 8, pc.Model.uniform(2), include_tune=False),
     pc.InputError, ["the model has 2 layers", "at least 8 stages",
                     "every stage needs at least one layer"]),
    ("from_arrays of no ops", lambda: pc.Schedule.from_arrays([], [], [], [], []),
     pc.ScheduleError, ["the schedule has no ops", "at least one op"]),
    # Times below float64's normal range: 22 ops of 5e-324 give a makespan of 1.1e-322.
    ("simulate of subnormal costs",
     lambda: pc.simulate(S, pc.Costs(f=5e-324, b=5e-324)),
     pc.InputError, ["underflow float64", "makespan 1.08694e-322", "f=4.94066e-324",
                     "smaller unit"]),
]


@pytest.mark.parametrize("call,error,needles", [c[1:] for c in AUDIT], ids=[c[0] for c in AUDIT])
def test_audit_input_gets_an_error_naming_it(call, error, needles):
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, pc.PipecoreError), type(info.value).__mro__
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    assert "nan" not in message and "NoneType" not in message
    # The error names what the user gave, not a value pipecore made from it.
    assert "Costs 'f'[" not in message and "'devices' must be" not in message


@pytest.fixture
def sixteen_gib(monkeypatch):
    """A machine with 16 GiB available, whatever this one has: the memory rule of the
    size guard is then the same on every machine."""
    from pipecore.core import hostmem

    monkeypatch.setattr(hostmem, "available_bytes", lambda: 16 * 2**30)


# Each needs more than 16 GiB at the guard's bytes per item (sizes.py and its callers):
# 1e8 transformer layers x 460 B = 46 GB; 1e9 uniform ones x 290 B; 321,240,520
# compositions (space_size(2000)) x 110 B = 35 GB; 1e5 devices' 1e10 link free times
# x 8 B = 80 GB; 2**30 stages x 40 B = 43 GB.
SIZES = [
    ("Model.transformer layers=10**8",
     lambda: pc.Model.transformer(layers=10**8, hidden=1024, heads=16, seq=2048, vocab=50000),
     ["Model.transformer(layers=100000000)", "100,000,002 layers", "42.8 GiB",
      "16.0 GiB is available"]),
    ("Model.uniform layers=10**9", lambda: pc.Model.uniform(10**9),
     ["Model.uniform(layers=1000000000)", "1,000,000,000 layers", "16.0 GiB is available"]),
    ("explore's default space at p=2000", lambda: _explore(2000, 1),
     ["default_space(devices=2000, microbatches=1, overlap=False)",
      "321,240,520 compositions", "to enumerate"]),
    ("explore at p=10**5", lambda: _explore(10**5, 1),
     ["explore(devices=100000, microbatches=1)", "10,000,000,000 link free times"]),
    ("wave placement of 2**30 stages", lambda: pc.placements.wave(2**27, 4),
     ["placements.wave(devices=134217728, waves=4)", "1,073,741,824 stages", "48 bytes each"]),
    ("compose needing 93 GiB",
     lambda: pc.compose(placement="linear", devices=10**4, microbatches=10**5),
     ["microbatches=100000", "2,000,000,000 ops at 96 bytes each", "178.8 GiB"]),
]


@pytest.mark.parametrize("call,needles", [c[1:] for c in SIZES], ids=[c[0] for c in SIZES])
def test_sizes_are_refused_before_anything_is_allocated(sixteen_gib, call, needles):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(MemoryError) as info:
            call()
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(info.value, pc.CapacityError)
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    # Refused before the allocation proportional to the size: the largest call here
    # makes one placement of 10,000 stages (0.4 MB) before its guard.
    assert peak < 8 * 2**20, peak


def test_space_size_counts_the_default_space_without_making_it():
    from pipecore.search.explore import default_space, space_size

    for p in (1, 2, 3, 5):
        for overlap in (False, True):
            assert space_size(p, overlap) == len(default_space(p, 4, overlap)), (p, overlap)
    # explore's docstring: "about 10,000 at p = 8".
    assert space_size(8) == 10_600


def test_explore_says_why_nothing_was_timed():
    # Every composition of this space deadlocks (tests/test_compose.py: strict 1F1B over
    # fixed streams on a V): no "least memory nan", but what happened to each.
    from pipecore.schedules.orders import Order
    from pipecore.search.explore import Composition

    order = Order("alternate", group=4, warmup="short", strict=True)
    space = [Composition(pc.placements.v(4), order, True, "with")]
    with pytest.raises(pc.TuneError) as info:
        _explore(4, 16, space=space, include_tune=False)
    message = str(info.value)
    assert "no composition of the space could be timed" in message
    assert "1 of 1 compositions" in message and "deadlock" in message
    assert "nan" not in message and math.isnan(info.value.smallest_limit)


def test_explore_csv_into_a_missing_folder_is_refused_before_the_search(tmp_path, monkeypatch,
                                                                          capsys):
    from pipecore.cli import main
    from pipecore.search import explore as explore_module

    def never(*args, **kw):
        raise AssertionError("the search ran before the output folder was checked")

    monkeypatch.setattr(explore_module, "explore", never)
    target = tmp_path / "missing" / "d" / "x.csv"
    assert main(["explore", "-p", "4", "-m", "8", "--csv", str(target)]) == 1
    err = " ".join(capsys.readouterr().err.split())  # the message is wrapped to 120 columns
    assert f"--csv {target}: folder {target.parent} does not exist" in err
    assert "torch" not in err
    assert main(["explore", "-p", "4", "-m", "8", "--out", str(target)]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_ratios_stay_in_their_range():
    # ZB-V with free F and B: each device runs its W's back to back from t = 0, so no
    # device is ever idle and the bubble ratio is exactly 0 (rounding gave -2.2e-16).
    sched = pc.build("zb-v", devices=6, microbatches=7)
    res = pc.simulate(sched, pc.Costs(f=0, b=0, w=0.001))
    assert 0.0 <= res.bubble_ratio <= 1e-12 and 0.0 <= res.bubble_rate <= 1e-12
    row = pc.simulate_many(sched, {"f": [0.0], "b": [0.0], "w": [0.001]}).to_pylist()[0]
    assert 0.0 <= row["bubble_ratio"] <= 1e-12 and 0.0 <= row["bubble_rate"] <= 1e-12
    from pipecore.core.result import bubble_rate, bubble_ratio

    assert bubble_ratio(6.000000000000001, 6, 1.0) == 0.0  # busy an ulp past p * makespan
    assert bubble_rate(1.0, 1.0000000000000002) == 0.0
    assert math.isnan(bubble_ratio(math.nan, 2, 1.0))  # NaN is kept for the overflow flag


def test_tiny_costs_never_give_an_infinite_throughput():
    # The audit's row: 1F1B p=4 m=8 with f = b = 5e-324 has a makespan of 22 x 5e-324,
    # subnormal: flagged, its metrics null, never 8 / 1.1e-322 = inf.
    rows = pc.simulate_many(S, {"f": [5e-324, 1.0], "b": [5e-324, 1.0]}).to_pylist()
    assert rows[0]["throughput"] is None and rows[0]["makespan"] is None
    assert "times underflow float64" in rows[0]["error"]
    # Row 1 untouched: (m + p - 1)(f + b) = 22 (FIELD.md's bubble formula), 8 / 22.
    assert rows[1]["makespan"] == 22.0 and rows[1]["throughput"] == 8 / 22
    # A normal makespan whose throughput still overflows: 1F1B p=2, m=10,000,
    # f = b = 1e-310 gives (m + p - 1)(f + b) = 2e-306 and m / that = 5e309 > 1.8e308.
    sched = pc.build("1f1b", devices=2, microbatches=10_000)
    row = pc.simulate_many(sched, {"f": [1e-310], "b": [1e-310]}).to_pylist()[0]
    assert row["makespan"] == pytest.approx(10_001 * 2e-310, rel=1e-9)
    assert row["throughput"] is None and "throughput overflows float64" in row["error"]


@pytest.mark.parametrize("name", ["1f1b", "bitpipe", "zb-v", "interleaved-zb", "chimera"])
def test_the_size_guard_estimate_covers_the_measured_peak(name):
    # The guard refuses a shape when its estimate exceeds the memory available; an
    # estimate below the real peak would let through a shape the OS then kills. At
    # 64 x 4096 (0.5 to 1.6 million ops) the per-op costs dominate; the first build
    # of the shape compiles and fills caches (a fixed cost) outside the measurement.
    import tracemalloc

    from pipecore.core.sizes import BYTES_PER_OP

    pc.build(name, 64, 4096)
    tracemalloc.start()
    try:
        sched = pc.build(name, 64, 4096)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    least = 2 * 64 * (sched.params["chunks"] or 1) * 4096  # the guard's count (registry.py)
    assert peak <= BYTES_PER_OP * least, (peak / least, BYTES_PER_OP)


@pytest.mark.parametrize("make", [lambda: pc.placements.linear(10**6),
                                  lambda: pc.placements.v(5 * 10**5),
                                  lambda: pc.placements.bidirectional(5 * 10**5),
                                  lambda: pc.placements.looped(25 * 10**4, 4),
                                  lambda: pc.placements.wave(25 * 10**4, 2)],
                         ids=["linear", "v", "bidirectional", "looped", "wave"])
def test_the_placement_guard_estimate_covers_the_measured_peak(make):
    # A million stages each (ints above the small-int cache, as at the sizes the
    # guard refuses); linear holds a distinct int per stage, the most.
    import tracemalloc

    from pipecore.schedules.placements import _BYTES_PER_STAGE

    tracemalloc.start()
    try:
        placement = make()
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= _BYTES_PER_STAGE * len(placement), peak / len(placement)


def test_the_compose_guard_estimate_covers_the_measured_peak():
    import tracemalloc

    from pipecore.core.sizes import BYTES_PER_OP

    pc.compose(placement="v", devices=64, microbatches=4096, split_backward=True)
    tracemalloc.start()
    try:
        sched = pc.compose(placement="v", devices=64, microbatches=4096, split_backward=True)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= BYTES_PER_OP * sched.num_ops, peak / sched.num_ops
