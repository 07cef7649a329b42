"""The user guide's Python snippets (the README's until issue 42 moved them to
docs/guide.md) run as a new user pastes them: in order, in one session, in
an empty folder (issue 37: every snippet runs)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
GUIDE = README.parent / "docs" / "guide.md"


def test_guide_python_snippets_run_in_order(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the snippets draw a Gantt chart: pip install "
                                             "'pipecore[plot]'")
    # A block marked <!-- not run: reason --> is left out here too (its reason says why).
    blocks = [code for _line, code, reason in python_blocks(GUIDE) if reason is None]
    assert len(blocks) >= 6
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/guide.md python block {i}", "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - say which block failed
            raise AssertionError(f"docs/guide.md python block {i} failed: {exc!r}\n{block}") \
                from exc
        if i == 0:
            # What the first block's comments promise: 1F1B at p=4, m=8, f=1, b=2 takes
            # (m + p - 1)(f + b) = 33, and device d holds p - d activations (FIELD.md).
            assert namespace["res"].makespan == 33.0
            assert namespace["res"].peak_activation.tolist() == [4.0, 3.0, 2.0, 1.0]
    assert (tmp_path / "gantt.png").exists()


# Each ```python block of the README, docs/guide.md and docs/composing.md also
# runs on its own (issue 42): a fresh namespace holding only ``pc`` (the
# guide's first block imports pipecore as pc, and the later blocks read on
# from there), in
# an empty folder. A block that cannot run here is marked in the Markdown by
# an HTML comment on the line before its fence, ``<!-- not run: reason -->``.
ROOT = README.parent
SNIPPET_FILES = [README, GUIDE, ROOT / "docs" / "composing.md"]
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")


def python_blocks(path):
    """``(line of the opening fence, code, reason not run or None)`` per ```python block."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = next((j for j in range(start, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                raise AssertionError(f"{path.name}:{start}: ```python block is never closed")
            before = lines[i - 1] if i else ""
            marker = _NOT_RUN.search(before)
            blocks.append((start, "\n".join(lines[start:end]) + "\n",
                           marker.group(1) if marker else None))
            i = end
        i += 1
    return blocks


def test_python_blocks_finds_fences_lines_and_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n```python\nx = 1\n```\n<!-- not run: needs a GPU -->\n"
                    "```python\ny = 2\n```\n```bash\nls\n```\n")
    assert python_blocks(page) == [(2, "x = 1\n", None), (6, "y = 2\n", "needs a GPU")]


_SNIPPETS = [(path, line, code, reason) for path in SNIPPET_FILES
             for line, code, reason in python_blocks(path)]


# A snippet that explores a whole space (20-30 s each on two cores) is heavy: CI's
# `pytest -m heavy` runs it, and the docs build runs the explore tutorial.
@pytest.mark.parametrize(("path", "line", "code", "reason"), [
    pytest.param(*s, id=f"{s[0].name}:{s[1]}",
                 marks=[pytest.mark.heavy] if "pc.explore(" in s[2] else [])
    for s in _SNIPPETS])
def test_each_python_snippet_runs_alone(path, line, code, reason, tmp_path, monkeypatch):
    if reason is not None:
        pytest.skip(f"{path.name}:{line}: not run: {reason}")
    pytest.importorskip("matplotlib", reason="some snippets draw: pip install 'pipecore[plot]'")
    import pipecore

    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__snippet__", "pc": pipecore}
    # Compiled with blank lines in front so a traceback's line numbers are the file's.
    source = "\n" * line + code
    try:
        exec(compile(source, str(path.relative_to(ROOT)), "exec"), namespace)
    except Exception as exc:  # noqa: BLE001 - say which block failed, and where
        raise AssertionError(f"{path.relative_to(ROOT)}:{line}: the ```python block starting "
                             f"on this line failed: {exc!r}") from exc


def test_readme_is_one_screen_with_a_picture_and_links_that_resolve():
    # Issue 42: what pipecore is, one picture, the two commands, links into the site.
    text = README.read_text()
    assert len(text.splitlines()) <= 45, "the README is meant to be read in one screen"
    targets = re.findall(r"\]\(([^)#\s]+)\)", text)
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert images == ["docs/readme.png"]
    assert {"docs/getting-started.md", "docs/tutorials/index.md", "docs/guide.md"} <= set(targets)
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
    # Its last paragraph is the site's build command.
    assert text.rstrip().endswith("then open `docs/_build/html/index.html`.")
    assert "python -m sphinx -W --keep-going -b html docs" in text.split("\n\n")[-1].replace(
        "\n", " ")
