"""Garbage in, pipecore's own error out (issue 38, item 6).

Each reader of user input gets random junk: wrong types, wrong shapes, strings,
NaN and infinities, nested containers, huge and negative numbers, and for the
file readers random bytes and damaged JSON. Whatever it does, the only
exception allowed out is a ``pc.PipecoreError`` (a refusal that names the
input), never a TypeError, an IndexError, a numpy or Arrow error, a hang or a
crash. Valid inputs may also come out of the strategies: then the call simply
succeeds.
"""

import json
import math
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipecore as pc

# Gaps in device keys are legal (a warning says what they cost); junk finds many.
pytestmark = pytest.mark.filterwarnings("ignore::pipecore.DeviceGapWarning")

# PIPECORE_FUZZ=dev: quick; long or huge: a hunt for new cases before a release.
EXAMPLES = {"dev": 200, "long": 5000, "huge": 20000}.get(os.environ.get("PIPECORE_FUZZ"), 500)
# Health checks judge the strategies, not pipecore: junk is large and slow to draw by design.
fuzz = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])

numbers = st.one_of(st.integers(-2**40, 2**40), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 1e308, -0.0, True, False]))
scalars = st.one_of(numbers, st.text(max_size=4), st.none(), st.binary(max_size=4),
                    st.complex_numbers(max_magnitude=10))
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=3), inner,
                                                                     max_size=3)),
                    max_leaves=8)
small_ints = st.lists(st.integers(-3, 6), min_size=0, max_size=8)
kind_names = st.lists(st.sampled_from(["F", "B", "W", "BW", "AR", "R", "O", "L", "X", "", "f"]),
                      max_size=8)


def _only_pipecore_errors(call):
    try:
        call()
    except pc.PipecoreError:
        pass


@fuzz
@given(st.one_of(small_ints, junk), st.one_of(small_ints, junk), st.one_of(kind_names, junk),
       st.one_of(small_ints, junk), st.one_of(small_ints, junk))
def test_from_arrays(device, slot, kind, stage, microbatch):
    _only_pipecore_errors(lambda: pc.Schedule.from_arrays(device, slot, kind, stage, microbatch))


actions = st.one_of(
    st.from_regex(r"[0-9]{1,2}(F|B|W|BW|I|R|AR|X)[0-9]{0,2}(&[0-9](F|B|BW)[0-9])?", fullmatch=True),
    st.text(max_size=6), st.none(), st.integers(-2, 3))


@fuzz
@given(st.one_of(st.dictionaries(st.one_of(st.integers(-2, 6), st.text(max_size=2), st.booleans()),
                                 st.lists(actions, max_size=6), max_size=4),
                 st.lists(st.lists(actions, max_size=6), max_size=4), junk),
       st.one_of(st.none(), st.integers(-2, 8), junk))
def test_from_actions(programs, devices):
    _only_pipecore_errors(lambda: pc.from_actions(programs, devices=devices))


@fuzz
@given(st.dictionaries(st.sampled_from(["f", "b", "w", "comm", "bytes", "bandwidth",
                                        "memory_limit", "activation", "bogus"]),
                       st.one_of(st.lists(numbers, min_size=1, max_size=3), junk), max_size=4))
def test_simulate_many_columns(columns):
    sched = pc.build("1f1b", 2, 2)
    _only_pipecore_errors(lambda: pc.simulate_many(sched, columns))


grid_values = st.one_of(junk, st.lists(st.integers(-1, 5), max_size=3),
                        st.fixed_dictionaries({"min": numbers, "max": numbers, "num": numbers}))


@fuzz
@given(st.fixed_dictionaries(
    {"schedules": st.one_of(st.just(["1f1b"]), st.just("all"), junk),
     "devices": st.one_of(st.just([2]), grid_values),
     "microbatches": st.one_of(st.just([2]), grid_values)},
    optional={"f": grid_values, "chunks": grid_values, "network": junk, "networks": junk,
              "options": junk, "sample": junk, "seed": junk, "part_size": junk,
              "memory_limit": grid_values, "bogus": junk}))
def test_grid(data):
    _only_pipecore_errors(lambda: pc.Grid.from_dict(data))


@fuzz
@given(st.one_of(st.binary(max_size=64),
                 st.lists(st.lists(actions, max_size=5), max_size=3).map(
                     lambda rows: "\n".join(",".join("" if a is None else str(a) for a in r)
                                            for r in rows).encode())))
def test_from_csv(tmp_path_factory, data):
    pytest.importorskip("torch", reason="from_csv needs torch: pip install 'pipecore[torch]'")
    from pipecore.bindings import torch as pt

    path = tmp_path_factory.mktemp("csv") / "sched.csv"
    path.write_bytes(data)
    _only_pipecore_errors(lambda: pt.from_csv(path))


events = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "B", "i"]), "name": st.sampled_from(["PP:0F0", "PP:0B0",
                                                                      "ProfilerStep#1", "aten::mm",
                                                                      "c10d::send"])},
    optional={"ts": numbers | st.text(max_size=2), "dur": numbers | st.none(), "cat": st.text(),
              "args": junk})


@fuzz
@given(st.one_of(
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.fixed_dictionaries({"traceEvents": st.one_of(st.lists(events, max_size=6), junk)},
                          optional={"distributedInfo": junk}).map(
        lambda v: json.dumps(v, default=str)),
    junk.map(lambda v: json.dumps(v, default=str))))
def test_from_profile(tmp_path_factory, text):
    pytest.importorskip("torch", reason="from_profile needs torch: pip install 'pipecore[torch]'")
    from pipecore.bindings import torch as pt

    folder = tmp_path_factory.mktemp("prof")
    (folder / "rank0.json").write_text(text)
    _only_pipecore_errors(lambda: pt.from_profile(folder))


@fuzz
@given(st.fixed_dictionaries({}, optional={k: numbers | junk for k in
                                           ("f", "b", "w", "comm", "activation", "weights", "bw",
                                            "overhead", "fb_factor")}))
def test_costs(fields):
    _only_pipecore_errors(lambda: pc.Costs(**fields))


def test_garbage_helpers_see_real_errors():
    # The helper lets only pipecore's errors through: a TypeError must fail the test.
    with pytest.raises(TypeError):
        _only_pipecore_errors(lambda: (_ for _ in ()).throw(TypeError("bug")))
    assert math.isnan(float("nan")) and np.isnan(np.nan) and pa is not None


# Device numbers far beyond the stages (the audit's Placement((0, 2**40)) built a range as
# long as the largest): refused at once, whatever the number. Microbatches stay small or
# far beyond an op table, so every call is quick.
device_numbers = st.lists(st.one_of(st.integers(0, 8), st.integers(0, 2**62)), max_size=8)


@fuzz
@given(st.one_of(device_numbers, junk),
       st.one_of(st.integers(-2, 64), st.integers(2**31, 2**62), junk))
def test_placements_and_compose(device_of, microbatches):
    _only_pipecore_errors(lambda: pc.placements.Placement(device_of))
    _only_pipecore_errors(lambda: pc.compose(placement=device_of, microbatches=microbatches))
