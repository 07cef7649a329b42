"""pipecore.bindings.torch against PyTorch's own pipelining code.

Golden facts come from torch itself: its validator ``_validate_schedule``, its
parser ``_Action.from_str``, its runtime's CSV loader and lowering, and the
``pipeline_order`` its schedule classes compute. Tests that start processes
are further down (``run``).
"""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings

torch = pytest.importorskip("torch", reason="needs torch: pip install 'pipecore[torch]'")

from pipecore.bindings import torch as pt  # noqa: E402
from torch.distributed.pipelining import schedules as ts  # noqa: E402

import pipecore as pc  # noqa: E402
import pipecore.testing as pct  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "torch"
REPLICATED = {"chimera", "dualpipe", "bitpipe", "helixpipe"}
# Families that move activations off their rank (O and L ops): torch's
# pipelining has no such action (bindings/_export.py says so by op).
OFFLOADING = {"bpipe"}


# -- helpers independent of the code under test ---------------------------------------------

class _Stage:
    """What torch's schedule constructors and runtime read from a stage (no module, no group)."""

    def __init__(self, index, num_stages, ranks):
        self.stage_index = index
        self.num_stages = num_stages
        self.group_size = ranks
        self.group_rank = 0
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.submod = None
        self.stage_index_to_group_rank = {}


def _loss(out, target):
    return out.sum()


def torch_order(cls_name, p, m, v, style):
    """torch's pipeline_order for a schedule class, computed by torch."""
    n = p * v
    if style == "single":
        return getattr(ts, cls_name)(_Stage(0, n, p), n_microbatches=m, loss_fn=_loss).pipeline_order
    idx = [0, 2 * p - 1] if style == "v" else list(range(0, n, p))
    return getattr(ts, cls_name)([_Stage(i, n, p) for i in idx], n_microbatches=m,
                                 loss_fn=_loss).pipeline_order


def compute_strings(order):
    """Per rank, torch's strings of the compute actions (idle steps and REDUCE_GRAD dropped)."""
    return {r: [str(a) for a in acts if a is not None
                and a.computation_type != ts._ComputationType.REDUCE_GRAD]
            for r, acts in order.items()}


def combos(name):
    """(p, m, options, schedule) for the shapes the family itself accepts, p in {2,4,8}, m in {p,2p,4p}.

    Interleaved families are also tried with 3 and 4 chunks per device, hanayo with 2 waves.
    """
    fam = pc.family(name)
    variants = [{}]
    if fam.chunks and fam.fixed_chunks is None and not fam.options:
        variants += [{"chunks": 3}, {"chunks": 4}]
    if "waves" in fam.options:
        variants += [{"waves": 2}]
    out = []
    for p in (2, 4, 8):
        for m in (p, 2 * p, 4 * p):
            for opts in variants:
                try:
                    sched = pc.build(name, p, m, **opts)
                except ValueError:
                    continue  # the family's own rule (e.g. chimera: m a multiple of p)
                out.append((p, m, opts, sched))
    return out


# -- packaging ----------------------------------------------------------------------------------

