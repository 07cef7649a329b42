"""Every command example of the README and the documentation prints no line
over 120 columns (issue 52): the first screen a user meets fits a terminal.

The examples are read from the Markdown itself (fenced ``bash``/``sh`` blocks
and the README's indented commands), optional ``[...]`` parts and trailing
``# comments`` dropped, and each reads what the examples before it made, as a reader pastes
them: the scan the ``report results/`` line reads, the CSV ``run-torch``
runs and the traces ``what-if`` reads are made, in the example's own
folder, by the page's examples that make them. Examples that take long
(a full study, real torch runs, Ray, the explore of p=8) are marked
``heavy``: CI runs them (``pytest -m heavy``); the README's test command
leaves them out.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipecore.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs" / "tutorials").glob("*.md")), ROOT / "bindings" / "README.md"]
WIDTH = 120

# Prefixes of examples that take tens of seconds or more, or real torch ranks.
HEAVY = ("study", "plan --model gpt3-175b", "plan --model megatron-1.7b --cluster a100:8,h100:8",
         "run-torch", "what-if", "warm", "explore -p 8", "calibrate", "plan --model megatron-1.7b --hardware",
         "explore -p 4 -m 16 --transformer",
         "scan grid.toml --out results/ --backend ray", "tune -p 8 -m 32 --memory-limit 2 --offload")
# What an example reads, made by an earlier one.
NEEDS = {"results/": "scan grid.toml --out results/", "traces/": "run-torch sched.csv --ranks 2 "
         "--model tiny-transformer --profile traces/", "sched.csv": "export",
         "my-hardware.toml": "calibrate --out my-hardware.toml"}


def examples() -> list[tuple[str, str]]:
    """``(page:line, command without "pipecore ")`` for each example, in page order."""
    found = []
    for page in PAGES:
        fence = None
        for n, line in enumerate(page.read_text().splitlines(), 1):
            text = line.strip()
            if text.startswith("```"):
                fence = None if fence is not None else text[3:]
                continue
            if fence is None and not line.startswith("    "):
                continue
            if fence is not None and not any(k in fence for k in ("bash", "sh", "console")):
                continue
            m = re.search(r"(?:^|&& )pipecore ([a-z].*)$", text.removeprefix("$ "))
            if not m:
                continue
            command = re.sub(r"\s+#.*$", "", m.group(1))
            command = re.sub(r"\s*\[[^\]]*\]", "", command).strip()
            found.append((f"{page.relative_to(ROOT)}:{n}", command))
    return found


EXAMPLES = examples()


def test_examples_are_found_on_every_page_that_has_them():
    where = {w.split(":")[0] for w, _c in EXAMPLES}
    assert {"README.md", "docs/guide.md", "bindings/README.md"} <= where
    assert ("README.md:6", "compare --devices 8 --microbatches 32") in EXAMPLES
    # Optional parts and comments are dropped, the command kept: the guide's line
    # "pipecore compare --devices 8 --microbatches 32 [--chunks 2] ... # also writes ...".
    guide = [c for w, c in EXAMPLES if w.startswith("docs/guide.md:")]
    assert guide[0] == "compare --devices 8 --microbatches 32"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A folder per page, made on first use, with the guide's own grid file:
    each page's examples run in order in its own folder, as its reader runs them."""
    made = {}
    guide = (ROOT / "docs" / "guide.md").read_text()
    grid = re.search(r"```toml\n(.*?)```", guide, re.S).group(1)
    # The guide's grid samples 100,000 rows; the width of what scan prints does
    # not depend on how many.
    grid = re.sub(r"(?m)^sample = \d+", "sample = 200", grid)

    def folder(page):
        if page not in made:
            made[page] = tmp_path_factory.mktemp(page.replace("/", "-").replace(":", "-"))
            (made[page] / "grid.toml").write_text(grid)
        return made[page]

    return folder


def _run(command, folder, capfd, monkeypatch):
    monkeypatch.chdir(folder)
    code = main(shlex.split(command))
    out, err = capfd.readouterr()
    return code, out, err


def _maker(page, line, path):
    """The example of the same page that makes ``path``: the nearest before
    ``page:line``, else the first after it (a reference list, not a script)."""
    mine = [(int(w.split(":")[1]), c) for w, c in EXAMPLES
            if w.split(":")[0] == page and c.startswith(NEEDS[path])]
    before = [c for n, c in mine if n < line]
    return before[-1] if before else next((c for n, c in mine if n > line), None)


def _make_inputs(command, page, line, folder, capfd, monkeypatch):
    """Make in ``folder`` each file ``command`` reads, by the example of
    ``page`` that makes it (see :func:`_maker`), its own inputs first."""
    for path, maker_prefix in NEEDS.items():
        if path not in command.split() or command.startswith(maker_prefix):
            continue
        maker = _maker(page, line, path)
        if maker is None or (folder / path).exists():
            continue
        _make_inputs(maker, page, line, folder, capfd, monkeypatch)
        code, _out, err = _run(maker, folder, capfd, monkeypatch)
        assert code == 0, f"pipecore {maker} (needed by pipecore {command}) failed: {err}"


def _params():
    """One test per distinct command (per page where it reads what an earlier
    example made), named by the first place it stands."""
    places = {}
    for where, command in EXAMPLES:
        reads = any(path in command.split() for path in NEEDS)
        places.setdefault((where.split(":")[0] if reads else "", command), []).append(where)
    return [pytest.param(where[0], command, id=f"{where[0]} {command}",
                         marks=[pytest.mark.heavy] if command.startswith(HEAVY) else [])
            for (_page, command), where in places.items()]


@pytest.mark.parametrize(("where", "command"), _params())
def test_example_fits_120_columns(where, command, folders, capfd, monkeypatch):
    if command.startswith(("run-torch", "what-if", "calibrate")) or "my-hardware.toml" in command.split():
        pytest.importorskip("torch", reason="torch examples need pipecore[torch]")
    if "--backend ray" in command:
        pytest.importorskip("ray", reason="the Ray example needs pipecore[ray]")
    page, line = where.split(":")
    # An example that reads or makes a file runs in a folder of its own, where
    # what it reads is made first by the examples of its page that make it (in
    # turn reading what they need): the result does not depend on which
    # examples a pytest worker ran before.
    touches = any(path in command.split() or command.startswith(maker)
                  for path, maker in NEEDS.items())
    folder = folders(where) if touches else folders(page)
    _make_inputs(command, page, int(line), folder, capfd, monkeypatch)
    code, out, err = _run(command, folder, capfd, monkeypatch)
    assert code == 0, f"pipecore {command} exited {code}: {err[-2000:]}"
    assert out.strip(), f"pipecore {command} printed nothing"
    wide = [(n, len(line)) for n, line in enumerate((out + err).splitlines(), 1)
            if len(line) > WIDTH]
    assert not wide, (f"pipecore {command}: lines over {WIDTH} columns (line, width): "
                      f"{wide[:5]}\n{(out + err)[:3000]}")
