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
"""

from __future__ import annotations

import numpy as np

from ..core.ops import InputError
from ..core.schedule import check_int
from .papers import HANAYO
from .registry import Family, register


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


def build_hanayo(devices, microbatches, chunks=2, waves=None):
    """Hanayo with W = chunks / 2 waves (see the module docstring).

    Parameters
    ----------
    devices : int
        Pipeline devices p.
    microbatches : int
        Microbatches m.
    chunks : int
        Stages per device, 2W (even).
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
    """The interleaved bubble (p-1)(F+B+W)/v with v = 2W chunks.

    Exact for this order when the forward and the fused backward take equal
    time (tested); not confirmed as the paper's formula. No closed form for
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
        form), ``exact``.
    """
    t = c.f + c.b + c.w
    bubble = (p - 1) * t / v
    return {"makespan": m * t + bubble, "bubble_time": bubble,
            "peak_activation": np.full(p, np.nan), "exact": bool(c.f == c.b + c.w)}


register(Family("hanayo", build_hanayo, formula_hanayo, chunks=True, default_chunks=2,
                options=("waves",), resolve=_resolve, check=lambda o: _resolve(None, o),
                summary="wave-like zig-zag placement (order: pipecore's greedy choice)",
                paper=HANAYO))