def test_bindings_package_does_not_import_torch():
    code = ("import sys, pipecore.bindings; "
            "assert 'torch' not in sys.modules, 'importing pipecore.bindings imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_module_is_installed_under_pipecore():
    assert pt.__name__ == "pipecore.bindings.torch"
    import pipecore.bindings

    assert pipecore.bindings.torch is pt


# -- kind mapping ---------------------------------------------------------------------------------

def test_kinds_map_to_torch_computation_types():
    # Written by hand: F->F, B->I, W->W, BW->B, and an overlapped F&BW unit -> OVERLAP_F_B.
    sched = pc.from_actions({0: ["0F0", "0F1", "0B0", "0W0", "0BW1"],
                             1: ["1F0", "1F1&1BW0", "1BW1"]})
    order = pt.to_actions(sched)
    assert {r: [str(a) for a in acts] for r, acts in order.items()} == {
        0: ["0F0", "0F1", "0I0", "0W0", "0B1"],
        1: ["1F0", "(1F1;1B0)OVERLAP_F_B", "1B1"],
    }
    CT = ts._ComputationType
    assert [a.computation_type for a in order[0]] == [CT.FORWARD, CT.FORWARD, CT.BACKWARD_INPUT,
                                                      CT.BACKWARD_WEIGHT, CT.FULL_BACKWARD]
    pair = order[1][1]
    assert pair.computation_type == CT.OVERLAP_F_B
    assert pair.sub_actions == (ts._Action(1, CT.FORWARD, 1), ts._Action(1, CT.FULL_BACKWARD, 0))
    # torch's validator accepts it and infers the placement pipecore has.
    assert ts._validate_schedule(order, 2, 2, 2) == {0: 0, 1: 1}
    # torch's parser reads each string back to the same action.
    assert all(ts._Action.from_str(str(a)) == a for acts in order.values() for a in acts)
    assert pt.from_actions(order) == sched


def test_overlap_with_split_backward_maps_to_input_backward():
    sched = pc.from_actions({0: ["0F0", "0F1&0B0", "0W0", "0B1", "0W1"]})
    (acts,) = pt.to_actions(sched).values()
    assert [str(a) for a in acts] == ["0F0", "(0F1;0I0)OVERLAP_F_B", "0W0", "0I1", "0W1"]
    ts._validate_schedule({0: acts}, 1, 1, 2)
    assert pt.from_actions({0: acts}) == sched


def test_loop_v_and_arbitrary_placements_are_what_torch_infers():
    loop = [0, 1, 2, 3, 0, 1, 2, 3]
    vee = [0, 1, 2, 3, 3, 2, 1, 0]
    for name, opts, placement in (("interleaved-1f1b", {}, loop), ("zb-v", {}, vee),
                                  ("hanayo", {"waves": 2}, vee + vee)):  # a zig-zag of two Vs
        sched = pc.build(name, 4, 8, **opts)
        mapping = ts._validate_schedule(pt.to_actions(sched), 4, sched.stages, 8)
        assert mapping == dict(enumerate(placement)), name


class _TableOnly:
    """A schedule as to_actions reads it (table, devices, name), with kinds Schedule refuses."""

    def __init__(self, kinds, stages=None, devices=1):
        n = len(kinds)
        self.table = pa.table({"device": [0] * n, "slot": list(range(n)), "kind": kinds,
                               "stage": stages or [0] * n, "microbatch": [0] * n})
        self.devices = devices
        self.name = "stub"


def test_recompute_and_offload_are_refused_naming_the_op():
    # torch has no recompute, offload or load action.
    with pytest.raises(ValueError, match=r"device 0 slot 1 \(0R0\): torch has no recompute action"):
        pt.to_actions(_TableOnly(["F", "R", "BW"]))
    with pytest.raises(ValueError, match=r"device 0 slot 2 \(0R0\): torch has no recompute action"):
        pt.to_actions(pc.recompute(pc.build("1f1b", 2, 2)))
    with pytest.raises(ValueError, match=r"device 0 slot 1 \(0O0\): torch has no action that moves an "
                       r"activation off its rank"):
        pt.to_actions(pc.offload(pc.build("1f1b", 2, 2)))
    with pytest.raises(ValueError, match=r"device 0 slot 2 \(0X0\): torch has no action for kind 'X'"):
        pt.to_actions(_TableOnly(["F", "BW", "X"]))


def test_all_reduce_is_skipped():
    (acts,) = pt.to_actions(_TableOnly(["F", "BW", "AR"])).values()
    assert [str(a) for a in acts] == ["0F0", "0B0"]


@pytest.mark.parametrize("name", sorted(REPLICATED))
def test_replicated_families_are_refused(name):
    sched = pc.build(name, 4, 8)
    with pytest.raises(ValueError, match=r"stage \d+ runs on devices \[\d+(, \d+)+\].*replicated"):
        pt.to_actions(sched)
    with pytest.raises(ValueError, match="replicated"):
        pt.to_csv(sched, "/nonexistent/never-written.csv")
    # torch itself rejects the naive translation: a stage may live on one rank only.
    kinds = {"F": "F", "B": "I", "W": "W", "BW": "B"}
    naive = {d: [] for d in range(sched.devices)}
    for d, prog in enumerate(sched.programs()):
        for unit in prog:
            ops = unit if isinstance(unit[0], tuple) else (unit,)
            naive[d] += [ts._Action(s, ts._ComputationType(kinds[k]), j) for k, s, j in ops
                         if k != "AR"]
    with pytest.raises(AssertionError, match=r"Stage \d+ is assigned to both rank"):
        ts._validate_schedule(naive, sched.devices, sched.stages, sched.microbatches)


# -- round trips over every family ------------------------------------------------------------------

EXPORTABLE = [n for n in pc.schedules() if n not in REPLICATED | OFFLOADING]


@pytest.mark.parametrize("name", EXPORTABLE)
def test_every_family_round_trips_and_passes_torch(name, tmp_path):
    shapes = combos(name)
    assert shapes, f"{name}: no shape built"
    for p, m, opts, sched in shapes:
        where = f"{name} p={p} m={m} {opts}"
        order = pt.to_actions(sched)
        # torch's validator: every stage on one rank, F before I/B before W, m of each.
        mapping = ts._validate_schedule(order, p, sched.stages, m)
        assert mapping == {s: int(d) for s, d in enumerate(sched.placement)}, where
        # torch's lowering (sends/receives) finds an order that does not hang.
        lowered = ts._add_send_recv({r: list(a) for r, a in order.items()}, mapping.__getitem__,
                                    sched.stages)
        assert sum(a.is_compute_op for acts in lowered.values() for a in acts) == sum(
            len(acts) for acts in order.values()), where
        back = pt.from_actions(order)
        assert back == sched, where
        assert back.table.replace_schema_metadata(None).equals(
            sched.table.replace_schema_metadata(None)), where


def test_round_trip_coverage():
    tested = {n: len(combos(n)) for n in EXPORTABLE}
    assert sum(tested.values()) >= 150, tested
    assert all(tested.values()), tested
    refused = {}
    for name in pc.schedules():
        try:
            pt.to_actions(pc.build(name, 4, 8))
        except ValueError as exc:
            refused[name] = str(exc)
    assert set(refused) == REPLICATED | OFFLOADING, refused
    assert all("replicated" in refused[n] for n in REPLICATED)
    assert all("moves an activation off its rank" in refused[n] for n in OFFLOADING)


def test_csv_round_trip_and_torch_runtime_reads_it(tmp_path):
    for name in EXPORTABLE:
        for i, (p, m, _, sched) in enumerate(combos(name)[::3]):
            path = pt.to_csv(sched, tmp_path / f"{name}-{i}.csv")
            assert pt.from_csv(path) == sched
            # torch's runtime loads it (its parser, validator and lowering), here rank 0's view.
            n = sched.stages
            mine = [s for s in range(n) if int(sched.placement[s]) == 0]
            runtime = ts._PipelineScheduleRuntime([_Stage(s, n, p) for s in mine], n_microbatches=m,
                                                  loss_fn=_loss)
            runtime._load_csv(str(path), format="compute_only")
            assert compute_strings(runtime.pipeline_order) == {
                d: [str(a) for a in acts] for d, acts in pt.to_actions(sched).items()}
            assert runtime.stage_index_to_group_rank == {s: int(d) for s, d in enumerate(sched.placement)}


def test_from_csv_reads_torchs_own_dump(tmp_path):
    n, p, m = 8, 4, 8
    runtime = ts.ScheduleZBVZeroBubble([_Stage(0, n, p), _Stage(7, n, p)], n_microbatches=m,
                                       loss_fn=_loss)
    path = tmp_path / "torch.csv"
    runtime._dump_csv(str(path), format="compute_only")  # idle steps are empty cells
    assert ",," in path.read_text()
    assert pt.from_csv(path).to_actions() == pc.build("zb-v", 4, 8).to_actions()


def test_validate_runs_torchs_lowering():
    # Placement is loop style; device 1 runs 3F0 before 1F0, which 3F0 waits on through 2F0.
    sched = pc.from_actions({0: ["0F0", "2F0", "2BW0", "0BW0"], 1: ["3F0", "1F0", "3BW0", "1BW0"]})
    order = pt.to_actions(sched)
    ts._validate_schedule(order, 2, 4, 1)  # torch's validator alone does not see it
    with pytest.raises(AssertionError, match="can't schedule sends/recvs"):
        ts._add_send_recv({r: list(a) for r, a in order.items()}, {0: 0, 1: 1, 2: 0, 3: 1}.__getitem__, 4)
    with pytest.raises(ValueError, match="torch rejects the order.*can't schedule sends/recvs"):
        pt.validate(sched)
    with pytest.raises(pc.ScheduleError, match="deadlock"):
        pc.validate(sched)  # pipecore's simulation sees the same hang
    assert pt.validate(pc.build("zb-v", 2, 4)) == {0: 0, 1: 1, 2: 1, 3: 0}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pct.schedules(max_devices=5, max_stages=8, max_microbatches=5, recompute=False, offload=False))
