"""Test oracle for ``pc.compose``: a slow, plain-Python reading of the compose spec.

Written from ``notes/COMPOSE_SPEC.md`` only (including its REVISION 2), without
looking at ``pipecore.schedules.compose`` or ``pipecore.kernels.compose``.  Its whole
value is that independence: the tests compare the real implementation with this
module, and this module with the older family builders.

The pipeline is simulated at unit time: every op takes one step, communication is
free, every device decides from the state at the start of the step, then all
decisions are committed together.

Readings of points the spec leaves open (see also the test file):

- split with ``w=None`` means ``w="with"``.
- "held back by the cap" for a fixed stream: the stream's next F is a forward of the
  device's first stage c_0 and nf(c_0) - nb(c_0) >= limit (whatever its readiness).
  For ``group="ready"`` the cap is part of the definition of the next F ("the first
  whose next forward is ready and within the cap"), so the warm-up never ends by the
  cap: with no eligible F the device is waiting for input (non-strict: a ready B ends
  the warm-up; otherwise it idles).
- in STEADY a capped forward counts as "not ready" (strict: idle; non-strict: the other
  kind runs if ready).
- ``policy["strict"]`` defaults to True (the Order dataclass default); greedy ignores it.
"""

import math

__all__ = ["compose_reference"]


def _per_device(value, p, name):
    if isinstance(value, (list, tuple)):
        if len(value) != p:
            raise ValueError("%s: need one value per device (%d), got %d" % (name, p, len(value)))
        return [int(v) for v in value]
    return [value] * p


class _Device:
    def __init__(self, d, stages, m, chain):
        self.d = d
        self.stages = stages
        self.c0 = stages[0]
        # the first stage of the second pipeline here, if any
        self.c1 = min((s for s in stages if s >= chain), default=None)
        self.m = m
        self.total = len(stages) * m
        self.kf = self.kb = self.kw = 0
        self.nf = {s: 0 for s in stages}
        self.nb = {s: 0 for s in stages}
        self.b_run = []  # B's in run order (for the W's)
        self.program = []
        self.phase = "warm"
        self.want = "B"
        self.limit = math.inf
        self.K = None  # counted warm-up, None = "fill"
        self.fstream = self.bstream = None  # None = group "ready"

    def done(self, split):
        return self.kf == self.total and self.kb == self.total and (not split or self.kw == self.total)

    def held(self, c):
        return 0 if c is None else self.nf[c] - self.nb[c]

    def inflight(self):
        """Microbatches in flight: the larger pipeline's count (the cap is per pipeline)."""
        return max(self.held(self.c0), self.held(self.c1))

    def capped(self, s):
        return s in (self.c0, self.c1) and self.held(s) >= self.limit


