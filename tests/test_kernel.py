"""The Numba kernel against the independent pure-Python oracle (tests/reference.py).

Times must be bit-identical: both follow docs/semantics.md with the same
floating-point operations. Run once with NUMBA_BOUNDSCHECK=1 in CI.
"""

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import simulate_reference

import pipecore as pc
from pipecore.testing import costs, family_schedules, networks, random_programs, schedules

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def link_function(network, comm, stages, gradients=False):
    """(src, dst, stage) -> (ser, lat), written from Network's documented rules.

    With ``gradients``, the size is the stage's gradient (all-reduce transfers).
    """
    comm = [float(comm)] * stages if np.ndim(comm) == 0 else [float(x) for x in comm]
    if network is None:
        return lambda src, dst, s: (0.0, comm[s])
    nbytes = network.grad_bytes if gradients else network.bytes
    nbytes = [float(nbytes)] * stages if np.ndim(nbytes) == 0 else [float(x) for x in nbytes]

    def link(src, dst, s):
        bw, lat = network.bandwidth, network.latency
        n = network.devices_per_node
        if n is not None and src // n != dst // n:
            bw, lat = network.inter_bandwidth, network.inter_latency
        return nbytes[s] / bw, comm[s] + lat

    return link


def run_both(sched, c, network):
    S, p = sched.stages, sched.devices
    arrays = c.stage_arrays(S, p)
    ref = simulate_reference(sched.programs(), arrays["f"], arrays["b"], arrays["w"],
                             arrays["activation"], arrays["activation_w"],
                             link_function(network, c.comm, S), fb_factor=c.fb_factor,
                             ar_link=link_function(network, c.comm, S, gradients=True),
                             r=arrays["r"], ckpt=arrays["checkpoint"], offload=arrays["offload"],
                             bw=None if c.bw is None else arrays["bw"],
                             overhead=arrays["overhead"], evict=arrays["evict"],
                             offload_to=sched.offload_to)
    return ref


def flat(per_device):
    return np.array([x for prog in per_device for x in prog], dtype=float)


def assert_same(sched, c, network):
    ref = run_both(sched, c, network)
    assert ref["status"] == "ok"
    res = pc.simulate(sched, c, network)
    np.testing.assert_array_equal(res.start, flat(ref["start"]))
    np.testing.assert_array_equal(res.finish, flat(ref["finish"]))
    assert res.makespan == ref["makespan"]
    tr = res.transfers.to_pydict()
    assert len(tr["start"]) == len(ref["transfers"])
    for k, x in enumerate(ref["transfers"]):
        assert (tr["src_device"][k], tr["dst_device"][k]) == (x["src_device"], x["dst_device"])
        assert tr["ready"][k] == x["ready"]
        assert tr["start"][k] == x["start"]
        assert tr["finish"][k] == x["end"]
        assert tr["arrival"][k] == x["arrival"]
    np.testing.assert_array_equal(res.peak_activation, np.array(ref["peak"]))
    mem = res.memory.to_pydict()
    ref_mem = [e for dev in ref["memory"] for e in dev]
    assert mem["time"] == [t for t, _ in ref_mem]
    assert mem["activation"] == [v for _, v in ref_mem]
    return res


@SETTINGS
@given(data=st.data(), sched=schedules())
def test_kernel_equals_reference_random_schedules(data, sched):
    c = data.draw(costs(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices))
    assert_same(sched, c, net)


@SETTINGS
@given(data=st.data(), sched=family_schedules(recompute=True))
def test_kernel_equals_reference_families(data, sched):
    c = data.draw(costs(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices, allow_none=False))
    assert_same(sched, c, net)


