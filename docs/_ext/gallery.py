"""The gallery and the schedule families' reference, drawn when the docs build.

Every family ``pipecore.schedules()`` lists, at one shape (p=4 devices,
m=8 microbatches, the family's default chunks) and the costs ``pipecore
compare`` uses by default: its Gantt chart (:func:`pipecore.output.gantt.write_gantt`),
its memory per device over time, and the three views (closed formula,
ideal table, simulation) as ``pipecore.compare`` computes them and
``report.html`` tabulates them. A family registered tomorrow is drawn
by the next build.

Each family's paper is its :attr:`pipecore.Family.paper` (a
:class:`pipecore.Paper`); a family without one is a build warning, so the
gallery never shows a family without its source. The extension uses
pipecore's public API only.
"""

from __future__ import annotations

import re

from generated import OUT, summary, title, write_pages

DEVICES, MICROBATCHES = 4, 8


def _costs():
    """The costs ``pipecore compare`` uses when given none (f = b = w = 1)."""
    from pipecore.cli import parser
    from pipecore.commands.options import costs_from, network_from

    args = parser().parse_args(["compare", "--devices", str(DEVICES),
                                 "--microbatches", str(MICROBATCHES)])
    return costs_from(args), network_from(args)


def rows() -> list[dict]:
    """One :func:`pipecore.compare` row per family, at the gallery's shape."""
    import pipecore as pc

    costs, network = _costs()
    return [pc.compare(DEVICES, MICROBATCHES, chunks=pc.family(name).default_chunks,
                       costs=costs, network=network, names=[name])[0]
            for name in pc.schedules()]


def _description(doc: str | None) -> str:
    """A numpydoc docstring's text before its first section (Parameters, ...)."""
    if not doc:
        return ""
    lines = doc.strip().splitlines()
    for i in range(1, len(lines)):
        if re.fullmatch(r"-{3,}", lines[i].strip()) and lines[i - 1].strip():
            lines = lines[:i - 1]
            break
    return "\n".join(lines).strip()


def _indent(text: str, by: str = "   ") -> str:
    return "\n".join(by + line if line else "" for line in text.splitlines())


def _paper(name: str) -> str:
    """The family's paper as an rst line: its citation linked to its text, then its note."""
    import pipecore as pc

    paper = pc.family(name).paper
    if paper is None:
        return "Paper: none recorded (give the Family a ``paper``)."
    note = f"; {paper.note}" if paper.note else ""
    return f"Paper: `{_rst_text(paper.citation())} <{paper.url}>`__{_rst_text(note)}."


def _rst_text(text: str) -> str:
    # Backslash-escape what rst reads as markup inside a link text or a line.
    return re.sub(r"([\\`*_|<>])", r"\\\1", text)


def families_page() -> str:
    """The rst of the families' reference: a section per family."""
    import inspect

    import pipecore as pc

    out = [".. _families:", "", title("Schedule families"),
           "The families :func:`pipecore.build` takes by name, as :func:`pipecore.schedules` "
           "lists them. Each is a :class:`pipecore.Family`: a builder (devices, microbatches, "
           "chunks to a :class:`pipecore.Schedule`) and a closed formula for its makespan and "
           "peak activation (:func:`pipecore.formula`). The :doc:`../gallery/index` draws each "
           "one.", ""]
    for name in pc.schedules():
        fam = pc.family(name)
        chunks = (f"fixed at {fam.fixed_chunks}" if fam.fixed_chunks else
                  f"default {fam.default_chunks}" if fam.chunks else "1 (takes no ``chunks``)")
        facts = [("chunks (stages per device)", chunks),
                 ("backward", "split into B and W" if fam.split else "fused (BW)"),
                 ("options", ", ".join(f"``{o}``" for o in fam.options) or "none")]
        text = summary(fam.summary)
        out += [f".. _family-{name}:", "", title(name, "-"), text[:1].upper() + text[1:] + ".", "",
                _paper(name), "", f"Picture: :ref:`the gallery's {name} <gallery-{name}>`.", ""]
        for key, value in facts:
            out += [f":{key}: {value}"]
        out += ["", f"**Builder** (``pc.build({name!r}, devices, microbatches, ...)``):", "",
                _description(inspect.getdoc(fam.builder)), "",
                "**Formula** (``pc.formula(schedule, costs)``):", "",
                _description(inspect.getdoc(fam.formula)), ""]
    return "\n".join(out)


def _views(row: dict) -> str:
    from pipecore.output.report import views_table

    return views_table(row)


