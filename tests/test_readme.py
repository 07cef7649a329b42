"""The README's Python snippets run as a new user pastes them: in order, in one
session, in an empty folder (issue 37: every README snippet runs)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_snippets_run_in_order(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the snippets draw a Gantt chart: pip install "
                                             "'pipecore[plot]'")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 6
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - say which block failed
            raise AssertionError(f"README python block {i} failed: {exc!r}\n{block}") from exc
        if i == 0:
            # What the first block's comments promise: 1F1B at p=4, m=8, f=1, b=2 takes
            # (m + p - 1)(f + b) = 33, and device d holds p - d activations (FIELD.md).
            assert namespace["res"].makespan == 33.0
            assert namespace["res"].peak_activation.tolist() == [4.0, 3.0, 2.0, 1.0]
    assert (tmp_path / "gantt.png").exists()
