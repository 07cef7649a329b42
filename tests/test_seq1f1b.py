"""Seq1F1B (Sun et al., arXiv:2406.03488): order, closed forms, the paper's claims.

The reference order below is written from the description of the authors'
Megatron-LM loop (github.com/thunlp/Seq1F1B,
megatron/core/pipeline_parallel/schedules.py,
``forward_backward_pipelining_without_interleaving`` with
``config.seq1f1b_splits = k``, and the ``sequence_1f1b_queue`` of
sequence_split.py): p - rank + k - 2 warm-up forwards, then one forward and
one backward per step, then the cool-down backwards; the queue hands the
backward the last chunk of the oldest sequence not yet done.
"""

import numpy as np
import pytest

import pipecore as pc
from pipecore.core.ops import ScheduleError
from pipecore.schedules import seq1f1b
from pipecore.schedules.registry import family


def reference_programs(p, n, k):
    """Per-device actions of the authors' loop, replayed step by step."""
    programs = []
    for d in range(p):
        warm = min(p - d + k - 2, n)
        state = {"queue": [], "out": [], "fwd": 0}  # queue: [sequence, its waiting units]
        steps = ["F"] * warm + ["F", "B"] * (n - warm) + ["B"] * warm
        for step in steps:
            queue, out = state["queue"], state["out"]
            if step == "F":
                fwd = state["fwd"]
                out.append(f"{d}F{fwd}")
                # A forward fills its own sequence's group (fwd // k), whatever
                # the backwards already took from the older groups.
                if not queue or queue[-1][0] != fwd // k:
                    queue.append([fwd // k, []])
                queue[-1][1].append(fwd)
                state["fwd"] = fwd + 1
            else:
                unit = queue[0][1].pop()  # the last chunk of the oldest sequence
                if not queue[0][1]:
                    queue.pop(0)
                out.append(f"{d}BW{unit}")
        programs.append(state["out"])
    return programs


SHAPES = [(1, 4, 2), (2, 4, 2), (4, 8, 2), (4, 16, 4), (3, 6, 3), (5, 20, 4), (4, 4, 4),
          (4, 12, 1), (2, 8, 4), (8, 8, 8), (6, 12, 2), (4, 2, 2)]


@pytest.mark.parametrize("p,n,k", SHAPES)
def test_order_is_the_authors_loop(p, n, k):
    sched = pc.build("seq1f1b", p, n, seq_chunks=k)
    assert list(sched.to_actions().values()) == reference_programs(p, n, k)
    assert sched.microbatches == n and sched.params["seq_chunks"] == k


def test_one_chunk_is_1f1b():
    for p, m in [(4, 8), (3, 2), (6, 12)]:
        assert pc.build("seq1f1b", p, m, seq_chunks=1).table.equals(pc.build("1f1b", p, m).table)


def test_kernel_path_equals_numpy_path(monkeypatch):
    small = {(p, n, k): pc.build("seq1f1b", p, n, seq_chunks=k).table for p, n, k in SHAPES}
    monkeypatch.setattr(seq1f1b, "at_scale", lambda devices, length: True)
    for (p, n, k), table in small.items():
        assert pc.build("seq1f1b", p, n, seq_chunks=k).table.equals(table)


COSTS = [pc.Costs(f=1, b=1, w=0, comm=0), pc.Costs(f=1, b=2, w=1, comm=0),
         pc.Costs(f=1.3, b=0.7, w=0.2, comm=0, activation=2.5), pc.Costs(f=1, b=3, w=0, comm=0)]


@pytest.mark.parametrize("p,n,k", SHAPES)
def test_closed_forms_match_simulation_and_table(p, n, k):
    # The three views: formula_seq1f1b (1F1B's makespan over n units, warm-up
    # peak min(p - d + k - 1, n)) against the simulation and the ideal table.
    sched = pc.build("seq1f1b", p, n, seq_chunks=k)
    for c in COSTS:
        res = pc.simulate(sched, c)
        fm = family("seq1f1b").formula(p, n, 1, c, seq_chunks=k)
        assert res.makespan == pytest.approx(fm["makespan"])
        np.testing.assert_allclose(res.peak_activation, fm["peak_activation"])
    row = pc.analysis.compare.three_views(sched, pc.simulate(sched, COSTS[1]), COSTS[1], None)
    assert row["flags"] == []
    # F one slot, BW two (B + W): 1F1B's 3 (n + p - 1) slots.
    assert pc.ideal_table(sched).length == 3 * (n + p - 1)


@pytest.mark.parametrize("p,m,k", [(4, 8, 2), (8, 16, 4), (4, 4, 8), (16, 32, 2)])
def test_paper_bubble_and_memory_against_1f1b(p, m, k):
    # m sequences of time T_F + T_B each: 1F1B's bubble ratio (p-1)/(m+p-1);
    # Seq1F1B runs k m units of T/k, so (p-1)/(k m + p - 1) (the paper's claim
    # that finer units shrink the bubble, section 3; the formula is the 1F1B
    # one over units). Memory: device 0 holds p sequences' activations in
    # 1F1B and p + k - 1 chunks of 1/k of one in Seq1F1B.
    seq = pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.0, activation=1.0)
    unit = pc.Costs(f=1.0 / k, b=2.0 / k, w=0.0, comm=0.0, activation=1.0 / k)
    one = pc.simulate(pc.build("1f1b", p, m), seq)
    ours = pc.simulate(pc.build("seq1f1b", p, k * m, seq_chunks=k), unit)
    assert one.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))
    assert ours.bubble_ratio == pytest.approx((p - 1) / (k * m + p - 1))
    assert one.peak_activation.max() == pytest.approx(min(p, m))
    assert ours.peak_activation.max() == pytest.approx(min(p + k - 1, k * m) / k)
    # Same work: the busy time of every device is equal.
    np.testing.assert_allclose(ours.busy, one.busy)