def test_random_schedules_round_trip_or_are_refused(sched):
    homes = {}
    for d, prog in enumerate(sched.programs()):
        for unit in prog:
            for k, s, _ in (unit if isinstance(unit[0], tuple) else (unit,)):
                if k != "AR":
                    homes.setdefault(s, set()).add(d)
    if any(len(h) > 1 for h in homes.values()):
        event("replicated: refused")
        with pytest.raises(ValueError, match="replicated"):
            pt.to_actions(sched)
        return
    order = pt.to_actions(sched)
    p, n, m = sched.devices, sched.stages, sched.microbatches
    mapping = ts._validate_schedule(order, p, n, m)
    assert mapping == {s: int(d) for s, d in enumerate(sched.placement)}
    back = pt.from_actions(order)
    assert back.table.replace_schema_metadata(None).equals(sched.table.replace_schema_metadata(None))
    event("exported" + ("" if all(order.values()) else " with an idle device"))
    if all(order.values()):
        # pipecore found no deadlock (the strategy validates); torch's lowering finds none either.
        ts._add_send_recv({r: list(a) for r, a in order.items()}, mapping.__getitem__, n)
        assert pt.validate(sched) == mapping
    else:
        with pytest.raises(ValueError, match="runs no op: torch's runtime needs"):
            pt.validate(sched)


# -- torch's schedules imported ------------------------------------------------------------------

