"""Op kinds and their codes, op labels, actions and the schedule error: what every layer shares."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..kernels.codes import AR, BW, KINDS, B, F, L, O, R, W  # noqa: E741, F401 (kind codes by their letters, re-exported)

__all__ = ["KINDS", "Action", "PipecoreError", "InputError", "CapacityError", "ScheduleError", "op_label"]

#: Op kinds (``KINDS``, from kernels/codes.py) by their letters: R recomputes
#: a forward whose activations were dropped (it runs on the F's device
#: before the B); O offloads a forward's activations to host memory, L
#: loads them back before the backward (copies on the device's host link).
KIND_CODE = {k: i for i, k in enumerate(KINDS)}

_KIND_TYPE = pa.dictionary(pa.int8(), pa.string())
_KIND_DICTIONARY = pa.array(KINDS, type=pa.string())

SCHEMA = pa.schema(
    [
        ("device", pa.int32()),
        ("slot", pa.int32()),
        ("kind", _KIND_TYPE),
        ("stage", pa.int32()),
        ("microbatch", pa.int32()),
    ]
)

# Longest-first so "BW" is not read as "B" followed by junk.
_ACTION_RE = re.compile(r"^\s*(\d+)(BW|F|B|W|R|O|L)(\d+)\s*$")
_AR_RE = re.compile(r"^\s*(\d+)AR\s*$")


def op_label(kind, stage, microbatch) -> str:
    """Compact label of one op: ``"0F3"``, or ``"2AR"`` for an all-reduce.

    Parameters
    ----------
    kind : str or int
        Kind name or code.
    stage, microbatch : int
        Indices (the microbatch of an all-reduce is ignored).

    Returns
    -------
    str

    Raises
    ------
    IndexError
        If an integer kind code is outside 0..7.
    """
    name = KINDS[kind] if not isinstance(kind, str) else kind
    return f"{stage}AR" if name == "AR" else f"{stage}{name}{microbatch}"


class PipecoreError(Exception):
    """Base of the errors pipecore raises when it refuses an input.

    Catch it to handle every refusal (a bad value, a schedule that breaks
    a rule, a grid, a tuning or partition request that cannot be met, a
    size the machine cannot hold, a missing optional dependency) without
    catching bugs: an ``internal error`` is a RuntimeError, not one of
    these.
    """


class InputError(PipecoreError, ValueError):
    """A value pipecore refuses; the message names it and the rule it broke.

    A ValueError, so code written against earlier releases still catches it.
    """


class CapacityError(PipecoreError, MemoryError):
    """A size the machine cannot hold, refused before anything is allocated
    (the message gives what it would need and what is available)."""


class ScheduleError(InputError):
    """A schedule breaks a rule.

    Attributes
    ----------
    rule : str
        Short name of the broken rule (``"missing-op"``, ``"order"``,
        ``"deadlock"``, ...).
    device, slot, stage, microbatch : int or None
        Where the offending op is, when there is one.
    kind : str or None
        The offending op's kind.
    """

    def __init__(self, message, *, rule, device=None, slot=None, stage=None,
                 microbatch=None, kind=None):
        super().__init__(message)
        self.rule = rule
        self.device = device
        self.slot = slot
        self.stage = stage
        self.microbatch = microbatch
        self.kind = kind


@dataclass(frozen=True, order=True)
class Action:
    """One op in compact form: ``"0F3"`` is stage 0, forward, microbatch 3.

    ``str(Action.parse(s)) == s`` for every canonical string ``s`` and
    ``Action.parse(str(a)) == a`` for every action ``a``. ``"2AR"`` is the
    gradient all-reduce of replicated stage 2 (it has no microbatch).

    Parameters
    ----------
    stage : int
        Model stage, 0-based in model order.
    kind : str
        One of ``"F"``, ``"B"``, ``"W"``, ``"BW"``, ``"AR"``, ``"R"``
        (recompute of a forward whose activations were dropped), ``"O"``
        (offload them to host memory), ``"L"`` (load them back).
    microbatch : int or None
        Microbatch index, 0-based; None for ``"AR"``.

    Raises
    ------
    ValueError
        If the kind is unknown or an index is negative.
    """

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self):
        if self.kind not in KIND_CODE:
            raise InputError(
                f"'kind' must be one of {', '.join(KINDS)} (got {self.kind!r})"
            )
        fields = ("stage",) if self.kind == "AR" else ("stage", "microbatch")
        if self.kind == "AR" and self.microbatch is not None:
            raise InputError(f"an all-reduce has no microbatch (got {self.microbatch!r})")
        for field in fields:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"'{field}' must be an int (got {value!r})")
            if value < 0:
                raise InputError(f"'{field}' must be >= 0 (got {value})")
            object.__setattr__(self, field, int(value))

    def __str__(self) -> str:
        return op_label(self.kind, self.stage, self.microbatch)

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse the compact form ``"<stage><kind><microbatch>"``.

        Parameters
        ----------
        text : str
            For example ``"0F3"``, ``"5BW12"``.

        Returns
        -------
        Action

        Raises
        ------
        ValueError
            If the text is not of that form.
        """
        ar = _AR_RE.match(text) if isinstance(text, str) else None
        if ar is not None:
            return cls(int(ar.group(1)), "AR", None)
        match = _ACTION_RE.match(text) if isinstance(text, str) else None
        if match is None:
            raise InputError(
                f"cannot parse action {text!r}: expected <stage><kind><microbatch> "
                f"with kind one of F, B, W, BW, R, O, L, e.g. '0F3', or <stage>AR"
            )
        return cls(int(match.group(1)), match.group(2), int(match.group(3)))


def check_int(name, value, minimum=None):
    """An argument checked to be an int (not a bool), at least ``minimum``.

    The one check every builder and search runs on shapes, so their errors
    read alike: ``'microbatches' must be >= 1 (got 0)``.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    value : object
        What the caller passed.
    minimum : int, optional
        The least value allowed.

    Returns
    -------
    int
        ``value`` as a Python int.

    Raises
    ------
    ValueError
        (:class:`InputError`) if ``value`` is not an int or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"'{name}' must be an int (got {value!r})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InputError(f"'{name}' must be >= {minimum} (got {value})")
    return value


def check_choice(name, value, choices):
    """An argument checked to be one of a few values.

    Parameters
    ----------
    name, value : str, object
        The argument's name (for the message) and what the caller passed.
    choices : sequence
        The values allowed, in the order the message lists them.

    Returns
    -------
    object
        ``value``, allowed.

    Raises
    ------
    ValueError
        (:class:`InputError`) naming the argument, the choices and the value.
    """
    if value not in choices:
        listed = " or ".join(", ".join(repr(c) for c in choices).rsplit(", ", 1))
        raise InputError(f"'{name}' must be {listed} (got {value!r})")
    return value


def check_type(name, value, kind, what):
    """An argument checked to be an instance of ``kind``.

    Parameters
    ----------
    name, value, kind : str, object, type
        The argument's name (for the message), what the caller passed and
        the type it must have.
    what : str
        How the message names the type, e.g. ``"a pipecore.Schedule"``.

    Returns
    -------
    object
        ``value``, of that type.

    Raises
    ------
    ValueError
        (:class:`InputError`) naming the argument and the type it got.
    """
    if not isinstance(value, kind):
        raise InputError(f"'{name}' must be {what} (got {type(value).__name__})")
    return value
