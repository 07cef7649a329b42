"""Text and marks of a Gantt chart as paths in pixels: the microbatch
numbers in their boxes (flat, or digit above digit in a narrow box), the
title, the axis labels and the key above the axes.

Text is drawn as glyph outlines (matplotlib's TextPath), made once per
string and size and kept across charts; the numbers of a chart are joined
into one path per colour, so a renderer fills two paths, not one per box.
Each function here imports matplotlib, which its callers (the Gantt
writers) have checked is installed. Pixels have y running up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DIGIT_EM", "DIGIT_TALL_EM", "INK_EM", "STACK_GAP_EM", "key_layout", "key_marks",
           "make_numbers", "number_paths", "text_path", "text_lines"]

# DejaVu Sans (matplotlib's default font) in ems: every digit advances
# 0.636, the widest digit's ink is 0.54 wide and digits stand 0.73 tall;
# stacked digits are a quarter em apart.
DIGIT_EM, INK_EM, DIGIT_TALL_EM, STACK_GAP_EM = 0.64, 0.54, 0.73, 0.25
_CAP_EM = 0.73  # capitals and digits above the baseline

# Outlines by (text, size in pixels): (path, ink width), baseline at the origin.
_TEXT: dict = {}
# Centred outlines of numbers, by (number, stacked, size).
_NUMBERS: dict = {}
# A key entry: swatch, gap to its label, gap to the next entry (pixels).
_SWATCH_PX, _PAD_PX, _GAP_PX = 14.0, 5.0, 16.0


def text_path(text: str, size_px: float) -> tuple:
    """The outline of ``text`` at ``size_px`` to the em, its baseline's left
    end at the origin, and the width of its ink."""
    got = _TEXT.get((text, size_px))
    if got is None:
        from matplotlib.textpath import TextPath

        path = TextPath((0.0, 0.0), text, size=size_px)
        width = float(path.vertices[:, 0].max()) if len(path.vertices) else 0.0
        got = _TEXT[(text, size_px)] = (path, width)
    return got


def text_lines(text: str, x: float, top: float, size_px: float, line_px: float,
               align: str = "center") -> Any:
    """Lines of ``text`` as one path: each centred on ``x`` (or with its
    left or right end there), the first line's capitals' top at ``top``."""
    from matplotlib.path import Path
    from matplotlib.transforms import Affine2D

    parts = []
    for i, line in enumerate(text.split("\n")):
        path, width = text_path(line, size_px)
        left = {"center": x - width / 2, "left": x, "right": x - width}[align]
        parts.append(path.transformed(Affine2D().translate(
            left, top - _CAP_EM * size_px - i * line_px)))
    return Path.make_compound_path(*parts)


def _number(n: int, stacked: bool, size_px: float) -> Any:
    """The outline of a number in pixels, centred on the origin."""
    key = (n, stacked, size_px)
    path = _NUMBERS.get(key)
    if path is None:
        from matplotlib.path import Path
        from matplotlib.transforms import Affine2D

        lines = list(str(n)) if stacked else [str(n)]
        parts = []
        for j, line in enumerate(lines):
            tp = text_path(line, size_px)[0]
            # Centred by the outline's control points (the exact extents, the
            # curves' extrema, are ten times slower and differ by a hair).
            lo, hi = tp.vertices.min(axis=0), tp.vertices.max(axis=0)
            # The first digit on top.
            dy = ((len(lines) - 1) / 2 - j) * (DIGIT_TALL_EM + STACK_GAP_EM) * size_px
            parts.append(tp.transformed(Affine2D().translate(-(lo[0] + hi[0]) / 2,
                                                             -(lo[1] + hi[1]) / 2 + dy)))
        path = _NUMBERS[key] = Path.make_compound_path(*parts)
    return path


def make_numbers(numbers: np.ndarray, stacked: np.ndarray, size_px: float) -> None:
    """Make the outlines of these numbers now (a process forked after this
    finds them made)."""
    for k in np.unique(numbers.astype(np.int64) * 2 + stacked).tolist():
        _number(k // 2, bool(k % 2), size_px)


def number_paths(at: np.ndarray, numbers: np.ndarray, stacked: np.ndarray, dark: np.ndarray,
                 size_px: float) -> list:
    """Numbers centred at the pixel points ``at``, as (path, colour) pairs:
    one path of the black numbers (where ``dark``: on a light box) and one
    of the white."""
    from matplotlib.path import Path

    out = []
    for colour, want in (((0.0, 0.0, 0.0), True), ((1.0, 1.0, 1.0), False)):
        sel = np.flatnonzero(dark == want)
        if not sel.size:
            continue
        verts, codes = [], []
        key = numbers[sel].astype(np.int64) * 2 + stacked[sel]
        for k in np.unique(key).tolist():
            one = sel[key == k]
            glyph = _number(k // 2, bool(k % 2), size_px)
            verts.append((glyph.vertices[None, :, :] + at[one][:, None, :]).reshape(-1, 2))
            codes.append(np.tile(glyph.codes, one.size))
        out.append((Path(np.concatenate(verts), np.concatenate(codes)), colour))
    return out


def key_layout(entries: list, width: float, size_px: float) -> tuple[list, int]:
    """Left edge and row of each key entry, flowing in rows no wider than
    ``width`` pixels, and the number of rows.

    ``entries`` are (what, style, label): ``what`` is "patch" (``style`` a
    colour), "line" (``style`` a dict of :func:`key_marks`' stroke
    properties) or "note" (words alone, no swatch).
    """
    places, x, row = [], 0.0, 0
    for what, _style, text in entries:
        w = text_path(text, size_px)[1] + (0.0 if what == "note" else _SWATCH_PX + _PAD_PX)
        if x > 0 and x + w > width:
            x, row = 0.0, row + 1
        places.append((x, row))
        x += w + _GAP_PX
    return places, (row + 1 if entries else 0)


def key_marks(entries: list, left: float, top: float, width: float, row_px: float,
              size_px: float) -> list:
    """The key as marks to draw: ("fill", path, colour) for swatches and
    labels, ("stroke", path, style) for line entries.

    Parameters
    ----------
    entries : list of (str, object, str)
        As :func:`key_layout` takes them; a line's style has ``color``,
        ``lw`` (points) and optionally ``alpha`` and ``dashes`` (points).
    left, top : float
        Pixel position of the first row's left end and top edge.
    width : float
        Pixels a row may take.
    row_px, size_px : float
        A row's height and the labels' em, in pixels.

    Returns
    -------
    list of tuple
    """
    from matplotlib.path import Path

    places, _rows = key_layout(entries, width, size_px)
    marks, labels = [], []
    for (what, style, text), (x, row) in zip(entries, places):
        x0 = left + x
        yc = top - (row + 0.5) * row_px
        if what == "note":
            x0 -= _SWATCH_PX + _PAD_PX
        elif what == "patch":
            marks.append(("fill", Path([(x0, yc - 4.5), (x0, yc + 4.5), (x0 + _SWATCH_PX, yc + 4.5),
                                        (x0 + _SWATCH_PX, yc - 4.5), (x0, yc - 4.5)], closed=True),
                          style))
        else:
            marks.append(("stroke", Path([(x0, yc), (x0 + _SWATCH_PX, yc)]), style))
        labels.append(text_lines(text, x0 + _SWATCH_PX + _PAD_PX, yc + _CAP_EM * size_px / 2,
                                 size_px, 0.0, align="left"))
    if labels:
        marks.append(("fill", Path.make_compound_path(*labels), "#222222"))
    return marks
