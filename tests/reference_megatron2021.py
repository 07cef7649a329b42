"""An independent reference for tests: Megatron-LM's 2021 pipeline schedules with
blocking, batched exchanges, timed as a rendezvous.

Written for pipecore's tests from the control flow of megatron/schedules.py and
megatron/p2p_communication.py at Megatron-LM commit 50a4b5fa02 (2021-04-08): each
device runs its forwards (F) and backwards (B) in that code's order; after each,
it posts one batched exchange (sends and receives to its pipeline neighbours)
and waits for all of it. A send and the matching receive (the n-th send from a
to b matches the n-th receive at b from a, as NCCL orders them) both start when
the later of the two is posted; a call ends ``x`` per tensor on its busier
direction after its last match starts. Nothing here uses pipecore's schedules
or simulator.
"""

from __future__ import annotations


def _chunk(k, p, v, forward):
    c = (k % (p * v)) // p
    return c if forward else v - 1 - c


def interleaved_program(d, p, v, m):
    """Actions of device ``d`` in the interleaved schedule: ("F"|"B", chunk) or ("C", ops)."""
    total = m * v
    all_warm = m == p
    warm = total if all_warm else min((p - d - 1) * 2 + (v - 1) * p, total)
    rest = total - warm
    nxt, prv = (d + 1) % p, (d - 1) % p

    def first(c):
        return d == 0 and c == 0

    def last(c):
        return d == p - 1 and c == v - 1

    out = [] if first(0) else [("C", [("recv", prv)])]
    for k in range(warm):
        c = _chunk(k, p, v, True)
        out.append(("F", c))
        ops = [] if last(c) else [("send", nxt)]
        if not (d == 0 and _chunk(k + 1, p, v, True) == 0) and k != total - 1:
            ops.append(("recv", prv))
        if k == warm - 1 and not all_warm and d != p - 1:
            ops.append(("recv", nxt))
        if ops:
            out.append(("C", ops))
    for k in range(rest):
        cf, cb = _chunk(k + warm, p, v, True), _chunk(k, p, v, False)
        out += [("F", cf), ("B", cb)]
        ops = ([] if last(cf) else [("send", nxt)]) + ([] if first(cb) else [("send", prv)])
        recv_prev = not (d == 0 and _chunk(k + warm - (p - 1), p, v, True) == v - 1) and k != rest - 1
        recv_next = not (d == p - 1 and _chunk(k - (p - 1), p, v, False) == 0)
        ops += ([("recv", prv)] if recv_prev else []) + ([("recv", nxt)] if recv_next else [])
        if ops:
            out.append(("C", ops))
    if all_warm and d != p - 1:
        out.append(("C", [("recv", nxt)]))
    for k in range(rest, total):
        cb = _chunk(k, p, v, False)
        out.append(("B", cb))
        ops = [] if first(cb) else [("send", prv)]
        if not (d == p - 1 and _chunk(k + 1, p, v, False) == v - 1) and k != total - 1:
            ops.append(("recv", nxt))
        if ops:
            out.append(("C", ops))
    return out


def one_f_one_b_program(d, p, m):
    """Actions of device ``d`` in the non-interleaved 1F1B schedule."""
    warm = min(p - d - 1, m)
    rest = m - warm
    first, last = d == 0, d == p - 1

    def call(*ops):
        ops = [o for o in ops if o is not None]
        return [("C", list(ops))] if ops else []

    recv_prev = None if first else ("recv", d - 1)
    send_next = None if last else ("send", d + 1)
    out = []
    for _ in range(warm):
        out += call(recv_prev) + [("F", 0)] + call(send_next)
    if rest:
        out += call(recv_prev)
    for i in range(rest):
        out += [("F", 0)] + call(send_next, None if last else ("recv", d + 1)) + [("B", 0)]
        if i == rest - 1:
            out += call(None if first else ("send", d - 1))
        else:
            out += call(None if first else ("send", d - 1), recv_prev)
    for _ in range(warm):
        out += call(None if last else ("recv", d + 1)) + [("B", 0)] + call(None if first else ("send", d - 1))
    return out


def makespan(programs, f, b, x):
    """Time until every device is done.

    Parameters
    ----------
    programs : list of lists
        Each device's actions.
    f, b : callable (device, chunk) -> float
        Forward and backward times.
    x : float
        Time of one tensor's exchange.
    """
    p = len(programs)
    pos, now, pending = [0] * p, [0.0] * p, [None] * p
    sent, received, n_sent, n_recv = {}, {}, {}, {}
    moved = True
    while moved:
        moved = False
        for d in range(p):
            while pos[d] < len(programs[d]):
                kind, arg = programs[d][pos[d]]
                if kind in ("F", "B"):
                    now[d] += (f if kind == "F" else b)(d, arg)
                    pos[d] += 1
                    moved = True
                    continue
                if pending[d] is None:
                    keys = []
                    for op, peer in arg:
                        pair = (d, peer) if op == "send" else (peer, d)
                        counter = n_sent if op == "send" else n_recv
                        n = counter.get(pair, 0)
                        counter[pair] = n + 1
                        (sent if op == "send" else received)[pair + (n,)] = now[d]
                        keys.append((op, pair + (n,)))
                    pending[d] = keys
                    moved = True
                keys = pending[d]
                if not all(key in sent and key in received for _, key in keys):
                    break
                sends = sum(1 for op, _ in keys if op == "send")
                start = max(max(sent[key], received[key]) for _, key in keys)
                now[d] = start + x * max(sends, len(keys) - sends)
                pending[d] = None
                pos[d] += 1
                moved = True
    if any(pos[d] < len(programs[d]) for d in range(p)):
        raise RuntimeError("the reference schedule deadlocked")
    return max(now)
