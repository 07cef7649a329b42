"""Chimera's placement space (issue 16): down=, up_placement=, down_layers=, up_layers=.

The golden values come from outside the code under test:

* tests/fixtures/chimera_golden.json froze today's chimera, op for op (its
  action lists, every op's start and finish, per-device peaks), at commit
  bf32e4c before the knobs existed; tests/fixtures/chimera_golden_gen.py is
  the script that wrote it (its commit is a31342a, before this file).
* every variant is simulated by tests/reference.py with per-segment costs
  computed here from the layer shares (a stage holding share q of the model
  takes q * p times a device share's time), and checked against closed
  forms for busy time and weights.
"""

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import simulate_reference

import pipecore as pc
from pipecore.schedules.chimera import PlacementWarning

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "chimera_golden.json").read_text())
G_COSTS = pc.Costs(f=1.0, b=1.5, w=0.75, activation=1.0, weights=2.0)
G_NET = pc.Network(bytes=1.0, bandwidth=4.0, latency=0.25, grad_bytes=3.0)


def _check_golden(sched, case):
    res = pc.simulate(sched, G_COSTS, G_NET)
    assert res.start.tolist() == case["start"]
    assert res.finish.tolist() == case["finish"]
    assert res.peak_activation.tolist() == case["peak_activation"]
    assert res.static_memory.tolist() == case["static_memory"]


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"p{c['devices']}m{c['microbatches']}"
                                                               f"-{c['variant']}")
def test_defaults_equal_frozen_chimera(case):
    p, m = case["devices"], case["microbatches"]
    sched = pc.build("chimera", p, m, variant=case["variant"])
    assert sched.to_actions() == {int(k): v for k, v in case["actions"].items()}
    _check_golden(sched, case)


@pytest.mark.parametrize("case", [c for c in GOLDEN["cases"] if c["variant"] == "direct"],
                         ids=lambda c: f"p{c['devices']}m{c['microbatches']}")
def test_explicit_defaults_equal_frozen_chimera(case):
    p, m = case["devices"], case["microbatches"]
    # The frozen cases join units directly (forward doubling is the default
    # from m = 2p on since issue 52, for these knob values too).
    sched = pc.build("chimera", p, m, down=m // 2, up_placement=list(range(p - 1, -1, -1)),
                     variant="direct")
    assert sched.to_actions() == {int(k): v for k, v in case["actions"].items()}
    _check_golden(sched, case)
    # Equal shares in any unit: the same stages, listed as one unit each
    # (layer shares take direct concatenation only).
    even = pc.build("chimera", p, m, down_layers=[3] * p, up_layers=[3] * p)
    assert even.to_actions() == {int(k): v for k, v in case["actions"].items()}
    assert even.params["stage_layers"] == [3] * p
    _check_golden(even, case)


@pytest.mark.parametrize("kwargs,match", [
    (dict(down=0), r"1 <= down <= microbatches - 1 = 7.*got down=0"),
    (dict(down=8), r"got down=8"),
    (dict(down=2.0), r"down must be an int \(got 2.0\)"),
    (dict(down=True), r"down must be an int \(got True\)"),
    (dict(up_placement=[3, 2, 1]), r"each of the 4 up-pipeline stages \(got 3 entries"),
    (dict(up_placement=[3, 2, 1, 4]), r"up_placement\[3\] must be a device index in 0..3 \(got 4\)"),
    (dict(up_placement=[3, 2, 1, -1]), r"up_placement\[3\].*got -1"),
    (dict(up_placement=5), r"up_placement must be a sequence of 4 device indices \(got 5\)"),
    (dict(down_layers=[1, 2, 3]), r"down_layers must give the share of each of the 4 stages"),
    (dict(up_layers=[1, 0, 1, 1]), r"up_layers\[1\] must be an int >= 1.*got 0"),
    (dict(down_layers=[1, 1.5, 1, 1]), r"down_layers\[1\].*got 1.5"),
    (dict(down_layers=[1, 1, 1, 1], up_layers=[2, 2, 2, 2]),
     r"sums must be equal \(got 4 for down_layers=\[1, 1, 1, 1\] and 8"),
    (dict(variant="forward-doubling", down=3), r"forward doubling takes only the default placement"),
    (dict(order="greedy"), r"order must be None, 'chimera' or 'list' \(got 'greedy'\)"),
    (dict(order="chimera", down=3), r"holds only an even microbatch split \(down = microbatches / 2 = 4\)"),
    (dict(order="list", variant="forward-doubling"), r"order='list' needs variant='direct'"),
])
def test_bad_knobs_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pc.build("chimera", 4, 8, **kwargs)