def test_half_the_memory_of_1f1b_at_two_chunks():
    # The abstract's "half memory footprint" at k = 2: (p + 1) / (2p) of
    # 1F1B's peak, which tends to one half as p grows.
    for p in (4, 8, 16, 32):
        seq = pc.Costs(comm=0.0)
        unit = pc.Costs(f=0.5, b=1.0, w=0.0, comm=0.0, activation=0.5)
        one = pc.simulate(pc.build("1f1b", p, 2 * p), seq).peak_activation.max()
        ours = pc.simulate(pc.build("seq1f1b", p, 4 * p, seq_chunks=2), unit).peak_activation.max()
        assert ours / one == pytest.approx((p + 1) / (2 * p))


def test_chunk_order_is_checked():
    sched = pc.build("seq1f1b", 2, 4, seq_chunks=2)
    assert seq1f1b.check_chunk_order(sched, 2) is sched
    # Plain 1F1B's backward runs chunk 0 before chunk 1: not causal-safe.
    with pytest.raises(ScheduleError, match=r"chunk-order: device 0 slot \d+: 0BW0 comes before "
                                            r"0BW1.*seq_chunks=2"):
        seq1f1b.check_chunk_order(pc.build("1f1b", 2, 4), 2)
    # A forward of chunk 1 before chunk 0 on stage 0.
    swapped = pc.from_actions([["0F1", "0F0", "0BW1", "0BW0"], ["1F0", "1F1", "1BW1", "1BW0"]])
    with pytest.raises(ScheduleError, match=r"device 0 slot 0: 0F1 comes before 0F0 \(slot 1\)"):
        seq1f1b.check_chunk_order(swapped, 2)


