"""BPipe (Kim et al., ICML 2023, PMLR 202:16639-16653): activations evicted to a
partner device, and the generalised O/L (Schedule.offload_to, Costs.evict).

Golden values come from outside the code under test: a hand-worked 4-device
case, 1F1B's closed form (m + p - 1)(f + b + w) and the peak rule derived in
pipecore/schedules/bpipe.py's docstring, re-derived here by hand; the
simulator is checked against the pure-Python reference (tests/reference.py),
which gained the partner copies independently of the kernels.

The paper's body could not be read (only its abstract and secondary
descriptions): the pairing of device d with p - 1 - d is the one its
description gives; its abstract states the aim, "enabling all GPUs to utilize
comparable amounts of memory", which test_peaks_are_balanced checks as the
spread of the per-device peaks. No table of the paper is reproduced.
"""

import numpy as np
import pytest
from test_kernel import assert_same

import pipecore as pc
from pipecore.analysis.compare import compare
from pipecore.analysis.formulas import formula
from pipecore.schedules.bpipe import evictions


def test_hand_worked_four_devices():
    # p=4, m=8, f=1, b=2 (BW=2), copies free. 1F1B: device d holds k_d = 4-d.
    # Pair (0, 3): k=4 and 1, n = floor((4-1+1)/2) = 2: device 0 evicts the
    # microbatches j with j mod 4 in {1, 3}: 1, 3, 5, 7, to device 3. Pair
    # (1, 2): n = floor((3-2+1)/2) = 1 < 2: no eviction.
    sched = pc.build("bpipe", 4, 8)
    assert sched.offload_to == (3, -1, -1, -1)
    # 1F1B's device 0 program with an O after each evicted F and each L
    # right after the backward before its own:
    assert sched.to_actions()[0] == [
        "0F0", "0F1", "0O1", "0F2", "0F3", "0O3", "0BW0", "0L1", "0F4", "0BW1", "0F5", "0O5",
        "0BW2", "0L3", "0F6", "0BW3", "0F7", "0O7", "0BW4", "0L5", "0BW5", "0BW6", "0L7", "0BW7"]
    assert sched.to_actions()[1] == pc.build("1f1b", 4, 8).to_actions()[1]
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0))
    # Same order and free copies: 1F1B's makespan, (m + p - 1)(f + b) = 33.
    assert res.makespan == 33.0
    # Device 0: at F4 (after BW0 freed 0 and L1 brought 1 back) it holds 1, 2,
    # 4 and 1 coming back while 3 is away: 3. Device 3 holds its own one and
    # two of device 0's (one window of 4 microbatches has 2 evicted): 3.
    assert res.peak_activation.tolist() == [3.0, 3.0, 2.0, 3.0]
    one = pc.simulate(pc.build("1f1b", 4, 8), pc.Costs(f=1.0, b=2.0))
    assert one.peak_activation.tolist() == [4.0, 3.0, 2.0, 1.0]
    # The partner's memory is in the timeline, not only in the peak: device 3
    # has rows for the copies it receives.
    mem = res.memory.to_pydict()
    dev3 = [a for d, a in zip(mem["device"], mem["activation"]) if d == 3]
    assert max(dev3) == 3.0 and len(dev3) == 2 * 8 + 2 * 4


def test_transfers_travel_to_the_partner_and_back():
    res = pc.simulate(pc.build("bpipe", 4, 8), pc.Costs(evict=0.5))
    tr = res.transfers.to_pydict()
    copies = [(s, d, k) for s, d, k in zip(tr["src_device"], tr["dst_device"], tr["kind"])
              if k in ("O", "L")]
    assert copies.count((0, 3, "O")) == 4 and copies.count((3, 0, "L")) == 4
    assert len(copies) == 8


@pytest.mark.parametrize("p", range(2, 11))
def test_formula_equals_simulation(p):
    # The closed form (bpipe.py) against the simulator over every m up to 3p
    # and copy times up to f, where the formula says it is exact.
    for m in range(1, 3 * p + 1):
        sched = pc.build("bpipe", p, m)
        for evict in (0.0, 0.25, 1.0):
            c = pc.Costs(f=1.0, b=2.0, evict=evict)
            fm = formula(sched, c)
            res = pc.simulate(sched, c)
            assert fm["exact"]
            assert res.makespan == fm["makespan"] == (m + p - 1) * 3.0, (p, m, evict)
            np.testing.assert_array_equal(res.peak_activation, fm["peak_activation"])


def test_balanced_peak_closed_form():
    # With m > p every evictor holds k_d - n_d + 1 and every partner
    # k_q + n_d; with k_d = p - d, k_q = d + 1, n_d = floor((p - 2d)/2) this is
    # p/2 + 1 on both for even p ((p+3)/2 on the evictor for odd p), and no
    # unpaired device holds more: the fullest device holds floor((p+3)/2) M
    # against 1F1B's p M (by hand: p=8 -> 5, p=16 -> 9, p=7 -> 5).
    for p, want in ((4, 3), (7, 5), (8, 5), (16, 9)):
        res = pc.simulate(pc.build("bpipe", p, 2 * p))
        assert res.peak_activation.max() == want == (p + 3) // 2
        assert pc.simulate(pc.build("1f1b", p, 2 * p)).peak_activation.max() == p


def test_peaks_are_balanced():
    # The paper's aim (abstract): comparable memory on every GPU. 1F1B's peaks
    # span 1..p; BPipe's span at most 3 M (the unpaired middle and the pair
    # that does not evict sit lower) once m > p.
    for p in (6, 8, 12):
        peak = pc.simulate(pc.build("bpipe", p, 3 * p)).peak_activation
        assert peak.max() - peak.min() <= 3.0 < p - 1


