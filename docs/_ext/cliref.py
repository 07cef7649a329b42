"""The command line reference, written from pipecore's argparse parser when
the docs build: a section per subcommand with its ``--help`` text, in the
order ``pipecore --help`` lists them.

It also runs the README's main job (``pipecore compare --devices 8
--microbatches 32``, without its pictures) so the getting-started page
shows the table the command prints today.
"""

from __future__ import annotations

import argparse
import functools
import io

from generated import OUT, title, write_pages

# The width the help text is wrapped to (argparse otherwise reads the terminal's).
WIDTH = 88


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(parser.formatter_class, width=WIDTH)
    return parser.format_help()


def _block(text: str) -> list[str]:
    body = [f"   {line}".rstrip() for line in text.splitlines()]
    return [".. code-block:: text", "   :class: cli-help", ""] + body + [""]


def page() -> str:
    """The reference page's rst text."""
    from pipecore.cli import COMMANDS, parser, subcommand_parsers

    top = parser()
    subs = subcommand_parsers()
    out = [title("Command line reference"),
           "``pipecore`` is installed with the package (``pip install -e .``). Every subcommand "
           "prints this text with ``pipecore SUBCOMMAND --help``; the page is made from the same "
           "parser each time the site builds.", ""]
    out += _block(_help(top))
    for name, sub in subs.items():
        out += [f".. _cli-{name}:", "", title(f"pipecore {name}", "-")]
        if name in COMMANDS:
            out += [COMMANDS[name].help[:1].upper() + COMMANDS[name].help[1:] + ".", ""]
        out += _block(_help(sub))
    return "\n".join(out)


def compare_output() -> str:
    """What ``pipecore compare --devices 8 --microbatches 32`` prints (no files written)."""
    from pipecore.cli import main

    buffer = io.StringIO()
    status = main(["compare", "--devices", "8", "--microbatches", "32", "--no-gantt",
                   "--no-report"], out=buffer)
    if status != 0:
        raise RuntimeError(f"pipecore compare exited with status {status}")
    return buffer.getvalue()


def _generate(app):
    write_pages({"cli.rst": page(), "compare-output.txt": compare_output()}, OUT)


def setup(app):
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
