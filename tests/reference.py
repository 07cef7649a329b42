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
             ``finish = start + duration`` (``BW`` duration is ``bw[s]``,
             default ``b[s] + w[s]``; every F, B, W, BW and R adds
             ``overhead[s]``)
* F&B pair:  one unit of a device program running the forward of one
             microbatch and the backward (``B`` or ``BW``) of another
             together (DualPipe's overlapped "F&B"). Both ops get
             ``start = max(prev finish or 0.0, availabilities of the
             producers of both ops)`` and ``finish = start + duration`` with
             ``duration = (dF + dB) * fb_factor``, ``dF = f[sF]``, ``dB =
             b[sB]`` (``B``) or ``(b[sB] + w[sB])`` (``BW``), evaluated in
             exactly that order. Single ops ignore ``fb_factor``.
* transfer:  ``ready = producer finish``,
             ``start = max(ready, end of previous transfer on the link)``
             (the first transfer on a link starts at ``ready``),
             ``end = start + ser``, ``arrival = end + lat``;
             a transfer with ``ser == 0`` never touches the link:
             ``start = ready``, ``end = ready + ser``, ``arrival = end + lat``.
* memory:    running total in program order (see ``docs/semantics.md``);
             within a pair the F's event (at the pair's start) comes before
             the B/BW's (at the pair's finish).
* R:         ``("R", s, j)`` recomputes the forward of stage ``s``
             microbatch ``j`` on F's device: duration ``r[s]``, one
             producer, the F (same device); the B or BW of ``(s, j)`` then
             needs the R instead of the F. The F of a recomputed ``(s, j)``
             allocates ``ckpt[s]``; the R allocates ``act[s] - ckpt[s]`` at
             its start.
* O, L:      ``("O", s, j)`` after the F and ``("L", s, j)`` before the
             backward, on F's device, offload the activation to host and
             load it back. Both take 0.0 (producer of O: the F; of L: the
             O). Device d has two copy queues, to host and back, each
             serving copies in issue order. When the O finishes, its copy
             to host starts at ``max(O finish, end of the previous copy to
             host on d)`` and ends ``off[s]`` later; when the L finishes,
             its copy back starts at ``max(L finish, end of that copy to
             host, end of the previous copy back on d)`` and ends ``off[s]``
             later. The backward of ``(s, j)`` has the L as producer,
             available at the end of the copy back. Memory then follows
             time: the copy to host frees ``act[s]`` at its end, the copy
             back allocates ``act[s]`` at its start; per device the events
             are sorted by time, and at equal times by row, a copy taking
             the row of the O or L that issued it. Both copies are listed in ``transfers`` (source
             and destination device d; O -> L, then L -> backward).
             With ``offload_to[d] = q >= 0`` the copies go to device q's
             memory instead: the same two queues and rules, each copy taking
             ``evict[s]``; q allocates ``act[s]`` at the start of the copy
             out and frees it at the end of the copy back, both events
             sorted before q's own at equal times (a copy back's end first).
             ``transfers`` lists them d -> q and q -> d. (The queues are the
             copies' own: a copy does not queue behind ordinary transfers
             between d and q; the kernel does, which matters only when d and
             q exchange pipeline transfers.)
* AR:        ``("AR", s, None)``, the gradient all-reduce of a stage ``s``
             replicated on exactly two devices, one AR op per replica device
             (a single-op entry, never in a pair). Duration 0.0; on device
             ``d`` it needs (program order) every backward op (B, W, BW) of
             ``s`` on ``d`` to come earlier in ``d``'s program, and (one
             ordinary transfer, priced by ``ar_link``) the last backward op
             of ``s`` in the program of the other replica device. No memory
             change, no memory event.

Ops are indexed by their *row*: their position when the programs are
flattened device by device, entry by entry, a pair contributing its F and
then its B/BW. The row is the contract's producer index (ops sorted by
(device, slot, kind) with F before B/BW inside a pair's slot).