def test_against_full_recomputation():
    # 1F1B with every activation recomputed keeps only checkpoints but pays
    # an R (time f) before each backward; BPipe with copies that fit beside a
    # forward pays no time. p=8, m=16, f=1, b=2, checkpoint 0.1 M.
    p, m = 8, 16
    c = pc.Costs(f=1.0, b=2.0, checkpoint=0.1, evict=0.5)
    plain = pc.simulate(pc.build("1f1b", p, m), c)
    rec = pc.simulate(pc.recompute(pc.build("1f1b", p, m)), c)
    bp = pc.simulate(pc.build("bpipe", p, m), c)
    assert bp.makespan == plain.makespan == (m + p - 1) * 3.0
    assert rec.makespan > plain.makespan + (m - 1) * 1.0  # at least m-1 R's on device 0's path
    assert bp.peak_activation.max() == 5.0 < plain.peak_activation.max() == 8.0
    assert rec.peak_activation.max() < bp.peak_activation.max()


def test_slow_copies_cost_time_and_formula_says_approximate():
    c = pc.Costs(f=1.0, b=2.0, evict=3.0)
    sched = pc.build("bpipe", 8, 16)
    res = pc.simulate(sched, c)
    fm = formula(sched, c)
    assert not fm["exact"]
    assert res.makespan > (16 + 8 - 1) * 3.0
    row = compare(8, 16, costs=c, names=["bpipe"])[0]
    assert any("approximate" in f or "formula" in f for f in row["flags"])


@pytest.mark.parametrize("network", [None, pc.Network(bytes=1.0, bandwidth=2.0, latency=0.25)])
@pytest.mark.parametrize("evict", [0.0, 0.5, 1.5])
def test_kernel_equals_reference(network, evict):
    for p, m in ((4, 8), (5, 7), (8, 16)):
        assert_same(pc.build("bpipe", p, m), pc.Costs(f=1.0, b=2.0, evict=evict, comm=0.125),
                    network)


def test_evictions_rule():
    partner, k, n = evictions(8, 16)
    assert partner.tolist() == [7, 6, 5, -1, -1, -1, -1, -1]
    assert k.tolist() == [8, 7, 6, 5, 4, 3, 2, 1]
    assert n.tolist() == [4, 3, 2, 0, 0, 0, 0, 0]


# -- the generalised O/L (shared files) -----------------------------------------------------------

def test_offload_to_a_peer_shares_the_link_with_pipeline_sends():
    # p=2, m=1: device 0 sends F0's output to device 1 on link 0->1 and
    # evicts it to device 1 on the same link. Network: 1 byte at 1 byte/s,
    # so the send takes 1; the copy takes evict=4. F0 [0,1]; the send,
    # issued by F0, goes first [1,2]; the copy, issued by O after it, waits
    # for the link: [2,6]. Without the send's bytes the copy starts at 1.
    sched = pc.offload(pc.build("1f1b", 2, 1), stages=[0], to=[1, -1])
    net = pc.Network(bytes=1.0, bandwidth=1.0)
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, evict=4.0), net)
    tr = res.transfers.to_pydict()
    out = [i for i, k in enumerate(tr["kind"]) if k == "O"][0]
    assert (tr["src_device"][out], tr["dst_device"][out]) == (0, 1)
    assert (tr["start"][out], tr["finish"][out]) == (2.0, 6.0)
    free = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, evict=4.0),
                       pc.Network(bytes=0.0, bandwidth=1.0)).transfers.to_pydict()
    assert free["start"][[i for i, k in enumerate(free["kind"]) if k == "O"][0]] == 1.0


def test_host_and_peer_offloads_mix():
    base = pc.build("1f1b", 4, 8)
    sched = pc.offload(pc.offload(base, stages=[1], microbatches=[2]), stages=[0],
                       microbatches=[1, 5], to=[3, -1, -1, -1])
    with pytest.raises(ValueError, match="set Costs.offload"):
        pc.simulate(sched, pc.Costs())
    res = pc.simulate(sched, pc.Costs(offload=0.5, evict=0.5))
    tr = res.transfers.to_pydict()
    routes = {(s, d) for s, d, k in zip(tr["src_device"], tr["dst_device"], tr["kind"])
              if k in ("O", "L")}
    assert routes == {(1, 1), (0, 3), (3, 0)}


def test_peer_only_schedule_needs_no_offload_cost_and_host_sharing_leaves_it_alone():
    sched = pc.build("bpipe", 4, 8)
    a = pc.simulate(sched, pc.Costs(evict=0.5))
    b = pc.simulate(sched, pc.Costs(evict=0.5, host_link_devices=2))
    assert a.makespan == b.makespan
    np.testing.assert_array_equal(a.peak_activation, b.peak_activation)


@pytest.mark.parametrize("bad, match", [
    ([1, 0], "offload_to' has 2 entries"),
    ([0, -1, -1], "entry 0 must be -1 \\(host\\) or another device"),
    ([5, -1, -1], "entry 0 must be -1"),
    ("host", "must be a sequence"),
    ([True, -1, -1], "entry 0"),
])
def test_offload_to_is_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        pc.offload(pc.build("1f1b", 3, 3), stages=[0], to=bad)


def test_costs_evict_is_checked():
    with pytest.raises(ValueError, match="evict"):
        pc.Costs(evict=-1.0)


def test_recompute_keeps_the_partner():
    sched = pc.build("bpipe", 8, 16)
    again = pc.recompute(sched, stages=[4])
    assert again.offload_to == sched.offload_to
