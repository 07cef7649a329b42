"""Text a Gantt chart draws as glyph outlines rather than Text artists:
the microbatch numbers in their boxes (flat, or digit above digit in a
narrow box) and the key above the axes.

A Text artist is laid out and rasterised on its own, and a compare labels
thousands of boxes over its charts; outlines of the few distinct strings
are made once (kept across charts), placed by offsets and filled as one
PathCollection per chart. Every function here imports matplotlib, which
its callers (the Gantt writers) have checked is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DIGIT_EM", "DIGIT_TALL_EM", "INK_EM", "STACK_GAP_EM", "key_artists",
           "key_layout", "number_artist"]

# DejaVu Sans (matplotlib's default font) in ems: every digit advances
# 0.636, the widest digit's ink is 0.54 wide and digits stand 0.73 tall;
# stacked digits are a quarter em apart.
DIGIT_EM, INK_EM, DIGIT_TALL_EM, STACK_GAP_EM = 0.64, 0.54, 0.73, 0.25

# Centred outlines of numbers at one size, by (number, stacked, size).
_NUMBERS: dict = {}
# Key labels' outlines and widths, by (label, size).
_LABELS: dict = {}
# A key entry: swatch, gap to its label, gap to the next entry (pixels).
_SWATCH_PX, _PAD_PX, _GAP_PX = 14.0, 5.0, 16.0


def _number(n: int, stacked: bool, size_px: float) -> Any:
    """The outline of a number in pixels, centred on the origin, ``size_px`` to the em."""
    key = (n, stacked, size_px)
    path = _NUMBERS.get(key)
    if path is None:
        from matplotlib.font_manager import FontProperties
        from matplotlib.path import Path
        from matplotlib.textpath import TextPath
        from matplotlib.transforms import Affine2D

        lines = list(str(n)) if stacked else [str(n)]
        parts = []
        for j, line in enumerate(lines):
            tp = TextPath((0.0, 0.0), line, prop=FontProperties(size=1.0))
            # Centred by the outline's control points (the exact extents, the
            # curves' extrema, are ten times slower and differ by a hair).
            lo, hi = tp.vertices.min(axis=0), tp.vertices.max(axis=0)
            # The first digit on top (display y runs up).
            dy = ((len(lines) - 1) / 2 - j) * (DIGIT_TALL_EM + STACK_GAP_EM)
            parts.append(tp.transformed(Affine2D().translate(-(lo[0] + hi[0]) / 2,
                                                             -(lo[1] + hi[1]) / 2 + dy)))
        path = Path.make_compound_path(*parts).transformed(Affine2D().scale(size_px))
        _NUMBERS[key] = path
    return path


def number_artist(ax: Any, x: np.ndarray, y: np.ndarray, numbers: np.ndarray,
                  stacked: np.ndarray, dark: np.ndarray, size_px: float) -> Any:
    """Numbers centred at (x, y) in data coordinates, added to ``ax``:
    black where ``dark`` (text on a light box), else white.

    The outlines are placed in pixels and joined into one path per colour,
    so Agg fills two paths, not one per number. The axes' data-to-pixel
    transform must not change before the artist is drawn.
    """
    from matplotlib.collections import PathCollection
    from matplotlib.path import Path
    from matplotlib.transforms import IdentityTransform

    at = ax.transData.transform(np.column_stack([x, y]))
    paths, colours = [], []
    for colour, want in (((0, 0, 0, 1), True), ((1, 1, 1, 1), False)):
        sel = np.flatnonzero(dark == want)
        if not sel.size:
            continue
        verts, codes = [], []
        key = numbers[sel] * 2 + stacked[sel]
        for k in np.unique(key).tolist():
            one = sel[key == k]
            glyph = _number(k // 2, bool(k % 2), size_px)
            verts.append((glyph.vertices[None, :, :] + at[one][:, None, :]).reshape(-1, 2))
            codes.append(np.tile(glyph.codes, one.size))
        paths.append(Path(np.concatenate(verts), np.concatenate(codes)))
        colours.append(colour)
    coll = PathCollection(paths, facecolors=colours, edgecolors="none", zorder=3,
                          transform=IdentityTransform())
    ax.add_collection(coll, autolim=False)
    return coll


def _label(text: str, size_px: float) -> tuple:
    """A key label's outline in pixels (baseline at the origin) and its width."""
    got = _LABELS.get((text, size_px))
    if got is None:
        from matplotlib.textpath import TextPath

        path = TextPath((0.0, 0.0), text, size=size_px)
        width = float(path.vertices[:, 0].max()) if len(path.vertices) else 0.0
        got = _LABELS[(text, size_px)] = (path, width)
    return got


def key_layout(entries: list, width: float, size_px: float) -> tuple[list, int]:
    """Left edge and row of each key entry, flowing in rows no wider than
    ``width`` pixels, and the number of rows.

    ``entries`` are (what, style, label): ``what`` is "patch" (``style`` a
    colour), "line" (``style`` a dict of LineCollection properties) or
    "note" (words alone, no swatch).
    """
    places, x, row = [], 0.0, 0
    for what, _style, text in entries:
        w = _label(text, size_px)[1] + (0.0 if what == "note" else _SWATCH_PX + _PAD_PX)
        if x > 0 and x + w > width:
            x, row = 0.0, row + 1
        places.append((x, row))
        x += w + _GAP_PX
    return places, (row + 1 if entries else 0)


def key_artists(fig: Any, entries: list, left: float, top: float, width: float,
                row_px: float, size_px: float) -> list:
    """The key's swatches, lines and labels, added to ``fig`` in pixels.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    entries : list of (str, object, str)
        As :func:`key_layout` takes them.
    left, top : float
        Pixel position of the first row's left end and top edge (y up).
    width : float
        Pixels a row may take.
    row_px, size_px : float
        A row's height and the labels' em, in pixels.

    Returns
    -------
    list
        The artists (to draw, and to remove after).
    """
    from matplotlib.collections import LineCollection, PathCollection, PolyCollection
    from matplotlib.transforms import IdentityTransform

    places, _rows = key_layout(entries, width, size_px)
    boxes, box_colours, lines, paths, offsets = [], [], [], [], []
    for (what, style, text), (x, row) in zip(entries, places):
        x0 = left + x
        yc = top - (row + 0.5) * row_px
        if what == "note":
            x0 -= _SWATCH_PX + _PAD_PX
        elif what == "patch":
            boxes.append([(x0, yc - 4.5), (x0, yc + 4.5), (x0 + _SWATCH_PX, yc + 4.5),
                          (x0 + _SWATCH_PX, yc - 4.5)])
            box_colours.append(style)
        else:
            lines.append(([(x0, yc), (x0 + _SWATCH_PX, yc)], style))
        paths.append(_label(text, size_px)[0])
        # Capitals and digits stand 0.73 em: centred on the swatch.
        offsets.append((x0 + _SWATCH_PX + _PAD_PX, yc - 0.36 * size_px))
    ident = IdentityTransform()
    out = []
    if boxes:
        out.append(PolyCollection(boxes, facecolors=box_colours, edgecolors="none",
                                  transform=ident))
    out += [LineCollection([seg], transform=ident, **style) for seg, style in lines]
    if paths:
        out.append(PathCollection(paths, offsets=offsets, offset_transform=ident, transform=ident,
                                  facecolors="#222222", edgecolors="none"))
    for a in out:
        fig.add_artist(a)
    return out
