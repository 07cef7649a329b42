"""The registry of schedule families that :func:`pipecore.build` reads.

Each family lives in its own module and registers a :class:`Family`: a
builder (devices, microbatches, chunks -> Schedule), a closed-form formula
for its makespan and peak activation, and the :class:`Paper` it comes from.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.ops import InputError
from ..core.schedule import Schedule, check_int
from ..core.sizes import BYTES_PER_OP, MAX_OPS, OPS_RULE, check_size  # noqa: F401 (re-exported)
from .construct import column_buffers  # noqa: F401  (blocks.py and generate.py import it here)
from .docsections import complete

__all__ = ["Family", "Paper", "register", "build", "schedules", "family"]

# The numpydoc parameters and returns every family's builder and every formula
# share (the contracts of Family.builder and Family.formula), written once here
# and added to their docstrings by with_builder_doc and with_formula_doc.
BUILDER_PARAMETERS = {"devices": ("int", "Pipeline devices p."),
                      "microbatches": ("int", "Microbatches m."),
                      "chunks": ("int", "Stages per device (fixed by the family where it takes "
                                        "none).")}
BUILDER_RETURNS = "Schedule"
FORMULA_PARAMETERS = {"p, m, v": ("int", "Devices, microbatches, chunks."),
                      "c": ("Costs", "Scalar costs.")}
FORMULA_RETURNS = "dict\n    ``makespan``, ``bubble_time``, ``peak_activation``, ``exact``."


def with_builder_doc(fn=None, **notes):
    """Add the builder contract's Parameters and Returns to a family builder's
    docstring (its own parameters follow ``devices``, ``microbatches`` and
    ``chunks``).

    Parameters
    ----------
    fn : callable, optional
        ``builder(devices, microbatches, chunks, ...) -> Schedule``. Without
        it, a decorator that takes ``notes``.
    **notes : str
        A family's own text for a shared parameter, e.g.
        ``devices="Pipeline devices p (even)."``.

    Returns
    -------
    callable
        ``fn``, its docstring completed (or the decorator).
    """
    parameters = {name: (kind, notes.get(name, text)) for name, (kind, text) in BUILDER_PARAMETERS.items()}
    if fn is None:
        return lambda f: complete(f, parameters, BUILDER_RETURNS)
    return complete(fn, parameters, BUILDER_RETURNS)


def with_formula_doc(fn):
    """Add the formula contract's Parameters and Returns to a family formula's
    docstring (its own parameters follow ``p, m, v`` and ``c``).

    Parameters
    ----------
    fn : callable
        ``formula(p, m, v, c) -> dict``.

    Returns
    -------
    callable
        ``fn``, its docstring completed.
    """
    return complete(fn, FORMULA_PARAMETERS, FORMULA_RETURNS)


@dataclass(frozen=True)
class Paper:
    """The publication a schedule family comes from.

    Attributes
    ----------
    authors : str
        As the paper lists them, shortened to "First et al." past two.
    title : str
        The title under which it appeared at ``venue``.
    venue : str
        Conference or journal with its year ("ICML 2021"), or what the
        source is when it is not a peer-reviewed paper ("arXiv:2410.19367",
        "GitHub repository").
    year : int
        Year of that publication.
    url : str
        An https address of the text: arXiv, OpenReview, a DOI or the
        repository.
    note : str
        What pipecore takes from it when that is not the whole paper (a
        section, a variant, or which part is pipecore's own choice).

    Raises
    ------
    ValueError
        If a field is empty, the year is not an int, or ``url`` is not an
        https address.
    """

    authors: str
    title: str
    venue: str
    year: int
    url: str
    note: str = ""

    def __post_init__(self):
        for name in ("authors", "title", "venue", "url"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InputError(f"Paper {name!r} must be a non-empty str (got {value!r})")
        if isinstance(self.year, bool) or not isinstance(self.year, int):
            raise InputError(f"Paper 'year' must be an int (got {self.year!r})")
        if not self.url.startswith("https://"):
            raise InputError(f"Paper 'url' must be an https address (got {self.url!r})")
        if not isinstance(self.note, str):
            raise InputError(f"Paper 'note' must be a str (got {self.note!r})")

    def citation(self) -> str:
        """One line: authors, title in quotes, venue (and the year if the venue lacks it).

        Returns
        -------
        str
        """
        venue = self.venue if str(self.year) in self.venue else f"{self.venue}, {self.year}"
        return f'{self.authors}, "{self.title}", {venue}'


@dataclass(frozen=True)
class Family:
    """A schedule family.

    Attributes
    ----------
    name : str
        Registry name (lower case).
    builder : callable
        ``builder(devices, microbatches, chunks) -> Schedule``.
    formula : callable
        ``formula(devices, microbatches, chunks, costs) -> dict`` (scalar
        costs) with ``makespan``, ``bubble_time`` (idle time within the
        longest per-device span), ``peak_activation`` (per device, in the
        units of ``costs.activation``) and ``exact`` (False where the
        formula is only an approximation for these costs); where devices do
        unequal work, also ``busy_max`` (the fullest device's busy time).
    chunks : bool
        Whether the family takes ``chunks`` (stages per device) > 1.
    default_chunks : int
        What ``chunks`` is when not given.
    summary : str
        One line for listings.
    split : bool
        Whether the family splits the backward into B and W.
    fixed_chunks : int or None
        The only ``chunks`` the family takes (2 for the V shapes).
    options : tuple of str
        Extra keyword options :func:`build` accepts for this family.
    resolve : callable, optional
        ``resolve(chunks, options) -> chunks``: turns the options into the
        chunks to build with (and checks them).
    tune_options : dict, optional
        Values of each option that :func:`pipecore.tune` tries (options not
        listed keep their default there).
    check : callable, optional
        ``check(options)``: the checks of option values that hold whatever
        the shape (raises ValueError naming the option); a grid runs them
        before scanning, so a bad value is an error, not a family that
        silently yields no rows.
    paper : Paper or None
        The publication the schedule comes from (every family pipecore
        registers has one; a family of your own may leave it None).
    """

    name: str
    builder: Callable
    formula: Callable
    chunks: bool = False
    default_chunks: int = 1
    summary: str = ""
    split: bool = False
    fixed_chunks: int | None = None
    options: tuple = ()
    resolve: Callable | None = None
    tune_options: dict = field(default_factory=dict)
    check: Callable | None = None
    paper: Paper | None = None

    def __post_init__(self):
        if self.paper is not None and not isinstance(self.paper, Paper):
            raise InputError(f"Family {self.name!r}: 'paper' must be a pipecore Paper or None "
                             f"(got {type(self.paper).__name__})")

    def chunks_for(self, requested: int | None) -> int:
        """The chunks this family uses when ``requested`` is asked for.

        Parameters
        ----------
        requested : int or None
            The caller's ``chunks`` (None for the family's default).

        Returns
        -------
        int
        """
        if self.fixed_chunks is not None:
            return self.fixed_chunks
        if not self.chunks:
            return 1
        return self.default_chunks if requested is None else requested


_REGISTRY: dict[str, Family] = {}


def register(fam: Family) -> Family:
    """Add a family to the registry.

    Parameters
    ----------
    fam : Family
        The family; :func:`build` and :func:`family` find it by its name,
        in any case.

    Returns
    -------
    Family
        ``fam`` itself, so a module can register and keep it in one line.

    Raises
    ------
    ValueError
        If the name is taken.
    """
    key = fam.name.lower()
    if key in _REGISTRY:
        raise InputError(f"schedule family {fam.name!r} is already registered")
    _REGISTRY[key] = fam
    return fam


def schedules() -> list[str]:
    """Names that :func:`build` accepts.

    Returns
    -------
    list of str
    """
    return sorted(_REGISTRY)


def family(name: str) -> Family:
    """Look up a family by name, case-insensitively.

    Parameters
    ----------
    name : str
        A name :func:`schedules` lists, in any case, spaces around it ignored.

    Returns
    -------
    Family
        Its builder, formula, options and paper.

    Raises
    ------
    ValueError
        If the name is unknown; the message lists the valid names.
    """
    key = str(name).strip().lower()
    if key not in _REGISTRY:
        raise InputError(f"unknown schedule {name!r}; valid names: {', '.join(schedules())}")
    return _REGISTRY[key]


def build(name: str, devices: int, microbatches: int, chunks: int | None = None,
          **options) -> Schedule:
    """Build a schedule of a named family.

    Parameters
    ----------
    name : str
        Family name, case-insensitive; see :func:`schedules`.
    devices : int
        Pipeline devices p >= 1.
    microbatches : int
        Microbatches m >= 1 (some families need more, e.g. a multiple of p).
    chunks : int, optional
        Stages per device v for the interleaved families (default 2);
        must be 1 or None for single-chunk families.
    **options
        Family-specific options, e.g. ``waves`` for ``hanayo`` (see the
        ``options`` of :class:`Family`). Every family also takes ``frozen``:
        stages whose weights are frozen (:func:`pipecore.freeze`).

    Returns
    -------
    Schedule
        Validated; its ``params`` record the family and the shape.

    Raises
    ------
    ValueError
        For an unknown name (listing the valid ones), arguments the family
        cannot take, a bad ``frozen`` stage, or a shape with more ops than an op table holds
        (2**31 - 1).
    MemoryError
        If building and validating the shape needs more memory than the OS
        has available (checked before anything is allocated, on Linux).
    """
    fam = family(name)
    frozen = options.pop("frozen", None)  # any family: see schedules/freeze.py
    devices = check_int("devices", devices, minimum=1)
    microbatches = check_int("microbatches", microbatches, minimum=1)
    unknown = sorted(set(options) - set(fam.options))
    if unknown:
        valid = ", ".join(fam.options) if fam.options else "none"
        raise InputError(f"'{fam.name}' takes no option {', '.join(map(repr, unknown))} "
                         f"(its options: {valid})")
    if fam.resolve is not None:
        chunks = fam.resolve(chunks, options)
    if chunks is None:
        chunks = fam.chunks_for(None)
    chunks = check_int("chunks", chunks, minimum=1)
    if fam.fixed_chunks is not None and chunks != fam.fixed_chunks:
        raise InputError(f"'{fam.name}' places {fam.fixed_chunks} stages per device: 'chunks' "
                         f"must be {fam.fixed_chunks} (got {chunks})")
    if not fam.chunks and chunks != 1:
        raise InputError(f"'{fam.name}' has one stage per device: 'chunks' must be 1 "
                         f"(got {chunks}); interleaved families take chunks")
    _check_size(fam.name, devices, microbatches, chunks)
    # Builders allocate millions of small tuples for big shapes; the cyclic
    # collector would rescan them over and over (its cost grows with the
    # live objects), and they hold no cycles, so it pauses while a builder
    # runs.
    paused = gc.isenabled()
    gc.disable()
    try:
        sched = fam.builder(devices, microbatches, chunks, **options)
    finally:
        if paused:
            gc.enable()
    sched.params.update({"family": fam.name, "devices": devices,
                         "microbatches": microbatches, "chunks": chunks, **options})
    if frozen is not None:
        sched = _FREEZE[0](sched, frozen, name=sched.name)
    return sched


#: ``pipecore.freeze``, set by schedules/freeze.py when it loads (it imports
#: families, so the registry cannot import it).
_FREEZE = [None]


def _check_size(name, p, m, v):
    """Refuse a shape whose table cannot be indexed or cannot fit in memory,
    before anything is allocated (the shared guard, core/sizes.py)."""
    # Every family has 2 or 3 ops per stage and microbatch (F and B or BW,
    # maybe W), p * v stages, and at most 2 all-reduces per device.
    check_size(f"'{name}' with devices={p}, microbatches={m}, chunks={v}", 3 * p * v * m + 2 * p,
               "ops", limit=MAX_OPS, rule=OPS_RULE, bytes_each=BYTES_PER_OP,
               least=2 * p * v * m, purpose="to build and validate", exact=False)
