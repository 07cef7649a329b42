"""The documentation site's generated pages cover what they promise (issue 42):
every public name, every CLI subcommand and every schedule family has its
entry. These check the rst the docs extensions write (docs/_ext/), without
building the site; .ci/run builds it with warnings as errors."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import apiref  # noqa: E402
import cliref  # noqa: E402
import gallery  # noqa: E402

import pipecore as pc  # noqa: E402
from pipecore.cli import COMMANDS, subcommand_parsers  # noqa: E402

_ENTRY = re.compile(r"^\.\. (?:autofunction|autoclass|autoexception|autodata|automodule):: (\S+)$",
                    re.M)


def _public_names():
    names = []
    for line in (ROOT / "tests" / "public_api.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            module, name = line.split()
            names.append(f"{module}.{name}")
    return names


def test_every_public_name_has_a_reference_entry():
    pages = apiref.pages()
    documented = {m for text in pages.values() for m in _ENTRY.findall(text)}
    missing = [name for name in _public_names() if name not in documented]
    assert not missing, f"no API reference entry for: {', '.join(missing)}"
    # Each module's page is in the reference's table of contents.
    index = pages["api/index.rst"]
    modules = {name.rsplit(".", 1)[0] for name in _public_names()}
    missing = [m for m in sorted(modules) if f"\n   {m}\n" not in index]
    assert not missing, f"module pages not in the API index: {missing}"


def test_a_name_that_does_not_exist_is_an_error_naming_it():
    with pytest.raises(ValueError, match="pipecore no_such_name"):
        apiref.pages([("pipecore", "simulate"), ("pipecore", "no_such_name")])


def test_every_cli_subcommand_has_a_section_with_its_options():
    page = cliref.page()
    subparsers = subcommand_parsers()
    assert list(subparsers) == list(COMMANDS)
    for name, sub in subparsers.items():
        heading = f"pipecore {name}\n{'-' * len(f'pipecore {name}')}\n"
        assert f".. _cli-{name}:" in page and heading in page, f"no section for {name}"
        section = page.split(heading, 1)[1].split("\n.. _cli-", 1)[0]
        for action in sub._actions:
            for option in action.option_strings:
                assert option in section, f"pipecore {name}: {option} not in its section"


def test_gallery_has_every_family_with_pictures_views_and_links():
    rows = gallery.rows()
    page = gallery.gallery_page(rows)
    families = gallery.families_page()
    assert [r["name"] for r in rows] == pc.schedules()
    for name in pc.schedules():
        assert f".. _gallery-{name}:" in page, f"no gallery entry for {name}"
        section = page.split(f".. _gallery-{name}:", 1)[1].split("\n.. _gallery-", 1)[0]
        for expected in (f"{name}-gantt.png", f"{name}-memory.png", "closed formula",
                         f"<family-{name}>`", f"<{pc.family(name).paper.url}>`__"):
            assert expected in section, f"gallery entry {name}: {expected!r} missing"
        assert f".. _family-{name}:" in families
        assert f"<gallery-{name}>`" in families, f"family {name} does not link to its picture"


def test_gallery_draws_a_gantt_and_a_memory_picture(tmp_path):
    pytest.importorskip("matplotlib", reason="the gallery draws: pip install 'pipecore[plot]'")
    rows = [r for r in gallery.rows() if r["name"] in ("1f1b", "zb-v")]
    gallery.draw(rows, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "1f1b-gantt.png", "1f1b-memory.png", "zb-v-gantt.png", "zb-v-memory.png"]


def test_landing_page_commands_are_the_readmes():
    # The landing page repeats the README's two commands; they must not drift apart.
    readme = (ROOT / "README.md").read_text()
    landing = (ROOT / "docs" / "index.md").read_text()
    readme_commands = [line.strip() for line in readme.splitlines()[:15]
                       if line.startswith("    python")]
    assert len(readme_commands) == 2
    for command in readme_commands:
        assert f"\n{command}\n" in landing, f"landing page lacks the README's {command!r}"


def test_docs_extensions_use_only_public_names_of_pipecore():
    # Issue 52: the extensions import no underscore name (and no module under
    # an underscore) from pipecore, and reach into no argparse internals
    # (pipecore.cli.subcommand_parsers gives the subcommands' parsers).
    import ast

    found = []
    for path in sorted((ROOT / "docs" / "_ext").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipecore"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(part.startswith("_") for part in node.module.split(".")):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {private}")
            if isinstance(node, ast.Attribute) and node.attr in ("_actions", "_SubParsersAction"):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not found, f"private names in docs/_ext: {found}"