TORCH = {  # name -> (class, style, pipecore family with the same order)
    "GPipe": ("ScheduleGPipe", "single", "gpipe"),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", "loop", "interleaved-1f1b"),
    "LoopedBFS": ("ScheduleLoopedBFS", "loop", "looped-bfs"),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", "loop", "interleaved-zb"),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", "v", "zb-v"),
    "DualPipeV": ("ScheduleDualPipeV", "v", "dualpipev"),
}


@pytest.mark.parametrize("name", list(TORCH))
def test_torch_schedules_import_and_simulate(name):
    cls_name, style, fam = TORCH[name]
    v = 1 if style == "single" else 2
    seen = 0
    for p in (2, 4, 8):
        for m in (p, 2 * p, 4 * p):
            try:
                order = torch_order(cls_name, p, m, v, style)
            except ValueError:
                continue  # torch's own rule (DualPipeV: m >= 2p)
            seen += 1
            sched = pt.from_torch(name, p, m)
            assert sched.devices == p and sched.stages == p * v and sched.microbatches == m
            assert compute_strings(order) == {r: [str(a) for a in acts]
                                              for r, acts in pt.to_actions(sched).items()}
            res = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=1.0))
            work = max(len(prog) for prog in sched.programs())  # unit ops, BW counts as one
            assert res.makespan >= work / v
            # pipecore's family of the same name builds torch's order, except torch's flexible
            # Interleaved1F1B at m == p (its last rank alternates 3F0 3B0 3F1 ...).
            if not (name == "Interleaved1F1B" and m == p):
                assert pc.build(fam, p, m, chunks=v).to_actions() == sched.to_actions(), (p, m)
    assert seen >= 6


def test_torch_interleaved_1f1b_at_m_equal_p_differs_from_pipecores():
    ours = pc.build("interleaved-1f1b", 2, 2).to_actions()
    theirs = pt.from_torch("Interleaved1F1B", 2, 2).to_actions()
    assert theirs[0] == ours[0]
    assert theirs[1] == ["1F0", "1F1", "3F0", "3BW0", "3F1", "3BW1", "1BW0", "1BW1"]
    assert ours[1] == ["1F0", "1F1", "3F0", "3F1", "3BW0", "3BW1", "1BW0", "1BW1"]


def test_from_torch_matches_the_saved_fixtures():
    names = {"ScheduleZBVZeroBubble": "ZBVZeroBubble", "ScheduleGPipe": "GPipe",
             "ScheduleInterleaved1F1B": "Interleaved1F1B", "ScheduleLoopedBFS": "LoopedBFS",
             "ScheduleInterleavedZeroBubble": "InterleavedZeroBubble", "ScheduleDualPipeV": "DualPipeV"}
    checked = 0
    for path in sorted(FIXTURES.glob("*.json")):
        fx = json.loads(path.read_text())
        if fx["class"] not in names:
            continue
        sched = pt.from_torch(fx["class"], fx["ranks"], fx["microbatches"])  # torch's class name
        want = {int(r): [a for a in acts if a is not None and "REDUCE_GRAD" not in a]
                for r, acts in fx["pipeline_order"].items()}
        assert {r: [str(a) for a in acts] for r, acts in pt.to_actions(sched).items()} == want
        assert sched.name == f"torch-{names[fx['class']]}"
        checked += 1
    assert checked == 11


def test_torch_1f1b_is_malformed_and_pipecore_says_so():
    # torch 2.13.0's Schedule1F1B: the last rank never runs F of microbatch 0 and runs F of m.
    order = compute_strings(torch_order("Schedule1F1B", 4, 8, 1, "single"))
    assert order[3][:3] == ["3F1", "3B0", "3F2"] and "3F8" in order[3] and "3F0" not in order[3]
    with pytest.raises(AssertionError, match="stage 3, microbatch 0 without first running Forward"):
        ts._validate_schedule(torch_order("Schedule1F1B", 4, 8, 1, "single"), 4, 4, 8)
    with pytest.raises(pc.ScheduleError) as info:
        pt.from_torch("1F1B", ranks=4, microbatches=8)
    err = info.value
    assert err.rule == "missing-op" and err.device == 3 and err.stage == 3 and err.microbatch == 0
    assert "Schedule1F1B" in str(err) and "stage 3 microbatch 0 has no F" in str(err)
    # Every other rank is 1F1B as pipecore builds it.
    ours = pc.build("1f1b", 4, 8).to_actions()
    kinds = {"F": "F", "B": "BW"}
    for r in range(3):
        assert [a[0] + kinds[a[1]] + a[2:] for a in order[r]] == ours[r]


# -- errors ------------------------------------------------------------------------------------------

