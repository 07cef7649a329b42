"""Transfer classes: the cost-independent key of every transfer's serialisation and latency."""

from __future__ import annotations

from numba import njit

# Per sending stage s, class s * X_CLASSES + k with k: 0 activation within a
# node, 1 activation between nodes, 2 and 3 the same for a gradient feeding
# an all-reduce, 4 an offload copy over a host link.
X_CLASSES = 5


@njit(cache=True)
def transfer_classes(x_src, op_stage, x_is_ar, x_host, x_src_dev, x_dst_dev, per_node, out):
    """Write every transfer's class into ``out`` (see ``X_CLASSES``).

    With ``per_node`` > 0, a transfer between devices whose
    ``device // per_node`` differ crosses nodes. A table of X_CLASSES
    entries per stage then gives serialisation and latency, so times are
    computed once per class instead of once per transfer.
    """
    for x in range(x_src.shape[0]):
        k = 0
        if x_host[x] > 0:
            k = 4
        else:
            if x_is_ar[x]:
                k = 2
            if per_node > 0 and x_src_dev[x] // per_node != x_dst_dev[x] // per_node:
                k += 1
        out[x] = op_stage[x_src[x]] * X_CLASSES + k