def critical_path(sched, c, network):
    """Longest dependency chain (ops + uncontended transfers), ignoring device order.

    An overlapped F&B pair is one node: it waits for the producers of both
    its ops and takes (F + B) * fb_factor.
    """
    arrays = c.stage_arrays(sched.stages, sched.devices)
    link = link_function(network, c.comm, sched.stages)
    ar_link = link_function(network, c.comm, sched.stages, gradients=True)
    units = [(d, unit if isinstance(unit[0], tuple) else (unit,))
             for d, prog in enumerate(sched.programs()) for unit in prog]
    ops = [(d, k, s, mb) for d, unit in units for (k, s, mb) in unit]
    where = {(k, s, mb): (d, k, s, mb) for (d, k, s, mb) in ops if k != "AR"}
    partner = {}
    for d, unit in units:
        if len(unit) == 2:
            a, b = ((d,) + unit[0], (d,) + unit[1])
            partner[a], partner[b] = b, a
    S = sched.stages

    def dur(k, s):
        return {"F": arrays["f"][s], "B": arrays["b"][s], "W": arrays["w"][s],
                "BW": arrays["b"][s] + arrays["w"][s], "AR": 0.0, "R": arrays["r"][s],
                "O": 0.0, "L": 0.0}[k]

    # The last backward op of each (stage, device), in program order, feeds the
    # all-reduce on the stage's other replica.
    last_back = {}
    for op in ops:
        if op[1] in ("B", "W", "BW"):
            last_back[(op[2], op[0])] = op

    def producers(k, s, mb):
        out = []
        if k == "F" and s > 0:
            out.append(where[("F", s - 1, mb)])
        if k in ("R", "O"):
            out.append(where[("F", s, mb)])
        if k == "L":
            out.append(where[("O", s, mb)])
        if k in ("B", "BW") and ("L", s, mb) in where:
            # Offloaded: the copy back (after the L, and after the copy to host).
            out += [where[("L", s, mb)], where[("O", s, mb)]]
            if s < S - 1:
                out.append(where.get(("B", s + 1, mb)) or where[("BW", s + 1, mb)])
            return out
        if k in ("B", "BW"):
            # A recomputed backward needs the R (which needs the F).
            out.append(where.get(("R", s, mb)) or where[("F", s, mb)])
            if s < S - 1:
                out.append(where.get(("B", s + 1, mb)) or where[("BW", s + 1, mb)])
        if k == "W":
            out.append(where[("B", s, mb)])
        return out

    def producers_of(op):
        d, k, s, mb = op
        if k == "AR":
            return [v for (st_, dv), v in last_back.items() if st_ == s and dv != d]
        return producers(k, s, mb)

    def length(op):
        if op in partner:
            first, second = sorted((op, partner[op]), key=lambda o: o[1] != "F")
            return (dur(first[1], first[2]) + dur(second[1], second[2])) * c.fb_factor
        return dur(op[1], op[2])

    # Longest path by relaxation in a topological order (Kahn's algorithm).
    prods = {op: producers_of(op) for op in ops}
    for op, other in partner.items():
        prods[op] = prods[op] + [q for q in producers_of(other) if q != op]
    waiting = {op: len(prods[op]) for op in ops}
    users = {op: [] for op in ops}
    for op, qs in prods.items():
        for q in qs:
            users[q].append(op)
    ready = [op for op in ops if waiting[op] == 0]
    done = {}
    while ready:
        op = ready.pop()
        d, k, s, mb = op
        t = 0.0
        for q in prods[op]:
            via = ar_link if k == "AR" else link
            ser, lat = via(q[0], d, q[2]) if q[0] != d else (0.0, 0.0)
            if k in ("B", "BW") and q[1] in ("L", "O"):  # host copies: one or two
                ser = arrays["offload"][s] * (1 if q[1] == "L" else 2)
            t = max(t, done[q] + ser + lat)
        done[op] = t + length(op)
        for u in users[op]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    assert len(done) == len(ops)
    return max(done.values())


@settings(max_examples=100, deadline=None)
@given(data=st.data(), sched=schedules())
def test_invariants(data, sched):
    c = data.draw(costs(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices))
    res = pc.simulate(sched, c, net)
    tol = 1e-9 * max(1.0, res.makespan)
    assert np.all(res.busy <= res.makespan + tol)
    assert res.makespan >= critical_path(sched, c, net) - tol
    assert np.all(res.start >= 0) and np.all(res.finish >= res.start)
    # Memory never goes negative (up to rounding of a - (a - aw) - aw).
    mem = np.asarray(res.memory.column("activation"))
    scale = max(1.0, float(np.abs(mem).max()) if mem.size else 1.0)
    assert mem.min(initial=0.0) >= -1e-9 * scale
    # Each device ends with nothing held.
    ends = [mem[np.asarray(res.memory.column("device")) == d][-1]
            for d in range(sched.devices) if (np.asarray(res.memory.column("device")) == d).any()]
    assert np.allclose(ends, 0.0, atol=1e-9 * scale)
    # Devices never run two units at once (the two ops of an F&B pair share one).
    dev = np.asarray(res.ops.column("device"))
    slot = np.asarray(res.ops.column("slot"))
    nxt = (dev[1:] == dev[:-1]) & (slot[1:] != slot[:-1])
    assert np.all(res.start[1:][nxt] >= res.finish[:-1][nxt])
    pair = (dev[1:] == dev[:-1]) & (slot[1:] == slot[:-1])
    assert np.all(res.start[1:][pair] == res.start[:-1][pair])
    assert np.all(res.finish[1:][pair] == res.finish[:-1][pair])
    assert 0.0 <= res.bubble_ratio <= 1.0 + 1e-12


