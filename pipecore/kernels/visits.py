"""The stack of devices to visit, each on it at most once.

Kernels that run every device's program as far as it can go, the list
scheduler's way (``localsearch.times``, ``replay.execution_order``), keep
the devices whose next op may have become ready on a stack: a device is
pushed when an op it waits for may have run, and ``queued[d]`` says
whether device d is on the stack, so a device woken by several producers
is visited once.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")
def push_all(queued, stack):
    """Put every device on the stack (``stack`` holds p entries), device 0
    on top, so that devices are first visited in order; return the height."""
    p = stack.shape[0]
    for d in range(p):
        queued[d] = True
        stack[d] = p - 1 - d
    return p


@njit(cache=True, inline="always")  # IR-inlined: no call per op
def push_once(d, queued, stack, top):
    """Put device d on the stack (of height ``top``) unless it is on it;
    return the new height."""
    if not queued[d]:
        queued[d] = True
        stack[top] = d
        top += 1
    return top


@njit(cache=True, inline="always")
def pop(queued, stack, top):
    """Take the device on top of the stack (of height ``top`` > 0) off it;
    return (the new height, the device)."""
    top -= 1
    d = stack[top]
    queued[d] = False
    return top, d