def test_import_errors_name_the_problem(tmp_path):
    CT = ts._ComputationType
    with pytest.raises(ValueError, match=r"rank 0 step 1: 0SEND_F0 is a SEND_F action"):
        pt.from_actions({0: [ts._Action(0, CT.FORWARD, 0), ts._Action(0, CT.SEND_F, 0)]})
    bad_pair = ts._Action(-1, CT.OVERLAP_F_B, None, (ts._Action(0, CT.FULL_BACKWARD, 0),
                                                     ts._Action(0, CT.FORWARD, 1)))
    with pytest.raises(ValueError, match="rank 0 step 0: .*overlaps one F with one I or B"):
        pt.from_actions({0: [bad_pair]})
    with pytest.raises(ValueError, match=r"ranks must be 0..p-1 \(got \[0, 2\]\)"):
        pt.from_actions({0: ["0F0"], 2: ["0B0"]})
    with pytest.raises(ValueError, match="rank 1 step 0: Invalid action string: 1Q0"):
        pt.from_actions({0: ["0F0", "0B0"], 1: ["1Q0"]})
    with pytest.raises(pc.ScheduleError, match="holds 2 microbatches, expected 3"):
        pt.from_actions({0: ["0F0", "0F1", "0B0", "0B1"]}, microbatches=3)
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0B0\n1F0,1Z0\n")
    with pytest.raises(ValueError, match="rank 1 step 1"):
        pt.from_csv(path)
    with pytest.raises(ValueError, match="unknown torch schedule 'Chimera'; valid names: GPipe"):
        pt.from_torch("Chimera", 4, 8)
    with pytest.raises(ValueError, match="exactly 2 stages per rank"):
        pt.from_torch("ZBVZeroBubble", 4, 8, stages_per_rank=3)
    with pytest.raises(ValueError, match="torch's ScheduleDualPipeV rejects ranks=4, microbatches=4"):
        pt.from_torch("dualpipev", 4, 4)
    with pytest.raises(ValueError, match="'ranks' must be an int >= 1"):
        pt.from_torch("GPipe", 0, 4)


def test_from_torch_accepts_class_names_and_more_chunks():
    assert pt.from_torch("ScheduleLoopedBFS", 2, 4) == pt.from_torch("loopedbfs", 2, 4)
    sched = pt.from_torch("Interleaved1F1B", 2, 4, stages_per_rank=3)
    assert sched.stages == 6 and sched.params["torch_class"] == "ScheduleInterleaved1F1B"
    assert sched.to_actions() == pc.build("interleaved-1f1b", 2, 4, chunks=3).to_actions()


# -- real runs: torch's runtime on CPU ranks (gloo), gradients against plain autograd -------------

def _programs_as_run(sched):
    """Per rank, the (stage, kind) sequence the runtime must call, in pipecore's program order."""
    out = {}
    for d, prog in enumerate(sched.programs()):
        out[d] = [(s, k) for unit in prog
                  for k, s, _ in (unit if isinstance(unit[0], tuple) else (unit,))]
    return out


def _plain_grads(stages, microbatches, batch, hidden=32, seed=0):
    """The same MLP as a run, trained on the whole batch without pipelining (no bindings code)."""
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for s in range(stages):
        lin = torch.nn.Linear(hidden, hidden)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(hidden, hidden, generator=gen) / hidden ** 0.5)
            lin.bias.copy_(torch.randn(hidden, generator=gen) * 0.1)
        layers += [lin, torch.nn.Tanh()] if s < stages - 1 else [lin]
    model = torch.nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(batch, hidden, generator=gen), torch.randn(batch, hidden, generator=gen)
    # torch divides the sum of the m microbatch losses by m; equal microbatches make that the batch MSE.
    torch.nn.functional.mse_loss(model(x), y).backward()
    lins = [m for m in model if isinstance(m, torch.nn.Linear)]
    return [(lin.weight.grad, lin.bias.grad) for lin in lins]


def _assert_grads_equal_plain(res, batch):
    plain = _plain_grads(res.stages, res.microbatches, batch)
    for s, (gw, gb) in enumerate(plain):
        got = res.grads[s]
        w = got["weight"] if "weight" in got else got["0.weight"]
        b = got["bias"] if "bias" in got else got["0.bias"]
        assert torch.allclose(w, gw, rtol=1e-5, atol=1e-6), (s, float((w - gw).abs().max()))
        assert torch.allclose(b, gb, rtol=1e-5, atol=1e-6), s
        assert float(gw.abs().max()) > 1e-4  # a real gradient, not zeros on both sides


# Heavy (CI's `pytest -m heavy`) but zb-h1's: a real run each, 15-30 s on two cores;
# zb-h1 keeps a split backward in the README's run.
@pytest.mark.slow
@pytest.mark.parametrize("name,p,m", [
    pytest.param("interleaved-1f1b", 4, 4, marks=pytest.mark.heavy), ("zb-h1", 2, 4),
    pytest.param("zb-v", 2, 4, marks=pytest.mark.heavy),
    pytest.param("dualpipev", 2, 4, marks=pytest.mark.heavy)])
