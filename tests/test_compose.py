"""pc.compose: placements, order policies and W rules built by the unit-time list scheduler.

Golden values: the family builders (pipecore.build), independent code written
from the papers and from PyTorch's schedules; a preset must equal its family
op for op. The rules' own oracle is tests/reference_compose.py
(tests/test_compose_reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import pipecore as pc
from pipecore.schedules.compose import presets
from pipecore.schedules.orders import Order

pytestmark = pytest.mark.kernels

CHUNKED = {"interleaved-1f1b": (2, 3), "looped-bfs": (2, 3), "interleaved-zb": (2, 3),
           "hanayo": (2, 4)}


def _shapes(name):
    for p in (1, 2, 3, 4, 6):
        for m in sorted({1, 2, p, 2 * p, 3 * p + 1, 4 * p}):
            for v in CHUNKED.get(name, (None,)):
                yield p, m, v


def _same(a, b):
    cols = ("device", "slot", "stage", "microbatch")
    return (all(np.array_equal(a.table.column(c).to_numpy(), b.table.column(c).to_numpy())
                for c in cols) and np.array_equal(a.kind_codes, b.kind_codes))


def test_at_least_ten_families_are_presets():
    assert len(presets()) >= 10
    assert set(presets()) <= set(pc.schedules())


@pytest.mark.parametrize("name", presets())
def test_preset_equals_its_family_op_for_op(name):
    checked = 0
    for p, m, v in _shapes(name):
        try:
            ref = pc.build(name, p, m, chunks=v) if v else pc.build(name, p, m)
        except ValueError:  # a shape the family refuses (e.g. m not a multiple of p)
            continue
        got = pc.compose(name, p, m, chunks=v) if v else pc.compose(name, p, m)
        assert got.programs() == ref.programs(), (name, p, m, v)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-h2", "hanayo", "zb-v"])
def test_preset_equals_its_family_at_a_larger_shape(name):
    v = CHUNKED.get(name, (None,))[0]
    ref = pc.build(name, 32, 128, chunks=v) if v else pc.build(name, 32, 128)
    got = pc.compose(name, 32, 128, chunks=v) if v else pc.compose(name, 32, 128)
    assert _same(got, ref)


@pytest.mark.parametrize("name", ["1f1b", "zb-h2", "interleaved-zb", "looped-bfs"])
def test_preset_written_on_all_threads_equals_its_family(name, monkeypatch):
    # Large tables are written by the parallel kernels: make every table
    # large enough here, so the small shapes take that path too.
    from pipecore.schedules import compose as C

    monkeypatch.setattr(C, "PARALLEL_MIN_OPS", 1)
    checked = 0
    for p, m, v in _shapes(name):
        try:
            ref = pc.build(name, p, m, chunks=v) if v else pc.build(name, p, m)
        except ValueError:
            continue
        got = pc.compose(name, p, m, chunks=v) if v else pc.compose(name, p, m)
        assert got.programs() == ref.programs(), (name, p, m, v)
        checked += 1
    assert checked >= 10


def test_default_order_on_a_line_is_1f1b_and_zb_h1():
    for p, m in [(1, 1), (2, 3), (4, 4), (5, 11)]:
        assert pc.compose(placement="linear", devices=p,
                          microbatches=m).programs() == pc.build("1f1b", p, m).programs()
        assert pc.compose(placement="linear", devices=p, microbatches=m,
                          split_backward=True).programs() == pc.build("zb-h1", p, m).programs()
        assert pc.compose(placement="linear", devices=p, microbatches=m,
                          order=pc.orders.breadth_first("fifo")).programs() == \
            pc.build("gpipe", p, m).programs()


def test_the_issues_calls():
    assert pc.compose("zb-v", devices=4, microbatches=16).programs() == \
        pc.build("zb-v", 4, 16).programs()
    s = pc.compose(placement="v", devices=4, microbatches=16,
                   order=pc.orders.one_f_one_b(inflight=6), split_backward=True)
    assert s.devices == 4 and s.num_ops == 8 * 16 * 3
    comp = s.params["composition"]
    assert comp["placement"] == "v" and comp["device_of"] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert comp["order"]["inflight"] == 6 and comp["split_backward"] is True
    s2 = pc.compose(placement=[0, 1, 2, 3, 3, 2, 1, 0], microbatches=16,
                    order=pc.orders.breadth_first(), w="late")
    assert s2.params["composition"]["w"] == "late"
    # breadth first: every forward before any backward on every device
    for prog in s2.programs():
        kinds = [k for k, _, _ in prog]
        assert kinds.index("B") == 32 and kinds[-16:] == ["W"] * 16
    res = pc.simulate(s, pc.Costs(f=1.0, b=1.0, w=1.0))
    assert res.makespan > 0


def test_inflight_caps_held_activation():
    # One activation per stage and microbatch held from F to B: a cap of c
    # microbatches in flight holds at most c activations per stage of the device.
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation=1.0, activation_w=0.0)
    peaks = []
    for cap in (2, 3, 4):
        s = pc.compose(placement="v", devices=4, microbatches=16,
                       order=pc.orders.one_f_one_b(inflight=cap), w="bubbles")
        peak = pc.simulate(s, costs).peak_activation
        # Costs' activation is per device: each of a V device's 2 stages holds half.
        assert peak.max() <= cap * 2 * 0.5 + 1e-9
        peaks.append(peak.max())
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def test_w_rules_place_w_where_they_say():
    base = dict(placement="linear", devices=3, microbatches=6)
    with_b = pc.compose(**base, w="with").programs()
    for prog in with_b:  # every B is followed at once by its own W
        for i, (k, s, j) in enumerate(prog):
            if k == "B":
                assert prog[i + 1] == ("W", s, j)
    late = pc.compose(**base, w="late").programs()
    for prog in late:  # no W before the device's last B
        kinds = [k for k, _, _ in prog]
        assert max(i for i, k in enumerate(kinds) if k == "B") < kinds.index("W")
    lag = pc.compose(**base, w=[0, 1, 2]).programs()
    assert lag == pc.build("zb-h1", 3, 6).programs()


def test_composed_schedule_is_a_schedule():
    s = pc.compose(placement="wave", devices=3, waves=2, microbatches=6,
                   order=pc.orders.greedy(inflight=4), split_backward=True, w="bubbles")
    pc.validate(s)
    actions = s.to_actions()
    assert sum(len(a) for a in actions.values()) == s.num_ops
    res = pc.simulate(s, pc.Costs(f=1.0, b=1.0, w=1.0))
    assert np.all(res.peak_activation > 0)


def test_preset_params_name_the_family_so_its_formula_applies():
    s = pc.compose("interleaved-1f1b", 4, 8, chunks=2)
    b = pc.build("interleaved-1f1b", 4, 8, chunks=2)
    assert {k: s.params[k] for k in b.params} == b.params
    assert pc.formula(s, pc.Costs())["makespan"] == pc.formula(b, pc.Costs())["makespan"]
    # A composition that is not a preset has no family, and the report says why.
    from pipecore.output.report import result_views

    plain = pc.compose(placement="v", devices=2, microbatches=4, w="bubbles")
    assert "family" not in plain.params
    views = result_views(pc.simulate(plain, pc.Costs()))
    assert views["flags"] == ["simulation only: a composed schedule (placement v, order "
                              "alternate, W bubbles) has no closed formula"]


def test_preset_choices_can_be_replaced():
    s = pc.compose("zb-h1", 4, 8, w="bubbles")
    assert s.params["composition"]["preset"] == "zb-h1"
    assert s.params["composition"]["overridden"] == ["w"]
    assert s.programs() != pc.build("zb-h1", 4, 8).programs()


@pytest.mark.parametrize("kwargs, message", [
    (dict(preset="nope", devices=2, microbatches=2), "unknown preset 'nope'"),
    (dict(preset="dualpipev", devices=2, microbatches=4), "not a preset of compose"),
    (dict(preset="zb-v", devices=2, microbatches=4, w="late"), "does not apply to the rotate"),
    (dict(preset="1f1b", microbatches=4), "needs 'devices'"),
    (dict(preset="1f1b", devices=2, microbatches=4, chunks=2), "'chunks' must be 1"),
    (dict(placement="zigzag", devices=2, microbatches=2), "unknown placement 'zigzag'"),
    (dict(placement=[0, 2, 1, 3, 5], microbatches=2), "device 4 holds no stage"),
    (dict(placement=[0, -1], microbatches=2), "stage 1 has device -1"),
    (dict(placement=[0, 1], devices=3, microbatches=2), "'devices' is 3 but the placement"),
    (dict(placement="v", microbatches=2), "needs 'devices'"),
    (dict(placement="linear", devices=2, microbatches=2, w="late", split_backward=False),
     "only with split_backward=True"),
    (dict(placement="linear", devices=2, microbatches=2, w="soon"), "unknown W rule 'soon'"),
    (dict(placement="linear", devices=2, microbatches=2, w=[0]), "'w' has 1 entries for 2"),
    (dict(placement="linear", devices=2, microbatches=0), "'microbatches' must be >= 1"),
    (dict(placement="linear", devices=2, microbatches=2, order="1f1b"), "must be a pipecore.orders"),
    (dict(placement="linear", devices=2, microbatches=2,
          order=pc.orders.one_f_one_b(warmup=[1, 2, 3])), "has 3 entries for 2 devices"),
])
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        pc.compose(**kwargs)


@pytest.mark.parametrize("make, message", [
    (lambda: pc.orders.one_f_one_b(warmup="long"), "order 'warmup' must be 'short', 'fill', 'all'"),
    (lambda: pc.orders.one_f_one_b(inflight=0), "'inflight' must be >= 1"),
    (lambda: pc.orders.one_f_one_b(group=0), "'group' must be >= 1"),
    (lambda: pc.orders.greedy(first="sideways"), "'first' must be 'backward' or 'forward'"),
    (lambda: pc.orders.breadth_first(backward="random"), "'backward' must be 'fifo' or 'lifo'"),
    (lambda: Order("round-robin"), "order policy 'round-robin'"),
    (lambda: Order("alternate", group="ready", backward="lifo"), "needs group= an int"),
    (lambda: pc.orders.greedy(overlap="yes"), "order 'overlap' must be True or False"),
    (lambda: Order("rotate", overlap=True), "the rotate order has no overlapped F&B units"),
])
def test_bad_orders_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_overlapped_units_share_a_slot_and_keep_the_rules():
    # Which units form is checked against tests/reference_compose.py
    # (test_compose_reference.py); here, what any unit must be.
    s = pc.compose(placement="v", devices=2, microbatches=4,
                   order=pc.orders.one_f_one_b(overlap=True))
    prog = s.programs()[0]
    units = [u for p in s.programs() for u in p if isinstance(u[0], tuple)]
    assert units and all(u[0][0] == "F" and u[0][1] != u[1][1] for u in units)
    assert s.params["composition"]["order"]["overlap"] is True
    # Same ops as without overlap, fewer slots; the families' checks pass (validated).
    plain = pc.compose(placement="v", devices=2, microbatches=4, order=pc.orders.one_f_one_b())
    flat = sorted(op for p in s.programs() for u in p
                  for op in (u if isinstance(u[0], tuple) else [u]))
    assert flat == sorted(op for p in plain.programs() for op in p)
    assert len(prog) < len(plain.programs()[0])


def test_deadlock_names_the_waiting_devices():
    # Fixed streams with strict 1F1B on a V: device 0's next backward needs
    # device 1's, which waits for a forward device 0 runs only after it.
    order = Order("alternate", group=4, warmup="short", strict=True)
    with pytest.raises(pc.ScheduleError, match="deadlock") as err:
        pc.compose(placement="v", devices=4, microbatches=16, order=order, w="with")
    text = str(err.value)
    assert "device 0 waits for B(stage 0, microbatch 0), which needs B(stage 1, microbatch 0)" \
        in text
    assert "A longer warm-up or a higher inflight cap" in text


def test_cap_deadlock_says_the_cap():
    # Strict 1F1B over fixed streams with one microbatch in flight on a V:
    # after F0 of both its stages and the last stage's B, device 0 wants its
    # next forward (a new microbatch, held back by the cap) before the
    # backward that would free the cap.
    order = Order("alternate", group=1, warmup="short", inflight=1, strict=True)
    with pytest.raises(pc.ScheduleError, match="device 0 has 1 microbatch in flight, its "
                       "inflight cap, and waits for one to finish before F\\(stage 0, "
                       "microbatch 1\\)"):
        pc.compose(placement="v", devices=3, microbatches=4, order=order)
    # The greedy policy, not bound to an alternation, finishes under the same cap.
    s = pc.compose(placement="v", devices=3, microbatches=4, order=pc.orders.greedy(inflight=1))
    assert s.num_ops == 6 * 4 * 2


def _strict_case(rng):
    """A random composition over strict fixed streams (what the stepless path takes)."""
    p = int(rng.integers(1, 5))
    S = int(rng.integers(p, 3 * p + 1))
    placement = list(range(p)) + [int(x) for x in rng.integers(0, p, S - p)]
    rng.shuffle(placement)
    if rng.random() < 0.5:  # the named placements, where the families live
        placement = rng.choice(["linear", "looped", "v"])
    m = int(rng.integers(1, 9))
    warmup = rng.choice(["short", "fill", "all", "int", "list"])
    warmup = {"int": int(rng.integers(1, 2 * p + 2)),
              "list": [int(x) for x in rng.integers(1, 2 * p + 2, p)]}.get(warmup, warmup)
    group = rng.choice([None, "all", 1, 2, 3])
    inflight = None if rng.random() < 0.6 else int(rng.integers(1, 2 * p + 2))
    order = Order("alternate", group=group, warmup=warmup, inflight=inflight, strict=True,
                  backward=rng.choice(["fifo", "lifo"]))
    split = bool(rng.random() < 0.6)
    w = rng.choice(["with", "late", "staggered", "lag", "lags"]) if split else None
    w = {"lag": int(rng.integers(0, 4)),
         "lags": [int(x) for x in rng.integers(0, 2 * p, p)]}.get(w, w)
    return p, placement, m, order, split, w


@pytest.mark.parametrize("cases, threads", [(600, False), (200, True)])
def test_stepless_writing_equals_stepping(cases, threads, monkeypatch):
    """Strict fixed streams are written device by device without time steps
    (kernels.compose.strict_kernel); stepping through unit time
    (compose_kernel, which tests/test_compose_reference.py checks against
    the plain-Python oracle) must give the same op table, or the same
    deadlock."""
    from pipecore.core.schedule import ScheduleError
    from pipecore.schedules import compose as C
    from pipecore.schedules import placements as P

    if threads:  # every table "large": the check beside the writing, on two threads
        monkeypatch.setattr(C, "PARALLEL_MIN_OPS", 1)
    rng = np.random.default_rng(41)
    kinds = {"same": 0, "deadlock": 0}
    for _ in range(cases):
        p, placement, m, order, split, w = _strict_case(rng)
        pl = P.resolve(placement, p, chunks=2 if placement == "looped" else None)
        sb, rule = C._split_and_w(split, w)
        got = []
        for stepless in (True, False):
            try:
                cols, _ = C._run(pl, m, order, sb, rule, C._untimed(), stepless=stepless)
                got.append([np.asarray(c).tolist() for c in cols])
            except ScheduleError as exc:
                got.append(str(exc))
        assert got[0] == got[1], (placement, p, m, order, split, w)
        kinds["deadlock" if isinstance(got[0], str) else "same"] += 1
    assert kinds["same"] > cases // 2 and kinds["deadlock"] > cases // 4  # both outcomes


def test_two_pipelines_by_hand():
    # Chimera's placement at p=2, m=2, greedy (backward first), fused: microbatch 0
    # goes down (stage 0 on device 0), microbatch 1 up (stage 0 on device 1). By
    # hand at unit steps: step 0 both first stages' forwards; step 1 the second
    # stages' (their inputs came at step 0); step 2 the last stages' backwards;
    # step 3 the first stages'; then each device all-reduces its two stages,
    # both shared with the other device, in stage order.
    s = pc.compose(placement="bidirectional", devices=2, microbatches=2,
                   order=pc.orders.greedy())
    assert s.programs() == [
        [("F", 0, 0), ("F", 1, 1), ("BW", 1, 1), ("BW", 0, 0), ("AR", 0, None), ("AR", 1, None)],
        [("F", 0, 1), ("F", 1, 0), ("BW", 1, 0), ("BW", 0, 1), ("AR", 0, None), ("AR", 1, None)]]
    assert s.replicated and s.params["composition"]["chains"] == 2
    assert s.params["composition"]["placement"] == "bidirectional"
    pc.simulate(s)  # a replicated schedule simulates like Chimera's


@pytest.mark.parametrize("kwargs, message", [
    (dict(microbatches=3, order=pc.orders.greedy()), r"must be a multiple of 2 \(got 3\)"),
    (dict(microbatches=4, order=pc.orders.rotate()), "the rotate order visits the chunks of one"),
])
def test_two_pipelines_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pc.compose(placement="bidirectional", devices=2, **kwargs)


def test_two_pipelines_have_no_construction_timing():
    from pipecore.schedules import compose as C

    with pytest.raises(ValueError, match="no all-reduce for replicated stages"):
        C.timing(pc.placements.bidirectional(2), 4, pc.Costs())
    with pytest.raises(ValueError, match="chains' must be 1 or 2"):
        pc.placements.Placement((0, 1, 1), chains=3)
    with pytest.raises(ValueError, match="3 entries do not split into 2 chains"):
        pc.placements.Placement((0, 1, 1), chains=2)
