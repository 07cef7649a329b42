"""The PyTorch round trip from the command line: export, run-torch (--profile), what-if.

Golden orders are written out by hand from the schedules' definitions (1F1B
with p=2: rank 0 warms up with two forwards, rank 1 with one); what torch
accepts is asked of torch itself (its parser and ``_validate_schedule``).
"""

import importlib.util
import io
import json
import shlex
from pathlib import Path

import pytest
from wrapped import flat

import pipecore as pc
from pipecore.cli import main

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch: pip install 'pipecore[torch]'")

# 1F1B, p=2, m=4, by hand: rank 0 runs F0 F1, then alternates; rank 1 alternates from F0.
ONEF1B_TORCH = [["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"],
                ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]]


def run_cli(argv):
    out = io.StringIO()
    status = main(argv, out=out)
    return status, out.getvalue()


# -- export -----------------------------------------------------------------------------------

def test_export_actions_json_reads_back(tmp_path):
    path = tmp_path / "s.json"
    status, text = run_cli(["export", "1f1b", "-p", "2", "-m", "4", "--actions", str(path)])
    assert status == 0 and f"wrote {path}" in text
    data = json.loads(path.read_text())
    # pipecore's kinds: torch's full backward B is pipecore's BW.
    assert data == {str(r): [a.replace("B", "BW") for a in acts]
                    for r, acts in enumerate(ONEF1B_TORCH)}
    assert pc.from_actions(data).to_actions() == pc.build("1f1b", 2, 4).to_actions()


def test_export_replicated_actions_say_how_to_read_them(tmp_path):
    path = tmp_path / "c.json"
    status, text = run_cli(["export", "chimera", "-p", "2", "-m", "4", "--actions", str(path)])
    assert status == 0 and "replicated=True" in text
    back = pc.from_actions(json.loads(path.read_text()), replicated=True)
    assert back.to_actions() == pc.build("chimera", 2, 4).to_actions()


