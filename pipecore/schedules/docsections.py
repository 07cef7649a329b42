"""Numpydoc sections that several public functions share, written once.

A family's builder and formula (registry.py), a named placement, an order
constructor, a block of the V catalogue and a list scheduler each share part
of their contract with their siblings: a parameter, the type they return,
the errors they raise. :func:`complete` adds that shared text to each
function's docstring, where the function's own text goes on saying what is
its own.
"""

from __future__ import annotations

import inspect
import re
import textwrap

__all__ = ["complete"]

# numpydoc's order of sections; any other section keeps its place after these.
_ORDER = ("Parameters", "Returns", "Yields", "Receives", "Other Parameters", "Raises", "Warns",
          "Warnings", "See Also", "Notes", "References", "Examples")


def complete(fn, parameters=None, returns=None, raises=None):
    """Add shared numpydoc sections to ``fn``'s docstring.

    Parameters
    ----------
    fn : callable
        The function; its own sections stay as written.
    parameters : dict, optional
        Name -> (type, text): entries of the Parameters section, for the
        names ``fn`` takes. An entry the docstring writes itself for the
        same name is kept instead; all entries follow the order of ``fn``'s
        signature.
    returns : str, optional
        The Returns section's text, where the docstring has none.
    raises : str, optional
        The Raises section's text, where the docstring has none.

    Returns
    -------
    callable
        ``fn``, its docstring completed.
    """
    head, sections = _sections(inspect.cleandoc(fn.__doc__ or ""))
    if parameters:
        place = {name: i for i, name in enumerate(inspect.signature(fn).parameters)}
        entries = {name: entry for name, entry in _entries("\n".join(
            f"{name} : {kind}\n    {text}" for name, (kind, text) in parameters.items())).items()
            if name in place}
        entries.update(_entries(sections.get("Parameters", "")))
        ordered = sorted(entries, key=lambda name: place.get(name, len(place)))
        sections["Parameters"] = "\n".join(entries[name] for name in ordered)
    for title, text in (("Returns", returns), ("Raises", raises)):
        if text is not None and title not in sections:
            sections[title] = textwrap.dedent(text).strip("\n")
    known = [t for t in _ORDER if t in sections] + [t for t in sections if t not in _ORDER]
    fn.__doc__ = "\n\n".join([head] * bool(head) + [f"{t}\n{'-' * len(t)}\n{sections[t]}"
                                                  for t in known])
    return fn


def _sections(doc):
    """The text before the first section, and each section's text by title."""
    parts = re.split(r"^(\S[^\n]*)\n(-{3,})\n", doc, flags=re.M)
    sections = {title: text.strip("\n") for title, _rule, text in zip(parts[1::3], parts[2::3],
                                                                      parts[3::3])}
    return parts[0].rstrip(), sections


def _entries(text):
    """A Parameters section's entries by the first name each documents
    (``a, b : int`` is filed under ``a``; ``**notes`` under ``notes``)."""
    blocks = re.split(r"\n(?=\S)", text) if text else []
    return {re.split(r"[ ,:]", block, maxsplit=1)[0].lstrip("*"): block.rstrip() for block in blocks}
