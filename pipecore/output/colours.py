"""How an op looks in every chart and page: its kind's colour, a second hue
for the second of two pipelines (Chimera, BitPipe, DualPipe), and a shade
per chunk (stage rank on its device within its pipeline), darker to lighter."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["KIND_ORDER", "KIND_COLOURS", "SECOND_PIPELINE_COLOURS", "UNKNOWN_COLOUR",
           "OpStyles", "chunk_of", "chunk_shade", "op_styles", "pipelines_of", "shade_hex"]

# Fixed kind order so legends and colours are stable from run to run.
KIND_ORDER = ("F", "B", "W", "BW", "AR", "R", "O", "L")
KIND_COLOURS = {
    "F": "#4C72B0",  # blue
    "B": "#DD8452",  # orange
    "W": "#55A868",  # green
    "BW": "#9467BD",  # purple, a red one: apart from F's blue in every chunk's shade
    "AR": "#C44E52",  # red: gradient all-reduce of a replicated stage
    "R": "#937860",  # brown: recompute of a dropped forward
    "O": "#8C8C8C",  # grey: offload issued (no compute time)
    "L": "#8C8C8C",  # grey: load back issued (no compute time)
}
# The second pipeline's ops: a neighbouring hue of the same kind, so a kind
# still reads as one family of colours while the two pipelines part.
SECOND_PIPELINE_COLOURS = {
    "F": "#3A9E9A",  # teal
    "B": "#C9A227",  # mustard
    "W": "#9BA33A",  # olive
    "BW": "#C0609A",  # magenta
    "R": "#B0885A",  # tan
}
UNKNOWN_COLOUR = "#8C8C8C"
# Grey whose shades stand for the chunks in legends.
CHUNK_GREY = "#808080"
# A device's first chunk is drawn darker than its kind's colour and its
# last lighter: spreading the shades both ways keeps two chunks of one kind
# far apart while a light F and a light BW stay apart too (blending all
# towards white brought the pale ones together: bitpipe's four purples).
_FIRST_CHUNK, _LAST_CHUNK = -0.25, 0.35


def chunk_shade(chunk: int, n_chunks: int) -> float:
    """A chunk's shade for :func:`shade_hex`: 0 with one chunk, else from
    darker (chunk 0) to lighter (the last)."""
    if n_chunks <= 1:
        return 0.0
    return _FIRST_CHUNK + (_LAST_CHUNK - _FIRST_CHUNK) * chunk / (n_chunks - 1)


def pipelines_of(device: np.ndarray, stage: np.ndarray,
                 microbatch: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """Pipeline of every op and the device each pipeline enters at.

    A microbatch runs in the pipeline whose first stage it starts on: one
    pipeline for most schedules, two for bidirectional ones (Chimera's down
    pipeline enters at device 0, its up pipeline at device p-1). Ops without
    a microbatch (an all-reduce, microbatch < 0) get -1. More than two entry
    devices (a hand-made schedule) are not told apart: one pipeline.

    Parameters
    ----------
    device, stage, microbatch : numpy.ndarray
        The op table's columns, one entry per op.

    Returns
    -------
    numpy.ndarray
        0 or 1 per op (-1 without a microbatch).
    tuple of int
        The entry devices, ascending: one or two (none without ops).
    """
    device = np.asarray(device, dtype=np.int64)
    stage = np.asarray(stage, dtype=np.int64)
    microbatch = np.asarray(microbatch, dtype=np.int64)
    has_mb = microbatch >= 0
    out = np.where(has_mb, 0, -1)
    if not has_mb.any():
        return out, ()
    entry = np.full(int(microbatch.max()) + 1, -1, dtype=np.int64)
    first = np.flatnonzero((stage == 0) & has_mb)[::-1]  # reversed: the first op wins
    entry[microbatch[first]] = device[first]
    entries = np.unique(entry[entry >= 0])
    if entries.size != 2:
        return out, tuple(int(d) for d in entries[:1]) if entries.size == 1 else ()
    second = entry[np.where(has_mb, microbatch, 0)] == entries[1]
    return np.where(has_mb, second.astype(np.int64), -1), (int(entries[0]), int(entries[1]))


def chunk_of(device: np.ndarray, stage: np.ndarray,
             pipeline: np.ndarray | None = None) -> np.ndarray:
    """Chunk of every op: the rank of its stage among its device's stages
    of the same pipeline (right for interleaved, V-shaped and replicated
    placements alike; Chimera's two replicas on a device are two pipelines'
    chunk 0, not chunks 0 and 1)."""
    if device.size == 0:
        return np.zeros(0, dtype=np.int64)
    stage = np.asarray(stage, dtype=np.int64)
    group = np.asarray(device, dtype=np.int64) * 3
    if pipeline is not None:
        group = group + np.asarray(pipeline, dtype=np.int64) + 1
    width = int(stage.max()) + 1
    key = group * width + stage
    uniq = np.unique(key)  # sorted by device and pipeline, then stage
    grp = uniq // width
    rank = np.arange(uniq.size) - np.searchsorted(grp, grp, side="left")
    return rank[np.searchsorted(uniq, key)]


def shade_hex(colour: str, amount: float) -> str:
    """Blend a #rrggbb colour towards white (``amount`` > 0, 1 white) or
    black (< 0, -1 black); 0 leaves it: a chunk's shade."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    if amount >= 0:
        return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in (r, g, b))
    return "#" + "".join(f"{round(c * (1 + amount)):02x}" for c in (r, g, b))


