"""The tutorials run (issue 42): each docs/tutorials/*.py, executed as the docs
build executes it (docs/_ext/tutorials.py: a fresh process, cell by cell, in
an empty folder), prints what its page says and writes the files its page
shows. The runner's own rules (cells, errors, torch) are checked on small
scripts."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import tutorials  # noqa: E402

SCRIPTS = {p.stem: p for p in tutorials.scripts()}

# What each tutorial must print and write: a tutorial that silently stops
# making its picture or its page fails here, not only on the site.
EXPECTED = {
    "scan-to-pareto": (["224 configurations", "224 rows in 1 part(s)", "fits 6 M",
                        "configurations on the Pareto frontiers"],
                       ["grid.toml", "results/_pareto.png", "results/part-000000.parquet",
                        "scan.html", "scan_frontier.csv"]),
    "tune-under-a-memory-budget": (["fastest within the memory limit", "budget   4 M:", "+recompute",
                                    "budget 2 M, no recompute:"],
                                   ["memory-by-budget.png", "tuned-4M.html"]),
    "torch-round-trip": (["gradients match the unpipelined model: True", "stage 1: F ",
                          "1f1b: predicted", "ms per step, the median of 3 runs (min-max over the runs ",
                          "than predicted (from ", "left out (4):"],
                         ["sched.csv", "traces/rank0.json", "traces/rank1.json",
                          "traces/pipecore-run.json"]),
    "straggler-what-if": (["no straggler: 33.00; device 3 at 1.3x: 40.20 (+21.8%)",
                           "without stragglers: 33 (17.9% less)", "p50 ", "p99 "],
                          ["straggler-gantt.png", "monte-carlo.png"]),
    "plan-a-training-run": (["39.1 billion parameters", "s per iteration", "layouts estimated in",
                             "best: ", "paper's layout: rank ", "published megatron-sc21-table1-39.1b: "
                             "outside the searched space"],
                            ["plans.parquet", "plan.html"]),
    "swarm-what-if": (["SWARM / fixed throughput: 1.22x (> 1: SWARM faster)",
                       "steady 1.33333, bound 1.33333", "fixed 1F1B, 10 iterations: ",
                       "mean uptime    200: SWARM ", "attempts lost; per stage:"],
                      ["swarm-churn.png"]),
    "compose-and-explore": (["same programs as pc.build: True", "zb-v preset",
                             "fastest within the memory limit", "layers per stage:", "GB of 40 GB"],
                            ["v-capped.png"]),
    "long-sequences": (["seq1f1b k=4 compute", "131072 zb-v"], ["long-sequences.png"]),
    "vocabulary-parallelism": (["4096  256000 vocab-1/vocab", "left out: the S and T passes"],
                               ["vocabulary-parallelism.png"]),
}


def test_every_tutorial_is_expected_and_on_the_tutorials_page():
    assert set(SCRIPTS) == set(EXPECTED)
    index = (ROOT / "docs" / "tutorials" / "index.md").read_text()
    toctree = index.split("{toctree}", 1)[1]
    for name in SCRIPTS:
        assert f"\n{name}\n" in toctree, f"{name} is not in the tutorials' toctree"
        assert f"{{doc}}`{name}`" in index, f"the tutorials page does not describe {name}"


# The torch round trip (real ranks) and compose-and-explore (a whole space) take
# 30-40 s each on two cores: CI's `pytest -m heavy` and its docs build run them.
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.heavy] if n in ("torch-round-trip", "compose-and-explore")
                 else []) for n in sorted(EXPECTED)])
def test_tutorial_runs_and_makes_what_its_page_shows(name, tmp_path):
    if tutorials.needs_torch(SCRIPTS[name].read_text()):
        pytest.importorskip("torch", reason="the torch tutorial needs pip install -e '.[torch]'")
    pytest.importorskip("matplotlib", reason="the tutorials draw: pip install 'pipecore[plot]'")
    record = tutorials.execute(SCRIPTS[name], tmp_path / "run")
    printed = "".join(cell["output"] for cell in record["cells"])
    written = {f for cell in record["cells"] for f, _size in cell["files"]}
    texts, files = EXPECTED[name]
    for text in texts:
        assert text in printed, f"{name} did not print {text!r}:\n{printed}"
    for file in files:
        assert file in written and (tmp_path / "run" / file).stat().st_size > 0, \
            f"{name} did not write {file}"
    # The page shows every cell: its prose, its code, its output and its pictures.
    page = tutorials.page(SCRIPTS[name], record)
    title, _intro, cells = tutorials.parse(SCRIPTS[name].read_text())
    assert page.startswith(f"# {title}\n")
    assert page.count("```python\n") == sum(1 for c in cells if c["code"])
    for file in files:
        if file.endswith(".png"):
            assert f"/generated/tutorials/{SCRIPTS[name].stem}/{file}" in page
        if file.endswith(".html"):  # linked, and shown in place
            assert f"<a href='{SCRIPTS[name].stem}/{file}'>" in page
            assert f"<iframe class='tutorial-page' src='{SCRIPTS[name].stem}/{file}'" in page


def test_parse_splits_prose_code_and_lines():
    text = ('"""Title here\n\nIntro *text*.\n"""\n\n# %%\n# Some prose\n#\n# more.\n'
            "x = 1\n\n# a code comment\ny = x + 1\n\n# %%\n# Only prose.\n")
    title, intro, cells = tutorials.parse(text)
    assert (title, intro) == ("Title here", "Intro *text*.")
    assert cells == [{"line": 10, "prose": "Some prose\n\nmore.",
                      "code": "x = 1\n\n# a code comment\ny = x + 1"},
                     {"line": None, "prose": "Only prose.", "code": ""}]
    with pytest.raises(ValueError, match="docstring"):
        tutorials.parse("x = 1\n")
    with pytest.raises(ValueError, match="line 3: code before"):
        tutorials.parse('"""T"""\n\nx = 1\n')


def test_a_failing_cell_names_the_script_its_line_and_the_error(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text('"""Broken\n"""\n\n# %%\nprint("first")\n\n# %%\n# Fails.\n'
                      'x = 1\nraise ValueError("boom")\n')
    with pytest.raises(tutorials.TutorialError) as err:
        tutorials.execute(script, tmp_path / "run")
    message = str(err.value)
    assert "tutorial broken.py: the cell at line 9 failed" in message
    assert re.search(r'broken\.py", line 10', message) and "ValueError: boom" in message


def test_cells_share_a_namespace_and_show_the_last_expression(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text('"""Ok\n"""\n\n# %%\nx = 20\n\n# %%\nopen("a.txt", "w").write("hi")\n'
                      "x + 1\n\n# %%\nNone\n")
    record = tutorials.execute(script, tmp_path / "run")
    assert [c["output"] for c in record["cells"]] == ["", "21\n", ""]
    assert record["cells"][1]["files"] == [["a.txt", 2]]


def test_torch_tutorial_without_torch_is_an_error_saying_how_to_install(tmp_path, monkeypatch):
    import importlib.util

    assert tutorials.needs_torch(SCRIPTS["torch-round-trip"].read_text())
    assert not tutorials.needs_torch(SCRIPTS["straggler-what-if"].read_text())
    assert tutorials.needs_torch("import torch.nn as nn\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(tutorials.TutorialError, match=r'needs PyTorch.*pip install -e "\.\[torch\]"'):
        tutorials.execute(SCRIPTS["torch-round-trip"], tmp_path / "run")
