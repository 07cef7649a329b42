"""Hanayo (Liu et al., SC'23): wave-like pipelines without weight copies.

W waves split the model into 2·W·p stages laid out in a zig-zag: stage s
with r = s mod 2p runs on device r for r < p and on device 2p-1-r
otherwise, so W = 1 is a V and every turn stays on one device.

The paper's figures and algorithm were not available here (only its
abstract), so the per-device order is pipecore's documented choice: the
earliest-start greedy of :func:`pipecore.generate.greedy` at unit op times
(a backward first on ties, then the lower microbatch, then the deeper
stage). With equal forward and backward times it gives the interleaved
bubble (p-1)(F+B)/(2W) (tested); the bubble of the paper's own order may
differ. No memory cap is applied.

How the paper runs more microbatches than devices is not known here either.
This order runs them as units of p microbatches, nearly back to back: with
a fused backward longer (or shorter) than the forward, every device waits
for each unit's first backward, so the bubble grows with m / p; the formula
counts one unit's bubble and names those gaps when they are there.
"""

from __future__ import annotations

import numpy as np

from ..core.ops import InputError
from ..core.schedule import check_int
from .papers import HANAYO
from .registry import Family, register, with_builder_doc


def wave_placement(devices, waves):
    """Device of each of the 2·W·p stages in Hanayo's zig-zag.

    Parameters
    ----------
    devices : int
        p.
    waves : int
        W.

    Returns
    -------
    numpy.ndarray
    """
    r = np.arange(2 * waves * devices) % (2 * devices)
    return np.where(r < devices, r, 2 * devices - 1 - r)


@with_builder_doc(chunks="Stages per device, 2W (even).")
def build_hanayo(devices, microbatches, chunks=2, waves=None):
    """Hanayo with W = chunks / 2 waves (see the module docstring).

    Parameters
    ----------
    waves : int, optional
        W; :func:`pipecore.build` already turned it into ``chunks``.

    Returns
    -------
    Schedule
        F and fused BW ops (no split backward), W waves on p devices.

    Raises
    ------
    ValueError
        If ``chunks`` is odd.
    """
    from .generate import greedy

    if chunks % 2:
        raise InputError(f"'hanayo' places 2 stages per device and wave: 'chunks' must be even "
                         f"(got {chunks})")
    return greedy(wave_placement(devices, chunks // 2), microbatches, name="hanayo")


def _resolve(chunks, options):
    waves = options.get("waves")
    if waves is None:
        return chunks
    waves = check_int("waves", waves, minimum=1)
    if chunks is not None and chunks != 2 * waves:
        raise InputError(f"'hanayo' with waves={waves} has chunks=2*waves={2 * waves} "
                         f"(got chunks={chunks})")
    return 2 * waves


def formula_hanayo(p, m, v, c, waves=None):
    """Bubble (p-1) max(T_F, T_BW) / W with W = v/2 waves and T_BW = T_B + T_W.

    Derived from this order, not from the paper (not readable here): the
    interleaved bubble (p-1)(T_F + T_BW)/v when the forward and the fused
    backward take equal time, and the bubble of one unit of p microbatches
    at any costs. Exact for m = p, and for m a multiple of p when T_F =
    T_BW (property-tested). With more microbatches and unequal times the
    greedy order, fixed at equal times, makes every device wait for each
    unit's first backward: idle gaps between units of p microbatches,
    which the formula leaves out (``gap_cause`` says so). No closed form for
    the peak activation.

    Parameters
    ----------
    p, m, v : int
        Devices, microbatches, chunks (2W).
    c : Costs
        Scalar costs.
    waves : int, optional
        Ignored (v = 2W already).

    Returns
    -------
    dict
        ``makespan``, ``bubble_time``, ``peak_activation`` (NaN: no closed
        form), ``exact``, and where not exact ``gap_cause``: what in the
        schedule the formula leaves out.
    """
    f, bw = c.f, c.b + c.w
    bubble = (p - 1) * max(f, bw) / (v // 2)
    out = {"makespan": m * (f + bw) + bubble, "bubble_time": bubble,
           "peak_activation": np.full(p, np.nan),
           "exact": bool(p == 1 or (m % p == 0 and (m == p or f == bw)))}
    if not out["exact"]:
        # Short: compare prints it after its note's prefix within 120 columns.
        gaps, short = m > p and f != bw, m % p
        out["gap_cause"] = (f"gaps between units; a last unit of only {short} microbatches"
                            if gaps and short else
                            f"one unit of only {m} microbatches, not p" if m < p else
                            f"a last unit of {short} microbatches, not p" if short else
                            "idle gaps between units of p microbatches")
    return out


register(Family("hanayo", build_hanayo, formula_hanayo, chunks=True, default_chunks=2,
                options=("waves",), resolve=_resolve, check=lambda o: _resolve(None, o),
                summary="wave-like zig-zag placement (order: pipecore's greedy choice)",
                paper=HANAYO))