def test_bad_options():
    with pytest.raises(ValueError, match=r"multiple of seq_chunks=4 \(got 6\)"):
        pc.build("seq1f1b", 2, 6, seq_chunks=4)
    with pytest.raises(ValueError, match=r"'seq_chunks' must be >= 1 \(got 0\)"):
        pc.build("seq1f1b", 2, 4, seq_chunks=0)
    with pytest.raises(ValueError, match=r"'seq1f1b' takes no option 'chunks_per_seq'"):
        pc.build("seq1f1b", 2, 4, chunks_per_seq=2)


# -- per-chunk work: Schedule.with_factors and with_chunk_costs --------------

def test_token_split_factors_are_the_causal_closed_form():
    # Even token split: chunk j of k does (1-a)/k of the linear work and
    # a (2j+1)/k^2 of the attention (token t reads t keys: the area of a
    # triangle's strip), i.e. k times that relative to the mean chunk.
    for k, a in [(2, 0.3), (4, 0.5), (8, 0.1)]:
        j = np.arange(k)
        got = seq1f1b.chunk_factors(seq1f1b.chunk_bounds(k, a, "tokens"), a)
        np.testing.assert_allclose(got, k * ((1 - a) / k + a * (2 * j + 1) / k**2))


def test_compute_split_balances_work_and_unbalances_tokens():
    # The paper's computation-wise partition: equal work per chunk, so the
    # later chunks hold fewer tokens. Work up to x is (1-a) x + a x^2.
    b = seq1f1b.chunk_bounds(4, 0.4, "compute")
    work = 0.6 * b + 0.4 * b**2
    np.testing.assert_allclose(work, np.arange(5) / 4)
    np.testing.assert_allclose(seq1f1b.chunk_factors(b, 0.4), 1.0)
    assert np.all(np.diff(np.diff(b)) < 0)


def test_factors_are_the_same_as_per_op_stragglers():
    # simulate applies time factors through the per-op factor path the
    # stragglers already use: the same times, bit for bit.
    sched = pc.build("seq1f1b", 4, 16, seq_chunks=4)
    heavy = seq1f1b.with_chunk_costs(sched, 0.4, 0.5)
    c = pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.1)
    a = pc.simulate(heavy, c)
    b = pc.simulate(sched, c, stragglers=heavy.factors.time)
    assert a.makespan == b.makespan
    np.testing.assert_array_equal(a.finish, b.finish)
    # Total work kept: factors average 1 per sequence.
    np.testing.assert_allclose(a.busy, pc.simulate(sched, c).busy)
    # With stragglers as well, both multiply.
    slow = pc.simulate(heavy, c, stragglers={0: 2.0})
    assert slow.makespan > a.makespan


def reference_peaks(sched, costs, act):
    """Running activation total per device in program order, factor by factor."""
    peaks = []
    for prog in sched.programs():
        total = best = 0.0
        for kind, s, u in prog:
            row = act[(s, u)]
            if kind == "F":
                total += costs.activation * row
                best = max(best, total)
            elif kind == "BW":
                total -= costs.activation * row
        peaks.append(best)
    return np.array(peaks)


def test_activation_factors_give_the_memory_of_uneven_chunks():
    sched = pc.build("seq1f1b", 4, 16, seq_chunks=4)
    heavy = seq1f1b.with_chunk_costs(sched, 0.4, 0.5, split="compute")
    tokens = 4 * np.diff(seq1f1b.chunk_bounds(4, 0.45, "compute"))
    act = {(s, u): tokens[u % 4] for s in range(4) for u in range(16)}
    c = pc.Costs(comm=0.0, activation=3.0)
    res = pc.simulate(heavy, c)
    np.testing.assert_allclose(res.peak_activation, reference_peaks(sched, c, act))
    # The timed memory curve reaches the same peaks and ends at zero.
    table = res.memory.table
    dev = table.column("device").to_numpy()
    total = table.column("activation").to_numpy()
    for d in range(4):
        assert total[dev == d].max() == pytest.approx(res.peak_activation[d])
        assert total[dev == d][-1] == pytest.approx(0.0, abs=1e-12)