The only public entry point is :func:`simulate_reference`.
"""

__all__ = ["simulate_reference"]

_FORWARD = ("F",)
_BACKWARD = ("B", "BW")
_ANY_BACKWARD = ("B", "W", "BW")  # the ops an AR of the same stage waits for


def _is_pair(entry):
    """An entry whose first element is itself a tuple/list is a (would-be) pair."""
    return isinstance(entry, (tuple, list)) and len(entry) > 0 and isinstance(entry[0], (tuple, list))


def simulate_reference(programs, f, b, w, act, act_w, link, fb_factor=1.0, ar_link=None,
                       r=None, ckpt=None, offload=None, bw=None, overhead=None, evict=None,
                       offload_to=None):
    """Simulate per-device programs exactly as docs/semantics.md says.

    Parameters
    ----------
    programs : list of list
        ``programs[d]`` holds the *entries* (units) of device ``d`` in
        program (slot) order; a program may be empty. An entry is either an
        op tuple ``(kind, stage, microbatch)``, kind in {"F", "B", "W",
        "BW", "AR"}, or an *F&B pair*: a tuple/list of exactly two op
        tuples, the first an ``F`` and the second a ``B`` or ``BW``
        (normally of another microbatch), which the device runs together as
        one unit occupying one slot. A pair starts once the previous unit of
        its device has finished and every producer of both of its ops is
        available; both ops get that start and the same finish.

        Ops are looked up by (stage, microbatch) only, so a stage may be
        *replicated*: its ops for different microbatches may sit on
        different devices. An ``("AR", stage, None)`` op (microbatch must
        be None; never part of a pair) is the gradient all-reduce of such a
        stage. AR ops may appear only for a stage whose non-AR ops sit on
        exactly two devices, and then there must be exactly one AR op of
        that stage on each of those two devices. The AR of stage ``s`` on
        device ``d`` must come after every B, W and BW of ``s`` on ``d`` in
        ``d``'s program (checked, no explicit edge: program order suffices),
        and its one producer is the *last* (in program order) B, W or BW
        op of ``s`` in the program of the other replica device ``r``: a
        transfer from ``r`` to ``d`` like any other (created when that
        producer finishes, in increasing consumer row among that producer's
        transfers, queued on link (r, d) together with ordinary transfers),
        priced by ``ar_link``. An AR takes 0.0: ``start = max(previous
        finish, arrival)``, ``finish = start + 0.0``. It is one row, has no
        memory effect and produces no memory event.
    f, b, w, act, act_w : sequences of float
        Per stage: durations, and the memory F allocates / W still needs.
    link : callable
        ``link(src_device, dst_device, producer_stage) -> (ser, lat)``, both
        >= 0: a transfer's serialisation time and latency.
    fb_factor : float, optional
        Finite and > 0 (default 1.0). A pair takes ``(dF + dB) * fb_factor``
        with ``dF = f[sF]`` and ``dB = b[sB]`` (B) or ``(b[sB] + w[sB])``
        (BW), in that order of operations. Single ops ignore it.
    ar_link : callable or None, optional
        ``ar_link(src_device, dst_device, stage) -> (ser, lat)`` for the
        transfers consumed by AR ops (the gradient exchange of ``stage``,
        from the remote replica ``src_device`` to the AR's device
        ``dst_device``). None (default) uses ``link`` with the same
        arguments. ``link`` stays in charge of every other transfer.
    r, ckpt : sequences of float, optional
        Per stage: the duration of an R op (default ``f``) and the memory a
        recomputed F keeps (default 0.0).
    offload : sequence of float, optional
        Per stage: the time of one host copy (required with O and L ops).
    evict, offload_to : sequence of float, sequence of int, optional
        Per stage the time of one copy to a partner device, and per device
        its partner (-1: host), as ``Costs.evict`` and
        ``Schedule.offload_to``.
    bw : sequence of float, optional
        Per stage: the time of a fused BW op (default ``b[s] + w[s]``,
        computed in that order).
    overhead : sequence of float, optional
        Per stage: a time added to every F, B, W, BW and R op of the stage
        (default 0.0): ``duration = base + overhead[s]``; AR, O and L stay
        0.0.

    Returns
    -------
    dict
        Ops are indexed by *row*: programs flattened device by device,
        entry by entry, a pair giving its F then its B/BW; the row is the
        contract's producer index. ``status`` ("ok" or "deadlock");
        ``start`` and ``finish`` (per device, one value per op in row order
        -- a pair gives two consecutive, equal values -- None for ops that
        never ran; without pairs, shaped like programs); ``makespan``
        (largest finish, 0.0 without ops); ``transfers`` (one dict per
        cross-device edge whose times are known, sorted by (src_row,
        dst_row), with keys src_device, src_slot, src_row, dst_device,
        dst_slot, dst_row, ready, start, end = start + ser, arrival; the
        slots are entry indices, so both ops of a pair share one);
        ``peak`` (per device, program-order running total over ops in row
        order, defined even under deadlock); ``memory`` (per device,
        ``(time, total)`` after each event of an op that ran, in row order:
        F at its start with +act, B at its finish with -(act - act_w), W
        with -act_w, BW with -act, a recomputed F +ckpt, R +(act - ckpt)
        at its start, AR none (it is skipped entirely); within
        a pair the F's event, at the pair's start, precedes the B/BW's, at
        the pair's finish);
        ``blocked`` (``(device, slot)`` of every device's stuck head entry).

    Raises
    ------
    ValueError
        For negative or NaN durations, ser or lat, a bad fb_factor, or a
        malformed schedule (including a malformed pair, a pair whose
        backward directly depends on its own forward, an AR op with a
        microbatch other than None, AR ops for a stage not on exactly two
        devices or not exactly one per replica device, an AR before a
        backward op of its stage on its device, or a replica device with no
        backward op of the AR's stage).
    """
    f = [float(x) for x in f]
    b = [float(x) for x in b]
    w = [float(x) for x in w]
    act = [float(x) for x in act]
    act_w = [float(x) for x in act_w]
    num_stages = len(f)
    num_devices = len(programs)
    r_dur = list(f) if r is None else [float(x) for x in r]
    ckpt_mem = [0.0] * num_stages if ckpt is None else [float(x) for x in ckpt]
    bw_dur = ([b[s] + w[s] for s in range(num_stages)] if bw is None
              else [float(x) for x in bw])
    extra = [0.0] * num_stages if overhead is None else [float(x) for x in overhead]
    for name, vec in (("f", f), ("b", b), ("w", w), ("r", r_dur), ("bw", bw_dur),
                      ("overhead", extra)):
        if len(vec) != num_stages:
            raise ValueError("%s has %d stages, f has %d" % (name, len(vec), num_stages))
        for s, x in enumerate(vec):
            if not x >= 0.0:  # also rejects NaN
                raise ValueError("%s[%d] = %r; durations must be >= 0" % (name, s, x))
    fb_factor = float(fb_factor)
    # rejects NaN, 0, negatives and inf (inf * 0.0 would make a NaN duration)
    if not 0.0 < fb_factor < float("inf"):
        raise ValueError("fb_factor = %r; must be a finite float > 0" % (fb_factor,))

    # ------------------------------------------------------------------
    # 1. Flatten the ops. The global index ("row", "gid") of an op is its
    #    position when programs[0], programs[1], ... are flattened entry by
    #    entry, a pair contributing its F then its B/BW: the ops sorted by
    #    (device, slot, kind) with F first inside a pair. This is the
    #    "producer index" of the contract. Without pairs, row == position in
    #    programs[0] + programs[1] + ...
    # ------------------------------------------------------------------
    op_device = []
    op_slot = []  # entry (unit) index of the op in its device program
    op_kind = []
    op_stage = []
    op_mb = []
    first_gid = []  # row of the first op of each device
    units = []  # units[d][slot] = tuple of the rows of that entry (1 or 2)

    def add_op(op, d, slot):
        kind, stage, mb = op
        kind = str(kind)
        stage = int(stage)
        if kind not in ("F", "B", "W", "BW", "AR", "R", "O", "L"):
            raise ValueError("unknown op kind %r at device %d slot %d" % (kind, d, slot))
        if not 0 <= stage < num_stages:
            raise ValueError("stage %d out of range at device %d slot %d" % (stage, d, slot))
        if kind == "AR" and mb is not None:
            raise ValueError("AR(stage %d) at device %d slot %d has microbatch %r; must be None"
                             % (stage, d, slot, mb))
        op_device.append(d)
        op_slot.append(slot)
        op_kind.append(kind)
        op_stage.append(stage)
        op_mb.append(mb)
        return len(op_kind) - 1

    for d, prog in enumerate(programs):
        first_gid.append(len(op_kind))
        dev_units = []
        for slot, entry in enumerate(prog):
            if _is_pair(entry):
                if len(entry) != 2 or not all(isinstance(op, (tuple, list)) and len(op) == 3 for op in entry):
                    raise ValueError("pair at device %d entry %d must be exactly two (kind, stage, "
                                     "microbatch) ops, got %r" % (d, slot, entry))
                kf, kb = str(entry[0][0]), str(entry[1][0])
                if kf != "F" or kb not in _BACKWARD:
                    raise ValueError("pair at device %d entry %d must be (F, B) or (F, BW), got (%s, %s)"
                                     % (d, slot, kf, kb))
                dev_units.append((add_op(entry[0], d, slot), add_op(entry[1], d, slot)))
            else:
                dev_units.append((add_op(entry, d, slot),))
        units.append(dev_units)
    n = len(op_kind)

    # (stage, microbatch) -> gid, for the three roles an op can have
    # (AR ops are handled separately below).
    forward_of = {}
    backward_of = {}  # the B or the BW
    weight_of = {}
    recompute_of = {}
    offload_of = {}
    load_of = {}
    for g in range(n):
        if op_kind[g] == "AR":
            continue
        key = (op_stage[g], op_mb[g])
        if op_kind[g] in _FORWARD:
            table = forward_of
        elif op_kind[g] in _BACKWARD:
            table = backward_of
        elif op_kind[g] == "R":
            table = recompute_of
        elif op_kind[g] == "O":
            table = offload_of
        elif op_kind[g] == "L":
            table = load_of
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
    duration = [0.0] * n  # of the op alone
    for g in range(n):
        s, mb, kind = op_stage[g], op_mb[g], op_kind[g]
        if kind == "F":
            duration[g] = f[s]
            if s > 0:
                producers[g].append(lookup(forward_of, (s - 1, mb), "F(s-1)", g))
        elif kind == "R":
            duration[g] = r_dur[s]
            pg = lookup(forward_of, (s, mb), "F(s)", g)
            if op_device[pg] != op_device[g]:
                raise ValueError("R(stage %d, mb %r) runs on device %d but its F on device %d"
                                 % (s, mb, op_device[g], op_device[pg]))
            producers[g].append(pg)
        elif kind == "O":
            pg = lookup(forward_of, (s, mb), "F(s)", g)
            if op_device[pg] != op_device[g]:
                raise ValueError("O(stage %d, mb %r) is not on its F's device" % (s, mb))
            producers[g].append(pg)
        elif kind == "L":
            pg = lookup(offload_of, (s, mb), "O(s)", g)
            if op_device[pg] != op_device[g]:
                raise ValueError("L(stage %d, mb %r) is not on its O's device" % (s, mb))
            producers[g].append(pg)
        elif kind == "B" or kind == "BW":
            duration[g] = b[s] if kind == "B" else bw_dur[s]
            if (s, mb) in load_of:
                producers[g].append(load_of[(s, mb)])
            elif (s, mb) in recompute_of:
                producers[g].append(recompute_of[(s, mb)])
            else:
                producers[g].append(lookup(forward_of, (s, mb), "F(s)", g))
            if s < num_stages - 1:
                producers[g].append(lookup(backward_of, (s + 1, mb), "backward(s+1)", g))
        elif kind == "W":
            duration[g] = w[s]
            pg = lookup(backward_of, (s, mb), "B(s)", g)
            if op_kind[pg] != "B":
                raise ValueError("W(stage %d, mb %r) but the backward is a BW" % (s, mb))
            producers[g].append(pg)
        # AR: duration 0.0, producer set below

    for g in range(n):
        if op_kind[g] in ("F", "B", "W", "BW", "R"):
            duration[g] = duration[g] + extra[op_stage[g]]

    # AR ops. The devices of a stage are those holding its non-AR ops; a
    # stage with AR ops must have exactly two, each holding exactly one AR
    # of the stage. The AR on device d must follow (in d's program, i.e. in
    # row order) every B/W/BW of its stage on d; its single producer is the
    # last (largest row) B/W/BW of its stage on the other device.
    stage_devices = {}  # stage -> set of devices holding its non-AR ops
    ar_rows = {}  # stage -> AR rows, in row order
    last_backward = {}  # (stage, device) -> largest row of a B/W/BW
    for g in range(n):
        if op_kind[g] == "AR":
            ar_rows.setdefault(op_stage[g], []).append(g)
            continue
        stage_devices.setdefault(op_stage[g], set()).add(op_device[g])
        if op_kind[g] in _ANY_BACKWARD:
            last_backward[(op_stage[g], op_device[g])] = g  # rows increase along a device
    for s, rows in sorted(ar_rows.items()):
        devs = sorted(stage_devices.get(s, ()))
        ar_devs = [op_device[g] for g in rows]
        if len(devs) != 2:
            raise ValueError("AR op(s) for stage %d on device(s) %s, but stage %d runs on device(s) %s; "
                             "AR needs a stage replicated on exactly two devices" % (s, ar_devs, s, devs))
        if ar_devs != devs:
            raise ValueError("stage %d runs on devices %d and %d and needs exactly one AR op on each, "
                             "got AR ops on device(s) %s" % (s, devs[0], devs[1], ar_devs))
        for g in rows:
            d = op_device[g]
            r = devs[1] if d == devs[0] else devs[0]
            h = last_backward.get((s, d))
            if h is not None and h > g:
                raise ValueError("AR(stage %d) at device %d slot %d comes before %s(stage %d, mb %r) "
                                 "at slot %d of the same device"
                                 % (s, d, op_slot[g], op_kind[h], s, op_mb[h], op_slot[h]))
            h = last_backward.get((s, r))
            if h is None:
                raise ValueError("AR(stage %d) at device %d slot %d: replica device %d has no backward "
                                 "op (B, W or BW) of stage %d" % (s, d, op_slot[g], r, s))
            producers[g].append(h)

    # Duration of each unit. A pair (F row gf, backward row gb) takes
    # (dF + dB) * fb_factor, where duration[gb] is already b or (b + w).
    # Its backward can only directly depend on its forward through F(s) of
    # the same (stage, microbatch): such a pair could never run.
    unit_duration = []
    for d in range(num_devices):
        durs = []
        for slot, rows in enumerate(units[d]):
            if len(rows) == 1:
                durs.append(duration[rows[0]])
                continue
            gf, gb = rows
            if gf in producers[gb]:
                raise ValueError("pair at device %d entry %d: %s(stage %d, mb %r) depends on the "
                                 "pair's own F" % (d, slot, op_kind[gb], op_stage[gb], op_mb[gb]))
            durs.append((duration[gf] + duration[gb]) * fb_factor)
        unit_duration.append(durs)

    # Cross-device edges become transfers; one record per (producer, consumer).
    # Consumers are appended in increasing consumer row.
    cross_consumers = [[] for _ in range(n)]
    for g in range(n):
        for pg in producers[g]:
            if op_device[pg] != op_device[g]:
                cross_consumers[pg].append(g)
    transfer = {}  # (producer gid, consumer gid) -> dict of times

    # ------------------------------------------------------------------
    # 3. Simulation (a worklist over devices; no global clock is needed).
    #
    # A unit (a single op, or an F&B pair) is *determined* (the start and
    # finish of its ops are fixed) as soon as the previous unit of its
    # device is determined and the availability of every producer of every
    # op of the unit is known: a same-device producer is available at its
    # finish, a cross-device producer at its transfer's arrival. (A pair's
    # backward directly needing its own forward was rejected above, so a
    # same-device producer always sits in an earlier unit, or a later one,
    # which then never becomes available: a deadlock.) Units are determined
    # eagerly, device by device, in whatever order that becomes possible;
    # they need not be determined in time order, because every quantity a
    # unit's times depend on is already final when it is determined. This
    # is a worklist fixed point: `to_check` holds devices whose head unit
    # may have become determinable (initially all; then the destination
    # device of every transfer whose arrival becomes known). Each unit is
    # examined O(1) times per input that becomes known, so the whole run is
    # O(n).
    #
    # An AR op is a single-op unit of duration 0.0 like any other; its one
    # cross-device producer (the remote replica's last backward of its
    # stage) is just another transfer, priced by ar_link instead of link,
    # and sharing the directed link (and its queue) with ordinary transfers.
    #
    # Determining a unit immediately creates the outgoing transfers of its
    # ops (ready = the unit's finish) -- for a pair, the F's first, then the
    # B/BW's, i.e. in increasing producer row; for one op, in increasing
    # consumer row (AR consumers included) -- and places them on their
    # links at once:
    #
    #   * ser == 0: the transfer never occupies the link ("order is
    #     irrelevant"), so start = ready, end = ready + ser, arrival =
    #     end + lat, and the link's state is untouched.
    #   * ser > 0: start = max(ready, end of the previous ser > 0 transfer
    #     placed on this link) (start = ready for the first), end = start +
    #     ser, arrival = end + lat.
    #
    # Why placing at creation serves each link in increasing (ready,
    # producer index, consumer row) order, as the contract requires (the
    # consumer row only matters for a producer with two transfers on one
    # link: its gradient and an AR of the same replica pair) -- i.e. why, when a
    # transfer is placed, every transfer that precedes it on its link is
    # already placed: all transfers on link (src, dst) have their producer
    # on device src. Units of one device are determined strictly in program
    # (slot) order and, within a pair, the F's transfers are created before
    # the B/BW's, so the link's transfers are created in increasing
    # producer-row order, which is increasing producer index. Along one
    # device's rows finish times never decrease (the start of unit k+1 >=
    # the finish of unit k, durations are >= 0 since fb_factor > 0, both
    # ops of a pair share one finish; float rounding is monotone), so
    # producer-index order is also non-decreasing in ready time: for any
    # two transfers on the link, creation order == (ready, producer index,
    # consumer row) order (one producer's transfers are created in
    # increasing consumer row). Hence a transfer created later can never need to be served
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
    head = [0] * num_devices  # slot of the first undetermined unit per device
    link_end = {}  # (src, dst) -> end of the last ser > 0 transfer placed on it
    link_last_key = {}  # (src, dst) -> (ready, producer gid, consumer gid) of that transfer
    to_check = list(range(num_devices))  # devices whose head may have become runnable

    copy_to_host_end = {}  # O gid -> end of its copy to host
    copy_to_host_start = {}
    copy_back = {}  # L gid -> (start, end) of its copy back
    queue_end = {}  # (device, "out" or "back") -> end of the last copy in that queue

    def availability(pg, g):
        """Time producer pg is available to consumer g, or None if unknown."""
        if op_kind[pg] == "L":  # the copy back, placed when the L ran
            return copy_back[pg][1] if pg in copy_back else None
        if op_device[pg] == op_device[g]:
            return finish[pg]
        tr = transfer.get((pg, g))
        return None if tr is None else tr["arrival"]

    def create_and_place_transfers(pg):
        src = op_device[pg]
        ready = finish[pg]
        for g in cross_consumers[pg]:  # increasing consumer row
            dst = op_device[g]
            if op_kind[g] == "AR" and ar_link is not None:
                fn, fn_name = ar_link, "ar_link"
            else:
                fn, fn_name = link, "link"
            # for an AR consumer op_stage[pg] == op_stage[g], the AR's stage
            ser, lat = fn(src, dst, op_stage[pg])
            ser = float(ser)
            lat = float(lat)
            if not (ser >= 0.0 and lat >= 0.0):
                raise ValueError("%s(%d, %d, %d) returned ser=%r lat=%r; both must be >= 0"
                                 % (fn_name, src, dst, op_stage[pg], ser, lat))
            if ser == 0:
                tr_start = ready
            else:
                lk = (src, dst)
                key = (ready, pg, g)
                if lk in link_last_key:
                    if not link_last_key[lk] < key:  # guard, see comment above
                        raise RuntimeError("link %r served out of (ready, producer index, consumer row) "
                                           "order" % (lk,))
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
                "src_row": pg,
                "dst_device": dst,
                "dst_slot": op_slot[g],
                "dst_row": g,
                "ready": ready,
                "start": tr_start,
                "end": tr_end,
                "arrival": tr_end + lat,
            }
            to_check.append(dst)

    def partner(d):
        return -1 if offload_to is None else offload_to[d]

    def place_copy(g):
        d, s = op_device[g], op_stage[g]
        if partner(d) >= 0:
            t = float(evict[s])
        else:
            if offload is None:
                raise ValueError("O/L ops need per-stage offload times")
            t = float(offload[s])
        if op_kind[g] == "O":
            begin = max(finish[g], queue_end.get((d, "out"), finish[g]))
            copy_to_host_end[g] = begin + t
            copy_to_host_start[g] = begin
            queue_end[(d, "out")] = begin + t
        else:
            o = offload_of[(s, op_mb[g])]
            begin = max(finish[g], copy_to_host_end[o], queue_end.get((d, "back"), finish[g]))
            copy_back[g] = (begin, begin + t)
            queue_end[(d, "back")] = begin + t

    def unit_start(rows, d):
        """Start time of the head unit (rows) of device d, or None if unknown."""
        times = [finish[rows[0] - 1] if head[d] > 0 else 0.0]
        for g in rows:
            for pg in producers[g]:
                a = availability(pg, g)
                if a is None:
                    return None
                times.append(a)
        return max(times)

    while to_check:
        d = to_check.pop()
        while head[d] < len(units[d]):
            rows = units[d][head[d]]
            st = unit_start(rows, d)
            if st is None:
                break  # the head of device d waits on a transfer not yet known
            fin = st + unit_duration[d][head[d]]
            for g in rows:
                start[g] = st
                finish[g] = fin
            head[d] += 1
            for g in rows:  # the F's transfers before the B/BW's
                create_and_place_transfers(g)
                if op_kind[g] in ("O", "L"):
                    place_copy(g)

    # ------------------------------------------------------------------
    # 4. Results.
    # ------------------------------------------------------------------
    blocked = [(d, head[d]) for d in range(num_devices) if head[d] < len(units[d])]
    status = "deadlock" if blocked else "ok"

    def device_rows(d):
        return range(first_gid[d], first_gid[d + 1] if d + 1 < num_devices else n)

    start_out = []
    finish_out = []
    for d in range(num_devices):
        rows = device_rows(d)
        start_out.append(start[rows.start:rows.stop])
        finish_out.append(finish[rows.start:rows.stop])

    finished = [x for x in finish if x is not None]
    makespan = max(finished) if finished else 0.0

    # Every created transfer has known times (its producer ran); host copies too.
    for og, end in copy_to_host_end.items():
        lg = load_of[(op_stage[og], op_mb[og])]
        q = partner(op_device[og])
        transfer[(og, lg)] = {"src_device": op_device[og], "src_slot": op_slot[og], "src_row": og,
                              "dst_device": op_device[og] if q < 0 else q,
                              "dst_slot": op_slot[lg], "dst_row": lg,
                              "ready": finish[og], "start": copy_to_host_start[og],
                              "end": end, "arrival": end}
    for lg, (begin, end) in copy_back.items():
        bg = backward_of[(op_stage[lg], op_mb[lg])]
        q = partner(op_device[lg])
        transfer[(lg, bg)] = {"src_device": op_device[lg] if q < 0 else q, "src_slot": op_slot[lg],
                              "src_row": lg,
                              "dst_device": op_device[lg], "dst_slot": op_slot[bg], "dst_row": bg,
                              "ready": finish[lg], "start": begin, "end": end, "arrival": end}
    transfers_out = [transfer[key] for key in sorted(transfer)]  # by (src_row, dst_row)

    # Memory: running total over ops in row order (a pair: F, then B/BW);
    # events only for ops that ran. AR ops are skipped: no change, no event.
    peak = []
    memory = []
    for d in range(num_devices):
        total = 0.0
        totals = []
        events = []
        for g in device_rows(d):
            s = op_stage[g]
            kind = op_kind[g]
            if kind in ("AR", "O", "L"):
                continue
            if kind == "F" and (s, op_mb[g]) in recompute_of:
                total = total + ckpt_mem[s]
                when = start[g]
            elif kind == "F":
                total = total + act[s]
                when = start[g]
            elif kind == "R":
                total = total + (act[s] - ckpt_mem[s])
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
        if offload_of:
            # Memory follows time: merge in the copies (frees at the end of a
            # copy to host, allocations at the start of a copy back).
            timed = []
            for g in device_rows(d):
                k, s = op_kind[g], op_stage[g]
                if k in ("AR", "O", "L") or finish[g] is None:
                    continue
                if k == "F":
                    delta = ckpt_mem[s] if (s, op_mb[g]) in recompute_of else act[s]
                elif k == "R":
                    delta = act[s] - ckpt_mem[s]
                elif k == "B":
                    delta = -(act[s] - act_w[s])
                elif k == "W":
                    delta = -act_w[s]
                elif k == "BW":
                    delta = -act[s]
                timed.append((start[g] if k in ("F", "R") else finish[g], g, 0, delta))
            for og, end in copy_to_host_end.items():
                if op_device[og] == d:
                    timed.append((end, og, 1, -act[op_stage[og]]))
            for lg, (begin, _end) in copy_back.items():
                if op_device[lg] == d:
                    timed.append((begin, lg, 1, act[op_stage[lg]]))
            # Activations this device holds for its partner.
            for og, _end in copy_to_host_end.items():
                if partner(op_device[og]) == d:
                    timed.append((copy_to_host_start[og], -1, 1, act[op_stage[og]]))
            for lg, (_begin, end) in copy_back.items():
                if partner(op_device[lg]) == d:
                    timed.append((end, -1, 0, -act[op_stage[lg]]))
            timed.sort(key=lambda e: (e[0], e[1], e[2]))
            total = 0.0
            events = []
            for when, _group, _g, delta in timed:
                total = total + delta
                events.append((when, total))
            totals = [0.0] + [x for _, x in events]
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
