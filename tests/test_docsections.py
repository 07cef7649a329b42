"""The shared numpydoc sections (pipecore/schedules/docsections.py): what
``complete`` adds to a docstring and where, and the docstrings it completes
in the package stay whole (every parameter, a Returns and a Raises)."""

import inspect
import re

import pytest

from pipecore.schedules import blocks, generate, orders, placements, registry
from pipecore.schedules.docsections import complete


def _make(doc):
    def fn(devices, microbatches, chunks=1, name="x"):
        pass
    fn.__doc__ = doc
    return fn


def _section(doc, title):
    match = re.search(rf"^{title}\n-+\n(.*?)(?=\n\n\S[^\n]*\n-{{3,}}\n|\Z)", doc, re.S | re.M)
    return match.group(1) if match else None


def test_shared_entries_follow_the_signature_and_the_own_text_wins():
    fn = complete(_make("""Summary.

        Parameters
        ----------
        chunks : int
            Its own text.
        """), {"name": ("str", "Shared name."), "devices": ("int", "Shared devices."),
               "chunks": ("int", "Shared chunks.")})
    params = _section(fn.__doc__, "Parameters")
    assert params == ("devices : int\n    Shared devices.\nchunks : int\n    Its own text.\n"
                      "name : str\n    Shared name.")


def test_shared_parameters_the_function_does_not_take_are_left_out():
    fn = complete(_make("Summary."), {"inflight": ("int", "Cap."), "devices": ("int", "p.")})
    assert "inflight" not in fn.__doc__
    assert _section(fn.__doc__, "Parameters") == "devices : int\n    p."


def test_returns_and_raises_are_added_only_where_missing_and_in_numpydoc_order():
    own = complete(_make("""Summary.

        Raises
        ------
        ValueError
            Its own.

        Returns
        -------
        dict
            Its own.
        """), None, "Schedule", "KeyError\n    Shared.")
    assert _section(own.__doc__, "Returns") == "dict\n    Its own."
    assert _section(own.__doc__, "Raises") == "ValueError\n    Its own."
    # numpydoc's order (Parameters, Returns, ..., Raises), whatever order they were written in.
    assert own.__doc__.index("Returns\n") < own.__doc__.index("Raises\n")
    added = complete(_make("Summary.\n\nNotes\n-----\nA note."), {"devices": ("int", "p.")},
                     "dict\n    ``makespan``.", "\n    ValueError\n        Shared.\n    ")
    assert added.__doc__ == ("Summary.\n\nParameters\n----------\ndevices : int\n    p.\n\n"
                             "Returns\n-------\ndict\n    ``makespan``.\n\n"
                             "Raises\n------\nValueError\n    Shared.\n\nNotes\n-----\nA note.")


COMPLETED = ([getattr(placements, n) for n in ("linear", "looped", "v", "wave", "bidirectional")]
             + [getattr(orders, n) for n in ("one_f_one_b", "depth_first", "breadth_first", "greedy",
                                             "rotate")]
             + [getattr(generate, n) for n in generate.__all__]
             + [blocks.v_min, blocks.v_half, blocks.v_zb])


@pytest.mark.parametrize("fn", COMPLETED, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_completed_docstrings_document_every_parameter_once(fn):
    doc = inspect.getdoc(fn)
    params = _section(doc, "Parameters")
    documented = [name.strip().lstrip("*") for line in params.splitlines() if not line.startswith(" ")
                  for name in line.split(" : ")[0].split(",")]
    assert documented == list(inspect.signature(fn).parameters), doc
    assert _section(doc, "Returns") and _section(doc, "Raises"), doc


def test_the_named_placements_raises_names_their_counts():
    assert "If devices or waves < 1," in placements.wave.__doc__
    assert "If devices < 1," in placements.v.__doc__


def test_every_family_builder_documents_the_builder_contract():
    import pipecore as pc

    for name in pc.schedules():
        doc = inspect.getdoc(pc.family(name).builder)
        params = _section(doc, "Parameters")
        for shared in registry.BUILDER_PARAMETERS:
            assert f"{shared} : int" in params, (name, shared)
        assert doc.index("Parameters\n") < doc.index("Returns\n"), name