def test_export_needs_an_output_and_names_bad_paths(tmp_path, capsys):
    assert main(["export", "1f1b", "-p", "2", "-m", "4"]) == 2
    assert "--csv FILE" in capsys.readouterr().err
    missing = tmp_path / "no" / "s.json"
    assert main(["export", "1f1b", "-p", "2", "-m", "4", "--actions", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--actions {missing}: folder {missing.parent} does not exist" in flat(err)
    assert len(err.strip().replace("\n  ", " ").splitlines()) == 1


def test_from_actions_takes_json_keys():
    assert pc.from_actions({"0": ["0F0", "0BW0"]}).to_actions() == {0: ["0F0", "0BW0"]}
    with pytest.raises(ValueError, match=r"device keys must be ints >= 0 \(got '01'\)"):
        pc.from_actions({"01": ["0F0", "0BW0"]})


@needs_torch
def test_export_csv_is_what_torch_reads(tmp_path):
    from pipecore.bindings import torch as pt
    from torch.distributed.pipelining import schedules as ts

    path = tmp_path / "s.csv"
    status, text = run_cli(["export", "1f1b", "-p", "2", "-m", "4", "--csv", str(path)])
    assert status == 0
    assert f"pipecore run-torch {path} --ranks 2" in text
    assert path.read_text().splitlines() == [",".join(acts) for acts in ONEF1B_TORCH]
    order = pt.read_csv(path)  # torch's own parser
    assert ts._validate_schedule(order, 2, 2, 4) == {0: 0, 1: 1}


@needs_torch
def test_explore_writes_its_winner_as_torchs_csv(tmp_path, capsys):
    from pipecore.bindings import torch as pt

    path = tmp_path / "winner.csv"
    status, text = run_cli(["explore", "-p", "2", "-m", "4", "--no-tune", "--no-progress",
                            "--memory-limit", "3", "--csv", str(path)])
    assert status == 0 and f"pipecore run-torch {path} --ranks 2" in text
    back = pt.from_csv(path)  # through torch's own parser
    assert back.devices == 2 and back.microbatches == 4
    # The winner the report names is what the file holds: the same makespan.
    makespan = float(flat(text).split(": makespan ")[1].split()[0])
    cli_costs = pc.Costs(f=1.0, b=1.0, w=1.0, comm=0.0)  # the command line's defaults
    assert pc.simulate(back, cli_costs).makespan == pytest.approx(makespan, rel=1e-5)
    # With --json the CSV's lines go to stderr: stdout stays one JSON document.
    status, text = run_cli(["explore", "-p", "2", "-m", "4", "--no-tune", "--no-progress",
                            "--json", "--csv", str(path)])
    assert status == 0 and json.loads(text)["composition"]
    assert "pipecore run-torch" in capsys.readouterr().err
    # A winner torch cannot run (tune's bitpipe replicates stages) is named, with the way out.
    status, text = run_cli(["explore", "-p", "2", "-m", "8", "--no-progress", "--memory-limit",
                            "3", "--weights", "0", "--csv", str(tmp_path / "best.csv")])
    err = capsys.readouterr().err
    assert status == 1 and "--csv: the winner, tune: bitpipe" in err
    assert "replicated stage" in err and "--no-tune searches only them" in err
    assert not (tmp_path / "best.csv").exists()


@needs_torch
def test_export_csv_refuses_replicated_schedules(tmp_path, capsys):
    path = tmp_path / "c.csv"
    assert main(["export", "dualpipe", "-p", "2", "-m", "4", "--csv", str(path)]) == 2
    assert "replicated stage" in capsys.readouterr().err
    assert not path.exists()


# -- torch's older grammar: B then W ----------------------------------------------------------

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
    assert len(err.strip().replace("\n  ", " ").splitlines()) == 1


@needs_torch
def test_b_then_w_from_actions_names_rank_and_step():
    from pipecore.bindings import torch as pt

    with pytest.raises(pc.ScheduleError, match=r"rank 0: step 1 is 0B0 and step 2 is 0W0: "
                                               r"(.|\n)*backward-input action, which is I today"):
        pt.from_actions({0: ["0F0", "0B0", "0W0"]})


@needs_torch
def test_run_torch_missing_csv_is_one_line(tmp_path, capsys):
    path = tmp_path / "nope.csv"
    assert main(["run-torch", str(path), "--ranks", "2"]) == 2
    err = capsys.readouterr().err
    assert f"run-torch: {path}: no such file" in flat(err) and "pipecore export" in err
    assert len(err.strip().replace("\n  ", " ").splitlines()) == 1


# -- the user guide's lines (the README's until issue 42), in order, at run-torch's defaults --

def _readme_torch_lines():
    """The user guide's PyTorch round trip: its command lines, in order, comments cut."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    block = text.split("# PyTorch round trip")[1].split("\n")[1:]
    lines = []
    for line in block:
        line = line.strip()
        if not line.startswith("pipecore "):
            break
        lines.append(shlex.split(line.split("#")[0])[1:])
    return lines


@needs_torch
@pytest.mark.heavy  # a minute of real torch runs; tests/test_cli_width.py runs the lines too
def test_readme_torch_lines_at_defaults(tmp_path, monkeypatch):
    from pipecore.bindings import torch as pt

    lines = _readme_torch_lines()
    assert [argv[0] for argv in lines] == ["export", "run-torch", "run-torch", "what-if"]
    monkeypatch.chdir(tmp_path)  # the README's relative paths land here
    outputs = []
    for argv in lines:
        if "mlp" in argv:
            continue  # a plain run, as test_bindings_torch's test_run_torch_cli_1f1b makes one
        status, text = run_cli(argv)
        assert status == 0, (argv, text)
        outputs.append(text)
    exported, profiled, ranked = outputs
    assert "wrote sched.csv (1f1b: 2 devices, 2 stages, 4 microbatches" in exported
    # run-torch --profile with --steps at its default (which once never reached the step
    # where profiling starts, and every rank crashed).
    assert "--steps" not in lines[2]
    assert "grads_match    True" in profiled
    assert "steps 3-5 of 7 (step 1 sets torch's stages up and is left out)" in profiled
    assert "reference_steps 2, 6, 7 (timed without the profiler" in profiled
    assert len(profiled.split("step_times")[1].split("(ms")[0].split()) == 7
    assert "next: pipecore what-if traces" in profiled
    run = json.loads((tmp_path / "traces" / "pipecore-run.json").read_text())
    assert (run["steps"], run["profiled_steps"], run["reference_steps"]) == (7, [2, 3, 4],
                                                                           [1, 5, 6])
    prof = pt.from_profile(tmp_path / "traces")
    assert len(prof.step_times) == 3  # steps 3, 4 and 5
    # Every stage's F and B were timed with and without the profiler: all corrected.
    assert sorted(prof.dilation) == [(0, "BW"), (0, "F"), (1, "BW"), (1, "F")]
    assert len(prof.reference_times) == 3
    assert prof.labels["F"] == 8 and prof.labels["BW"] == 8  # 2 stages x 4 microbatches a step
    assert "profiled schedule (1f1b, 4 microbatches): predicted" in ranked
    assert "median of 3 unprofiled reference steps" in flat(ranked)
    assert "costs: compute times divided by what the profiler added, measured against 3 " \
        "unprofiled steps" in flat(ranked)
    assert "left out (4):" in ranked
    # --check runs the schedules for real, each --repeats times in turn, and shows the spread.
    status, checked = run_cli(["what-if", "traces", "--schedules", "1f1b,gpipe", "--check",
                               "--repeats", "2", "--steps", "3"])
    assert status == 0, checked
    assert "measured ms" in checked and "error" in checked
    assert "measured: median of 2 run(s) per schedule, each the median of step 3; spread " \
        "over runs: " in flat(checked)
    assert "1f1b " in flat(checked).split("spread over runs: ")[1]
    assert "gpipe " in flat(checked).split("spread over runs: ")[1]