@settings(max_examples=80, deadline=None)
@given(sched=schedules(max_devices=4, max_stages=6, max_microbatches=4), seed=st.integers(0, 2**32 - 1))
def test_deadlock_agrees_with_reference(sched, seed):
    # Shuffle one device's program into an order that may deadlock.
    rng = random.Random(seed)
    progs = sched.programs()
    d = rng.randrange(sched.devices)
    rng.shuffle(progs[d])
    try:
        shuffled = pc.Schedule.from_programs(progs, devices=sched.devices,
                                             replicated=sched.replicated)
    except pc.ScheduleError as exc:
        assert exc.rule == "order"  # a same-device producer moved after its consumer
        return
    c = pc.Costs(f=1.0, b=1.0, w=1.0, offload=0.5)
    ref = run_both(shuffled, c, None)
    if ref["status"] == "ok":
        pc.simulate(shuffled, c)
    else:
        with pytest.raises(pc.ScheduleError) as info:
            pc.simulate(shuffled, c)
        assert info.value.rule == "deadlock"
        assert info.value.blocked == [tuple(x) for x in ref["blocked"]]


def test_contention_serialises_one_link():
    # GPipe on 2 devices, f=1, zero-cost backward: device 0 sends a forward
    # every 1 time unit but each transfer holds the link for 2. Transfer j
    # starts at 1 + 2j (FIFO) and lands at 3 + 2j + 0.5 latency.
    sched = pc.build("gpipe", 2, 3)
    res = pc.simulate(sched, pc.Costs(f=1.0, b=0.0), pc.Network.uniform(4.0, 2.0, 0.5))
    tr = res.transfers.to_pydict()
    fwd = [k for k in range(len(tr["kind"])) if tr["kind"][k] == "F"]
    assert [tr["start"][k] for k in fwd] == [1.0, 3.0, 5.0]
    assert [tr["arrival"][k] for k in fwd] == [3.5, 5.5, 7.5]


def test_two_level_network_uses_inter_links():
    sched = pc.build("gpipe", 4, 1)
    net = pc.Network.two_level(bytes=2.0, devices_per_node=2, intra_bandwidth=2.0,
                               inter_bandwidth=1.0, intra_latency=0.0, inter_latency=1.0)
    res = pc.simulate(sched, pc.Costs(f=1.0, b=1.0), net)
    # Forward: F0 [0,1] -> 1 intra (2/2 = 1) -> F1 [2,3] -> inter (2/1 + 1 = 3) -> F2 [6,7]
    # -> intra 1 -> F3 [8,9]; backward mirrors it: BW3 [9,10], BW2 [11,12], BW1 [15,16], BW0 [17,18].
    assert res.makespan == 18.0


def test_large_random_schedule_matches_reference():
    rng = random.Random(7)
    progs = random_programs(rng, devices=16, stages=32, microbatches=24, split=0.5)
    sched = pc.Schedule.from_programs(progs, devices=16)
    assert_same(sched, pc.Costs(f=1.0, b=1.5, w=0.5, comm=0.25), pc.Network.uniform(1.0, 2.0, 0.1))


def test_deterministic():
    sched = pc.build("interleaved-1f1b", 8, 32, chunks=2)
    net = pc.Network.uniform(1.0, 1.0, 0.1)
    a = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.5), net)
    b = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.5), net)
    np.testing.assert_array_equal(a.start, b.start)
    assert math.isfinite(a.makespan)


@SETTINGS
@given(data=st.data(), sched=family_schedules(recompute=True))
def test_kernel_equals_reference_with_fused_backward_and_overhead(data, sched):
    # Costs.bw and Costs.overhead against the oracle's own bw/overhead arithmetic.
    c = data.draw(costs(stages=sched.stages, op_times=True))
    net = data.draw(networks(devices=sched.devices))
    assert_same(sched, c, net)
