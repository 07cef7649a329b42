"""Sphinx configuration of pipecore's documentation site.

Why Sphinx with the PyData theme, myst-parser and numpydoc: the docstrings
are numpydoc, the existing pages (docs/*.md, docs/research/*.md) are
Markdown, and numpy/pandas users know the PyData look.

The API reference, the command line reference and the gallery are written
into docs/generated/ by the extensions in docs/_ext/ each time the site
builds, from tests/public_api.txt, the argparse parser and
``pipecore.schedules()``: a new name, subcommand or family appears without
anyone editing a page.

Build (offline, warnings as errors, every cross-reference checked with -n)::

    pip install -e ".[docs]"
    python -m sphinx -n -W --keep-going -b html docs docs/_build/html
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))
# The gallery draws with matplotlib off screen.
os.environ.setdefault("MPLBACKEND", "Agg")

import pipecore  # noqa: E402

project = "pipecore"
author = "pipecore developers"
copyright = "pipecore developers"
release = version = pipecore.__version__

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
    "myst_parser",
    "apiref",
    "cliref",
    "gallery",
    "tutorials",
    "validationpage",
]

# A tutorial's page is its script, docs/tutorials/NAME.py: the tutorials
# extension runs it and hands the parser the page's Markdown instead of the
# code (docs/_ext/tutorials.py). No other .py under docs/ is a page (the
# top level's are conf.py and readme_figure.py).
source_suffix = {".rst": "restructuredtext", ".md": "markdown", ".py": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "_ext", "*.py", "**/__pycache__"]

# Markdown: ```python fences, $...$ maths in the research notes, anchors for
# the headings other pages link to.
myst_enable_extensions = ["dollarmath", "deflist", "colon_fence"]
myst_heading_anchors = 3

# autodoc: members in source order, type hints in the signature only (the
# numpydoc sections already say each parameter's type in words).
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {}

# numpydoc: render the docstrings as written. The class pages list their
# methods through autodoc, so numpydoc's own member tables (which would
# demand an autosummary stub for every attribute) stay off.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()

html_theme = "pydata_sphinx_theme"
html_title = f"pipecore {release}"
html_static_path = ["_static"]
html_css_files = ["pipecore.css"]
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    # The landing page has one section: its width goes to the commands instead.
    "secondary_sidebar_items": {"**": ["page-toc"], "index": []},
    "footer_start": ["copyright"],
    "footer_end": [],
}
# Pages with no section navigation of their own use the full width.
html_sidebars = {page: [] for page in ("index", "getting-started", "generated/gallery/index",
                                        "generated/cli", "guide", "tutorials/index", "validation")}
html_show_sourcelink = False
