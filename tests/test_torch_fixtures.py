"""pipecore's per-device op orders against PyTorch's own schedules.

The JSON files in tests/fixtures/torch/ were generated once from torch 2.13.0
by tests/fixtures/torch/make_fixtures.py (see the README there for the command);
torch is not a test dependency. torch's letters map to pipecore's kinds as
F -> F, I (backward for inputs) -> B, W -> W, B (full backward) -> BW; None
entries are idle steps and REDUCE_GRAD is not a compute op.
"""

import json
import re
from pathlib import Path

import pytest

import pipecore as pc

FIXTURES = Path(__file__).parent / "fixtures" / "torch"
TORCH_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}
COMPUTE = re.compile(r"^(\d+)([FIWB])(\d+)$")
OVERLAP = re.compile(r"^\((\d+)F(\d+);(\d+)B(\d+)\)OVERLAP_F_B$")


def load(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def torch_programs(fx):
    """Per-rank compute actions in pipecore's notation, idle steps dropped."""
    out = {}
    for rank, actions in fx["pipeline_order"].items():
        progs = []
        for a in actions:
            if a is None:
                continue
            pair = OVERLAP.match(a)
            if pair:  # torch's OVERLAP_F_B of a forward and a full backward
                fs, fm, bs, bm = pair.groups()
                progs.append(f"{fs}F{fm}&{bs}BW{bm}")
                continue
            mt = COMPUTE.match(a)
            if mt is None:
                assert "REDUCE_GRAD" in a, a  # the only non-compute action in these files
                continue
            stage, kind, mb = mt.groups()
            progs.append(f"{stage}{TORCH_KIND[kind]}{mb}")
        out[int(rank)] = progs
    return out


@pytest.mark.parametrize("fixture,family", [
    ("zbv_p4_m8", "zb-v"), ("zbv_p2_m4", "zb-v"), ("zbv_p4_m16", "zb-v"),
    ("interleaved_zb_p4_m8", "interleaved-zb"), ("interleaved_zb_p2_m4", "interleaved-zb"),
    ("interleaved_zb_p4_m16", "interleaved-zb"), ("interleaved_zb_p4_m4", "interleaved-zb"),
    ("interleaved_1f1b_p4_m8", "interleaved-1f1b"), ("looped_bfs_p4_m8", "looped-bfs"),
    ("gpipe_p4_m8", "gpipe"), ("dualpipev_p4_m8", "dualpipev"),
])
def test_same_order_as_torch(fixture, family):
    fx = load(fixture)
    assert fx["torch_validation"] == "ok"
    sched = pc.build(family, fx["ranks"], fx["microbatches"], chunks=fx["stages_per_rank"])
    assert sched.to_actions() == torch_programs(fx)
    placement = {int(s): r for s, r in fx["stage_to_rank"].items()}
    assert {s: int(d) for s, d in enumerate(sched.placement)} == placement


def test_torch_1f1b_last_rank_is_malformed_and_caught():
    # torch 2.13.0's Schedule1F1B gives the last rank forwards of microbatches
    # 1..m (no F of microbatch 0, and an F of microbatch m that does not exist).
    fx = load("1f1b_p4_m8")
    progs = torch_programs(fx)
    assert progs[3][0] == "3F1" and "3F8" in progs[3]
    with pytest.raises(pc.ScheduleError) as info:
        pc.from_actions(progs)
    err = info.value
    assert err.rule == "missing-op" and err.device == 3
    assert "stage 3 microbatch 0 has no F" in str(err)
    # Its other ranks are 1F1B as pipecore builds it.
    ours = pc.build("1f1b", 4, 8).to_actions()
    assert all(progs[r] == ours[r] for r in range(3))