def test_formula_only_for_the_symmetric_placement():
    c = pc.Costs(f=1.0, b=2.0)
    plain = pc.formula(pc.build("chimera", 4, 8), c)["makespan"]
    # Forward doubling (the default at m = 2p) with b = 2f: (p-2)/2 (f + b)
    # of bubble beside m (f + b) of work, the paper's ratio.
    assert plain == 8 * 3 + 1 * 3
    # Layer shares keep direct concatenation: bubble ratio 0.200 at b = 2f
    # (docs/research/bidirectional.md 1.6), a makespan of 24 / 0.8 = 30.
    explicit = pc.build("chimera", 4, 8, down=4, up_placement=(3, 2, 1, 0), down_layers=[2] * 4)
    assert pc.formula(explicit, c)["makespan"] == 30.0 == pc.simulate(explicit, c).makespan
    assert pc.formula(pc.build("chimera", 4, 8, variant="direct"), c)["makespan"] == 30.0
    for kw in (dict(down=3), dict(order="list"), dict(down_layers=[1, 2, 2, 3]),
               dict(up_placement=[1, 0, 3, 2])):
        with pytest.raises(ValueError, match="closed form only for the symmetric placement"):
            pc.formula(pc.build("chimera", 4, 8, **kw), c)


def test_unknown_option_still_refused():
    with pytest.raises(ValueError, match="takes no option 'down_split'"):
        pc.build("chimera", 4, 8, down_split=3)


def test_shared_device_placement_warns_and_counts_replicas():
    with pytest.warns(PlacementWarning, match=r"stages \[0, 1\] on device 3: it is no longer one "
                                              r"stage per pipeline per device; devices \[2\] hold"):
        sched = pc.build("chimera", 4, 4, up_placement=[3, 3, 0, 1])
    pc.validate(sched)
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, weights=1.0))
    # Device 3 holds down stage 3 and up stages 0 and 1; device 2 only down stage 2.
    assert res.static_memory.tolist() == [2.0, 2.0, 1.0, 3.0]
    assert sched.stage_devices == [(0, 3), (1, 3), (0, 2), (1, 3)]


def test_both_replicas_on_one_device_share_weights_and_skip_allreduce():
    sched = pc.build("chimera", 4, 4, up_placement=[0, 1, 2, 3])  # both pipelines downward
    assert "AR" not in {a[-2:] for prog in sched.to_actions().values() for a in prog}
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, weights=1.0))
    assert res.static_memory.tolist() == [1.0] * 4


def test_list_order_of_the_symmetric_placement():
    # Same placement and split as Chimera, other order: same work, weights and
    # all-reduce pairs, a different program.
    chim = pc.build("chimera", 4, 8)
    lst = pc.build("chimera", 4, 8, order="list")
    assert lst.to_actions() != chim.to_actions()
    assert lst.stage_devices == chim.stage_devices == [(0, 3), (1, 2), (1, 2), (0, 3)]
    c = pc.Costs(f=1.0, b=2.0, weights=1.0)
    a, b = pc.simulate(chim, c), pc.simulate(lst, c)
    np.testing.assert_array_equal(a.busy, b.busy)
    np.testing.assert_array_equal(a.static_memory, b.static_memory)