def test_real_run_gradients_equal_the_unpipelined_model(name, p, m):
    sched = pc.build(name, p, m)
    res = pt.run(sched, model="mlp", batch=2 * m)
    assert res.grads_match is True and res.max_abs_error < 1e-6
    _assert_grads_equal_plain(res, 2 * m)
    # The runtime called each rank's compute in pipecore's order (an overlapped unit: F, then B).
    ran = {}
    for rank, stage, kind, _ in res.op_times[0]:
        if stage >= 0:  # compute (stage -1: torch posting or waiting on sends/receives)
            ran.setdefault(rank, []).append((stage, kind))
    assert ran == _programs_as_run(sched)


@pytest.mark.slow
def test_run_torch_cli_1f1b(tmp_path):
    # Two ranks: the command line is what is under test here; real runs on
    # four ranks are test_real_run_gradients_equal_the_unpipelined_model's.
    from pipecore.cli import main

    sched = pc.build("1f1b", 2, 4)
    path = pt.to_csv(sched, tmp_path / "sched.csv")
    out = tmp_path / "out.json"
    with out.open("w") as fh:
        status = main(["run-torch", str(path), "--ranks", "2", "--model", "mlp", "--json"], out=fh)
    result = json.loads(out.read_text())
    assert status == 0 and result["grads_match"] is True
    assert (result["ranks"], result["stages"], result["microbatches"]) == (2, 2, 4)
    assert main(["run-torch", str(path), "--ranks", "4"]) == 2  # the CSV has 2 ranks


# -- calibration and fidelity ---------------------------------------------------------------------

def test_calibrate_measures_every_stage():
    torch.manual_seed(0)
    stages = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()) for _ in range(3)]
    costs, times = pt.calibrate(stages, torch.randn(16, 64), repeats=5, warmup=1, comm=2e-4,
                                return_times=True)
    assert isinstance(costs, pc.Costs)
    assert costs.f.shape == costs.b.shape == costs.w.shape == (3,)
    assert (costs.f > 0).all() and (costs.w > 0).all() and (costs.b[1:] > 0).all()
    assert list(costs.f) == times["F"] and list(costs.w) == times["W"] and costs.comm == 2e-4
    assert len(times["BW"]) == 3 and min(times["BW"]) > 0
    # Stage 0's input needs no gradient: its B computes nothing (torch does it all in W).
    assert times["B"][0] < min(times["F"])
    res = pc.simulate(pc.build("1f1b", 3, 3), costs)
    assert res.makespan > 3 * sum(times["F"])  # at least every microbatch's forward through the pipe
    with pytest.raises(ValueError, match="at least one stage"):
        pt.calibrate([], torch.randn(1, 64))


def _fake_run(op_times, rank_times, stages=2, transfer=1e-3):
    from pipecore.bindings._torch_run import RunResult

    return RunResult(ranks=len(rank_times[0]), stages=stages, microbatches=2, grads={}, reference=None,
                     max_abs_error=None, grads_match=None, step_times=[max(r) for r in rank_times],
                     op_times=op_times, transfer=transfer, rank_times=rank_times)


def test_costs_from_run_means_and_overhead():
    step = [(0, 0, "F", 1.0), (0, 0, "F", 3.0), (0, -1, "post", 0.5), (0, 0, "BW", 4.0),
            (0, 0, "BW", 6.0), (1, 1, "F", 2.0), (1, -1, "wait", 5.0), (1, 1, "F", 2.0),
            (1, 1, "B", 1.0), (1, 1, "W", 3.0), (1, 1, "B", 1.0), (1, 1, "W", 3.0)]
    warm = [(r, s, k, 100.0) for r, s, k, _ in step]  # left out as warmup
    run = _fake_run([warm, step], [[500.0, 500.0], [18.0, 25.0]])
    plain = pt.costs_from_run(run, warmup=1, overhead=False)
    # By hand: stage 0 F mean 2, BW mean 5 -> b 5, w 0; stage 1 F 2, B 1, W 3.
    assert list(plain.f) == [2.0, 2.0] and list(plain.b) == [5.0, 1.0] and list(plain.w) == [0.0, 3.0]
    assert plain.comm == 1e-3
    # Overhead: rank 0 spent 18 s, computed 14, waited 0 -> 4 over 4 calls = 1 per op;
    # rank 1 spent 25, computed 12, waited 5 -> 8 over 6 calls.
    over = pt.costs_from_run(run, warmup=1)
    assert list(over.f) == [3.0, 2.0 + 8 / 6] and list(over.b) == [6.0, 1.0 + 8 / 6]
    assert list(over.w) == [0.0, 3.0 + 8 / 6]
    with pytest.raises(ValueError, match="no F or no backward of stage 1"):
        pt.costs_from_run(_fake_run([[(0, 0, "F", 1.0), (0, 0, "BW", 1.0)]], [[3.0]]), warmup=0)
    # Means, not medians: forwards of 1, 1 and 4 s cost 2 s each (the median would say 1).
    skew = [(0, 0, "F", 1.0), (0, 0, "F", 1.0), (0, 0, "F", 4.0), (0, 0, "BW", 2.0)]
    one = _fake_run([skew], [[9.0]], stages=1)
    assert list(pt.costs_from_run(one, warmup=0, overhead=False).f) == [2.0]