def compose_reference(placement, microbatches, split, policy, w=None, chains=1):
    """Build the per-device programs of a composed schedule, by the spec, slowly.

    Parameters
    ----------
    placement : sequence of int
        Device of each stage, stages in model order; devices ``0..p-1`` each hold at
        least one stage.
    microbatches : int
        m >= 1.
    split : bool
        False: ops are ``F`` and fused ``BW``; True: ``F``, ``B`` and ``W``.
    policy : dict
        ``{"policy": "alternate", "group": int | "all" | "ready", "backward": "fifo" |
        "lifo", "warmup": "short" | "fill" | "all" | int | list, "inflight": None | int |
        list, "strict": bool}`` (strict defaults to True) or ``{"policy": "greedy",
        "first": "backward" | "forward", "inflight": None | int | list}``; either may
        add ``"overlap": True``: a device (alternate: past its warm-up) that runs a
        forward or a backward while the other kind's next op, of another stage, is
        runnable too runs both in the step, the forward first in its program
        (an overlapped unit; the programs show it as the two ops in a row).
    w : None, str, int or list of int
        W rule when ``split``: ``"with"``, ``"late"``, ``"bubbles"``, ``"staggered"``, a
        lag for every device, or one lag per device. None means ``"with"``.
    chains : int
        2: ``placement`` maps the stages twice, one pipeline after the other (entry
        ``c * S + s`` is stage s of pipeline c); pipeline c carries microbatches
        ``c * m/2 ... (c + 1) * m/2 - 1`` and each device ends with an all-reduce
        ``("AR", s, None)`` of every stage it shares with another device, in stage order.

    Returns
    -------
    list of list of tuple
        One list per device of ``(kind, stage, microbatch)`` in program order.

    Raises
    ------
    RuntimeError
        ``"deadlock ..."`` naming the step and each unfinished device's next wanted op,
        when in some step no device can run anything while ops remain.
    ValueError
        Bad inputs.
    """
    P = [int(x) for x in placement]
    S = len(P)
    m = int(microbatches)
    if S == 0 or m < 1 or S % chains or m % chains:
        raise ValueError("need at least one stage and one microbatch, split evenly over chains")
    m //= chains  # per pipeline; the stages of both pipelines are 0..S-1 here
    C = S // chains  # stages per pipeline
    p = max(P) + 1
    if min(P) < 0 or sorted(set(P)) != list(range(p)):
        raise ValueError("every device 0..p-1 must hold at least one stage")
    devs = [_Device(d, [s for s in range(S) if P[s] == d], m, C) for d in range(p)]
    bkind = "B" if split else "BW"

    # ---- W rule
    if not split:
        lag, fill_mode = [math.inf] * p, "never"
    else:
        w = "with" if w is None else w
        if w == "with":
            lag, fill_mode = [0] * p, "never"
        elif w == "late":
            lag, fill_mode = [math.inf] * p, "end"
        elif w == "bubbles":
            lag, fill_mode = [math.inf] * p, "idle"
        elif w == "staggered":
            lag, fill_mode = list(range(p)), "end"
        elif isinstance(w, (list, tuple)):
            lag, fill_mode = _per_device(w, p, "w"), "end"
        elif isinstance(w, int) and not isinstance(w, bool):
            lag, fill_mode = [w] * p, "end"
        else:
            raise ValueError("unknown w rule %r" % (w,))

    # ---- policy
    kind = policy["policy"]
    strict = bool(policy.get("strict", True))
    overlap = bool(policy.get("overlap", False))
    inflight = policy.get("inflight")
    if inflight is not None:
        for dev, cap in zip(devs, _per_device(inflight, p, "inflight")):
            dev.limit = cap
    if kind == "greedy":
        prefer_b = policy.get("first", "backward") == "backward"
        if policy.get("first", "backward") not in ("backward", "forward"):
            raise ValueError("greedy first must be 'backward' or 'forward'")
    elif kind == "alternate":
        group = policy.get("group", "ready")
        if group == "all":
            group = m
        backward = policy.get("backward", "fifo")
        warmup = policy.get("warmup", "short")
        warm = _per_device(warmup, p, "warmup") if isinstance(warmup, (list, tuple)) else [warmup] * p
        for dev in devs:
            n = len(dev.stages)
            if group != "ready":
                G = min(int(group), m)
                if G < 1:
                    raise ValueError("group must be >= 1")
                R = m // G
                rem = m - R * G

                def stream(order, G=G, R=R, rem=rem):
                    out = [(c, r * G + i) for r in range(R) for c in order for i in range(G)]
                    out += [(c, R * G + i) for c in order for i in range(rem)]
                    return out

                dev.fstream = stream(dev.stages)
                if backward == "fifo":
                    dev.bstream = stream(dev.stages[::-1])
                elif backward == "lifo":
                    dev.bstream = dev.fstream[::-1]
                else:
                    raise ValueError("backward must be 'fifo' or 'lifo'")
            k = warm[dev.d]
            if k == "all":
                dev.K = n * m
            elif k == "fill":
                dev.K = None
            elif k == "short":
                if dev.fstream is None:
                    dev.K = min(C - dev.c0 % C, n * m)
                else:
                    s0, j0 = dev.bstream[0]
                    pos = dev.fstream.index((s0, j0))
                    dev.K = min(pos + (C - 1 - s0 % C) + 1, n * m)
            elif isinstance(k, int) and not isinstance(k, bool):
                dev.K = min(max(k, 0), n * m)
            else:
                raise ValueError("unknown warmup %r" % (k,))
    else:
        raise ValueError("unknown policy %r" % (kind,))

    fdone, bdone = set(), set()

    def f_ready(s, j):
        return s % C == 0 or (s - 1, j) in fdone

    def b_ready(s, j):
        return (s, j) in fdone and (s % C == C - 1 or (s + 1, j) in bdone)

    # ---- per-device views of "the next F" and "the next B"
    def next_f(dev):
        """(op runnable now or None, held back by the cap?)"""
        if dev.fstream is not None:
            if dev.kf >= dev.total:
                return None, False
            s, j = dev.fstream[dev.kf]
            if dev.capped(s):
                return None, True
            return ((s, j) if f_ready(s, j) else None), False
        for s in reversed(dev.stages):
            j = dev.nf[s]
            if j < m and f_ready(s, j) and not dev.capped(s):
                return (s, j), False
        # "ready": the cap is part of the definition of the next F, so the next F is never
        # "held back by the cap"; no eligible F means the device waits for input.
        return None, False

    def next_b(dev):
        if dev.bstream is not None:
            if dev.kb >= dev.total:
                return None
            s, j = dev.bstream[dev.kb]
            return (s, j) if b_ready(s, j) else None
        heads = [(dev.nb[s], -s) for s in dev.stages if dev.nb[s] < m and b_ready(s, dev.nb[s])]
        if not heads:
            return None
        j, ms = min(heads)
        return (-ms, j)

    def end_warm(dev):
        dev.phase, dev.want = "steady", "B"
        if not strict:
            dev.limit = min(dev.limit, dev.inflight())

    def run_b(dev, op):
        dev.want = "F"
        return ("B",) + op

    def run_f(dev, op):
        dev.want = "B"
        return ("F",) + op

    def decide_alternate(dev):
        if dev.phase == "warm":
            if dev.K is None:
                b = next_b(dev)
                if b is not None:
                    end_warm(dev)
                else:
                    f, _ = next_f(dev)
                    return ("F",) + f if f is not None else None
            else:
                f, held = next_f(dev)
                if dev.kf >= dev.K or held:
                    end_warm(dev)
                elif f is not None:
                    return ("F",) + f
                else:
                    b = next_b(dev) if not strict else None
                    if b is None:
                        return None
                    end_warm(dev)
                    return run_b(dev, b)
        # steady
        want = dev.want
        if want == "F" and dev.kf >= dev.total:
            want = "B"
        if want == "B":
            if dev.kb >= dev.total:
                return None
            b = next_b(dev)
            if b is not None:
                return run_b(dev, b)
            if not strict:
                f, _ = next_f(dev)
                if f is not None:
                    return run_f(dev, f)
            return None
        f, _ = next_f(dev)
        if f is not None:
            return run_f(dev, f)
        if not strict:
            b = next_b(dev)
            if b is not None:
                return run_b(dev, b)
        return None

    def decide_greedy(dev):
        cands = []
        for s in dev.stages:
            j = dev.nb[s]
            if j < m and b_ready(s, j):
                cands.append((0 if prefer_b else 1, j, -s, "B"))
            j = dev.nf[s]
            if j < m and f_ready(s, j) and not dev.capped(s):
                cands.append((1 if prefer_b else 0, j, -s, "F"))
        if not cands:
            return None
        _, j, ms, k = min(cands)
        return (k, -ms, j)

    decide = decide_greedy if kind == "greedy" else decide_alternate

    def greedy_heads(dev):
        """The best runnable F and the best runnable B (lower microbatch, then deeper stage)."""
        fs = [(dev.nf[s], -s) for s in dev.stages
              if dev.nf[s] < m and f_ready(s, dev.nf[s]) and not dev.capped(s)]
        bs = [(dev.nb[s], -s) for s in dev.stages if dev.nb[s] < m and b_ready(s, dev.nb[s])]
        f = (-min(fs)[1], min(fs)[0]) if fs else None
        b = (-min(bs)[1], min(bs)[0]) if bs else None
        return f, b

    def pair_with(dev):
        """(F op, B op) to run as one overlapped unit this step, or None."""
        if kind == "greedy":
            f, b = greedy_heads(dev)
        elif dev.phase != "steady":
            return None
        else:
            f, b = next_f(dev)[0], next_b(dev)
        if f is None or b is None or f[0] == b[0]:
            return None
        return f, b

    def next_w(dev):
        s, j = dev.b_run[dev.kw]
        return ("W", s, j)

    def wanted(dev):
        """Human description of what an unfinished device is waiting for."""
        if dev.kb >= dev.total:
            return "W(%d, %d)" % next_w(dev)[1:] if dev.kw < dev.kb else "nothing"
        parts = []
        if dev.fstream is not None:
            if dev.kf < dev.total:
                parts.append("F%r" % (dev.fstream[dev.kf],))
            parts.append("%s%r" % (bkind, dev.bstream[dev.kb]))
        else:
            parts += ["F(%d, %d)" % (s, dev.nf[s]) for s in dev.stages if dev.nf[s] < m]
            parts += ["%s(%d, %d)" % (bkind, s, dev.nb[s]) for s in dev.stages if dev.nb[s] < m]
        state = dev.phase if kind == "alternate" else "greedy"
        if kind == "alternate" and dev.phase == "steady":
            state += " want " + dev.want
        return "%s (%s, kf=%d kb=%d, in flight %d, limit %s)" % (
            " or ".join(parts), state, dev.kf, dev.kb, dev.inflight(), dev.limit)

    t = 0
    while not all(dev.done(split) for dev in devs):
        ops = []
        for dev in devs:
            op = None
            if dev.done(split):
                pass
            elif split and dev.kw < dev.kb and dev.kb - dev.kw > lag[dev.d]:
                op = next_w(dev)
            else:
                op = decide(dev)
                if overlap and op is not None:
                    unit = pair_with(dev)
                    if unit is not None:
                        op = ("P",) + unit
                        dev.want = "F"
                if op is None and split and dev.kw < dev.kb:
                    if fill_mode == "idle" or dev.kb == dev.total:
                        op = next_w(dev)
            ops.append(op)
        if all(op is None for op in ops):
            waits = "; ".join("device %d wants %s" % (dev.d, wanted(dev)) for dev in devs
                              if not dev.done(split))
            raise RuntimeError("deadlock at step %d: %s" % (t, waits))
        for dev, op in zip(devs, ops):
            if op is None:
                continue
            if op[0] == "P":
                (fs, fj), (bs, bj) = op[1], op[2]
                parts = [("F", fs, fj), ("B", bs, bj)]
            else:
                parts = [op]
            written = []
            for k, s, j in parts:
                if k == "F":
                    dev.kf += 1
                    dev.nf[s] += 1
                    fdone.add((s, j))
                    written.append(("F", s, j))
                elif k == "B":
                    dev.kb += 1
                    dev.nb[s] += 1
                    dev.b_run.append((s, j))
                    bdone.add((s, j))
                    written.append((bkind, s, j))
                else:
                    dev.kw += 1
                    written.append(("W", s, j))
            dev.program.append(written[0] if len(written) == 1 else tuple(written))
        t += 1
    if chains == 1:
        return [dev.program for dev in devs]

    def real(op):
        return (op[0], op[1] % C, op[2] + (op[1] // C) * m)

    holders = {}
    for v, d in enumerate(P):
        holders.setdefault(v % C, set()).add(d)
    out = []
    for dev in devs:
        prog = [tuple(real(o) for o in u) if isinstance(u[0], tuple) else real(u)
                for u in dev.program]
        prog += [("AR", s, None) for s in sorted(holders)
                 if dev.d in holders[s] and len(holders[s]) > 1]
        out.append(prog)
    return out