@dataclass(frozen=True)
class OpStyles:
    """The look of every op of a schedule: one style per kind, pipeline and
    chunk that occurs, each with its colour and names.

    ``style`` gives each op's index into the other lists; ``legend`` is the
    compact key a static chart draws (a swatch per kind and pipeline, then a
    grey shade per chunk), while ``names`` name every style on its own (a
    trace per style in an interactive chart)."""

    style: np.ndarray
    kinds: list
    pipelines: list
    chunks: list
    colours: list
    names: list
    hovers: list
    n_chunks: int
    entries: tuple
    legend: list


def _pipeline_words(entries: tuple, devices: int) -> list[str]:
    """Names of the two pipelines: down and up when they enter at the ends."""
    a, b = entries
    if (a, b) == (0, devices - 1):
        return [f"down (d{a}\u2192d{b})", f"up (d{b}\u2192d{a})"]
    return [f"from d{a}", f"from d{b}"]


def op_styles(kind: np.ndarray, device: np.ndarray, stage: np.ndarray,
              microbatch: np.ndarray, devices: int, drawn: np.ndarray | None = None) -> OpStyles:
    """Colour and legend names of every op.

    Parameters
    ----------
    kind : numpy.ndarray of str
        Each op's kind.
    device, stage, microbatch : numpy.ndarray
        The op table's columns.
    devices : int
        Devices of the schedule (names the pipelines' ends).
    drawn : numpy.ndarray of bool, optional
        Ops that are drawn; the legend lists only their styles. All by default.

    Returns
    -------
    OpStyles
    """
    kind = np.asarray(kind).astype(str)
    device = np.asarray(device, dtype=np.int64)
    drawn = np.ones(kind.size, dtype=bool) if drawn is None else np.asarray(drawn, dtype=bool)
    pipe, entries = pipelines_of(device, stage, microbatch)
    chunk = chunk_of(device, stage, pipe)
    chunk = np.where(pipe >= 0, chunk, 0)  # an all-reduce serves every chunk
    n_chunks = int(chunk[drawn].max()) + 1 if drawn.any() else 1
    two = len(entries) == 2
    pipe_words = _pipeline_words(entries, devices) if two else []
    present, k_inv = np.unique(kind, return_inverse=True)
    names_k = [k for k in KIND_ORDER if k in set(present.tolist())]
    names_k += sorted(set(present.tolist()) - set(KIND_ORDER))
    k_code = np.array([names_k.index(k) for k in present.tolist()], dtype=np.int64)[k_inv]
    code = (k_code * 3 + (pipe + 1)) * max(n_chunks, 1) + chunk
    uniq, style = np.unique(code, return_inverse=True)
    kinds, pipes, chunks, colours, names, hovers = [], [], [], [], [], []
    for u in uniq.tolist():
        k = names_k[u // max(n_chunks, 1) // 3]
        pl = (u // max(n_chunks, 1)) % 3 - 1
        c = u % max(n_chunks, 1)
        base = (SECOND_PIPELINE_COLOURS.get(k, KIND_COLOURS.get(k, UNKNOWN_COLOUR)) if pl == 1
                else KIND_COLOURS.get(k, UNKNOWN_COLOUR))
        kinds.append(k)
        pipes.append(pl)
        chunks.append(c)
        colours.append(shade_hex(base, chunk_shade(c, n_chunks) if pl >= 0 else 0.0))
        name, hover = k, k
        if two and pl >= 0:
            name += " " + pipe_words[pl].split(" (")[0]
            hover += f" pipeline {pipe_words[pl]}"
        if n_chunks > 1 and pl >= 0:
            name += f" chunk {c}"
            hover += f" chunk {c}"
        names.append(name)
        hovers.append(hover)
    # The static key: each kind (per pipeline) in its own colour, then the
    # chunks' shades of grey.
    shown = set(np.unique(style[drawn]).tolist()) if drawn.any() else set()
    legend, seen = [], set()
    for s in sorted(shown, key=lambda i: (names_k.index(kinds[i]), pipes[i], chunks[i])):
        key = (kinds[s], pipes[s])
        if key in seen:
            continue
        seen.add(key)
        base = (SECOND_PIPELINE_COLOURS.get(kinds[s], KIND_COLOURS.get(kinds[s], UNKNOWN_COLOUR))
                if pipes[s] == 1 else KIND_COLOURS.get(kinds[s], UNKNOWN_COLOUR))
        label = kinds[s] + (f", {pipe_words[pipes[s]]}" if two and pipes[s] >= 0 else "")
        legend.append((base.lower(), label))
    if n_chunks > 1:
        legend += [(shade_hex(CHUNK_GREY, chunk_shade(c, n_chunks)),
                    f"chunk {c}" + (" (darker)" if c == 0 else
                                    " (lighter)" if c == n_chunks - 1 else ""))
                   for c in range(n_chunks)]
    return OpStyles(style=style.astype(np.int64), kinds=kinds, pipelines=pipes, chunks=chunks,
                    colours=colours, names=names, hovers=hovers, n_chunks=n_chunks,
                    entries=entries, legend=legend)