def test_ranking_agreement_counts_only_separated_pairs():
    rows = [
        {"schedule": "a", "measured": 10.0, "low": 9.0, "high": 11.0, "q1": 9.5, "q3": 10.5,
         "predicted": 5.0},
        {"schedule": "b", "measured": 20.0, "low": 19.0, "high": 21.0, "q1": 19.5, "q3": 20.5,
         "predicted": 6.0},
        {"schedule": "c", "measured": 20.5, "low": 18.0, "high": 22.0, "q1": 20.4, "q3": 20.6,
         "predicted": 4.0},
    ]
    # Ranges: a-b and a-c are separated, b-c overlap. a-b agrees (5 < 6), a-c does not (5 > 4).
    assert pt.ranking_agreement(rows) == (1, 2, [("a", "c")])
    # Quartiles: b-c separate too (20.5 < 20.4 is false: b's q3 20.5 >= c's q1 20.4, so not).
    assert pt.ranking_agreement(rows, "iqr") == (1, 2, [("a", "c")])
    rows[2]["q1"] = 20.51
    assert pt.ranking_agreement(rows, "iqr") == (1, 3, [("a", "c"), ("b", "c")])
    with pytest.raises(ValueError, match="spread must be 'range' or 'iqr'"):
        pt.ranking_agreement(rows, "sd")
    for r, e in zip(rows, (-0.5, -0.7, -0.8)):
        r.update(error=e, error_low=e, error_high=e, predicted_calibrate=r["predicted"],
                 error_calibrate=e)
    text = pt.format_fidelity(rows)
    assert "ranking (range): 1 of 2 pairs" in text and "median |error|: 70.0%" in text
    assert "ranking (iqr): 1 of 3 pairs" in text


def test_timed_runs_takes_schedules_in_turn_and_reports_median_range_and_quartiles(monkeypatch):
    from pipecore.bindings import _fidelity

    # A stand-in for pt.run: records the order of the calls, returns made-up step times
    # (the first step of each run, 9 s, is the warm-up left out).
    steps = {"gpipe": [[9.0, 1.0, 3.0], [9.0, 2.0, 2.0], [9.0, 4.0, 6.0]],
             "1f1b": [[9.0, 5.0, 7.0], [9.0, 8.0, 8.0], [9.0, 6.0, 6.0]]}
    calls = []

    def fake_run(sched, **options):
        calls.append((sched.name, options))
        k = sum(1 for name, _ in calls if name == sched.name) - 1
        return _fake_run([[]] * 3, [[s] for s in steps[sched.name][k]])

    monkeypatch.setattr(_fidelity, "run", fake_run)
    scheds = [pc.build("gpipe", 2, 2), pc.build("1f1b", 2, 2)]
    out = pt.timed_runs(scheds, 3, warmup=1, model="mlp", steps=3)
    # Every schedule once before any runs again; the options reach every run, check off.
    assert [c[0] for c in calls] == ["gpipe", "1f1b"] * 3
    assert all(c[1] == {"model": "mlp", "steps": 3, "check": False} for c in calls)
    assert list(out) == ["gpipe", "1f1b"]
    # By hand: gpipe's runs take the median of steps 2-3: 2, 2, 5 -> median 2, range 2-5,
    # quartiles (inclusive method, positions 0.5 and 1.5 of 0..2) 2 and 3.5.
    g = out["gpipe"]
    assert g["runs"] == [2.0, 2.0, 5.0] and g["measured"] == 2.0
    assert (g["low"], g["high"], g["q1"], g["q3"]) == (2.0, 5.0, 2.0, 3.5)
    # 1f1b: 6, 8, 6 -> median 6, range 6-8, quartiles 6 and 7.
    f = out["1f1b"]
    assert f["runs"] == [6.0, 8.0, 6.0] and f["measured"] == 6.0
    assert (f["low"], f["high"], f["q1"], f["q3"]) == (6.0, 8.0, 6.0, 7.0)
    assert len(f["results"]) == 3
    # A mapping names the schedules itself; one run keeps its single value as every bound.
    calls.clear()
    one = pt.timed_runs({"mine": scheds[0]}, 1, warmup=1, check=True)
    assert calls == [("gpipe", {"check": True})]
    assert one["mine"]["measured"] == one["mine"]["q1"] == one["mine"]["high"] == 2.0


