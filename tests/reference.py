"""Slow, pure-Python reference simulator (the *oracle*) for pipecore.

This module implements the contract written down in ``docs/semantics.md``
as plainly as possible, using only the standard library. It exists so that
property tests can compare the fast Numba kernel against it bit for bit; it
is deliberately written for obviousness rather than speed (it is still
O(n log n) in the number of ops, so tens of thousands of ops take well under
a few seconds).

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

import heapq

__all__ = ["simulate_reference"]

_FORWARD = ("F",)
_BACKWARD = ("B", "BW")
_WEIGHT = ("W",)


def simulate_reference(programs, f, b, w, act, act_w, link):
    """
    programs: list over devices; programs[d] is a list of (kind, stage, microbatch) tuples, kind in {"F","B","W","BW"}, in program (slot) order. A device may have an empty program.
    f, b, w, act, act_w: sequences indexed by stage (floats): durations per stage and memory per stage (see semantics.md).
    link: callable link(src_device, dst_device, producer_stage) -> (ser, lat), both floats >= 0, giving a transfer's serialisation time and latency.
    Returns a dict:
      "status": "ok" or "deadlock"
      "start", "finish": list over devices of lists of floats (same shape as programs); for ops never started under deadlock use None
      "makespan": max finish (float; 0.0 if no ops; under deadlock the max over finished ops)
      "transfers": list of dicts, one per cross-device dependency edge, sorted by (producer device, producer slot, consumer device, consumer slot), keys: src_device, src_slot, dst_device, dst_slot, ready, start, end (= start + ser, when the link is released), arrival. Under deadlock include only transfers whose times are known.
      "peak": list over devices of peak memory (float), computed per semantics.md (program-order running total; independent of times, so defined even under deadlock)
      "memory": list over devices of lists of (time, total_after_event) in program order: F contributes an event at its start time with +act, B at its finish with -(act-act_w), W at its finish with -act_w, BW at its finish with -act (only for ops that ran)
      "blocked": list of (device, slot) of the head op of every device that could not finish its program (empty when ok)
    """
    f = [float(x) for x in f]
    b = [float(x) for x in b]
    w = [float(x) for x in w]
    act = [float(x) for x in act]
    act_w = [float(x) for x in act_w]
    num_stages = len(f)
    num_devices = len(programs)

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
    # 3. Event simulation.
    #
    # An op is *determined* (its start and finish are fixed) as soon as the
    # previous op of its device is determined and the availability of every
    # producer is known: a same-device producer is available at its finish,
    # a cross-device producer at its transfer's arrival. Determining an op
    # immediately creates its outgoing transfers, whose ready time is the
    # op's finish. Ops are determined eagerly, in whatever order that
    # becomes possible (they need not be in time order: every quantity an
    # op's times depend on is already final when it is determined).
    #
    # A transfer with ser == 0 never occupies its link, so its times are
    # final at creation (start = ready, arrival = ready + 0 + lat).
    #
    # A transfer with ser > 0 goes into `pending`, a heap keyed by
    # (ready, producer gid). Once no op can be determined, we pop the
    # smallest key, place it on its link (start = max(ready, link's last
    # end)), and go back to determining ops. Why this places every link's
    # transfers in increasing (ready, producer index) order, as required:
    #   * Among transfers that already exist, the popped one has the
    #     smallest key, so nothing already known can precede it.
    #   * A transfer that does not exist yet has an undetermined producer P.
    #     Follow why P is undetermined: its device's first undetermined op
    #     waits on an unplaced transfer; that transfer is either pending
    #     (ready >= the popped ready r, by minimality) or again has an
    #     undetermined producer, and so on; the chain ends at a pending
    #     transfer because the ops that do eventually run form an acyclic
    #     dependency graph. Every step of the chain goes through at least
    #     one ser > 0 link hop (arrival >= start + ser > start >= ready)
    #     plus non-negative durations, so P finishes strictly after r, i.e.
    #     the future transfer's ready time is > r and it comes after the
    #     popped one in key order.
    # The only way "strictly" can fail is floating-point absorption
    # (t + ser == t for a tiny ser > 0 relative to t). We do not try to
    # handle that degenerate case; instead every link checks that the keys
    # it places are strictly increasing and raises RuntimeError if not, so
    # the oracle never silently returns an order that violates the contract.
    # ------------------------------------------------------------------
    start = [None] * n
    finish = [None] * n
    head = [0] * num_devices  # slot of the first undetermined op per device
    link_end = {}  # (src, dst) -> end of the last transfer placed on it
    link_last_key = {}  # (src, dst) -> key of the last transfer placed on it
    pending = []  # heap of (ready, producer gid, consumer gid)
    to_check = list(range(num_devices))  # devices whose head may have become runnable

    def availability(pg, g):
        """Time producer pg is available to consumer g, or None if unknown."""
        if op_device[pg] == op_device[g]:
            return finish[pg]
        tr = transfer.get((pg, g))
        return None if tr is None else tr["arrival"]

    def create_transfers(pg):
        src = op_device[pg]
        for g in cross_consumers[pg]:
            dst = op_device[g]
            ser, lat = link(src, dst, op_stage[pg])
            ser = float(ser)
            lat = float(lat)
            tr = {
                "src_device": src,
                "src_slot": op_slot[pg],
                "dst_device": dst,
                "dst_slot": op_slot[g],
                "ready": finish[pg],
                "start": None,
                "end": None,
                "arrival": None,
                "_ser": ser,
                "_lat": lat,
            }
            transfer[(pg, g)] = tr
            if ser == 0:
                tr["start"] = tr["ready"]
                tr["end"] = tr["start"] + ser
                tr["arrival"] = tr["end"] + lat
                to_check.append(dst)
            else:
                heapq.heappush(pending, (tr["ready"], pg, g))

    def determine_ops():
        while to_check:
            d = to_check.pop()
            prog_len = len(programs[d])
            while head[d] < prog_len:
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
                    create_transfers(g)
                    continue
                break  # head of device d waits on something unknown

    def place_on_link(ready, pg, g):
        tr = transfer[(pg, g)]
        key = (ready, pg, g)
        lk = (tr["src_device"], tr["dst_device"])
        if lk in link_last_key and not link_last_key[lk] < key:
            raise RuntimeError(
                "reference simulator: link %r would serve transfer with key %r after key %r; "
                "a serialisation time was absorbed by floating-point rounding, so the link "
                "order of docs/semantics.md cannot be realised by this oracle" % (lk, key, link_last_key[lk])
            )
        link_last_key[lk] = key
        if lk in link_end:
            tr["start"] = max(ready, link_end[lk])
        else:
            tr["start"] = ready
        tr["end"] = tr["start"] + tr["_ser"]
        tr["arrival"] = tr["end"] + tr["_lat"]
        link_end[lk] = tr["end"]
        to_check.append(tr["dst_device"])

    determine_ops()
    while pending:
        ready, pg, g = heapq.heappop(pending)
        place_on_link(ready, pg, g)
        determine_ops()

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

    transfers_out = []
    for tr in transfer.values():
        if tr["arrival"] is None:
            continue  # cannot happen (pending is drained), kept for clarity
        transfers_out.append({k: v for k, v in tr.items() if not k.startswith("_")})
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