@pytest.mark.parametrize("p", [4, 8])
def test_list_order_tie_rule(p):
    # The docstring's claim: at m = p, F = 1, BW = 2 the list order takes as long
    # as Chimera's; at m = 4p it is shorter than direct concatenation (no
    # unit-boundary slots). With F = BW the paper's formula m (f+b) +
    # (p-2)(f+b)/2 is exact for Chimera.
    c = pc.Costs(f=1.0, b=2.0)
    assert (pc.simulate(pc.build("chimera", p, p, order="list"), c).makespan
            == pc.simulate(pc.build("chimera", p, p), c).makespan)
    assert (pc.simulate(pc.build("chimera", p, 4 * p, order="list"), c).makespan
            < pc.simulate(pc.build("chimera", p, 4 * p, variant="direct"), c).makespan)
    if p == 4:
        unit = pc.Costs(f=1.0, b=1.0)
        assert pc.simulate(pc.build("chimera", 4, 4, order="list"), unit).makespan == 4 * 2 + 1 * 2


def test_down_split_moves_microbatches():
    sched = pc.build("chimera", 4, 8, down=3)
    stage0 = {d: {a for a in acts if a.startswith("0F")} for d, acts in sched.to_actions().items()}
    # Down stage 0 on device 0 runs microbatches 0..2, up stage 0 (device 3) the other five.
    assert stage0[0] == {f"0F{j}" for j in range(3)}
    assert stage0[3] == {f"0F{j}" for j in range(3, 8)}


def test_layer_only_split_keeps_chimera_order():
    plain = pc.build("chimera", 4, 4).to_actions()
    sched = pc.build("chimera", 4, 4, down_layers=[1, 1, 2, 2])
    # Segments of one unit: stages 2 and 3 hold two each (segments 2-3, 4-5).
    assert sched.params["stage_layers"] == [1] * 6
    # Device 0 runs up stage 3 as segments 4 then 5 forward, 5 then 4 backward.
    assert sched.to_actions()[0][:6] == ["0F0", "0F1", "4F2", "5F2", "5BW2", "4BW2"]
    assert len(sched.to_actions()[0]) == len(plain[0]) + 5  # 5F, 5BW for 2 microbatches, 5AR
    # f = 1 per device share: stage 3 (two units of six) takes 4/3 per forward.
    res = pc.simulate(sched, pc.Costs(f=1.0, b=0.0))
    ops = res.ops.to_pydict()
    f5 = [ops["finish"][i] - ops["start"][i] for i in range(len(ops["kind"]))
          if ops["kind"][i] == "F" and ops["stage"][i] == 5]
    assert f5 == pytest.approx([4 / 6] * 4)


# -- every variant against the reference simulator ----------------------------

@st.composite
def variants(draw):
    p = draw(st.sampled_from([2, 4, 6]))
    m = p * draw(st.integers(1, 2))
    down = draw(st.integers(1, m - 1))
    if draw(st.booleans()):
        up = draw(st.permutations(list(range(p))))
    else:
        up = draw(st.lists(st.integers(0, p - 1), min_size=p, max_size=p))
    down_layers = draw(st.lists(st.integers(1, 3), min_size=p, max_size=p))
    # up_layers: another composition of the same total.
    total = sum(down_layers)
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=p - 1, max_size=p - 1,
                                unique=True))) if total - 1 >= p - 1 else list(range(1, p))
    up_layers = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    use_layers = draw(st.sampled_from(["none", "down", "both"]))
    kw = {"down": down, "up_placement": up, "order": draw(st.sampled_from([None, "list"]))}
    if use_layers == "down":
        kw["down_layers"] = down_layers
    elif use_layers == "both":
        kw.update(down_layers=down_layers, up_layers=up_layers)
    f = draw(st.sampled_from([0.5, 1.0, 1.25]))
    b = draw(st.sampled_from([0.0, 1.0, 2.0]))
    w = draw(st.sampled_from([0.0, 0.5]))
    return p, m, kw, pc.Costs(f=f, b=b, w=w, activation=1.0, weights=1.0)


