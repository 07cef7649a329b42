"""Tutorials that run: each docs/tutorials/NAME.py is a page, executed when the
docs build, shown with its code, what it printed and the files it wrote.

Why our own extension rather than sphinx-gallery: sphinx-gallery writes
reStructuredText pages into a gallery folder and shows matplotlib figures it
catches itself, while these tutorials show files pipecore writes (PNG
charts, HTML reports, Parquet folders) and run torch ranks in subprocesses;
about 200 lines here keep the page at tutorials/NAME.html, one Markdown
pipeline with the rest of the site, and no new dependency for ``.[docs]``.

A script is plain Python in the "percent" cell format (Jupytext, VS Code):

- its module docstring: the first line is the page title, the rest the
  introduction (Markdown);
- ``# %%`` starts a cell; the comment lines right after it are the cell's
  prose (Markdown, ``# `` cut), the rest its code.

Each script runs in a fresh Python process (``python tutorials.py SCRIPT
FOLDER RECORD``) whose working directory is docs/generated/tutorials/NAME/,
one namespace for all cells, as a reader pasting them in order would. Per
cell the record keeps what it printed (and the value of a last bare
expression, as a notebook shows it) and the files it made or changed. A
script runs again only when its text or pipecore's version changes (the
record carries a fingerprint; a change to this file reruns them all, as
it changes every page). A cell that raises fails the build, naming
the script, the cell's line and the traceback; a script that imports torch
fails it when torch is not installed (``pip install -e ".[torch]"``).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import html
import io
import json
import os
import shutil
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from generated import DOCS, OUT

SCRIPTS = DOCS / "tutorials"
RUNS = OUT / "tutorials"
#: The files a cell's output lists but does not show or link (data, not pages).
_SHOWN = {".png": "image", ".svg": "image", ".html": "page"}


# -- reading a script ---------------------------------------------------------------------------

def scripts(folder: Path = SCRIPTS) -> list[Path]:
    """Every tutorial script, by name."""
    return sorted(folder.glob("*.py"))


def parse(text: str) -> tuple[str, str, list[dict]]:
    """``(title, introduction, cells)``; a cell is ``{"line", "prose", "code"}``.

    ``line`` is the 1-based line of the cell's first code line in the script,
    so an error can point at it.
    """
    tree = ast.parse(text)
    doc = ast.get_docstring(tree, clean=True)
    if not doc or not tree.body or not isinstance(tree.body[0], ast.Expr):
        raise ValueError("a tutorial starts with a docstring whose first line is its title")
    title, _, intro = doc.partition("\n")
    lines = text.splitlines()
    cells, current = [], None
    for number, line in enumerate(lines[tree.body[0].end_lineno:],
                                  start=tree.body[0].end_lineno + 1):
        if line.strip() == "# %%":
            current = {"line": None, "prose": [], "code": []}
            cells.append(current)
        elif current is None:
            if line.strip():
                raise ValueError(f"line {number}: code before the first '# %%' cell marker")
        elif not current["code"] and (line.startswith("# ") or line.strip() == "#"):
            current["prose"].append(line[2:])
        elif current["code"] or line.strip():
            if current["line"] is None:
                current["line"] = number
            current["code"].append(line)
    for cell in cells:
        cell["prose"] = "\n".join(cell["prose"]).strip()
        cell["code"] = "\n".join(cell["code"]).rstrip()
    return title.strip(), intro.strip(), cells


def needs_torch(text: str) -> bool:
    """Whether a script imports torch or pipecore's torch binding."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.split(".")[0] == "torch"
                or (node.module == "pipecore.bindings" and any(a.name == "torch"
                                                                 for a in node.names))
                or node.module.startswith("pipecore.bindings.torch")):
            return True
    return False


# -- running one (in its own process) -----------------------------------------------------------

def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _run_cells(script: Path, record: Path) -> int:
    """Run ``script``'s cells in the working directory; write the record as JSON."""
    text = script.read_text()
    _title, _intro, cells = parse(text)
    here = Path.cwd()
    namespace = {"__name__": "__main__", "__file__": str(script)}
    out = {"cells": [], "error": None}
    for cell in cells:
        before = _files(here)
        printed = io.StringIO()
        entry = {"output": "", "files": []}
        out["cells"].append(entry)
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                if cell["code"]:
                    # Blank lines in front keep a traceback's line numbers the script's.
                    tree = ast.parse("\n" * (cell["line"] - 1) + cell["code"])
                    last = tree.body.pop() if tree.body and isinstance(tree.body[-1],
                                                                       ast.Expr) else None
                    exec(compile(tree, str(script), "exec"), namespace)
                    if last is not None:
                        value = eval(compile(ast.Expression(last.value), str(script), "eval"),
                                     namespace)
                        if value is not None:
                            print(repr(value))
        except BaseException:  # noqa: BLE001 - the record says what failed, the build stops
            entry["output"] = printed.getvalue()
            out["error"] = {"line": cell["line"], "traceback": traceback.format_exc()}
            break
        entry["output"] = printed.getvalue()
        after = _files(here)
        entry["files"] = [[name, after[name][1]] for name in after
                          if before.get(name) != after[name]]
    record.write_text(json.dumps(out, indent=1))
    return 1 if out["error"] else 0


def fingerprint(script: Path) -> str:
    """What decides whether a run and its page are still good: the script's text,
    pipecore's version and this extension's code (which lays the page out)."""
    import pipecore

    this = Path(__file__).resolve().read_bytes()
    return hashlib.sha256(script.read_bytes() + pipecore.__version__.encode()
                          + this).hexdigest()[:16]


