"""Transfer times: serialisation and latency of every transfer on one- or two-level links."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def transfer_times(x_src, op_stage, x_is_ar, x_src_dev, x_dst_dev, nbytes, grads, comm,
                   bw, lat, inter_bw, inter_lat, per_node, ser, x_lat):
    """Serialisation time and latency of every transfer, in one pass.

    ``nbytes``, ``grads`` and ``comm`` are per sending stage; a transfer
    feeding an all-reduce carries ``grads``. With ``per_node`` > 0, links
    between nodes (device // per_node differs) use the inter values. Same
    arithmetic as before this kernel: ``bytes / bandwidth`` and
    ``comm + link latency``.
    """
    for x in range(x_src.shape[0]):
        s = op_stage[x_src[x]]
        size = grads[s] if x_is_ar[x] else nbytes[s]
        if per_node > 0 and x_src_dev[x] // per_node != x_dst_dev[x] // per_node:
            ser[x] = size / inter_bw
            x_lat[x] = comm[s] + inter_lat
        else:
            ser[x] = size / bw
            x_lat[x] = comm[s] + lat