def test_timed_runs_refuses_what_it_cannot_time():
    sched = pc.build("1f1b", 2, 2)
    for repeats in (0, True, 2.0):
        with pytest.raises(ValueError, match=r"'repeats' must be an int >= 1 \(got "):
            pt.timed_runs([sched], repeats)
    with pytest.raises(ValueError, match="'profile' is not an option of its runs"):
        pt.timed_runs([sched], profile="traces")
    with pytest.raises(ValueError, match="'ranks' is not an option"):
        pt.timed_runs([sched], ranks=2)
    with pytest.raises(ValueError, match="'stepz' is not an option"):
        pt.timed_runs([sched], stepz=3)
    with pytest.raises(ValueError, match="two schedules are named '1f1b'"):
        pt.timed_runs([sched, pc.build("1f1b", 2, 4)])
    with pytest.raises(ValueError, match="got a str in the sequence: '1f1b'"):
        pt.timed_runs(["1f1b"])
@pytest.mark.slow
def test_a_failing_rank_is_reported_with_its_error(tmp_path):
    from pipecore.bindings import _torch_run

    with pytest.raises(RuntimeError, match=r"rank \d of the torch run failed(.|\n)*FileNotFoundError"):
        _torch_run.run_csv(tmp_path / "missing.csv", [[0], [1]], stages=2, microbatches=2,
                           timeout=30)


@pytest.mark.heavy  # real ranks pinned and timed: 15 s on two cores
def test_pinned_ranks_each_run_on_their_own_cpu():
    # Issue 39's protocol: rank r on the r-th CPU this process may use, gloo's threads too.
    import os

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        pytest.skip("pinning two ranks needs two CPUs this process may use")
    res = pt.run(pc.build("1f1b", 2, 2), steps=1, pin=True)
    assert res.grads_match
    assert res.cpus == [[cpus[0]], [cpus[1]]]
    # torch's compute thread, gloo's and the interpreter's all live on the rank's one CPU.
    assert all(t is None or t >= 2 for t in res.threads)
    free = pt.run(pc.build("1f1b", 2, 2), steps=1, pin=False, check=False)
    assert free.cpus == [cpus, cpus]


def test_pin_needs_a_cpu_per_rank(monkeypatch):
    from pipecore.core import cpus

    monkeypatch.setattr(cpus, "cpu_ids", lambda: [0])
    with pytest.raises(pc.InputError, match=r"pin=True needs a CPU per rank: 2 ranks, 1 CPUs"):
        pt.run(pc.build("1f1b", 2, 2), pin=True)
    with pytest.raises(pc.InputError, match="'pin' must be None, True or False"):
        pt.run(pc.build("1f1b", 2, 2), pin="yes")


def test_composed_schedules_pass_torch():
    """Issue 41: a composed schedule exports like any other. Compositions of
    explore's default space with overlapped units at p=2 and p=4 (m=2p; every 5th and every 25th,
    placements, orders and W rules all come round) that build, through
    torch's validator and its send/receive lowering, and back."""
    from pipecore.core.schedule import ScheduleError
    from pipecore.search.explore import default_space

    tried = 0
    for p, every in ((2, 5), (4, 25)):
        m = 2 * p
        seen = set()
        for comp in default_space(p, m, overlap=True)[::every]:
            if comp.placement.chains > 1:
                continue  # replicated stages: torch runs a stage on one rank (below)
            try:
                sched = pc.compose(placement=comp.placement, microbatches=m, order=comp.order,
                                   split_backward=comp.split_backward, w=comp.w)
            except ScheduleError:
                continue  # a deadlock: no schedule to export
            order = pt.to_actions(sched)
            text = repr(sorted(order.items()))
            if text in seen:
                continue
            seen.add(text)
            mapping = ts._validate_schedule(order, p, sched.stages, m)
            assert mapping == {s: int(d) for s, d in enumerate(sched.placement)}, comp.label
            lowered = ts._add_send_recv({r: list(a) for r, a in order.items()},
                                        mapping.__getitem__, sched.stages)
            assert sum(a.is_compute_op for acts in lowered.values() for a in acts) == sum(
                len(acts) for acts in order.values()), comp.label
            assert pt.from_actions(order) == sched, comp.label
            tried += 1
    assert tried > 100, tried
    two = pc.compose(placement="bidirectional", devices=2, microbatches=4,
                     order=pc.orders.greedy())
    with pytest.raises(ValueError, match="torch's pipelining runs every stage on exactly one"):
        pt.to_actions(two)


@pytest.mark.slow
def test_a_composed_schedule_runs_in_torch_with_the_unpipelined_gradients():
    # The first call at two ranks: a V placement, 1F1B with a cap of 3
    # microbatches in flight, backward split (W staggered).
    m = 4
    sched = pc.compose(placement="v", devices=2, microbatches=m,
                       order=pc.orders.one_f_one_b(inflight=3), split_backward=True)
    res = pt.run(sched, model="mlp", batch=2 * m)
    assert res.grads_match is True and res.max_abs_error < 1e-6
    _assert_grads_equal_plain(res, 2 * m)
