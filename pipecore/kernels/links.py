"""A transfer on its link: the one rule of every kernel that times transfers.

A link carries one transfer at a time, in the order the transfers are
placed on it (docs/semantics.md): a transfer ready at ``ready`` starts once
the link is free, holds it for its serialisation time, and arrives its
latency after that. A transfer whose serialisation is 0 never occupies its
link; callers test for that before placing one.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")  # IR-inlined: the callers' loops keep their code
def on_link(ready, ser, link_free, slot):
    """Place a transfer ready at ``ready`` that holds its link for ``ser``.

    Parameters
    ----------
    ready : float
        When the transfer could start (its producer's finish, or later).
    ser : float
        Its serialisation time (> 0).
    link_free : float64 array
        When each link is next free; entry ``slot`` is updated to the end
        of this transfer's serialisation.
    slot : int or tuple of int
        The link's entry of ``link_free``: a link, or (link, lane) in the
        batched kernels' (links, lanes) arrays.

    Returns
    -------
    start : float
        When the transfer starts on the link.
    end : float
        When its serialisation ends (it arrives its latency later).
    """
    start = max(ready, link_free[slot])
    end = start + ser
    link_free[slot] = end
    return start, end
