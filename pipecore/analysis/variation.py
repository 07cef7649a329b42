"""Variation: stragglers, jitter and sequence lengths, one draw or many.

A *straggler* is a device whose ops run slower by a constant factor (or
any per-op factors). *Jitter* multiplies each op's time by a random factor
(per op, or one per microbatch for all its ops, as varying sequence lengths
do). :func:`monte_carlo` simulates thousands of draws in one batched kernel
and returns the distribution of iteration time.

Draws are reproducible: draw k of ``Jitter(seed=s)`` is the same whether 1
or 10,000 draws are asked for (draws come in blocks of ``BLOCK``, block b
from ``numpy.random.default_rng([s, b])``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..core import hostmem, tier
from ..core.costs import Costs, Network
from ..core.ops import AR, CapacityError, InputError, check_type
from ..core.schedule import Schedule, check_int
from ..core.simulate import straggler_scale
from ..kernels.replay import replay_scaled as _replay_scaled

__all__ = ["Jitter", "MonteCarlo", "WhatIf", "monte_carlo", "what_if", "straggler_scale", "BLOCK"]

#: Draws per random block (see the module docstring).
BLOCK = 256


@dataclass(frozen=True)
class Jitter:
    """Random factors on op times.

    Parameters
    ----------
    dist : {"lognormal", "normal", "empirical"}
        ``lognormal``: ``exp(sigma Z - sigma^2 / 2)`` (mean 1);
        ``normal``: ``max(0, 1 + sigma Z)``; ``empirical``: factors drawn
        uniformly, with replacement, from ``factors``.
    sigma : float
        Spread of the lognormal or normal factor (>= 0).
    seed : int
        Seed of the draws.
    per : {"op", "microbatch"}
        One factor per op, or one per microbatch shared by all its ops (a
        microbatch with a longer sequence is slower everywhere).
    factors : sequence of float
        The empirical factors (> 0), for ``dist="empirical"``.

    Raises
    ------
    ValueError
        For an unknown ``dist`` or ``per``, a negative ``sigma`` or seed, or
        bad empirical factors.
    """

    dist: str = "lognormal"
    sigma: float = 0.05
    seed: int = 0
    per: str = "op"
    factors: tuple = field(default=())

    def __post_init__(self):
        if self.dist not in ("lognormal", "normal", "empirical"):
            raise InputError(f"Jitter 'dist' must be 'lognormal', 'normal' or 'empirical' "
                             f"(got {self.dist!r})")
        if self.per not in ("op", "microbatch"):
            raise InputError(f"Jitter 'per' must be 'op' or 'microbatch' (got {self.per!r})")
        sigma = float(self.sigma)
        if not math.isfinite(sigma) or sigma < 0:
            raise InputError(f"Jitter 'sigma' must be a finite number >= 0 (got {self.sigma!r})")
        object.__setattr__(self, "sigma", sigma)
        check_int("seed", self.seed, minimum=0)
        facs = tuple(float(x) for x in self.factors)
        if self.dist == "empirical":
            if not facs or any(not math.isfinite(x) or x <= 0 for x in facs):
                raise InputError("Jitter 'factors' must be a non-empty sequence of finite "
                                 "numbers > 0 for dist='empirical'")
        object.__setattr__(self, "factors", facs)

    @classmethod
    def lognormal(cls, sigma: float, seed: int = 0, per: str = "op") -> Jitter:
        """Lognormal factors with mean 1 and log-spread ``sigma``.

        Parameters
        ----------
        sigma : float
            Standard deviation of the factors' logarithm (0: no jitter).
        seed, per : int, {"op", "microbatch"}
            As :class:`Jitter`.

        Returns
        -------
        Jitter
            Heavy-tailed slow ops: a few much slower, none below zero.

        Raises
        ------
        ValueError
            As :class:`Jitter`: for a negative ``sigma`` or ``seed``, or an
            unknown ``per``.
        """
        return cls("lognormal", sigma, seed, per)

    @classmethod
    def normal(cls, sigma: float, seed: int = 0, per: str = "op") -> Jitter:
        """Factors ``max(0, 1 + sigma Z)``, Z standard normal.

        Parameters
        ----------
        sigma : float
            Standard deviation of the factors around 1.
        seed, per : int, {"op", "microbatch"}
            As :class:`Jitter`.

        Returns
        -------
        Jitter
            Symmetric noise around the given times, clipped at zero.

        Raises
        ------
        ValueError
            As :class:`Jitter`.
        """
        return cls("normal", sigma, seed, per)

    @classmethod
    def seqlen(cls, lengths: Sequence[float], attention_share: float = 0.0, seed: int = 0,
               packed: int | None = None, pool: int = 4096) -> Jitter:
        """Per-microbatch factors from sequence lengths, padded or packed.

        Padded (``packed=None``): a microbatch whose sequences are padded to
        length ``L`` takes ``(1 - a) L / Lbar + a (L / Lbar)^2`` of the time
        at the mean length ``Lbar``: the linear layers scale with tokens and
        attention (share ``a`` of the time at ``Lbar``) with the square of
        the length. Each draw gives every microbatch a length taken
        uniformly from ``lengths`` (e.g. observed batch lengths).

        Packed (``packed=T`` tokens per microbatch): documents with lengths
        drawn from ``lengths`` fill each microbatch up to ``T`` tokens (the
        last one cut to fit), with attention within each document only.
        The tokens, so the linear layers' time, are the same for every
        microbatch; attention costs the sum of squared document lengths,
        so a microbatch takes ``(1 - a) + a Q / Qbar`` with ``Q`` its sum of
        squares and ``Qbar`` the mean over a pool of ``pool`` packed
        microbatches (made from ``seed``), from which each draw picks.

        Parameters
        ----------
        lengths : sequence of float
            Observed lengths (> 0).
        attention_share : float
            Share of the time in attention at the mean, in [0, 1].
        seed : int
        packed : int, optional
            Tokens per packed microbatch (>= 1).
        pool : int, default 4096
            Packed microbatches made to draw from.

        Returns
        -------
        Jitter
            An empirical, per-microbatch jitter.

        Raises
        ------
        ValueError
            For empty or non-positive lengths, a share outside [0, 1], or a
            bad ``packed`` or ``pool``.
        """
        arr = np.asarray(lengths, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise InputError("'lengths' must be a non-empty sequence of finite numbers > 0")
        a = float(attention_share)
        if not 0.0 <= a <= 1.0:
            raise InputError(f"'attention_share' must be in [0, 1] (got {attention_share!r})")
        if packed is None:
            ratio = arr / arr.mean()
            return cls("empirical", 0.0, seed, "microbatch",
                       tuple((1 - a) * ratio + a * ratio * ratio))
        tokens = check_int("packed", packed, minimum=1)
        pool = check_int("pool", pool, minimum=1)
        rng = np.random.default_rng([seed, 1 << 20])  # a stream apart from the draws'
        squares = np.empty(pool)
        for i in range(pool):
            left, q = float(tokens), 0.0
            while left > 0:
                doc = min(float(arr[rng.integers(arr.size)]), left)
                q += doc * doc
                left -= doc
            squares[i] = q
        return cls("empirical", 0.0, seed, "microbatch",
                   tuple((1 - a) + a * squares / squares.mean()))

    def draw(self, schedule: Schedule, draws: int = 1, first: int = 0) -> np.ndarray:
        """Factors of draws ``first .. first + draws - 1``, one column each.

        Parameters
        ----------
        schedule : Schedule
        draws : int
        first : int

        Returns
        -------
        numpy.ndarray
            Shape (ops, draws), rows in the schedule's op order; an
            all-reduce (no microbatch) gets 1.0 when ``per="microbatch"``.

        Raises
        ------
        ValueError
            For bad counts.
        """
        draws = check_int("draws", draws, minimum=1)
        first = check_int("first", first, minimum=0)
        n = schedule.num_ops
        m = schedule.microbatches
        mb = schedule._column("microbatch").astype(np.int64)
        is_ar = schedule.kind_codes == AR
        width = n if self.per == "op" else m
        out = np.empty((n, draws))
        b0, b1 = first // BLOCK, (first + draws - 1) // BLOCK
        for b in range(b0, b1 + 1):
            block = self._block(b, width)
            lo = max(first, b * BLOCK)
            hi = min(first + draws, (b + 1) * BLOCK)
            cols = block[:, lo - b * BLOCK:hi - b * BLOCK]
            if self.per == "microbatch":
                cols = np.where(is_ar[:, None], 1.0, cols[np.where(is_ar, 0, mb)])
            out[:, lo - first:hi - first] = cols
        return out

    def _block(self, b, width):
        return _block(self, b, width)


@lru_cache(maxsize=4)
def _block(jitter, b, width):
    """Block b of a jitter's factors (width x BLOCK), kept for the next
    single-draw simulations that read the same block (read-only)."""
    rng = np.random.default_rng([jitter.seed, b])
    if jitter.dist == "empirical":
        facs = np.asarray(jitter.factors)
        out = facs[rng.integers(0, facs.size, size=(width, BLOCK))]
    else:
        z = rng.standard_normal((width, BLOCK))
        sigma = jitter.sigma
        if jitter.dist == "lognormal":
            out = np.exp(sigma * z - 0.5 * sigma * sigma)
        else:
            out = np.maximum(0.0, 1.0 + sigma * z)
    out.setflags(write=False)
    return out





@dataclass
class MonteCarlo:
    """Iteration times of many jitter draws.

    Attributes
    ----------
    makespans : numpy.ndarray
        One per draw, in draw order.
    jitter : Jitter
    seconds : float
        Wall time of the batched evaluation.
    """

    makespans: np.ndarray
    jitter: Jitter
    seconds: float = 0.0

    def quantile(self, q: float) -> float:
        """The q-quantile of the iteration time.

        Parameters
        ----------
        q : float
            In [0, 1].

        Returns
        -------
        float
            The makespan below which that share of the draws fall.

        Raises
        ------
        ValueError
            If q is outside [0, 1].
        """
        if not 0.0 <= q <= 1.0:
            raise InputError(f"'q' must be in [0, 1] (got {q!r})")
        return float(np.quantile(self.makespans, q))

    @property
    def p50(self) -> float:
        """float: median iteration time."""
        return self.quantile(0.5)

    @property
    def p90(self) -> float:
        """float: 90th percentile."""
        return self.quantile(0.9)

    @property
    def p99(self) -> float:
        """float: 99th percentile."""
        return self.quantile(0.99)

    def _repr_html_(self) -> str:
        """Jupyter: p50, p90, p99 and the other statistics with their unit,
        the draw count, and a histogram marking the three quantiles."""
        from ..core.result import _plugin

        return _plugin("monte_carlo_html")(self)

    def summary(self) -> dict:
        """Mean, standard deviation, min, p50, p90, p99 and max.

        Returns
        -------
        dict
        """
        x = self.makespans
        return {"draws": int(x.size), "mean": float(x.mean()), "std": float(x.std()),
                "min": float(x.min()), "p50": self.p50, "p90": self.p90, "p99": self.p99,
                "max": float(x.max())}


@tier.compiled()  # many simulations: compile at once, no interpreted budget
def monte_carlo(schedule: Schedule, costs: Costs | None = None, jitter: Jitter | None = None,
                draws: int = 10_000, network: Network | None = None, stragglers=None,
                first: int = 0) -> MonteCarlo:
    """Simulate many jitter draws of one schedule in one batched call.

    Draw k equals ``pc.simulate(schedule, costs, network,
    stragglers=stragglers, jitter=jitter, draw=first + k)`` exactly.

    Parameters
    ----------
    schedule : Schedule
    costs : Costs, optional
    jitter : Jitter, optional
        Default ``Jitter.lognormal(0.05)``.
    draws : int
        Number of draws (>= 1).
    network : Network, optional
    stragglers : mapping or array_like, optional
        As ``pipecore.core.simulate.straggler_scale``, applied to every draw.
    first : int
        Index of the first draw.

    Returns
    -------
    MonteCarlo

    Raises
    ------
    ValueError
        For bad arguments (as :func:`pipecore.simulate`).
    ScheduleError
        If the schedule is invalid or deadlocks.
    """
    import time

    from ..core.pack import structure_of
    from ..core.simulate import compile_schedule, simulate

    t0 = time.perf_counter()
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    jitter = Jitter.lognormal(0.05) if jitter is None else jitter
    if not isinstance(jitter, Jitter):
        raise InputError(f"'jitter' must be a pipecore.Jitter (got {type(jitter).__name__})")
    draws = check_int("draws", draws, minimum=1)
    free = hostmem.available_bytes()
    if free is not None and 8 * draws > free:  # one float64 makespan per draw
        raise CapacityError(f"monte_carlo: draws={draws:,} needs {8 * draws / 1e9:.3g} GB for "
                            f"its makespans alone; {free / 1e9:.3g} GB are available")
    comp = compile_schedule(schedule, costs, network)
    strag = straggler_scale(schedule, stragglers)
    out = np.empty(draws)
    if comp.x_host.any():
        # Offload copies: memory and shared links need the full scheduler; one draw at a time.
        for k in range(draws):
            out[k] = simulate(schedule, costs, network, stragglers=strag, jitter=jitter,
                              draw=first + k).makespan
        return MonteCarlo(out, jitter, time.perf_counter() - t0)
    st = structure_of(schedule)
    cost = comp.stage_cost[comp.op_class, comp.op_stage]
    done = 0
    while done < draws:
        # Whole blocks where possible, so each block's randoms are made once.
        k0 = first + done
        take = min(draws - done, BLOCK - k0 % BLOCK)
        fac = jitter.draw(schedule, take, k0)
        scale = np.ascontiguousarray(strag[:, None] * fac)
        _replay_scaled(st.order, comp.x_ser, comp.x_lat, cost, scale, float(comp.fb_factor),
                       schedule.devices, max(st.n_links, 1), out[done:done + take])
        done += take
    return MonteCarlo(out, jitter, time.perf_counter() - t0)





@dataclass
class WhatIf:
    """A counterfactual of one simulation: what the iteration would have
    cost without its stragglers (and, optionally, its jitter).

    Attributes
    ----------
    makespan : float
        The simulated iteration time.
    counterfactual : float
        The same schedule, costs, network and jitter draw without what was
        removed.
    per_device : dict of int to float
        For each slowed device: how much faster the iteration gets when
        that device alone runs at normal speed (its marginal cost).
    removed : str
        What was removed ("stragglers", "jitter", or both).
    critical : pyarrow.Table or None
        The simulation's critical path (:func:`pipecore.critical_path`).
    share : pyarrow.Table or None
        Time each device holds on that path (:func:`pipecore.device_share`):
        who the iteration waited for.
    """

    makespan: float
    counterfactual: float
    per_device: dict
    removed: str
    critical: object = None
    share: object = None

    @property
    def saved(self) -> float:
        """float: makespan minus counterfactual."""
        return self.makespan - self.counterfactual

    def __repr__(self) -> str:
        # Short: the critical path tables are in .critical and .share.
        return (f"WhatIf(makespan={self.makespan:.6g}, without {self.removed}="
                f"{self.counterfactual:.6g}, devices={sorted(self.per_device)})")

    def _repr_html_(self) -> str:
        """Jupyter: :meth:`report` as preformatted text."""
        import html

        return f"<pre style='font-size:12px'>{html.escape(self.report())}</pre>"

    def report(self) -> str:
        """Plain-text summary, slowest contributors first.

        Returns
        -------
        str
        """
        pct = 100 * abs(self.saved) / self.makespan if self.makespan else 0.0
        # A list schedule can get slower when an op gets faster: say which way.
        change = ("the same" if self.saved == 0 else
                  f"{pct:.1f}% {'less' if self.saved > 0 else 'more'}")
        lines = [f"iteration {self.makespan:.6g}; without {self.removed}: "
                 f"{self.counterfactual:.6g} ({change}); times in the costs' units"]
        for d, cost in sorted(self.per_device.items(), key=lambda kv: -kv[1]):
            if cost >= 0:
                lines.append(f"  device {d}: {cost:.6g} of it (iteration {self.makespan - cost:.6g} "
                             f"if only this device ran at normal speed)")
            else:
                lines.append(f"  device {d}: none of it; at normal speed alone it would make the "
                             f"iteration {-cost:.6g} longer ({self.makespan - cost:.6g})")
        if self.share is not None:
            rows = sorted(self.share.to_pylist(), key=lambda r: -r["total"])
            lines.append("critical path by device (compute + transfers out):")
            for r in rows:
                if r["total"] > 0:
                    lines.append(f"  device {r['device']}: {r['total']:.6g} "
                                 f"({100 * r['share']:.1f}%; compute {r['compute']:.6g})")
        return "\n".join(lines)


def what_if(result, remove_stragglers: bool = True, remove_jitter: bool = False,
            freeze=None) -> WhatIf:
    """The iteration time without the stragglers (or jitter) of a simulation,
    or with some stages frozen.

    As in the what-if analysis of straggling workers (Lin et al.,
    "Understanding Stragglers in Large Model Training Using What-if
    Analysis", OSDI 2025): re-simulate with the slow devices at normal speed,
    keeping everything else (the jitter draw included), and attribute the
    difference to each slowed device by restoring it alone.

    With ``freeze``, the counterfactual is instead the same schedule with
    those stages frozen (:func:`pipecore.freeze`: no W, and no backward
    below the lowest trainable stage) under the same costs and network;
    ``saved`` is then the time freezing gains (positive: faster).

    Parameters
    ----------
    result : Result
        From :func:`pipecore.simulate` with ``stragglers`` and/or ``jitter``.
    remove_stragglers : bool
        Remove the straggler factors.
    remove_jitter : bool
        Remove the jitter too.
    freeze : float or iterable of int, optional
        A share of the model to freeze from its input side (a float in
        [0, 1): whole stages ``0..floor(freeze * S) - 1``) or the stages to
        freeze. The two flags above are then not used.

    Returns
    -------
    WhatIf

    Raises
    ------
    ValueError
        If nothing is to be removed, ``freeze`` is bad (naming the stage or
        share and the rule), or ``freeze`` is given for a simulation with
        stragglers or jitter (their per-op factors do not carry over to a
        schedule with fewer ops).
    """
    from ..core.simulate import Result, simulate

    if not isinstance(result, Result):
        raise InputError(f"'result' must be a pipecore.Result (got {type(result).__name__})")
    if freeze is not None:
        return _what_if_frozen(result, freeze)
    if not (remove_stragglers or remove_jitter):
        raise InputError("nothing to remove: set remove_stragglers or remove_jitter")
    sched, costs, net = result.schedule, result.costs, result.network
    strag = straggler_scale(sched, result.stragglers)
    jitter = None if remove_jitter else result.jitter
    kept = None if remove_stragglers else strag
    base = simulate(sched, costs, net, stragglers=kept, jitter=jitter, draw=result.draw)
    per_device = {}
    if remove_stragglers:
        dev = sched._column("device")
        for d in range(sched.devices):
            mine = dev == d
            if np.all(strag[mine] == 1.0):
                continue
            alone = strag.copy()
            alone[mine] = 1.0
            res = simulate(sched, costs, net, stragglers=alone, jitter=result.jitter, draw=result.draw)
            per_device[d] = result.makespan - res.makespan
    removed = " and ".join(w for w, on in (("stragglers", remove_stragglers),
                                           ("jitter", remove_jitter)) if on)
    from .critical import critical_path, device_share

    path = critical_path(result)
    return WhatIf(result.makespan, base.makespan, per_device, removed, path,
                  device_share(path, sched.devices))


def _what_if_frozen(result, freeze):
    """:func:`what_if` with ``freeze``: the same schedule with stages frozen."""
    from ..core.simulate import simulate
    from ..schedules.freeze import freeze as freeze_schedule

    if result.stragglers is not None or result.jitter is not None:
        raise InputError("what_if(freeze=...) needs a simulation without stragglers or jitter: "
                         "their per-op factors do not carry over to the frozen schedule, which "
                         "has fewer ops")
    sched = result.schedule
    if isinstance(freeze, (float, np.floating)):
        frozen = freeze_schedule(sched, fraction=freeze)
    else:
        frozen = freeze_schedule(sched, freeze)
    base = simulate(frozen, result.costs, result.network)
    stages = list(frozen.frozen)
    from .critical import critical_path, device_share

    path = critical_path(result)
    return WhatIf(result.makespan, base.makespan, {},
                  f"the backward work of frozen stages {stages}" if stages else
                  "nothing (the share freezes no whole stage)", path,
                  device_share(path, sched.devices))