class TutorialError(RuntimeError):
    """A tutorial could not run; the message names the script and says why."""


def execute(script: Path, folder: Path, timeout: float = 600.0) -> dict:
    """Run ``script`` in a fresh process in the empty folder ``folder``; return its record.

    Raises :class:`TutorialError` naming the script, the failing cell's line
    and the traceback, or saying that torch is missing.
    """
    import importlib.util

    script = Path(script).resolve()
    if needs_torch(script.read_text()) and importlib.util.find_spec("torch") is None:
        raise TutorialError(f"tutorial {script.name} needs PyTorch, which is not installed: "
                            "pip install -e \".[torch]\" (CI installs it)")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    record = folder.parent / f"{script.stem}.json"
    record.unlink(missing_ok=True)
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(script),
                           str(record)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if not record.exists():
        raise TutorialError(f"tutorial {script.name} did not run (exit {proc.returncode}):\n"
                            f"{proc.stderr[-3000:]}")
    result = json.loads(record.read_text())
    if result["error"]:
        raise TutorialError(f"tutorial {script.name}: the cell at line {result['error']['line']}"
                            f" failed:\n{result['error']['traceback']}")
    result["fingerprint"] = fingerprint(script)
    record.write_text(json.dumps(result, indent=1))
    return result


# -- the page -----------------------------------------------------------------------------------

def _size(n: int) -> str:
    for unit in ("bytes", "kB", "MB"):
        if n < 1000 or unit == "MB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def page(script: Path, result: dict) -> str:
    """The Markdown of a tutorial's page: prose, code, output and files cell by cell."""
    text = script.read_text()
    title, intro, cells = parse(text)
    stem = script.stem
    out = [f"# {title}", "", intro, "",
           f"*This page runs `docs/tutorials/{script.name}` every time the site builds; "
           "the output below is what it printed then. Run the script yourself in an empty "
           "folder to get the same files.*", ""]
    for cell, ran in zip(cells, result["cells"], strict=True):
        if cell["prose"]:
            out += [cell["prose"], ""]
        if cell["code"]:
            out += ["```python", cell["code"], "```", ""]
        if ran["output"].strip():
            out += ["```{code-block} text", ":class: tutorial-output", "",
                    ran["output"].rstrip(), "```", ""]
        listed, pages = [], []
        for name, size in ran["files"]:
            kind = _SHOWN.get(Path(name).suffix)
            if kind == "image":
                out += [f"```{{image}} /generated/tutorials/{stem}/{name}",
                        f":alt: {name}, written by the cell above", ":class: tutorial-figure",
                        "```", "", f"<p class='tutorial-caption'>{html.escape(name)}</p>", ""]
            elif kind == "page":
                href = f"{html.escape(stem)}/{html.escape(name)}"
                listed.append(f"<a href='{href}'><code>{html.escape(name)}</code></a> "
                              f"({_size(size)}, opens the page)")
                # Shown in place too; lazily, as the pages inline plotly (about 5 MB each).
                pages.append(f"<iframe class='tutorial-page' src='{href}' loading='lazy' "
                             f"title='{html.escape(name)}, written by the cell above'></iframe>")
            else:
                listed.append(f"<code>{html.escape(name)}</code> ({_size(size)})")
        if listed:
            out += ["<p class='tutorial-files'>Files written: " + ", ".join(listed) + "</p>", ""]
        for frame in pages:
            out += [frame, ""]
    return "\n".join(out) + "\n"


# -- Sphinx -------------------------------------------------------------------------------------

def _stale(script: Path) -> bool:
    record = RUNS / f"{script.stem}.json"
    if not record.exists():
        return True
    try:
        return json.loads(record.read_text()).get("fingerprint") != fingerprint(script)
    except ValueError:
        return True


def _generate(app):
    from sphinx.errors import ExtensionError
    from sphinx.util import logging

    log = logging.getLogger(__name__)
    stale = [s for s in scripts() if _stale(s)]
    app.env.pipecore_rerun = {f"tutorials/{s.stem}" for s in stale}
    # Two at a time: the machine class the build targets has two cores, and
    # most of a tutorial's time is one process simulating.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {s: pool.submit(execute, s, RUNS / s.stem) for s in stale}
        for script, future in futures.items():
            try:
                future.result()
            except TutorialError as exc:
                raise ExtensionError(str(exc)) from None
            log.info(f"tutorial {script.name} ran")


def _outdated(app, env, added, changed, removed):
    # A script run again (pipecore's version changed) is a page to read again.
    return sorted(getattr(env, "pipecore_rerun", set()) - added - changed)


def _source(app, docname, source):
    if not docname.startswith("tutorials/") or docname == "tutorials/index":
        return
    script = SCRIPTS / f"{docname.split('/', 1)[1]}.py"
    result = json.loads((RUNS / f"{script.stem}.json").read_text())
    source[0] = page(script, result)


def _copy_pages(app, exception):
    # The HTML pages a tutorial writes open from its page: beside it in the site.
    if exception is not None or app.builder.format != "html":
        return
    for script in scripts():
        folder = RUNS / script.stem
        for path in folder.rglob("*.html"):
            target = Path(app.outdir) / "tutorials" / script.stem / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def setup(app):
    app.connect("builder-inited", _generate)
    app.connect("env-get-outdated", _outdated)
    app.connect("source-read", _source)
    app.connect("build-finished", _copy_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.exit(_run_cells(Path(sys.argv[1]), Path(sys.argv[2])))
