"""Order policies: the priority a composed schedule's construction follows.

The second of a composition's three choices (placement, order, partition).
An :class:`Order` is a value; :func:`pipecore.compose` runs it through a
list scheduler at unit time (docs/composing.md states the rules). Two
policies:

- ``"alternate"``: each device has a forward stream (its chunks visited in
  rounds of ``group`` microbatches) and a backward stream; it runs a warm-up
  of forwards, then alternates one backward and one forward, waiting for
  each in turn. :func:`one_f_one_b`, :func:`depth_first` and
  :func:`breadth_first` are its common settings.
- ``"greedy"``: each step a device runs whichever op is ready, backward (or
  forward) first, then the lower microbatch, then the deeper stage
  (:func:`greedy`).
- ``"rotate"``: after a warm-up, a device visits its chunks in turn, each
  visit one forward, one backward and its W of that chunk (:func:`rotate`;
  ZB-V's order on the V).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.ops import InputError, check_int
from .docsections import complete

__all__ = ["Order", "one_f_one_b", "depth_first", "breadth_first", "greedy", "rotate",
           "WARMUPS", "POLICIES"]

WARMUPS = ("short", "fill", "all")
POLICIES = ("alternate", "greedy", "rotate")


@dataclass(frozen=True)
class Order:
    """An order policy for :func:`pipecore.compose`.

    Attributes
    ----------
    policy : str
        ``"alternate"``, ``"greedy"`` or ``"rotate"``.
    group : int, "all" or None
        alternate: microbatches per round of the forward stream (each round
        visits the device's chunks in stage order, ``group`` microbatches
        each); None means p, Megatron's choice; "all" means m (breadth
        first); "ready" means no fixed stream: the next forward is the
        deepest stage's that is ready, the next backward the oldest
        microbatch's that is ready. Irrelevant with one chunk.
    backward : str
        alternate: ``"fifo"`` (backwards in the forwards' rounds, chunks in
        reverse) or ``"lifo"`` (the forward stream reversed).
    warmup : str, int or tuple of int
        alternate: forwards before the first backward: ``"short"`` (the
        first backward's own forward plus one per later stage: 1F1B's p-d;
        with ``group="ready"``, one per stage from the device's first on),
        ``"fill"`` (forwards until the first backward is ready),
        ``"all"``, a count, or a count per device.
    inflight : int, tuple of int or None
        Most microbatches in flight on a device, from the forward of its
        first stage to that stage's backward (a cap on held activations:
        at most ``inflight`` per stage of the device).
    first : str
        greedy: ``"backward"`` or ``"forward"``, the kind run first when both are ready.
    strict : bool
        alternate: a device waits for the op its alternation wants next
        (the families' behaviour); with False, while that op is not ready it
        runs the other kind if that is ready, keeping at most as many
        microbatches in flight as its warm-up brought in (or ``inflight``).
    overlap : bool
        alternate and greedy: when a device (past its warm-up) has both its
        next forward and its next backward ready, of different stages, it
        runs them as one overlapped F&B unit (DualPipe's), which takes
        ``Costs.fb_factor`` times the two ops' time; the forward comes first
        in the unit and the backward is the one the policy would run next.
    """

    policy: str = "alternate"
    group: int | None = None
    backward: str = "fifo"
    warmup: object = "short"
    inflight: object = None
    first: str = "backward"
    strict: bool = True
    overlap: bool = False

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise InputError(f"order policy {self.policy!r} is not one of "
                             f"{', '.join(map(repr, POLICIES))}")
        if self.group is not None and self.group not in ("all", "ready"):
            check_int("group", self.group, minimum=1)
        if self.backward not in ("fifo", "lifo"):
            raise InputError(f"order 'backward' must be 'fifo' or 'lifo' (got {self.backward!r})")
        if self.backward == "lifo" and self.group == "ready":
            raise InputError("order backward='lifo' reverses the fixed forward stream: it needs "
                             "group= an int, 'all' or None, not 'ready'")
        if not isinstance(self.strict, (bool, np.bool_)):
            raise InputError(f"order 'strict' must be True or False (got {self.strict!r})")
        if not isinstance(self.overlap, (bool, np.bool_)):
            raise InputError(f"order 'overlap' must be True or False (got {self.overlap!r})")
        if self.overlap and self.policy == "rotate":
            raise InputError("the rotate order has no overlapped F&B units: each visit runs its "
                             "forward, backward and W in turn (overlap=True goes with the "
                             "alternate and greedy policies)")
        if self.first not in ("backward", "forward"):
            raise InputError(f"order 'first' must be 'backward' or 'forward' (got {self.first!r})")
        if not (self.policy == "rotate" and self.warmup is None):
            _counts("warmup", self.warmup, WARMUPS if self.policy != "rotate" else ())
        if self.inflight is not None:
            _counts("inflight", self.inflight, ())
        if isinstance(self.warmup, list):
            object.__setattr__(self, "warmup", tuple(self.warmup))
        if isinstance(self.inflight, list):
            object.__setattr__(self, "inflight", tuple(self.inflight))

    def describe(self) -> dict:
        """The policy as plain values, for a schedule's ``params``.

        Returns
        -------
        dict
        """
        out = {"policy": self.policy}
        if self.policy == "alternate":
            out.update(group=self.group, backward=self.backward, warmup=_plain(self.warmup),
                       strict=self.strict)
        elif self.policy == "rotate":
            out.update(warmup=_plain(self.warmup))
        else:
            out.update(first=self.first)
        out["inflight"] = _plain(self.inflight)
        if self.overlap:
            out["overlap"] = True
        return out


def _plain(x):
    return list(x) if isinstance(x, tuple) else x


def _counts(name, value, words):
    """Check a per-device count option: one of ``words``, an int >= 1 or a sequence of them."""
    if isinstance(value, str):
        if value not in words:
            allowed = ", ".join(repr(w) for w in words) + (", " if words else "")
            raise InputError(f"order {name!r} must be {allowed}an int >= 1 or one int per "
                             f"device (got {value!r})")
        return
    if np.ndim(value) == 0:
        check_int(name, value, minimum=1)
        return
    for d, x in enumerate(value):
        check_int(f"{name}[{d}]", x, minimum=1)


def _constructor(refused):
    """Give an order constructor the sections all of them share: the
    ``inflight`` entry (for those that take it), the Returns, and a Raises
    saying what ``Order`` refuses of its arguments."""
    def add(make):
        return complete(make, {"inflight": ("int or sequence of int, optional",
                                            "Most microbatches in flight per device.")},
                        "Order", f"ValueError\n    {refused}")
    return add


@_constructor("For a bad warm-up, cap or group.")
def one_f_one_b(warmup="short", inflight=None, group="ready", strict=False,
                overlap=False) -> Order:
    """1F1B: a warm-up of forwards, then one backward, one forward, ...

    By default the alternation is a preference: a device whose wanted op is
    not ready runs the other kind if that one is (keeping at most as many
    microbatches in flight as its warm-up brought in), and on a device with
    several stages the next forward (backward) is whichever is ready, the
    deepest stage (oldest microbatch) first. On one stage per device this is
    1F1B itself.

    Parameters
    ----------
    warmup : str, int or sequence of int, default "short"
        Forwards before the first backward (see :class:`Order`); "short" is
        1F1B's p-d on a linear placement, "fill" the eager count.
    group : int, "all" or "ready", default "ready"
        Fixed streams in rounds of ``group`` microbatches over the chunks,
        or "ready" (see :class:`Order`).
    strict : bool, default False
        Wait for the op the alternation wants instead.
    overlap : bool, default False
        Past the warm-up, run the next forward and the next backward as one
        overlapped F&B unit when both are ready (see :class:`Order`).
    """
    return Order("alternate", group=group, warmup=warmup, inflight=inflight, strict=strict,
                 overlap=overlap)


@_constructor("For a bad warm-up, cap or group.")
def depth_first(group=None, warmup="fill", inflight=None) -> Order:
    """Depth-first: rounds of ``group`` microbatches through the chunks,
    forwards until the first backward is ready, then strict 1F1B over the
    fixed streams (Megatron's interleaved order when group = p on a looped
    placement).

    Parameters
    ----------
    group : int, optional
        Microbatches per round (default p).
    warmup : str, int or sequence of int, default "fill"
        As :func:`one_f_one_b`.
    """
    return Order("alternate", group=group, warmup=warmup, inflight=inflight)


@_constructor('For a backward order other than "fifo" or "lifo".')
def breadth_first(backward="lifo") -> Order:
    """Breadth-first: every microbatch through chunk 0, then chunk 1, ...;
    all forwards before any backward (looped BFS; GPipe with one chunk).

    Parameters
    ----------
    backward : str, default "lifo"
        "lifo": backwards in the reverse of the forwards (the newest
        activation first, as looped BFS); "fifo": chunks in reverse,
        microbatches in order (GPipe's order with one chunk).
    """
    return Order("alternate", group="all", backward=backward, warmup="all")


@_constructor("For a bad ``first`` or cap.")
def greedy(first="backward", inflight=None, overlap=False) -> Order:
    """Earliest-start list scheduling: run whatever is ready.

    Ties go to the ``first`` kind, then the lower microbatch, then the deeper
    stage (Hanayo's order here, :func:`pipecore.generate.greedy`, at unit times).

    Parameters
    ----------
    first : str, default "backward"
        "backward" or "forward".
    overlap : bool, default False
        Run the best ready forward and the best ready backward as one
        overlapped F&B unit when both are ready (see :class:`Order`).
    """
    return Order("greedy", first=first, inflight=inflight, overlap=overlap)


@_constructor("For a bad warm-up or cap.")
def rotate(warmup=None, inflight=None) -> Order:
    """Per-chunk 1F1B: a device visits its chunks in turn after a warm-up.

    The warm-up runs forwards, the deepest stage whose forward is ready
    first. Then each visit to a chunk runs its next forward (if any is
    left), its next backward and, with split backward, that backward's W;
    chunks are visited deepest first, each joining once its first backward
    is ready. With no forward left a device runs backwards as they become
    ready and fills the gaps with the last visited chunk's W's. On the V
    placement with a warm-up of 2p-1 forwards this is ZB-V's order (the
    ``zb-v`` preset). The W rule of :func:`pipecore.compose` does not apply.
    It suits placements whose chunks of a microbatch come back to a device
    soon (the V, waves); on a looped placement a visit's forward can wait on
    a device that waits in turn, which ``compose`` reports as a deadlock.

    Parameters
    ----------
    warmup : int or sequence of int, optional
        Forwards before the first visit; default S - 1 (every stage but
        one), at most the device's forwards.
    """
    return Order("rotate", warmup=warmup, inflight=inflight)
