"""simulate_many: many cost settings in one kernel call, equal to simulate()."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.testing import family_schedules, networks

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

# The batched kernels keep memory in program order, so they refuse schedules
# whose O and L copies move memory at copy times (pipecore.core.pack says so;
# test_refuses_offloading_families checks it): every other family is drawn.
OFFLOADING = {"bpipe"}
BATCHED = sorted(set(pc.schedules()) - OFFLOADING)


@settings(max_examples=40, deadline=None)
@given(sched=family_schedules(max_devices=6, max_microbatches=12, names=BATCHED), data=st.data())
def test_matches_simulate_row_by_row(sched, data):
    n = data.draw(st.integers(1, 6))
    vals = st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(0.01, 3.0)
    table = {k: np.array([data.draw(vals) for _ in range(n)]) for k in ("f", "b", "w", "comm")}
    table["activation"] = np.ones(n)
    table["activation_w"] = np.array([data.draw(st.floats(0.0, 1.0)) for _ in range(n)])
    table["fb_factor"] = np.array([data.draw(st.floats(0.1, 1.0)) for _ in range(n)])
    net = data.draw(networks(devices=sched.devices))
    out = pc.simulate_many(sched, table, net).to_pylist()
    for k, row in enumerate(out):
        c = pc.Costs(**{name: float(table[name][k]) for name in table})
        res = pc.simulate(sched, c, net)
        assert row["makespan"] == res.makespan  # bit for bit: the same kernel and arithmetic
        assert row["bubble_ratio"] == pytest.approx(res.bubble_ratio, abs=1e-12)
        assert row["bubble_rate"] == pytest.approx(res.bubble_rate, abs=1e-12)
        assert row["peak_activation_max"] == res.peak_activation.max()


def test_defaults_and_arrow_input():
    import pyarrow as pa

    sched = pc.build("1f1b", 4, 8)
    out = pc.simulate_many(sched, pa.table({"f": [1.0, 2.0], "b": [2.0, 4.0]}))
    # (m + p - 1) (f + b): 33 and 66.
    assert out.column("makespan").to_pylist() == [33.0, 66.0]
    assert out.column("w").to_pylist() == [0.0, 0.0]  # Costs' default


@pytest.mark.parametrize("table,match", [
    ({"f": [1.0, -1.0]}, r"column 'f' row 1: must be finite and >= 0 \(got -1.0\)"),
    ({"f": [1.0], "b": [1.0, 2.0]}, "differ in length"),
    ({"speed": [1.0]}, "unknown column"),
    ({"fb_factor": [0.0]}, r"'fb_factor' row 0: must be finite and > 0"),
    ({"activation": [1.0], "activation_w": [2.0]}, "row 0: 'activation_w' must be <="),
    ({"f": []}, "no rows"),
])
def test_bad_tables(table, match):
    with pytest.raises(ValueError, match=match):
        pc.simulate_many(pc.build("1f1b", 2, 2), table)


def test_deadlock_is_reported_once():
    sched = pc.from_actions({0: ["0F0", "0BW0", "0F1", "0BW1"], 1: ["1F1", "1F0", "1BW0", "1BW1"]})
    with pytest.raises(pc.ScheduleError, match="deadlock"):
        pc.simulate_many(sched, {"f": [1.0]})


@settings(max_examples=40, deadline=None)
@given(sched=family_schedules(max_devices=6, max_microbatches=12, names=BATCHED), data=st.data())
def test_replay_equals_list_scheduler(sched, data):
    # The replayed order and the full list scheduler must agree bit for bit on
    # every metric, per-row network columns included.
    n = data.draw(st.integers(1, 70))  # crosses a lane group (64) now and then
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    table = {k: rng.choice([0.0, 0.5, 1.0, 2.5], n) for k in ("f", "b", "w", "comm")}
    table["bytes"] = rng.choice([0.0, 1.0, 3.0], n)
    table["grad_bytes"] = rng.choice([0.0, 2.0], n)
    table["bandwidth"] = rng.choice([0.5, 2.0, np.inf], n)
    table["inter_bandwidth"] = rng.choice([0.25, 1.0], n)
    table["latency"] = rng.choice([0.0, 0.3], n)
    table["inter_latency"] = rng.choice([0.0, 1.0], n)
    table["activation_w"] = rng.uniform(0, 1, n)
    table["weights"] = rng.uniform(0, 2, n)
    table["fb_factor"] = rng.uniform(0.5, 1.0, n)
    net = pc.Network.two_level(1.0, data.draw(st.integers(1, 4)), 1.0, 1.0)
    a = pc.simulate_many(sched, table, net, method="replay")
    b = pc.simulate_many(sched, table, net, method="list")
    assert a.equals(b)


def test_network_columns_match_simulate():
    sched = pc.build("zb-v", 4, 8)
    rows = {"f": [1.0, 2.0], "b": [1.0, 1.5], "w": [0.5, 1.0], "comm": [0.1, 0.0],
            "bytes": [2.0, 1.0], "bandwidth": [1.0, 4.0], "inter_bandwidth": [0.5, 0.25],
            "latency": [0.2, 0.0], "inter_latency": [1.0, 2.0], "weights": [3.0, 1.0],
            "memory_limit": [1e9, 0.5]}
    out = pc.simulate_many(sched, rows, pc.Network.two_level(0.0, 2, 1.0, 1.0)).to_pylist()
    for k, row in enumerate(out):
        net = pc.Network.two_level(rows["bytes"][k], 2, rows["bandwidth"][k],
                                   rows["inter_bandwidth"][k], rows["latency"][k],
                                   rows["inter_latency"][k])
        c = pc.Costs(f=rows["f"][k], b=rows["b"][k], w=rows["w"][k], comm=rows["comm"][k],
                     weights=rows["weights"][k])
        res = pc.simulate(sched, c, net)
        assert row["makespan"] == res.makespan
        assert row["memory_max"] == (res.peak_activation + res.static_memory).max()
        assert row["throughput"] == 8 / res.makespan
    assert [r["fits"] for r in out] == [True, False]


def test_per_stage_network_bytes_are_refused():
    with pytest.raises(ValueError, match="scalar Network 'bytes'"):
        pc.simulate_many(pc.build("1f1b", 2, 2), {"f": [1.0]},
                         pc.Network.uniform([1.0, 2.0], 1.0))


@pytest.mark.parametrize("name,p,m", [("zb-h1", 4, 8), ("dualpipev", 4, 8), ("interleaved-1f1b", 4, 8)])
def test_constant_memory_costs_take_the_fast_path_exactly(name, p, m):
    # Same memory costs in every row: memory is tracked once per structure, not per
    # lane (issue 14). Every row must still equal pc.simulate, memory included.
    sched = pc.build(name, p, m)
    rng = np.random.default_rng(3)
    n = 70  # a full group of 64 lanes and a partial one
    table = {"f": rng.uniform(0.5, 2, n), "b": rng.uniform(0.5, 2, n), "w": rng.uniform(0, 1, n),
             "comm": rng.uniform(0, 0.1, n), "activation": np.full(n, 1.5),
             "activation_w": np.full(n, 0.5), "weights": np.full(n, 2.0)}
    net = pc.Network.uniform(bytes=1.0, bandwidth=4.0, latency=0.01)
    rows = pc.simulate_many(sched, table, net).to_pylist()
    for k in (0, 1, 63, 64, 69):
        res = pc.simulate(sched, pc.Costs(**{c: float(table[c][k]) for c in table}), net)
        assert rows[k]["makespan"] == res.makespan
        assert rows[k]["peak_activation_max"] == res.peak_activation.max()
        assert rows[k]["memory_max"] == (res.peak_activation + res.static_memory).max()


@settings(max_examples=40, deadline=None)
@given(sched=family_schedules(names=BATCHED))
def test_arrival_rows_are_never_shared_by_two_live_transfers(sched):
    # The sweep keeps arrivals in reused rows (kernels.replay.transfer_slots):
    # a row may hold a new transfer only after the last one in it was read.
    # Checked here by walking the units in order, independently of the kernel.
    from pipecore.core.pack import structure_of

    s = structure_of(sched)
    holder = {}  # row -> transfer living in it
    produced = set()
    for u in range(s.n_units):
        for j in range(s.u_in_ptr[u], s.u_in_ptr[u + 1]):
            x = int(s.in_x[j])
            assert x in produced and s.in_slot[j] == s.x_slot[x]
            assert holder.pop(int(s.x_slot[x])) == x  # still its row's holder, freed now
        for x in range(s.u_out0[u], s.u_out1[u]):
            row = int(s.x_slot[x])
            assert 0 <= row < s.n_slots and row not in holder
            holder[row] = x
            produced.add(x)
    assert len(produced) == s.n_transfers


def test_arrival_rows_stay_few_and_a_bad_order_is_refused():
    from pipecore.core.pack import structure_of
    from pipecore.kernels.replay import transfer_slots

    # 1F1B at p=8, m=64: 2 (p - 1) m = 896 transfers, but in the replay's
    # execution order only a few are in flight at once (8 rows here).
    s = structure_of(pc.build("1f1b", 8, 64))
    assert s.n_transfers == 2 * 7 * 64 and s.n_slots <= 16
    # A unit that reads a transfer no earlier unit wrote.
    x_slot, in_slot = np.empty(2, np.int32), np.empty(1, np.int32)
    assert transfer_slots(np.array([0, 1, 1]), np.array([1], np.int32),
                          np.array([0, 1], np.int32), np.array([1, 2], np.int32),
                          x_slot, in_slot) == -1


@pytest.mark.parametrize("name", sorted(OFFLOADING))
def test_refuses_offloading_families(name):
    with pytest.raises(ValueError, match="offloads activations .* use pipecore.simulate"):
        pc.simulate_many(pc.build(name, 4, 8), {"f": [1.0, 2.0]})
