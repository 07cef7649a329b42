"""Numba kernels. They see flat arrays only and never raise: they return a
status code; the Python layer turns it into an error. The semantics they
implement are written down in docs/semantics.md."""

from __future__ import annotations

import numpy as np
from numba import njit

STATUS_OK = 0
STATUS_DEADLOCK = 1


@njit(cache=True, inline="always")
def _before(t_a, k_a, t_b, k_b):
    # Heap order: ready time, then transfer id (= producer row order).
    return t_a < t_b or (t_a == t_b and k_a < k_b)


@njit(cache=True)
def _heap_push(heap_t, heap_k, size, t, k):
    i = size
    heap_t[i] = t
    heap_k[i] = k
    while i > 0:
        parent = (i - 1) >> 1
        if _before(heap_t[i], heap_k[i], heap_t[parent], heap_k[parent]):
            heap_t[i], heap_t[parent] = heap_t[parent], heap_t[i]
            heap_k[i], heap_k[parent] = heap_k[parent], heap_k[i]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _heap_pop(heap_t, heap_k, size):
    # Caller reads the top (index 0) first; this removes it.
    size -= 1
    heap_t[0] = heap_t[size]
    heap_k[0] = heap_k[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        right = left + 1
        if right < size and _before(heap_t[right], heap_k[right], heap_t[left], heap_k[left]):
            child = right
        if _before(heap_t[child], heap_k[child], heap_t[i], heap_k[i]):
            heap_t[i], heap_t[child] = heap_t[child], heap_t[i]
            heap_k[i], heap_k[child] = heap_k[child], heap_k[i]
            i = child
        else:
            break
    return size


@njit(cache=True)
def list_schedule(dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link,
                  x_ser, x_lat, stage_cost, n_links,
                  start, finish, x_start, x_arrival, head):
    """Fill op and transfer times; return a status code.

    Each device runs its program in order; an op starts when the device is
    free and every producer is available (finished locally, or its transfer
    arrived). Transfers with serialisation > 0 wait in a heap ordered by
    (ready time, id) and are placed on their link in that order: once no
    device can progress, every op still to run starts after some pending
    arrival, hence strictly after the heap's smallest ready time, so no
    later transfer can precede the one popped. Zero-serialisation transfers
    never occupy a link and are resolved at once.

    On return ``head[d]`` is the row of device d's first op that did not
    run (``dev_ptr[d+1]`` when the device finished).
    """
    p = dev_ptr.shape[0] - 1
    n = op_kind.shape[0]
    nx = x_dst.shape[0]
    done = np.zeros(n, dtype=np.bool_)
    x_done = np.zeros(nx, dtype=np.bool_)
    dev_free = np.zeros(p, dtype=np.float64)
    link_free = np.zeros(n_links, dtype=np.float64)
    heap_t = np.empty(nx, dtype=np.float64)
    heap_k = np.empty(nx, dtype=np.int64)
    heap_size = 0
    # Device of each op, for waking the consumer of an arrived transfer.
    op_dev = np.empty(n, dtype=np.int32)
    for d in range(p):
        head[d] = dev_ptr[d]
        for i in range(dev_ptr[d], dev_ptr[d + 1]):
            op_dev[i] = d
    stack = np.empty(p, dtype=np.int64)
    queued = np.zeros(p, dtype=np.bool_)
    top = 0
    for d in range(p - 1, -1, -1):
        stack[top] = d
        top += 1
        queued[d] = True

    while True:
        while top > 0:
            top -= 1
            d = stack[top]
            queued[d] = False
            end = dev_ptr[d + 1]
            while head[d] < end:
                i = head[d]
                t = dev_free[d]
                ready = True
                for j in range(2):
                    q = dep[i, j]
                    if q < 0:
                        continue
                    x = xfer[i, j]
                    if x >= 0:
                        if not x_done[x]:
                            ready = False
                            break
                        if x_arrival[x] > t:
                            t = x_arrival[x]
                    else:
                        if not done[q]:
                            ready = False
                            break
                        if finish[q] > t:
                            t = finish[q]
                if not ready:
                    break
                start[i] = t
                f = t + stage_cost[op_kind[i], op_stage[i]]
                finish[i] = f
                done[i] = True
                dev_free[d] = f
                head[d] = i + 1
                for x in range(out_ptr[i], out_ptr[i + 1]):
                    if x_ser[x] == 0.0:
                        x_start[x] = f
                        x_arrival[x] = f + x_lat[x]
                        x_done[x] = True
                        c = op_dev[x_dst[x]]
                        if not queued[c]:
                            queued[c] = True
                            stack[top] = c
                            top += 1
                    else:
                        heap_size = _heap_push(heap_t, heap_k, heap_size, f, x)
        if heap_size == 0:
            break
        r = heap_t[0]
        x = heap_k[0]
        heap_size = _heap_pop(heap_t, heap_k, heap_size)
        link = x_link[x]
        s = r
        if link_free[link] > s:
            s = link_free[link]
        e = s + x_ser[x]
        link_free[link] = e
        x_start[x] = s
        x_arrival[x] = e + x_lat[x]
        x_done[x] = True
        c = op_dev[x_dst[x]]
        if not queued[c]:
            queued[c] = True
            stack[top] = c
            top += 1

    for d in range(p):
        if head[d] < dev_ptr[d + 1]:
            return STATUS_DEADLOCK
    return STATUS_OK


@njit(cache=True)
def peak_memory(dev_ptr, op_kind, op_stage, act, act_w, peak):
    """Per-device peak of the activation total, in program order."""
    p = dev_ptr.shape[0] - 1
    for d in range(p):
        total = 0.0
        best = 0.0
        for i in range(dev_ptr[d], dev_ptr[d + 1]):
            k = op_kind[i]
            s = op_stage[i]
            if k == 0:
                total = total + act[s]
                if total > best:
                    best = total
            elif k == 1:
                total = total - (act[s] - act_w[s])
            elif k == 2:
                total = total - act_w[s]
            else:
                total = total - act[s]
        peak[d] = best
