"""generate.memory_greedy: memory-aware list scheduling with split backward."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.schedules.generate import memory_greedy

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 5), m=st.integers(1, 10), vee=st.booleans(),
       f=st.floats(0.2, 2.0), b=st.floats(0.2, 2.0), w=st.floats(0.0, 2.0),
       comm=st.sampled_from([0.0, 0.3]), aw=st.floats(0.0, 1.0), extra=st.floats(0.0, 8.0),
       w_fill=st.sampled_from([0.0, 0.5, 1.0]))
def test_valid_and_within_limit(p, m, vee, f, b, w, comm, aw, extra, w_fill):
    placement = list(range(p)) + (list(range(p))[::-1] if vee else [])
    costs = pc.Costs(f=f, b=b, w=w, comm=comm, activation=1.0, activation_w=aw, weights=0.5)
    # The least a device needs: its weights plus one microbatch on each of its stages.
    per_stage = 1.0 / (2 if vee else 1)
    need = 0.5 + per_stage * (2 if vee else 1)
    limit = need + extra
    sched = memory_greedy(placement, m, costs, limit, w_fill=w_fill)
    pc.validate(sched)
    res = pc.simulate(sched, costs)
    assert (res.peak_activation + res.static_memory).max() <= limit * (1 + 1e-9)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 24), (6, 18)])
def test_unit_costs_match_zb_h1_at_its_memory(p, m):
    # ZB paper (ICLR 2024), section 3: with T_F = T_B = T_W = 1, ZB-H1 keeps
    # 1F1B's peak (p microbatches) and has bubble (p - 1)(T_F + T_B - T_W), so
    # the makespan is 3m + p - 1. The greedy, given that memory and 1F1B's
    # warm-up, does no worse.
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation=1.0, activation_w=0.5, weights=0.0)
    sched = memory_greedy(range(p), m, costs, float(p), warmup=[p - d for d in range(p)],
                          w_fill=0.5)
    res = pc.simulate(sched, costs)
    assert res.makespan <= 3 * m + p - 1
    assert res.peak_activation.max() <= p


@pytest.mark.parametrize("p,m", [(3, 9), (4, 12), (8, 24)])
@pytest.mark.parametrize("w_fill", [0.0, 0.5, 1.0])
def test_unlimited_memory_linear_reaches_the_lower_bound(p, m, w_fill):
    # With unit costs the last device cannot start before p - 1 and has 3m of
    # work, so 3m + p - 1 is a lower bound on any schedule's makespan; ZB-H2
    # reaches it (ZB paper, section 3: zero bubble in steady state) and so
    # must the greedy when memory is not limited.
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=0.5, weights=0.0)
    res = pc.simulate(memory_greedy(range(p), m, costs, w_fill=w_fill), costs)
    assert res.makespan == 3 * m + p - 1


@pytest.mark.parametrize("kwargs,match", [
    ({"memory_limit": 0.5}, r"memory_limit 0.5 is below what device 0 needs"),
    ({"warmup": 0}, "'warmup' must be >= 1"),
    ({"warmup": [1, 2]}, "'warmup' has 2 entries for 4 devices"),
    ({"costs": 3}, "'costs' must be a pipecore.Costs"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory_greedy(range(4), 8, **kwargs)


def test_warmup_search_reaches_a_shallower_warmup_under_a_tight_limit():
    # p=4, m=8, F=B=W=1, M_W = M_B / 2, limit 3 microbatches: the proven MILP
    # optimum of the linear placement is 31 (tests/test_milp.py); fixed
    # warm-ups p-d+k give 33 at best. The search finds a depth below 1F1B's
    # on some device and reaches 31.
    from pipecore.schedules.generate import warmup_search

    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=0.5, weights=0.0)
    sched = warmup_search(range(4), 8, costs, 3.0)
    res = pc.simulate(sched, costs)
    assert res.makespan == 31.0
    assert res.peak_activation.max() <= 3.0
    warm = sched.params["warmup"]
    assert any(w < 4 - d for d, w in enumerate(warm))
    fixed = min(pc.simulate(pc.generate.memory_greedy(range(4), 8, costs, 3.0,
                                                      [4 - d + k for d in range(4)], wf),
                            costs).makespan for k in range(5) for wf in (0.0, 0.5, 1.0))
    assert fixed == 33.0


def test_warmup_search_errors():
    from pipecore.schedules.generate import warmup_search

    with pytest.raises(ValueError, match="no warm-up gives"):
        warmup_search(range(4), 8, pc.Costs(activation=1.0, weights=0.0), 0.5)
    with pytest.raises(ValueError, match="'max_evals' must be >= 1"):
        warmup_search(range(4), 8, max_evals=0)


# The Numba kernel (kernels/greedy.py) against the plain-Python reference it
# was ported from (tests/reference_generate.py): same programs op for op, and the
# same error where every device waits. Shapes include V placements, random
# placements with idle devices, per-stage cost vectors, warm-up caps and
# limits tight enough to stall.
@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 9), layout=st.sampled_from(["linear", "vee", "random"]),
       seed=st.integers(0, 10_000), f=st.floats(0.1, 2.0), b=st.floats(0.1, 2.0),
       w=st.floats(0.0, 2.0), comm=st.sampled_from([0.0, 0.25, 1.0]), aw=st.floats(0.0, 1.0),
       limit=st.one_of(st.none(), st.floats(0.5, 12.0)),
       warm=st.one_of(st.none(), st.integers(1, 6)), w_fill=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
       per_stage=st.booleans())
def test_kernel_equals_the_python_reference(p, m, layout, seed, f, b, w, comm, aw, limit, warm,
                                            w_fill, per_stage):
    import numpy as np
    from reference_generate import memory_greedy_reference
    rng = np.random.default_rng(seed)
    if layout == "linear":
        placement = list(range(p))
    elif layout == "vee":
        placement = list(range(p)) + list(range(p))[::-1]
    else:
        placement = [int(x) for x in rng.integers(0, p, size=int(rng.integers(1, 2 * p + 1)))]
    S = len(placement)
    if per_stage:
        costs = pc.Costs(f=rng.uniform(0.1, 2, S), b=rng.uniform(0.1, 2, S), w=rng.uniform(0, 2, S),
                         comm=comm, activation=1.0, activation_w=aw, weights=0.5)
    else:
        costs = pc.Costs(f=f, b=b, w=w, comm=comm, activation=1.0, activation_w=aw, weights=0.5)
    args = (placement, m, costs, limit, warm, w_fill)
    try:
        want = memory_greedy_reference(*args)
    except ValueError as exc:
        with pytest.raises(ValueError) as got:
            memory_greedy(*args)
        assert str(got.value) == str(exc)
        return
    got = memory_greedy(*args)
    assert got.table.equals(want.table)
    assert got.devices == want.devices
