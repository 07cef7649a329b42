"""SWARM-style pipelines: swarms of unreliable, unequal peers per stage.

A what-if for decentralized training (Ryabinin et al., "SWARM Parallelism:
Training Large Models Can Be Surprisingly Communication-Efficient", ICML
2023, arXiv 2301.11913). Each model stage is served by a *swarm* of
replicas (peers) of different speeds; every request of a microbatch (the
forward or the backward of one stage) is routed to one live replica of that
stage when it arrives, and a replica that leaves loses the request it was
running and its queue, which are routed again to the stage's other replicas.

It is a discrete-event simulation, not an op table: which device runs an op
is decided while the run goes (by the routing rule, the queues and the
failures), so it is no :class:`pipecore.Schedule` and no registered family.
:func:`swarm` compares it with a fixed pipeline of the same devices
(:func:`pipecore.simulate` of a registered family) under the same failures.

The model (each assumption is a choice; the docstring of :func:`swarm` says
which option changes it):

* A microbatch is driven by a *trainer* that holds every stage's input, as in
  the SWARM code, whose servers run a stateless backward that recomputes the
  forward (yandex-research/swarm, ``swarm/pipeline/src/moe/server/
  expert_backend.py``). So a backward may run on any replica of its stage, and
  a lost request costs only itself: nothing upstream is redone.
* Each replica serves its queue first in, first out, one request at a time.
* Transfers take ``costs.comm`` (indexed by the sending stage) and never
  contend; the optimizer step and gradient averaging are not simulated.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.costs import Costs, per_stage, per_stage_direct
from ..core.ops import InputError, check_int, check_type

__all__ = ["Swarm", "swarm", "ROUTINGS"]

#: Routing rules of :func:`swarm`: ``throughput`` is SWARM's balancer (each
#: request to the live replica with the least virtual load, which then grows
#: by the request's time on that replica), ``proportional`` a random replica
#: with probability proportional to its speed, ``uniform`` a random live
#: replica, ``queue`` the replica that would finish the request first given
#: the work already queued on each.
ROUTINGS = ("throughput", "proportional", "uniform", "queue")

F, B = 0, 1
_KIND = ("F", "B")
# Events at one instant: a finished request counts before a replica leaves at
# that instant, and a replica that joins takes the requests arriving then.
_DONE, _JOIN, _LEAVE, _ARRIVE = 0, 1, 2, 3


@dataclass
class Swarm:
    """What a SWARM-style run did, beside a fixed pipeline of the same devices.

    Times are in the costs' unit (seconds when the costs are seconds);
    throughputs are microbatches per that unit, higher is better.

    Attributes
    ----------
    makespan : float
        Time until the last microbatch's backward of stage 0 finished.
    throughput : float
        ``microbatches / makespan``.
    steady_throughput : float
        Microbatches completed per unit of time once the pipeline is full:
        the least-squares slope of completions against time, the first and
        last 10% of them (fill and drain) left out; ``throughput`` when fewer
        than 10 microbatches ran. An estimate: it may pass ``capacity`` by a
        little when completions come in bursts.
    capacity : float
        The bound no routing beats: the least, over stages, of the stage's
        summed replica speeds over its work per microbatch (every replica up).
    utilisation : list of numpy.ndarray
        Per stage, per replica: useful busy time over the time it was up,
        in [0, 1].
    lost_work : float
        Compute time spent on requests that a leaving replica lost.
    lost_requests : int
        Requests lost that way (each ran again elsewhere).
    requests : dict of str to numpy.ndarray
        Every attempt of every request, one row each: ``microbatch``,
        ``stage``, ``kind`` (0 forward, 1 backward), ``replica``, ``arrive``
        (time it reached the stage), ``start``, ``finish`` (the leave time
        for a lost one) and ``lost``.
    downtime : list of list of tuple
        Per stage, per replica: the (leave, rejoin) intervals the run saw.
    fixed : dict
        The fixed pipeline of the same devices under the same failures:
        ``schedule`` (family), ``mode`` (``"pipelines"``, ``"weighted"`` or
        ``"split"``), ``shares`` (microbatches per pipeline per iteration),
        ``iteration`` (time of one iteration without failures),
        ``microbatches`` (run), ``makespan`` (``inf`` when a device it needs
        never comes back), ``throughput`` and ``lost_work``. Empty when
        ``fixed=None``.
    routing : str
    seed : int
    """

    makespan: float
    throughput: float
    steady_throughput: float
    capacity: float
    utilisation: list
    lost_work: float
    lost_requests: int
    requests: dict
    downtime: list
    fixed: dict = field(default_factory=dict)
    routing: str = "throughput"
    seed: int = 0

    @property
    def speedup(self) -> float:
        """float: SWARM throughput over the fixed pipeline's (> 1: SWARM is
        faster); ``inf`` when the fixed pipeline never finishes, ``nan``
        without a fixed pipeline."""
        if not self.fixed:
            return math.nan
        if self.fixed["throughput"] == 0:
            return math.inf
        return self.throughput / self.fixed["throughput"]

    def report(self) -> str:
        """Plain-text summary (fits 120 columns).

        Returns
        -------
        str
        """
        lines = [f"SWARM routing={self.routing!r} seed={self.seed}: {len(self.utilisation)} stages, "
                 f"replicas {[len(u) for u in self.utilisation]}; times in the costs' unit",
                 f"  throughput {self.throughput:.6g} microbatches per unit time (higher is better), "
                 f"steady {self.steady_throughput:.6g}, bound {self.capacity:.6g}",
                 f"  makespan {self.makespan:.6g}; lost work {self.lost_work:.6g} "
                 f"({self.lost_requests} requests re-routed)"]
        for s, u in enumerate(self.utilisation):
            lines.append(f"  stage {s} utilisation (busy / up): "
                         + " ".join(f"{x:.2f}" for x in u))
        if self.fixed:
            fx = self.fixed
            if math.isinf(fx["makespan"]):
                lines.append(f"  fixed {fx['schedule']} ({fx['mode']}): never finishes, a device it "
                             f"needs leaves and does not come back")
            else:
                lines.append(f"  fixed {fx['schedule']} ({fx['mode']}): throughput "
                             f"{fx['throughput']:.6g} over {fx['microbatches']} microbatches, makespan "
                             f"{fx['makespan']:.6g}, lost work {fx['lost_work']:.6g}")
            lines.append(f"  SWARM / fixed throughput: {self.speedup:.3g}x (> 1: SWARM faster)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Swarm(throughput={self.throughput:.6g}, makespan={self.makespan:.6g}, "
                f"lost_requests={self.lost_requests}, fixed={self.fixed.get('throughput', None)})")


class _Availability:
    """Down intervals of every replica: given, or drawn lazily from churn.

    Churn draws come from one stream per replica (``default_rng([seed, s,
    r])``), so the SWARM run and the fixed pipeline see the same trace
    however far each reads it.
    """

    def __init__(self, replicas, failures, churn, seed):
        self.churn = churn
        self.given = [[[] for _ in range(n)] for n in replicas]
        for s, r, leave, rejoin in failures:
            self.given[s][r].append((leave, rejoin))
        for per_stage_list in self.given:
            for lst in per_stage_list:
                lst.sort()
        if churn is not None:
            self.rngs = [[np.random.default_rng([seed, s, r]) for r in range(n)]
                         for s, n in enumerate(replicas)]
            self.clock = [[0.0] * n for n in replicas]

    def interval(self, s, r, k):
        """The k-th (leave, rejoin) of replica (s, r), or None."""
        lst = self.given[s][r]
        if self.churn is not None:
            up, down = self.churn
            while len(lst) <= k:
                rng = self.rngs[s][r]
                leave = self.clock[s][r] + rng.exponential(up)
                rejoin = leave + rng.exponential(down)
                lst.append((leave, rejoin))
                self.clock[s][r] = rejoin
        return lst[k] if k < len(lst) else None

    def seen(self, s, r, until):
        """Intervals of (s, r) that start before ``until``."""
        out, k = [], 0
        while True:
            iv = self.interval(s, r, k)
            if iv is None or iv[0] >= until:
                return out
            out.append(iv)
            k += 1


def _check_speeds(stages, replicas, speeds):
    if speeds is None:
        if stages is None or replicas is None:
            raise InputError("give 'speeds' (one list of replica speeds per stage), or 'stages' and "
                             "'replicas'")
        stages = check_int("stages", stages, minimum=1)
        if isinstance(replicas, (int, np.integer)) and not isinstance(replicas, bool):
            counts = [check_int("replicas", replicas, minimum=1)] * stages
        else:
            counts = [check_int(f"replicas[{s}]", n, minimum=1) for s, n in enumerate(replicas)]
            if len(counts) != stages:
                raise InputError(f"'replicas' has {len(counts)} entries but there are {stages} stages "
                                 f"(one count per stage)")
        return [np.ones(n) for n in counts]
    if isinstance(speeds, (str, bytes)) or not isinstance(speeds, Sequence) or not speeds:
        raise InputError(f"'speeds' must be a non-empty list with one list of replica speeds per stage "
                         f"(got {speeds!r:.60})")
    out = []
    for s, row in enumerate(speeds):
        if isinstance(row, (int, float, np.number)) or isinstance(row, (str, bytes)):
            raise InputError(f"'speeds'[{s}] must be a list of replica speeds (got {row!r})")
        arr = np.asarray(row, dtype=object)
        if arr.ndim != 1 or arr.size == 0:
            raise InputError(f"'speeds'[{s}] must be a non-empty list of replica speeds (got {row!r:.60})")
        vals = []
        for r, x in enumerate(arr):
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(float(x)) or float(x) <= 0:
                raise InputError(f"speed of stage {s} replica {r} must be a finite number > 0, "
                                 f"1.0 the nominal speed (got {x!r})")
            vals.append(float(x))
        out.append(np.array(vals))
    if stages is not None and check_int("stages", stages, minimum=1) != len(out):
        raise InputError(f"'speeds' has {len(out)} stages but 'stages' is {stages}")
    if replicas is not None:
        counts = [replicas] * len(out) if isinstance(replicas, (int, np.integer)) else list(replicas)
        if counts != [len(x) for x in out]:
            raise InputError(f"'replicas' {replicas!r} does not match the speeds given "
                             f"({[len(x) for x in out]} replicas per stage)")
    return out


def _number(name, value, positive=False):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number (got {value!r})")
    x = float(value)
    if math.isnan(x) or x < 0 or (positive and x == 0):
        raise InputError(f"{name} must be {'> 0' if positive else '>= 0'} (got {value!r})")
    return x


def _check_failures(failures, speeds):
    if isinstance(failures, (str, bytes)) or not isinstance(failures, Sequence):
        raise InputError(f"'failures' must be a list of (stage, replica, leave, rejoin) "
                         f"(got {failures!r:.60})")
    out = []
    for i, item in enumerate(failures):
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 4:
            raise InputError(f"failures[{i}] must be (stage, replica, leave, rejoin) with rejoin None "
                             f"for never (got {item!r})")
        s, r, leave, rejoin = item
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s < len(speeds):
            raise InputError(f"failures[{i}]: stage {s!r} is not one of 0..{len(speeds) - 1}")
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < len(speeds[s]):
            raise InputError(f"failures[{i}]: replica {r!r} is not one of stage {s}'s "
                             f"0..{len(speeds[s]) - 1}")
        leave = _number(f"failures[{i}] leave time", leave)
        if math.isinf(leave):
            raise InputError(f"failures[{i}] leave time must be finite (got {leave})")
        rejoin = math.inf if rejoin is None else _number(f"failures[{i}] rejoin time", rejoin)
        if rejoin <= leave:
            raise InputError(f"failures[{i}]: rejoin {rejoin} must come after leave {leave}")
        out.append((int(s), int(r), leave, rejoin))
    by_replica = {}
    for s, r, leave, rejoin in sorted(out):
        prev = by_replica.get((s, r))
        if prev is not None and leave < prev:
            raise InputError(f"stage {s} replica {r} leaves at {leave} while it is still away "
                             f"(until {prev}): one replica's down intervals must not overlap")
        by_replica[(s, r)] = rejoin
    for s, row in enumerate(speeds):
        gone = [r for r in range(len(row)) if by_replica.get((s, r)) == math.inf]
        if len(gone) == len(row):
            raise InputError(f"stage {s}: every replica leaves for good (rejoin None), so its requests "
                             f"can never run")
    return out


def _check_churn(churn):
    if churn is None:
        return None
    if isinstance(churn, (str, bytes)) or not isinstance(churn, Sequence) or len(churn) != 2:
        raise InputError(f"'churn' must be (mean_uptime, mean_downtime) (got {churn!r:.60})")
    up = _number("churn mean_uptime", churn[0], positive=True)
    down = _number("churn mean_downtime", churn[1], positive=True)
    if math.isinf(up) or math.isinf(down):
        raise InputError(f"'churn' times must be finite (got {churn!r})")
    return up, down


def _route(policy, s, live, work, speed, state, rng, now):
    """Replica of stage ``s`` that takes a request of ``work`` (time at speed 1)."""
    sp = speed[s]
    if len(live) == 1:
        r = live[0]
    elif policy == "uniform":
        r = live[int(rng.integers(len(live)))]
    elif policy == "proportional":
        w = sp[live]
        r = live[int(rng.choice(len(live), p=w / w.sum()))]
    elif policy == "throughput":
        # SWARM's balancer: least virtual load first, ties broken at random.
        load = state["load"][s]
        best = min(load[r] for r in live)
        ties = [r for r in live if load[r] == best]
        r = ties[int(rng.integers(len(ties)))] if len(ties) > 1 else ties[0]
    else:  # queue: earliest expected finish of this request
        free = state["free"][s]
        r = min(live, key=lambda q: (max(free[q], now) + work / sp[q], q))
    if policy == "throughput":
        state["load"][s][r] += work / sp[r]
    return r


def _simulate(speeds, fwd, bwd, comm, microbatches, in_flight, routing, avail, retry, seed):
    S = len(speeds)
    rng = np.random.default_rng([seed, 1 << 30])  # apart from the churn streams
    alive = [[True] * len(sp) for sp in speeds]
    queues = [[deque() for _ in sp] for sp in speeds]
    running = [[None] * len(sp) for sp in speeds]  # (request id, start, token)
    pending = [deque() for _ in range(S)]  # requests of a stage with no live replica
    state = {"load": [np.zeros(len(sp)) for sp in speeds],
             "free": [np.zeros(len(sp)) for sp in speeds]}  # expected time each replica empties
    busy = [np.zeros(len(sp)) for sp in speeds]
    next_iv = [[0] * len(sp) for sp in speeds]
    down_seen = [[[] for _ in sp] for sp in speeds]
    req_mb, req_stage, req_kind, req_arrive = [], [], [], []
    rows = {k: [] for k in ("microbatch", "stage", "kind", "replica", "arrive", "start", "finish", "lost")}
    events, seq = [], 0
    lost_work, lost_requests = 0.0, 0
    completions = []
    token = 0

    def push(t, kind, payload):
        nonlocal seq
        heapq.heappush(events, (t, kind, seq, payload))
        seq += 1

    def new_request(mb, s, kind, t):
        req_mb.append(mb)
        req_stage.append(s)
        req_kind.append(kind)
        req_arrive.append(t)
        push(t, _ARRIVE, len(req_mb) - 1)

    def work_of(q):
        return fwd[req_stage[q]] if req_kind[q] == F else bwd[req_stage[q]]

    def start_next(s, r, t):
        nonlocal token
        if running[s][r] is not None or not queues[s][r]:
            return
        q = queues[s][r].popleft()
        token += 1
        running[s][r] = (q, t, token)
        push(t + work_of(q) / speeds[s][r], _DONE, (s, r, token))

    def arrive(q, t):
        s = req_stage[q]
        live = [r for r in range(len(speeds[s])) if alive[s][r]]
        if not live:
            pending[s].append(q)
            return
        w = work_of(q)
        r = _route(routing, s, live, w, speeds, state, rng, t)
        state["free"][s][r] = max(state["free"][s][r], t) + w / speeds[s][r]
        req_arrive[q] = t
        queues[s][r].append(q)
        start_next(s, r, t)

    def schedule_next_failure(s, r):
        iv = avail.interval(s, r, next_iv[s][r])
        if iv is not None:
            push(iv[0], _LEAVE, (s, r, iv[1]))

    def record(q, r, start, finish, lost):
        for k, v in (("microbatch", req_mb[q]), ("stage", req_stage[q]), ("kind", req_kind[q]),
                     ("replica", r), ("arrive", req_arrive[q]), ("start", start), ("finish", finish),
                     ("lost", lost)):
            rows[k].append(v)

    started = min(in_flight, microbatches)
    for mb in range(started):
        new_request(mb, 0, F, 0.0)
    for s in range(S):
        for r in range(len(speeds[s])):
            schedule_next_failure(s, r)
    max_lost = 100 * 2 * S * microbatches + 1000
    now = 0.0
    while len(completions) < microbatches:
        if not events:  # cannot happen after the checks of swarm(); a hang would be worse
            raise InputError(f"the run is stuck with {microbatches - len(completions)} microbatches "
                             f"unfinished: a stage has no replica left")
        now, kind, _, payload = heapq.heappop(events)
        if kind == _ARRIVE:
            arrive(payload, now)
        elif kind == _DONE:
            s, r, tok = payload
            cur = running[s][r]
            if cur is None or cur[2] != tok:
                continue  # the replica left while running it
            q, start, _ = cur
            running[s][r] = None
            busy[s][r] += now - start
            record(q, r, start, now, False)
            mb, k = req_mb[q], req_kind[q]
            if k == F and s < S - 1:
                new_request(mb, s + 1, F, now + comm[s])
            elif k == F:
                new_request(mb, s, B, now)
            elif s > 0:
                new_request(mb, s - 1, B, now + comm[s])
            else:
                completions.append(now)
                if started < microbatches:
                    new_request(started, 0, F, now)
                    started += 1
            start_next(s, r, now)
        elif kind == _LEAVE:
            s, r, rejoin = payload
            alive[s][r] = False
            down_seen[s][r].append((now, rejoin))
            moved = []
            if running[s][r] is not None:
                q, start, _ = running[s][r]
                running[s][r] = None
                lost_work += now - start
                lost_requests += 1
                record(q, r, start, now, True)
                moved.append(q)
            moved.extend(queues[s][r])
            queues[s][r].clear()
            state["free"][s][r] = now
            for q in moved:
                push(now + retry, _ARRIVE, q)
            if rejoin != math.inf:
                push(rejoin, _JOIN, (s, r))
            if lost_requests > max_lost:
                raise InputError(f"the run makes no progress: {lost_requests} requests lost to failures; "
                                 f"replicas leave faster than they finish a request (check 'churn' or "
                                 f"'failures' against the op times)")
        else:  # _JOIN
            s, r = payload
            alive[s][r] = True
            next_iv[s][r] += 1
            live = [x for x in range(len(speeds[s])) if alive[s][x] and x != r]
            # As SWARM's balancer: a newcomer starts at the least load, so it is tried at once.
            state["load"][s][r] = min((state["load"][s][x] for x in live), default=0.0)
            state["free"][s][r] = now
            schedule_next_failure(s, r)
            waiting = list(pending[s])
            pending[s].clear()
            for q in waiting:
                arrive(q, now)
    makespan = now
    table = {k: np.asarray(v, dtype=np.float64 if k in ("arrive", "start", "finish")
                           else (bool if k == "lost" else np.int64)) for k, v in rows.items()}
    return makespan, np.asarray(completions), busy, lost_work, lost_requests, table, down_seen


def _uptime(intervals, end):
    down = sum(max(0.0, min(rejoin, end) - leave) for leave, rejoin in intervals if leave < end)
    return end - down


def _fixed(schedule, mode, speeds, costs_vec, microbatches, iterations, avail):
    """Throughput of a fixed pipeline of the same devices, restarting an
    iteration that a device's departure interrupts once the device is back."""
    from ..core.simulate import simulate
    from ..schedules.registry import build

    fwd, bwd, comm = costs_vec
    S = len(speeds)
    counts = [len(x) for x in speeds]
    if mode == "auto":
        mode = "weighted" if len(set(counts)) == 1 else "split"
    if mode in ("pipelines", "weighted"):
        R = counts[0]
        if len(set(counts)) != 1:
            raise InputError(f"fixed_mode={mode!r} needs the same replica count in every stage (got "
                             f"{counts}); use fixed_mode='split'")
        groups = [[(s, k) for s in range(S)] for k in range(R)]
        factors = [[1.0 / speeds[s][k] for s in range(S)] for k in range(R)]
    elif mode == "split":
        # One pipeline; stage s splits each microbatch evenly over its replicas
        # and waits for the slowest share.
        groups = [[(s, r) for s in range(S) for r in range(counts[s])]]
        factors = [[1.0 / (counts[s] * speeds[s].min()) for s in range(S)]]
    else:
        raise InputError(f"'fixed_mode' must be 'auto', 'pipelines', 'weighted' or 'split' (got {mode!r})")
    per_iteration = microbatches // iterations
    if mode == "weighted":
        # Shares in proportion to each pipeline's rate at its slowest stage,
        # rounded by largest remainder.
        work = np.asarray(fwd) + np.asarray(bwd)
        rate = np.array([1.0 / max(work[s] * fac[s] for s in range(S)) for fac in factors])
        exact = per_iteration * rate / rate.sum()
        shares = np.floor(exact).astype(int)
        for k in np.argsort(-(exact - shares), kind="stable")[:per_iteration - shares.sum()]:
            shares[k] += 1
    else:
        shares = np.full(len(groups), per_iteration // len(groups))
    if shares.min() < 1:
        raise InputError(f"the fixed pipeline gives pipeline {int(shares.argmin())} no microbatch per "
                         f"iteration: it needs more than microbatches={microbatches} over "
                         f"fixed_iterations={iterations} (at least iterations x pipelines = "
                         f"{iterations * len(groups)})")
    costs = Costs(f=np.asarray(fwd), b=np.asarray(bwd), w=0.0, comm=np.asarray(comm))
    times = []
    for fac, share in zip(factors, shares):
        sched = build(schedule, S, int(share))
        if sched.stages != S:
            raise InputError(f"fixed schedule {schedule!r} has {sched.stages} stages on {S} devices; "
                             f"give a family with one stage per device (e.g. '1f1b', 'gpipe')")
        strag = np.asarray(fac)[sched._column("device")]
        times.append(simulate(sched, costs, stragglers=strag).makespan)

    def run(group, t, length):
        """Finish time of ``length`` of work started at ``t`` on ``group``; lost work."""
        lost = 0.0
        while True:
            # Wait until every device of the group is up.
            moved = True
            while moved:
                moved = False
                for s, r in group:
                    k = 0
                    while (iv := avail.interval(s, r, k)) is not None and iv[0] <= t:
                        if t < iv[1]:
                            t, moved = iv[1], True
                        k += 1
            if math.isinf(t):
                return t, lost
            cut = math.inf
            for s, r in group:
                k = 0
                while (iv := avail.interval(s, r, k)) is not None and iv[0] < t + length:
                    if iv[0] > t:
                        cut = min(cut, iv[0])
                        break
                    k += 1
            if cut == math.inf:
                return t + length, lost
            lost += cut - t
            t = cut

    t, lost = 0.0, 0.0
    for _ in range(iterations):
        ends = []
        for group, length in zip(groups, times):
            end, lw = run(group, t, length)
            ends.append(end)
            lost += lw
        t = max(ends)
        if math.isinf(t):
            break
    done = iterations * int(shares.sum())
    return {"schedule": schedule, "mode": mode, "iteration": max(times), "microbatches": done,
            "shares": [int(x) for x in shares],
            "makespan": t, "throughput": 0.0 if math.isinf(t) else done / t, "lost_work": lost}


def swarm(speeds=None, costs: Costs | None = None, microbatches: int = 64, *, stages: int | None = None,
          replicas=None, routing: str = "throughput", in_flight: int | None = None, failures=(),
          churn=None, retry: float = 0.0, seed: int = 0, fixed: str | None = "1f1b",
          fixed_mode: str = "auto", fixed_iterations: int = 10) -> Swarm:
    """Simulate SWARM-style training: swarms of unequal, unreliable replicas per stage.

    Each microbatch runs the forward of stages 0..S-1 and then the backward
    of S-1..0; each of these 2S requests goes to one live replica of its
    stage, chosen by ``routing`` when the request arrives, and waits in that
    replica's queue (first in, first out). A replica that leaves loses the
    request it runs (its compute so far is *lost work*) and hands back its
    queue; all of them go to the stage's live replicas after ``retry``. A
    replica that rejoins takes requests again (with SWARM's balancer it
    starts at the least load, so it is tried at once). Deterministic per
    ``seed``.

    Parameters
    ----------
    speeds : list of list of float, optional
        Per stage, the speed of each replica (1.0 nominal; 0.5 takes twice
        as long). Or give ``stages`` and ``replicas`` for all at 1.0.
    costs : Costs, optional
        ``f`` forward, ``b + w`` backward of one microbatch through one stage
        at speed 1 (a scalar for every stage or one entry per stage); SWARM's
        servers recompute the forward inside the backward, so fold that into
        ``b``. ``comm`` is the time of each hop between stages, indexed by the
        sending stage. Default ``Costs()`` (f=1, b=2).
    microbatches : int, default 64
        Microbatches to run (>= 1).
    stages : int, optional
    replicas : int or list of int, optional
        Replicas per stage (all stages, or one count each).
    routing : {"throughput", "proportional", "uniform", "queue"}
        ``throughput``: the live replica with the least virtual load, which
        then grows by the request's time there; ``proportional``: a random
        replica, chance in proportion to speed; ``uniform``: a random live
        replica; ``queue``: the replica that would finish the request first
        given its queue. ``throughput`` follows SWARM's balancer
        (yandex-research/swarm, ``moe/client/balancer.py``: a heap of
        accumulated expected time per peer), with exact speeds where SWARM
        measures them.
    in_flight : int, optional
        Microbatches under way at once (trainers); a new one starts when one
        finishes. Default twice the number of replicas; ``None`` is that
        default, give ``microbatches`` to start all at once.
    failures : list of (stage, replica, leave, rejoin)
        Departures; ``rejoin=None`` for never (some replica of each stage must
        stay or return).
    churn : (float, float), optional
        Random departures instead: every replica stays up for exponential
        times of mean ``churn[0]`` and stays away for mean ``churn[1]``.
    retry : float, default 0
        Time before a lost or handed-back request is routed again (the
        trainer's failure detection).
    seed : int, default 0
        Seed of the routing draws and the churn.
    fixed : str or None, default "1f1b"
        A registered family with one stage per device to compare with
        (``None``: no comparison).
    fixed_mode : {"auto", "weighted", "pipelines", "split"}
        ``pipelines``: replica k of every stage forms pipeline k, each takes
        an equal share of an iteration's microbatches and iterations end
        together (needs equal replica counts); ``weighted``: the same
        pipelines with shares in proportion to each one's rate at its slowest
        stage (the best static split); ``split``: one pipeline whose stage s
        splits each microbatch evenly over its replicas and waits for the
        slowest. ``auto``: ``weighted`` when the counts are equal, else
        ``split``.
    fixed_iterations : int, default 10
        Iterations of the fixed pipeline (it flushes after each), of
        ``microbatches // fixed_iterations`` microbatches over all its
        pipelines. A departure of any of a pipeline's devices
        interrupts that pipeline's iteration, which restarts once every device
        of it is back (its work so far is lost).

    Returns
    -------
    Swarm

    Raises
    ------
    ValueError
        (:class:`pipecore.InputError`) naming the bad argument: speeds,
        counts, an unknown routing or fixed mode, a failure naming a stage or
        replica that does not exist or overlapping one already under way, a
        stage left with no replica for good, too few microbatches for the
        fixed pipeline, or churn so heavy that no request can finish.
    """
    spd = _check_speeds(stages, replicas, speeds)
    S = len(spd)
    costs = Costs() if costs is None else costs
    check_type("costs", costs, Costs, "a pipecore.Costs")
    fwd = per_stage("Costs", "f", costs.f, S, S)
    bwd = per_stage("Costs", "b", costs.b, S, S) + per_stage("Costs", "w", costs.w, S, S)
    comm = per_stage_direct("Costs", "comm", costs.comm, S)
    if routing not in ROUTINGS:
        raise InputError(f"'routing' must be one of {', '.join(ROUTINGS)} (got {routing!r})")
    microbatches = check_int("microbatches", microbatches, minimum=1)
    total = sum(len(x) for x in spd)
    in_flight = 2 * total if in_flight is None else check_int("in_flight", in_flight, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    retry = _number("'retry'", retry)
    if math.isinf(retry):
        raise InputError(f"'retry' must be finite (got {retry})")
    fails = _check_failures(failures, spd)
    churn = _check_churn(churn)
    if churn is not None and fails:
        raise InputError("give 'failures' or 'churn', not both")
    if fixed_mode not in ("auto", "pipelines", "weighted", "split"):
        raise InputError(f"'fixed_mode' must be 'auto', 'pipelines', 'weighted' or 'split' "
                         f"(got {fixed_mode!r})")
    fixed_iterations = check_int("fixed_iterations", fixed_iterations, minimum=1)
    avail = _Availability([len(x) for x in spd], fails, churn, seed)

    makespan, done, busy, lost_work, lost_requests, table, seen = _simulate(
        spd, fwd, bwd, comm, microbatches, in_flight, routing, avail, retry, seed)
    util = [np.array([busy[s][r] / up if (up := _uptime(seen[s][r], makespan)) > 0 else 0.0
                      for r in range(len(spd[s]))]) for s in range(S)]
    capacity = min(float(spd[s].sum()) / (fwd[s] + bwd[s]) for s in range(S))
    done.sort()
    throughput = microbatches / makespan
    steady = throughput
    mid = done[math.ceil(0.1 * microbatches):math.floor(0.9 * microbatches)]
    if microbatches >= 10 and mid.size >= 2 and mid[-1] > mid[0]:
        # Least-squares slope of completions over time: completions come in
        # bursts, and a rate between two of them depends on where they fall.
        x = mid - mid.mean()
        steady = float((x * (np.arange(mid.size) - (mid.size - 1) / 2)).sum() / (x * x).sum())
    fx = {}
    if fixed is not None:
        fx = _fixed(fixed, fixed_mode, spd, (fwd, bwd, comm), microbatches, fixed_iterations, avail)
    return Swarm(makespan, throughput, steady, capacity, util, lost_work, lost_requests, table,
                 [[list(x) for x in row] for row in seen], fx, routing, seed)
