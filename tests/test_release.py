"""The release artifact's configuration (issue 52, part 7): the version is
written in one place and ``pipecore --version`` prints it, and the wheel's
package list names every package of the tree. .ci/run builds the wheel and
the sdist, installs the wheel in a fresh environment and runs it."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pipecore

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_reads_the_version_from_the_package():
    project = PYPROJECT["project"]
    assert "version" not in project, "pyproject.toml must not write the version itself"
    assert "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pipecore.__version__"}


def test_the_version_string_is_written_once():
    # Outside pipecore/__init__.py no source file, nor the build configuration,
    # holds the version literally (docs/conf.py reads pipecore.__version__).
    literal = re.compile(rf"""["']{re.escape(pipecore.__version__)}["']""")
    files = [ROOT / "pyproject.toml", ROOT / "docs" / "conf.py",
             *sorted((ROOT / "pipecore").rglob("*.py")), *sorted((ROOT / "bindings").rglob("*.py"))]
    holders = [str(f.relative_to(ROOT)) for f in files if literal.search(f.read_text())]
    assert holders == ["pipecore/__init__.py"]


def test_pipecore_version_prints_the_installed_distributions_version():
    # The installed metadata (what pip and importlib report) was made from
    # pipecore.__version__ at install time; the command prints the same.
    # (After changing the version, reinstall: pip install -e .)
    installed = importlib.metadata.version("pipecore")
    assert installed == pipecore.__version__
    got = subprocess.run([sys.executable, "-m", "pipecore.cli", "--version"], capture_output=True,
                         text=True, timeout=300, check=True)
    assert got.stdout.strip() == f"pipecore {installed}"


def test_the_wheel_lists_every_package_of_the_tree():
    # setuptools installs only the packages listed: one left out (as
    # pipecore.commands once was) is missing from the wheel, and the
    # installed `pipecore` command fails to import.
    setuptools = PYPROJECT["tool"]["setuptools"]
    dirs = {name: ROOT / Path(*name.split(".")) for name in setuptools["packages"]}
    dirs.update({name: ROOT / path for name, path in setuptools["package-dir"].items()})
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "pipecore").rglob("__init__.py")}
    tree |= {"pipecore." + ".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "bindings").rglob("__init__.py")}
    assert sorted(setuptools["packages"]) == sorted(tree)
    for name, folder in dirs.items():
        assert (folder / "__init__.py").is_file(), f"{name}: no {folder}/__init__.py"
