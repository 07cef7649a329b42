"""The PyTorch round trip from the command line.

What torch accepts is asked of torch itself (its parser and ``_validate_schedule``).
"""

import importlib.util

import pytest

import pipecore as pc
from pipecore.cli import main

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch: pip install 'pipecore[torch]'")

def _older_grammar_csv(tmp_path):
    """A CSV shaped like torch's zb1p_2rank_2stagep_compute.csv: two stages per rank, idle
    cells, and B written for backward-input before each W (today's grammar writes I)."""
    from pipecore.bindings import torch as pt

    new = pt.to_csv(pc.build("interleaved-zb", 2, 4), tmp_path / "today.csv")
    rows = [line.split(",") for line in new.read_text().splitlines()]
    rows[1].insert(0, "")  # an idle step, as torch's file has
    old = tmp_path / "zb_old.csv"
    old.write_text("\n".join(",".join(cell.replace("I", "B") for cell in row) for row in rows)
                   + "\n")
    return old, rows


@needs_torch
def test_b_then_w_csv_names_i(tmp_path):
    from pipecore.bindings import torch as pt

    old, rows = _older_grammar_csv(tmp_path)
    # Rank 0's first backward-input (its last stage's, microbatch 0) comes before its W.
    first = next(i for i, cell in enumerate(rows[0]) if "I" in cell)
    stage, mb = rows[0][first].split("I")
    assert rows[0].index(f"{stage}W{mb}") > first
    with pytest.raises(pc.ScheduleError) as info:
        pt.from_csv(old)
    err = info.value
    text = str(err)
    assert str(old) in text and "line 1 (rank 0)" in text
    assert f"cell {first + 1} is {stage}B{mb}" in text and f"is {stage}W{mb}" in text
    assert "I today" in text and f"Write {stage}I{mb} in place of {stage}B{mb}" in text
    assert (err.rule, err.stage, err.microbatch) == ("duplicate-op", int(stage), int(mb))
    # The hint is right: with I in place of B, torch's own validator takes the file.
    fixed = tmp_path / "fixed.csv"
    fixed.write_text(old.read_text().replace("B", "I"))
    pt.validate(pt.from_csv(fixed))


@needs_torch
def test_b_then_w_in_run_torch_is_one_line_and_no_run(tmp_path, capsys):
    old, _ = _older_grammar_csv(tmp_path)
    assert main(["run-torch", str(old), "--ranks", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipecore: error: ") and "which is I today" in err
    assert len(err.strip().splitlines()) == 1


@needs_torch
def test_b_then_w_from_actions_names_rank_and_step():
    from pipecore.bindings import torch as pt

    with pytest.raises(pc.ScheduleError, match=r"rank 0: step 1 is 0B0 and step 2 is 0W0: "
                                               r"(.|\n)*backward-input action, which is I today"):
        pt.from_actions({0: ["0F0", "0B0", "0W0"]})