def gallery_page(table: list[dict]) -> str:
    """The gallery's rst, from :func:`rows` (the pictures are named, not drawn)."""
    from pipecore.analysis.compare import describe_costs

    costs, _ = _costs()
    out = [title("Gallery"),
           f"Every schedule family at p={DEVICES} devices and m={MICROBATCHES} microbatches, "
           "with the family's default chunks per device (v), drawn from the library each time "
           f"the site builds, with {describe_costs(costs)}. Each entry shows the Gantt chart "
           "(one row per device, ops coloured by kind; lighter shades are later chunks), memory "
           "per device over time, and the three views of "
           ":func:`pipecore.compare`: the closed formula, the ideal table at unit op times and "
           "the simulation.", "",
           "The same pictures for your own shape: ``pipecore compare --devices P "
           "--microbatches M`` (see :doc:`/getting-started`).", ""]
    out += [".. raw:: html", "", "   <div class='gallery-index'>"]
    out += [f"   <a href='#gallery-{r['name']}'>{r['name']}</a>" for r in table]
    out += ["   </div>", ""]
    for row in table:
        name = row["name"]
        out += [f".. _gallery-{name}:", "", title(name, "-")]
        if row["error"]:
            out += [f"Not drawn at this shape: {row['error']}", ""]
            continue
        text = summary(pc_summary(name))
        out += [f"{text[:1].upper() + text[1:]}; v={row['chunks']}, makespan "
                f"{row['makespan']:g} cost units.", "",
                f"Reference: :ref:`the {name} family <family-{name}>` · {_paper(name)}", "",
                f".. image:: {name}-gantt.png", f"   :alt: Gantt chart of {name}", "",
                # Memory and the views side by side (docs/_static/pipecore.css).
                ".. container:: gallery-row", "",
                f"   .. image:: {name}-memory.png",
                f"      :alt: memory per device over time, {name}", "",
                "   .. raw:: html", "", _indent(f"<div class='views-box'>{_views(row)}</div>", "      "), ""]
        if row["flags"]:
            out += ["Where the views disagree:", ""]
            out += [f"- {flag}" for flag in row["flags"]] + [""]
        else:
            out += ["The three views agree.", ""]
    return "\n".join(out)


def pc_summary(name: str) -> str:
    import pipecore as pc

    return pc.family(name).summary


def draw(table: list[dict], folder) -> None:
    """Write each family's ``NAME-gantt.png`` and ``NAME-memory.png`` into ``folder``."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from pipecore.output.gantt import write_gantt

    folder.mkdir(parents=True, exist_ok=True)
    for row in table:
        res = row["result"]
        if res is None:
            continue
        name = row["name"]
        write_gantt(res, folder / f"{name}-gantt.png")
        # Memory as report.html's chart draws it: activation + weights per
        # device, a step after each event.
        mem = res.memory
        dev = mem.column("device").to_numpy()
        time = mem.column("time").to_numpy()
        act = mem.column("activation").to_numpy()
        static = np.asarray(res.static_memory, dtype=np.float64)
        fig = Figure(figsize=(5.2, 3.2), dpi=110, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for d in range(int(res.devices)):
            sel = np.flatnonzero(dev == d)
            t = np.concatenate([[0.0], time[sel], [res.makespan]])
            a = np.concatenate([[0.0], act[sel], [act[sel][-1] if sel.size else 0.0]])
            ax.step(t, a + static[d], where="post", label=f"device {d}", linewidth=1.5)
        ax.set_xlim(0, res.makespan)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("time (cost units)")
        ax.set_ylabel("memory (M)")
        ax.set_title(f"{name}: memory per device (activation + weights)", loc="left",
                     fontsize=10)
        ax.legend(loc="upper center", ncols=int(res.devices), fontsize=8, frameon=False,
                  bbox_to_anchor=(0.5, -0.22), handlelength=1.2)
        ax.grid(alpha=0.3)
        fig.savefig(folder / f"{name}-memory.png")


def _generate(app):
    from sphinx.util import logging

    import pipecore as pc

    log = logging.getLogger(__name__)
    for name in pc.schedules():
        if pc.family(name).paper is None:
            log.warning("gallery: family %r has no paper (Family.paper is None)", name)
    table = rows()
    for row in table:
        if row["error"]:  # the gallery promises a picture of every family
            log.warning("gallery: family %r cannot be built at p=%d, m=%d: %s", row["name"],
                        DEVICES, MICROBATCHES, row["error"])
    draw(table, OUT / "gallery")
    write_pages({"gallery/index.rst": gallery_page(table), "api/families.rst": families_page()},
                OUT)


def setup(app):
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