def _share_arrays(sched, kw, costs):
    """Per-segment values from the layer shares, written from the docstring."""
    p, S = sched.devices, sched.stages
    layers = kw.get("down_layers")
    if layers is None:
        assert S == p
        share = [1.0 / p] * S
    else:
        total = sum(layers)
        g = math.gcd(*layers, *kw.get("up_layers", layers))
        assert S == total // g
        share = [g / total] * S
    return {name: [getattr(costs, name) * p * q for q in share]
            for name in ("f", "b", "w", "activation", "weights")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variants(), st.sampled_from([None, pc.Network(bytes=1.0, bandwidth=2.0, latency=0.5,
                                                     grad_bytes=1.5)]))
def test_every_variant_matches_reference(v, net):
    p, m, kw, costs = v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacementWarning)
        sched = pc.build("chimera", p, m, **kw)
    pc.validate(sched)
    arr = _share_arrays(sched, kw, costs)
    S = sched.stages

    def link(src, dst, s, nbytes=1.0):
        return (0.0, 0.0) if net is None else (nbytes / net.bandwidth, net.latency)

    ref = simulate_reference(sched.programs(), arr["f"], arr["b"], arr["w"], arr["activation"],
                             [0.0] * S, link,
                             ar_link=lambda a, b_, s: link(a, b_, s, 0.0 if net is None else 1.5))
    assert ref["status"] == "ok"
    res = pc.simulate(sched, costs, net)
    np.testing.assert_allclose(res.start, [x for prog in ref["start"] for x in prog], rtol=1e-12)
    np.testing.assert_allclose(res.finish, [x for prog in ref["finish"] for x in prog], rtol=1e-12)
    np.testing.assert_allclose(res.peak_activation, ref["peak"], rtol=1e-12)
    # Closed forms: each device is busy for (f + b + w) * p * share of every
    # stage replica it holds, times that pipeline's microbatches; weights
    # count once per distinct segment a device holds.
    busy = np.zeros(p)
    weights = np.zeros(p)
    held = set()
    programs = sched.programs()
    for d, prog in enumerate(programs):
        for kind, s, _mb in prog:
            if kind == "F":
                busy[d] += arr["f"][s] + arr["b"][s] + arr["w"][s]
            if kind != "AR" and (s, d) not in held:
                held.add((s, d))
                weights[d] += arr["weights"][s]
    np.testing.assert_allclose(res.busy, busy, rtol=1e-12)
    np.testing.assert_allclose(res.static_memory, weights, rtol=1e-12)
    total_f = sum(1 for prog in programs for a in prog if a[0] == "F")
    assert total_f == S * m


def test_stage_layers_feed_model_costs():
    # A uniform 8-layer model on unit hardware: each layer takes F = 0.5, B = 1,
    # W = 0.25 and holds 1 byte of activation and 2 of weights. Per-stage Costs
    # from pc.Model for the schedule's segments must give what scalar Costs of
    # one device share (8 / 4 = 2 layers) give.
    model = pc.Model.uniform(8, f=0.5, b=1.0, w=0.25, activation=1.0, weights=2.0)
    hw = pc.Hardware(flops=1.0, memory_bandwidth=float("inf"), link_bandwidth=1.0,
                     link_latency=0.0)
    sched = pc.build("chimera", 4, 8, down_layers=[1, 2, 2, 3], up_layers=[3, 2, 2, 1])
    per_stage = model.costs(sched.params["stage_layers"], hw)
    scalar = pc.Costs(f=1.0, b=2.0, w=0.5, activation=2.0, weights=4.0)
    a, b = pc.simulate(sched, per_stage), pc.simulate(sched, scalar)
    np.testing.assert_allclose(a.finish, b.finish, rtol=1e-12)
    np.testing.assert_allclose(a.peak_activation, b.peak_activation, rtol=1e-12)
    np.testing.assert_allclose(a.static_memory, b.static_memory, rtol=1e-12)
    # Device 0 holds down stage 0 (layer 0) and up stage 3 (layer 7); device 1
    # layers 1-2 and 5-6; device 2 both replicas of layers 3-4 (one copy);
    # device 3 layers 5-7 and 0-2. Two bytes of weights per layer.
    assert a.static_memory.tolist() == [4.0, 8.0, 4.0, 12.0]