def test_paths_that_would_ignore_factors_refuse():
    heavy = seq1f1b.with_chunk_costs(pc.build("seq1f1b", 2, 4, seq_chunks=2), 0.3, 0.3)
    rule = r"carries per-op work factors \(Schedule.with_factors\), which .* would ignore"
    with pytest.raises(ValueError, match=rule):
        pc.ideal_table(heavy)
    with pytest.raises(ValueError, match=rule):
        pc.simulate_many(heavy, {"f": [1.0, 2.0]})
    with pytest.raises(ValueError, match=rule):
        pc.recompute(heavy, stages=[0])
    with pytest.raises(ValueError, match=rule):
        pc.compile_schedule(heavy, pc.Costs())
    pc.validate(heavy)  # the rules do not depend on the work


def test_bad_factors():
    sched = pc.build("seq1f1b", 2, 4, seq_chunks=2)
    with pytest.raises(ValueError, match=r"'time' factors need one entry per op \(16\)"):
        sched.with_factors(time=[1.0])
    bad = np.ones(sched.num_ops)
    bad[3] = 0.0
    with pytest.raises(ValueError, match=r"'time' factor of op row 3 \(device 0 slot 3 .*\) must "
                                         r"be a finite number > 0 \(got 0.0\)"):
        sched.with_factors(time=bad)
    with pytest.raises(ValueError, match=r"but its forward's .* must be equal"):
        sched.with_factors(activation=np.where(sched.kind_codes == 0, 1.0, 2.0))
    with pytest.raises(ValueError, match=r"'attention_f' must be in \[0, 1\)"):
        seq1f1b.with_chunk_costs(sched, 1.0, 0.2)
    with pytest.raises(ValueError, match=r"needs a schedule built by pipecore.build\('seq1f1b'"):
        seq1f1b.with_chunk_costs(pc.build("1f1b", 2, 4), 0.1, 0.1)
    assert sched.with_factors(time=np.ones(16)) != sched


# -- the long-sequence study --------------------------------------------------

def test_attention_share_is_megatrons_closed_form():
    # Llama-2 7B block, b = 1: linear FLOPs 2 s (4 h^2 + 3 h f) (gated MLP,
    # kv heads = heads) and attention 4 s^2 h (the Model.transformer docstring,
    # Megatron eq. 2's terms): share 4 s^2 h / (that + 4 s^2 h).
    from pipecore.analysis.longseq import attention_shares
    h, f = 4096, 11008
    for s in (8192, 32768):
        got = attention_shares(pc.Model.preset("llama2-7b", seq=s),
                               pc.Model.preset("llama2-7b", seq=s // 2))
        linear = 2 * s * (4 * h * h + 3 * h * f)
        assert got["f"] == pytest.approx(4 * s * s * h / (linear + 4 * s * s * h), rel=1e-9)
        assert got["w"] == pytest.approx(0.0, abs=1e-9)


def test_study_memory_is_the_closed_form_and_the_compute_split_wins_long():
    from pipecore.analysis.longseq import seq1f1b_study
    rows = seq1f1b_study(seq_lengths=(8192, 65536), seq_chunks=(2, 4))
    by = {(r["seq"], r["schedule"]): r for r in rows}
    p = 8
    for s in (8192, 65536):
        assert by[(s, "1f1b")]["speedup"] == 1.0
        for k in (2, 4):
            # Equal tokens per chunk: device 0 holds (p + k - 1)/(k p) of 1F1B's activations.
            assert by[(s, f"seq1f1b k={k} tokens")]["memory_ratio"] == pytest.approx(
                (p + k - 1) / (k * p))
    # At 64k tokens attention is most of the work: equal-work chunks beat
    # equal-token chunks and every other schedule here.
    long = [r for r in rows if r["seq"] == 65536]
    assert max(long, key=lambda r: r["speedup"])["schedule"] == "seq1f1b k=4 compute"
    assert by[(65536, "seq1f1b k=4 tokens")]["speedup"] < 1.0
