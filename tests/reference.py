"""Slow, pure-Python reference simulator (the *oracle*) for pipecore.

This module implements the contract written down in ``docs/semantics.md``
as plainly as possible, using only the standard library. It exists so that
property tests can compare the fast Numba kernel against it bit for bit; it
is deliberately written for obviousness rather than speed (it is still
linear in the number of ops, up to dict overhead, so tens of thousands of
ops take well under a second).

Floating-point arithmetic follows the contract literally so results are
reproducible by any other implementation doing the same operations:

* op:        ``start = max(prev finish or 0.0, availabilities)``,
             ``finish = start + duration`` (``BW`` duration is ``b[s] + w[s]``)
* transfer:  ``ready = producer finish``,
             ``start = max(ready, end of previous transfer on the link)``
             (the first transfer on a link starts at ``ready``),
             ``end = start + ser``, ``arrival = end + lat``;
             a transfer with ``ser == 0`` never touches the link:
             ``start = ready``, ``end = ready + ser``, ``arrival = end + lat``.
* memory:    running total in program order (see ``docs/semantics.md``).

The only public entry point is :func:`simulate_reference`.
"""

__all__ = ["simulate_reference"]

_FORWARD = ("F",)
_BACKWARD = ("B", "BW")


def simulate_reference(programs, f, b, w, act, act_w, link):
    """Simulate per-device programs exactly as docs/semantics.md says.

    Parameters
    ----------
    programs : list of list of tuple
        ``programs[d]`` holds ``(kind, stage, microbatch)`` tuples in program
        (slot) order, kind in {"F", "B", "W", "BW"}; a program may be empty.
    f, b, w, act, act_w : sequences of float
        Per stage: durations, and the memory F allocates / W still needs.
    link : callable
        ``link(src_device, dst_device, producer_stage) -> (ser, lat)``, both
        >= 0: a transfer's serialisation time and latency.

    Returns
    -------
    dict
        ``status`` ("ok" or "deadlock"); ``start`` and ``finish`` (shaped
        like programs, None for ops that never ran); ``makespan`` (largest
        finish, 0.0 without ops); ``transfers`` (one dict per cross-device
        edge whose times are known, sorted by producer device and slot, then
        consumer device and slot, with keys src_device, src_slot,
        dst_device, dst_slot, ready, start, end = start + ser, arrival);
        ``peak`` (per device, program-order running total, defined even
        under deadlock); ``memory`` (per device, ``(time, total)`` after
        each event of an op that ran: F at its start with +act, B at its
        finish with -(act - act_w), W with -act_w, BW with -act); ``blocked``
        (``(device, slot)`` of every device's stuck head op).

    Raises
    ------
    ValueError
        For negative or NaN durations, ser or lat, or a malformed schedule.
    """
    f = [float(x) for x in f]
    b = [float(x) for x in b]
    w = [float(x) for x in w]
    act = [float(x) for x in act]
    act_w = [float(x) for x in act_w]
    num_stages = len(f)
    num_devices = len(programs)
    for name, vec in (("f", f), ("b", b), ("w", w)):
        if len(vec) != num_stages:
            raise ValueError("%s has %d stages, f has %d" % (name, len(vec), num_stages))
        for s, x in enumerate(vec):
            if not x >= 0.0:  # also rejects NaN
                raise ValueError("%s[%d] = %r; durations must be >= 0" % (name, s, x))

    # ------------------------------------------------------------------
    # 1. Flatten the ops. The global index ("gid") of an op is its position
    #    in programs[0] + programs[1] + ..., i.e. in the ops sorted by
    #    (device, slot). This is the "producer index" of the contract.
    # ------------------------------------------------------------------
    op_device = []
    op_slot = []
    op_kind = []
    op_stage = []
    op_mb = []
    first_gid = []  # gid of slot 0 of each device
    for d, prog in enumerate(programs):
        first_gid.append(len(op_kind))
        for slot, op in enumerate(prog):
            kind, stage, mb = op
            kind = str(kind)
            stage = int(stage)
            if kind not in ("F", "B", "W", "BW"):
                raise ValueError("unknown op kind %r at device %d slot %d" % (kind, d, slot))
            if not 0 <= stage < num_stages:
                raise ValueError("stage %d out of range at device %d slot %d" % (stage, d, slot))
            op_device.append(d)
            op_slot.append(slot)
            op_kind.append(kind)
            op_stage.append(stage)
            op_mb.append(mb)
    n = len(op_kind)

    # (stage, microbatch) -> gid, for the three roles an op can have.
    forward_of = {}
    backward_of = {}  # the B or the BW
    weight_of = {}
    for g in range(n):
        key = (op_stage[g], op_mb[g])
        if op_kind[g] in _FORWARD:
            table = forward_of
        elif op_kind[g] in _BACKWARD:
            table = backward_of
        else:
            table = weight_of
        if key in table:
            raise ValueError("duplicate %s op for stage %d microbatch %r" % (op_kind[g], key[0], key[1]))
        table[key] = g

    def lookup(table, key, what, g):
        if key not in table:
            raise ValueError(
                "op %s(stage %d, mb %r) at device %d slot %d has no %s producer"
                % (op_kind[g], op_stage[g], op_mb[g], op_device[g], op_slot[g], what)
            )
        return table[key]

    # ------------------------------------------------------------------
    # 2. Dependencies (docs/semantics.md, "Dependencies") and durations.
    # ------------------------------------------------------------------
    producers = [[] for _ in range(n)]
    duration = [0.0] * n
    for g in range(n):
        s, mb, kind = op_stage[g], op_mb[g], op_kind[g]
        if kind == "F":
            duration[g] = f[s]
            if s > 0:
                producers[g].append(lookup(forward_of, (s - 1, mb), "F(s-1)", g))
        elif kind == "B" or kind == "BW":
            duration[g] = b[s] if kind == "B" else b[s] + w[s]
            producers[g].append(lookup(forward_of, (s, mb), "F(s)", g))
            if s < num_stages - 1:
                producers[g].append(lookup(backward_of, (s + 1, mb), "backward(s+1)", g))
        else:  # W
            duration[g] = w[s]
            pg = lookup(backward_of, (s, mb), "B(s)", g)
            if op_kind[pg] != "B":
                raise ValueError("W(stage %d, mb %r) but the backward is a BW" % (s, mb))
            producers[g].append(pg)

    # Cross-device edges become transfers; one record per (producer, consumer).
    cross_consumers = [[] for _ in range(n)]
    for g in range(n):
        for pg in producers[g]:
            if op_device[pg] != op_device[g]:
                cross_consumers[pg].append(g)
    transfer = {}  # (producer gid, consumer gid) -> dict of times

    # ------------------------------------------------------------------
    # 3. Simulation (a worklist over devices; no global clock is needed).
    #
    # An op is *determined* (its start and finish are fixed) as soon as the
    # previous op of its device is determined and the availability of every
    # producer is known: a same-device producer is available at its finish,
    # a cross-device producer at its transfer's arrival. Ops are determined
    # eagerly, device by device, in whatever order that becomes possible; they
    # need not be determined in time order, because every quantity an op's
    # times depend on is already final when it is determined. This is a
    # worklist fixed point: `to_check` holds devices whose head op may have
    # become determinable (initially all; then the destination device of
    # every transfer whose arrival becomes known). Each op is examined O(1)
    # times per input that becomes known, so the whole run is O(n).
    #
    # Determining an op immediately creates its outgoing transfers (ready =
    # the op's finish) and places them on their links at once:
    #
    #   * ser == 0: the transfer never occupies the link ("order is
    #     irrelevant"), so start = ready, end = ready + ser, arrival =
    #     end + lat, and the link's state is untouched.
    #   * ser > 0: start = max(ready, end of the previous ser > 0 transfer
    #     placed on this link) (start = ready for the first), end = start +
    #     ser, arrival = end + lat.
    #
    # Why placing at creation serves each link in increasing (ready,
    # producer index) order, as the contract requires -- i.e. why, when a
    # transfer is placed, every transfer that precedes it on its link is
    # already placed: all transfers on link (src, dst) have their producer
    # on device src. Ops of one device are determined strictly in program
    # (slot) order, so the link's transfers are created in increasing
    # producer-slot order, which is increasing producer index. Along one
    # device's program finish times never decrease (start of slot k+1 >=
    # finish of slot k, and durations are >= 0; float rounding is monotone),
    # so producer-index order is also non-decreasing in ready time: for any
    # two transfers on the link, creation order == (ready, producer index)
    # order. Hence a transfer created later can never need to be served
    # earlier, and no lookahead is needed. (This is the same order a
    # global-clock simulation would produce; it just does not need the clock.)
    # As a guard, each link still checks that the keys it serves strictly
    # increase and raises RuntimeError otherwise (unreachable with the
    # non-negative durations validated above).
    #
    # Transfers with ser == 0 are never queued (see above), so they neither
    # wait for nor delay ser > 0 transfers on the same link. Dropping a
    # ser == 0 transfer from the recurrence does not change any other
    # transfer's start: max(r_next, max(r_k, E)) == max(r_next, E) when
    # r_next >= r_k.
    # ------------------------------------------------------------------
    start = [None] * n
    finish = [None] * n
    head = [0] * num_devices  # slot of the first undetermined op per device
    link_end = {}  # (src, dst) -> end of the last ser > 0 transfer placed on it
    link_last_key = {}  # (src, dst) -> (ready, producer gid) of that transfer
    to_check = list(range(num_devices))  # devices whose head may have become runnable

    def availability(pg, g):
        """Time producer pg is available to consumer g, or None if unknown."""
        if op_device[pg] == op_device[g]:
            return finish[pg]
        tr = transfer.get((pg, g))
        return None if tr is None else tr["arrival"]

    def create_and_place_transfers(pg):
        src = op_device[pg]
        ready = finish[pg]
        for g in cross_consumers[pg]:
            dst = op_device[g]
            ser, lat = link(src, dst, op_stage[pg])
            ser = float(ser)
            lat = float(lat)
            if not (ser >= 0.0 and lat >= 0.0):
                raise ValueError("link(%d, %d, %d) returned ser=%r lat=%r; both must be >= 0"
                                 % (src, dst, op_stage[pg], ser, lat))
            if ser == 0:
                tr_start = ready
            else:
                lk = (src, dst)
                key = (ready, pg)
                if lk in link_last_key:
                    if not link_last_key[lk] < key:  # guard, see comment above
                        raise RuntimeError("link %r served out of (ready, producer index) order" % (lk,))
                    tr_start = max(ready, link_end[lk])
                else:
                    tr_start = ready
                link_last_key[lk] = key
            tr_end = tr_start + ser
            if ser != 0:
                link_end[(src, dst)] = tr_end
            transfer[(pg, g)] = {
                "src_device": src,
                "src_slot": op_slot[pg],
                "dst_device": dst,
                "dst_slot": op_slot[g],
                "ready": ready,
                "start": tr_start,
                "end": tr_end,
                "arrival": tr_end + lat,
            }
            to_check.append(dst)

    while to_check:
        d = to_check.pop()
        while head[d] < len(programs[d]):
            g = first_gid[d] + head[d]
            times = [finish[g - 1] if head[d] > 0 else 0.0]
            for pg in producers[g]:
                a = availability(pg, g)
                if a is None:
                    break
                times.append(a)
            else:
                start[g] = max(times)
                finish[g] = start[g] + duration[g]
                head[d] += 1
                create_and_place_transfers(g)
                continue
            break  # the head of device d waits on a transfer not yet known

    # ------------------------------------------------------------------
    # 4. Results.
    # ------------------------------------------------------------------
    blocked = [(d, head[d]) for d in range(num_devices) if head[d] < len(programs[d])]
    status = "deadlock" if blocked else "ok"

    start_out = []
    finish_out = []
    for d in range(num_devices):
        lo = first_gid[d]
        hi = lo + len(programs[d])
        start_out.append(start[lo:hi])
        finish_out.append(finish[lo:hi])

    finished = [x for x in finish if x is not None]
    makespan = max(finished) if finished else 0.0

    # Every created transfer has known times (its producer ran).
    transfers_out = list(transfer.values())
    transfers_out.sort(key=lambda t: (t["src_device"], t["src_slot"], t["dst_device"], t["dst_slot"]))

    # Memory: running total in program order; events only for ops that ran.
    peak = []
    memory = []
    for d in range(num_devices):
        total = 0.0
        totals = []
        events = []
        for slot in range(len(programs[d])):
            g = first_gid[d] + slot
            s = op_stage[g]
            kind = op_kind[g]
            if kind == "F":
                total = total + act[s]
                when = start[g]
            elif kind == "B":
                total = total - (act[s] - act_w[s])
                when = finish[g]
            elif kind == "W":
                total = total - act_w[s]
                when = finish[g]
            else:  # BW
                total = total - act[s]
                when = finish[g]
            totals.append(total)
            if finish[g] is not None:
                events.append((when, total))
        peak.append(max(totals) if totals else 0.0)
        memory.append(events)

    return {
        "status": status,
        "start": start_out,
        "finish": finish_out,
        "makespan": makespan,
        "transfers": transfers_out,
        "peak": peak,
        "memory": memory,
        "blocked": blocked,
    }
