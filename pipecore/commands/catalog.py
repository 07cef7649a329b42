"""``pipecore families``: every registered schedule family with its summary,
chunks, backward, options and the paper it comes from (``pipecore list``
prints the names and summaries only)."""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict

from ..schedules.registry import family, schedules

# Terminal output fits 120 columns; the name, chunks and backward columns
# take the first 38, every further line of an entry is indented past them.
WIDTH = 120
_NAME, _CHUNKS, _BACKWARD = 18, 11, 9
_INDENT = " " * _NAME


def families_arguments(p):
    p.add_argument("--json", action="store_true",
                   help="print a JSON list (name, summary, chunks, split, options, paper)")


def _chunks(fam) -> str:
    if fam.fixed_chunks is not None:
        return f"fixed {fam.fixed_chunks}"
    return f"default {fam.default_chunks}" if fam.chunks else "1"


def family_record(name: str) -> dict:
    """One family as plain data (what ``pipecore families --json`` prints).

    Parameters
    ----------
    name : str
        A name :func:`pipecore.schedules` lists.

    Returns
    -------
    dict
        ``name``, ``summary``, ``chunks`` (``takes``, ``default``,
        ``fixed``), ``split`` (backward split into B and W), ``options``
        and ``paper`` (its fields and ``citation``, or None).

    Raises
    ------
    ValueError
        If the name is unknown.
    """
    fam = family(name)
    paper = None
    if fam.paper is not None:
        paper = asdict(fam.paper) | {"citation": fam.paper.citation()}
    return {"name": fam.name, "summary": fam.summary,
            "chunks": {"takes": fam.chunks, "default": fam.chunks_for(None),
                       "fixed": fam.fixed_chunks},
            "split": fam.split, "options": list(fam.options), "paper": paper}


def _wrap(label: str, text: str) -> list[str]:
    """``label`` then ``text``, wrapped to WIDTH under the entry's indent."""
    first = f"{_INDENT}{label}"
    return textwrap.wrap(text, WIDTH, initial_indent=first,
                         subsequent_indent=" " * len(first), break_on_hyphens=False)


def families_table() -> str:
    """The text ``pipecore families`` prints: an entry of a few lines per family.

    Returns
    -------
    str
        Lines of at most 120 characters.
    """
    names = schedules()
    out = [f"{len(names)} schedule families (pipecore build NAME ...; chunks = stages per "
           "device, backward BW = fused, B + W = split)", "",
           f"{'family':<{_NAME}}{'chunks':<{_CHUNKS}}{'backward':<{_BACKWARD}}summary"]
    for name in names:
        fam = family(name)
        head = (f"{fam.name:<{_NAME}}{_chunks(fam):<{_CHUNKS}}"
                f"{'B + W' if fam.split else 'BW':<{_BACKWARD}}")
        out += textwrap.wrap(fam.summary or "-", WIDTH, initial_indent=head,
                             subsequent_indent=" " * len(head))
        if fam.options:
            out += _wrap("options: ", ", ".join(fam.options))
        if fam.paper is None:
            out += _wrap("paper:   ", "none recorded")
        else:
            out += _wrap("paper:   ", fam.paper.citation())
            if fam.paper.note:
                out += _wrap("         ", fam.paper.note)
            out += _wrap("         ", fam.paper.url)
        out.append("")
    return "\n".join(out)


def families_command(args, out):
    if args.json:
        out.write(json.dumps([family_record(n) for n in schedules()], indent=1) + "\n")
    else:
        out.write(families_table() + "\n")
    return 0
