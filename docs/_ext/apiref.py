"""The API reference, written from tests/public_api.txt when the docs build.

tests/public_api.txt lists the public names, one ``module name`` a line. A
page per module lists its names with their first docstring line; a page
per name holds its autodoc entry (a module named as a name, such as
``pipecore blocks``, is its module's page). Adding a line to the file adds
the entry; tests/test_docs.py checks that every line has one.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys

from generated import OUT, ROOT, summary, title, write_pages

PUBLIC_API = ROOT / "tests" / "public_api.txt"

# The directive that documents each kind of object.
DIRECTIVES = {"function": "autofunction", "class": "autoclass", "exception": "autoexception",
              "data": "autodata"}
ROLES = {"function": "func", "class": "class", "exception": "exc", "data": "data",
         "module": "mod"}


def read_names(path=PUBLIC_API) -> list[tuple[str, str]]:
    """``(module, name)`` pairs of the file, in its order (``#`` lines are comments)."""
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected 'module name' (got {line!r})")
        pairs.append((parts[0], parts[1]))
    return pairs


def kind_of(obj) -> str:
    """``module``, ``exception``, ``class``, ``function`` or ``data``."""
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    return "function" if callable(obj) else "data"


def _lookup(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{PUBLIC_API.name}: {module} {name}: not importable ({exc})") from exc


def doc_comment(name: str, obj) -> str:
    """The ``#:`` comment above the assignment of constant ``name`` in the
    pipecore module that defines it (a constant's ``__doc__`` is its type's)."""
    pattern = re.compile(rf"((?:^#:.*\n)+)^{re.escape(name)}\b\s*(?::[^=\n]*)?=", re.M)
    for modname, module in sorted(sys.modules.items()):
        if not modname.startswith("pipecore") or getattr(module, name, None) is not obj:
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            continue
        found = pattern.search(source)
        if found:
            return "\n".join(line[2:].strip() for line in found.group(1).splitlines())
    return ""


def _summary(obj, kind: str, name: str) -> str:
    if kind == "data":
        return summary(doc_comment(name, obj))
    return summary(inspect.getdoc(obj))


def _name_page(module: str, name: str, kind: str) -> str:
    full = f"{module}.{name}"
    lines = [title(full), f".. {DIRECTIVES[kind]}:: {full}"]
    if kind in ("class", "exception"):
        lines.append("   :members:")
    return "\n".join(lines) + "\n"


def _module_page(module: str, entries: list[tuple[str, str, str]]) -> str:
    out = [title(module), f".. automodule:: {module}", "   :no-members:", ""]
    if entries:
        out += [".. list-table::", "   :widths: 30 70", "   :class: api-names", ""]
        for name, kind, text in entries:
            full = f"{module}.{name}"
            link = f":py:{ROLES[kind]}:`~{full}`"
            out += [f"   * - {link}", f"     - {text}" if text else "     -"]
        out.append("")
        pages = [f"{module}.{name}" for name, kind, _ in entries if kind != "module"]
        if pages:
            out += [".. toctree::", "   :hidden:", ""] + [f"   {p}" for p in pages] + [""]
    return "\n".join(out)


def pages(pairs: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """The reference's rst pages, ``{path under docs/generated/: text}``."""
    pairs = read_names() if pairs is None else pairs
    modules: dict[str, list] = {}
    for module, name in pairs:
        obj = _lookup(module, name)
        kind = kind_of(obj)
        modules.setdefault(module, []).append((name, kind, _summary(obj, kind, name)))
        if kind == "module":
            modules.setdefault(f"{module}.{name}", [])
    out = {}
    for module, entries in modules.items():
        out[f"api/{module}.rst"] = _module_page(module, entries)
        for name, kind, _ in entries:
            if kind != "module":
                out[f"api/{module}.{name}.rst"] = _name_page(module, name, kind)
    index = [title("API reference"),
             "Every public name, from its docstring. The schedule families have a page of "
             "their own (:doc:`families`), and the :doc:`../gallery/index` draws each one.", "",
             ".. toctree::", "   :maxdepth: 1", "", "   families"]
    index += [f"   {module}" for module in modules] + [""]
    out["api/index.rst"] = "\n".join(index)
    return out


def _generate(app):
    write_pages(pages(), OUT)


def _skip_field_aliases(app, what, name, obj, skip, options):
    # A NamedTuple's fields carry the docstring "Alias for field number N";
    # the class docstring's Attributes section documents them already.
    doc = getattr(obj, "__doc__", None) or ""
    if doc.startswith("Alias for field number"):
        return True
    return None


def _constant_docs(app, what, name, obj, options, lines):
    # autodoc gives a constant its type's docstring ("Built-in immutable
    # sequence."); the constant's own words are its ``#:`` comment.
    if what == "data" and not inspect.ismodule(obj) and not callable(obj):
        lines[:] = doc_comment(name.rsplit(".", 1)[-1], obj).splitlines()


def setup(app):
    app.connect("autodoc-process-docstring", _constant_docs)
    app.connect("builder-inited", _generate)
    app.connect("autodoc-skip-member", _skip_field_aliases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
