"""Reports of several results (issue 37, item 4): each section states its own
costs, network, stragglers and jitter, and a note names the actual cause
of a gap between the simulation and the closed formula.

Golden values: 1F1B at p=4, m=8, f=1, b=2, w=0 takes (m + p - 1)(f + b) =
33 (the 1F1B paper's closed form), so any other makespan of that schedule
is a gap some departure from the formula's assumptions must explain.
"""

from __future__ import annotations

import re

import pytest
from pagetext import parse as _parse

import pipecore as pc
from pipecore.analysis.compare import compare
from pipecore.output.report import result_views

pytest.importorskip("plotly", reason="reports need plotly: pip install pipecore[plot]")

PLAIN = pc.Costs(f=1.0, b=2.0, w=0.0)
ONE_F_ONE_B = pc.build("1f1b", 4, 8)


def _makespan_note(res) -> str:
    flags = result_views(res)["flags"]
    found = [f for f in flags if f.startswith("makespan:")]
    assert len(found) == 1, flags
    return found[0]


def test_a_straggler_is_named_as_the_cause_not_communication():
    plain = pc.simulate(ONE_F_ONE_B, PLAIN)
    assert plain.makespan == 33.0 and result_views(plain)["flags"] == []  # (m + p - 1)(f + b)
    res = pc.simulate(ONE_F_ONE_B, PLAIN, stragglers={2: 1.5})
    assert res.makespan > 33.0
    note = _makespan_note(res)
    assert note == ("makespan: simulation differs from formula; cause: straggler (device 2 at "
                    "1.5x op time)")
    # A factor of 1 slows nothing, so it explains nothing.
    assert result_views(pc.simulate(ONE_F_ONE_B, PLAIN, stragglers={2: 1.0}))["flags"] == []


def test_jitter_is_named_with_its_draw():
    res = pc.simulate(ONE_F_ONE_B, PLAIN, jitter=pc.Jitter(sigma=0.1, seed=1))
    note = _makespan_note(res)
    assert "cause: jitter (lognormal sigma=0.1 per op, seed 1, draw 0)" in note
    assert "straggler" not in note and "communication" not in note


def test_each_departure_that_moves_the_figure_is_named():
    costs = pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.1)
    res = pc.simulate(ONE_F_ONE_B, costs, stragglers={3: 1.3}, jitter=pc.Jitter(sigma=0.1, seed=1))
    note = _makespan_note(res)
    assert note.startswith("makespan: simulation differs from formula; causes: jitter (")
    assert "straggler (device 3 at 1.3x op time)" in note and note.endswith(", communication")


def test_communication_is_not_blamed_for_a_peak_it_does_not_move():
    # V-ZB's peak formula is approximate at f=1, b=2, w=0; transfers change
    # times, not the order of ops, so they leave the peak where it is.
    rows = {r["name"]: r for r in compare(4, 6, costs=pc.Costs(f=1.0, b=2.0, comm=0.5))}
    peak = [f for f in rows["v-zb"]["flags"] if f.startswith("peak activation")]
    assert peak == ["peak activation: simulation differs from formula; cause: formula "
                    "approximate for these costs"]
    span = [f for f in rows["v-zb"]["flags"] if f.startswith("makespan")]
    assert span == ["makespan: simulation differs from formula; causes: communication, formula "
                    "approximate for these costs"]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    res = pc.simulate(ONE_F_ONE_B, PLAIN)
    r2 = pc.simulate(pc.build("zb-h1", 4, 8), pc.Costs(f=1.0, b=1.0, w=1.0, comm=0.1),
                     network=pc.Network.uniform(2.0, 4.0, 0.05),
                     stragglers={3: 1.3}, jitter=pc.Jitter(sigma=0.1, seed=1))
    r3 = pc.simulate(ONE_F_ONE_B, PLAIN, stragglers={2: 1.5})
    path = pc.report([res, r2, r3], tmp_path_factory.mktemp("two") / "page.html")
    return path.read_text()


def test_each_section_states_its_own_setting(two):
    page = _parse(two)
    # Sorted by makespan: plain 1F1B (33), then zb-h1 and the straggling 1F1B.
    assert page.h2[0] == "1f1b #1" and set(page.h2) == {"1f1b #1", "1f1b #2", "zb-h1"}
    sections = dict(zip(page.h2, page.settings))
    plain, straggling, other = sections["1f1b #1"], sections["1f1b #2"], sections["zb-h1"]
    assert "costs: f=1 b=2 w=0 comm=0" in plain and "stragglers: none" in plain
    assert "jitter: none" in plain and "network: none" in plain
    assert "costs: f=1 b=1 w=1 comm=0.1" in other
    assert "network: bytes=2 bandwidth=4 latency=0.05" in other
    assert "stragglers: device 3 at 1.3x op time" in other
    assert "jitter: lognormal sigma=0.1 per op, seed 1, draw 0" in other
    assert "stragglers: device 2 at 1.5x op time" in straggling
    assert "weights=1" in plain  # the memory costs that shape the memory chart


def test_page_does_not_claim_one_setting_for_all(two):
    head = two.split("<div class='headline'>")[0]
    assert "f=1 b=2" not in head and "b=1 w=1" not in head
    assert "differ in costs, network, stragglers and jitter" in head


def test_summary_shows_what_differs(two):
    page = _parse(two)
    assert page.summary_head[-1].startswith("setting")
    by = {cells[0]: cells[-1] for cells in page.summary_rows}
    assert by["1f1b #2"] == ("costs: b=2 w=0 comm=0 \u00b7 network: none (each transfer takes "
                             "comm) \u00b7 stragglers: device 2 at 1.5x op time \u00b7 jitter: none")
    # The two 1F1B rows are told apart in the headline too.
    assert page.headline[0].startswith("fastest: 1f1b #1, one step in 33 cost units")


def test_notes_name_the_straggler_not_communication(two):
    page = _parse(two)
    notes = [f for f in page.feet if re.match(r"\[\d+\] ", f)]
    straggler_notes = [n for n in notes if "device 2 at 1.5x" in n]
    assert straggler_notes and not any("communication" in n for n in straggler_notes)
    assert any("communication" in n and "device 3 at 1.3x" in n for n in notes)
