"""How an op looks in every chart and page: its kind's colour, and the
chunk (stage rank on its device) whose shade tells interleaved stages apart."""

from __future__ import annotations

import numpy as np

__all__ = ["KIND_ORDER", "KIND_COLOURS", "UNKNOWN_COLOUR", "chunk_of", "shade_hex"]

# Fixed kind order so legends and colours are stable from run to run.
KIND_ORDER = ("F", "B", "W", "BW", "AR", "R", "O", "L")
KIND_COLOURS = {
    "F": "#4C72B0",  # blue
    "B": "#DD8452",  # orange
    "W": "#55A868",  # green
    "BW": "#8172B3",  # purple
    "AR": "#C44E52",  # red: gradient all-reduce of a replicated stage
    "R": "#937860",  # brown: recompute of a dropped forward
    "O": "#8C8C8C",  # grey: offload issued (no compute time)
    "L": "#8C8C8C",  # grey: load back issued (no compute time)
}
UNKNOWN_COLOUR = "#8C8C8C"


def chunk_of(device: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Chunk of every op: the rank of its stage among its device's stages
    (right for interleaved, V-shaped and replicated placements alike)."""
    if device.size == 0:
        return np.zeros(0, dtype=np.int64)
    width = int(stage.max()) + 1
    key = device.astype(np.int64) * width + stage
    uniq = np.unique(key)  # sorted by device, then stage
    dev_of = uniq // width
    rank = np.arange(uniq.size) - np.searchsorted(dev_of, dev_of, side="left")
    return rank[np.searchsorted(uniq, key)]


def shade_hex(colour: str, amount: float) -> str:
    """Blend a #rrggbb colour towards white (0 unchanged, 1 white): the
    lighter shade of a later chunk, as the HTML pages write it."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in (r, g, b))
