"""Where one strategy ranks among a search's: one a user names, or a published run's.

A strategy the search estimated takes its rank (or its reason for having
none) from the search's table. Any other strategy is estimated here with
the search's model, cluster and batch and placed where the search's own
order (the objective, then memory per GPU) would put it; the ranking says
which of its settings the searched space did not hold.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from ..core.ops import InputError
from .estimate import Estimate, estimate, why_not_ranked
from .strategy import Strategy

__all__ = ["Ranking", "full_label", "mark_line", "parse_strategy", "rank_of", "published_matches",
           "published_rankings"]

# The names a strategy string takes (Megatron's words where it has them), each
# with the Strategy field it sets.
_KEYS = {"tp": "tp", "pp": "pp", "dp": "dp", "mb": "microbatch_size", "microbatch_size": "microbatch_size",
         "schedule": "schedule", "chunks": "chunks", "recompute": "recompute", "rc": "recompute",
         "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel", "zero": "zero",
         "overlap": "dp_overlap", "dp_overlap": "dp_overlap", "attention": "attention",
         "precision": "precision", "p2p": "p2p_overlap", "grad-acc": "grad_accumulation_fusion"}
# Words of the two settings Strategy.label() writes as key=word.
_WORDS = {"p2p_overlap": {"overlapped": True, "blocking": False},
          "grad_accumulation_fusion": {"fused": True, "unfused": False}}
# "pools 1x2,0x1", "pool 0" and "layers 10x3,4" (label form, a space before the value) or with "=":
# a run "kxn" is k repeated n times.
_RUN = r"\d+(?:x\d+)?"
_LISTS = re.compile(rf"(?<![\w-])(pools|pool|layers)(?:\s*=\s*|\s+)({_RUN}(?:\s*,\s*{_RUN})*)",
                    re.IGNORECASE)
_INTS = ("tp", "pp", "dp", "microbatch_size", "chunks", "zero")
_FLAGS = {"yes": True, "on": True, "true": True, "1": True, "no": False, "off": False, "false": False,
          "0": False}
# The label form (Strategy.label()): "tp8", "mb1", "zero1", "x3".
_LABEL = re.compile(r"^(tp|pp|dp|mb|zero|x)(\d+)$")
_SYNTAX = ("tp=8,pp=8,dp=16,mb=1,schedule=interleaved-1f1b,chunks=3,recompute=selective,sp,zero=1 "
           "(or a row's label: 'tp8 pp8 dp16 mb1 interleaved-1f1b x3 rc=selective sp zero1')")
# How a setting reads in a sentence.
_NAMES = {"tp": "tp", "pp": "pp", "dp": "dp", "microbatch_size": "microbatch size", "schedule": "schedule",
          "chunks": "chunks", "recompute": "recompute", "sequence_parallel": "sequence parallelism",
          "zero": "ZeRO", "dp_overlap": "overlap", "attention": "attention", "precision": "precision",
          "p2p_overlap": "p2p", "grad_accumulation_fusion": "grad-acc", "pools": "pools", "layers": "layers"}


def parse_strategy(text: str, gpus: int | None = None) -> Strategy:
    """A strategy from a short string, e.g. ``"tp=8,pp=8,dp=16,mb=1,sp,zero=1"``.

    Parameters
    ----------
    text : str
        Items separated by commas or spaces. ``key=value`` with keys ``tp``,
        ``pp``, ``dp``, ``mb`` (``microbatch_size``), ``schedule``, ``chunks``,
        ``recompute`` (``rc``: none, selective, full), ``sp`` (sequence
        parallelism; alone it means on, or ``sp=on``/``off``), ``zero``
        (0-3), ``overlap`` (gradient reduction overlapped with the backward:
        on/off), ``attention`` (flash, unfused), ``precision`` (bf16, fp16).
        A row label as :meth:`Strategy.label` writes it and ``pipecore plan``
        prints it (``tp8 pp8 dp16 mb1 interleaved-1f1b x3 rc=selective sp
        zero1``) reads too, with the settings of Megatron-LM 2021 (``p2p``:
        overlapped or blocking; ``grad-acc``: fused or unfused) and of a
        mixed cluster: ``pools 1x2,0x1`` (the pool of each pipeline rank;
        ``kxn`` is pool k for n ranks in a row), ``pool 1`` (every rank on
        pool 1) and ``layers 10x3,4`` (transformer layers of each stage,
        runs written the same way). Unnamed settings take the search's
        values: tp and pp 1, microbatch size 1, 1f1b, the schedule's default
        chunks, recompute none, no sequence parallelism, ZeRO 0, overlap on,
        flash attention, bf16, p2p overlapped, grad-acc fused, every rank on
        the cluster's first pool and layers split evenly.
    gpus : int, optional
        The GPUs of the run: without ``dp``, dp is ``gpus / (tp * pp)``.

    Returns
    -------
    Strategy

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) naming the item and the rule it
        breaks: an unknown key, a repeated one, a value of the wrong kind,
        an unknown schedule, or dp missing where ``gpus`` cannot give it.
    """
    from ..schedules.registry import family

    if not isinstance(text, str) or not text.strip():
        raise InputError(f"strategy must be a string like {_SYNTAX} (got {text!r})")
    given: dict = {}

    def put(field, value, item):
        if field in given:
            raise InputError(f"strategy {text!r}: {_NAMES[field]} is given twice (again in {item!r})")
        given[field] = value

    rest, lists = text, {}
    for match in reversed(list(_LISTS.finditer(text))):
        key = match.group(1).lower()
        if key in lists:
            raise InputError(f"strategy {text!r}: {_NAMES.get(key, key)} is given twice (again in "
                             f"{match.group(0)!r})")
        if key != "layers" and {"pool", "pools"} & set(lists):
            raise InputError(f"strategy {text!r}: pool and pools are both given; give one (pool k puts "
                             f"every rank on pool k)")
        values = []
        for run in re.split(r"\s*,\s*", match.group(2)):
            k, _, n = run.partition("x")
            if n and int(n) < 1:
                raise InputError(f"strategy {text!r}: run {run!r} of {key} repeats {k} {n} times; "
                                 f"write kxn with n >= 1")
            values += [int(k)] * (int(n) if n else 1)
        lists[key] = values
        rest = rest[:match.start()] + " " + rest[match.end():]
    for item in (t for t in re.split(r"[,\s]+", rest.strip()) if t):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        label = _LABEL.match(key) if not eq else None
        if label:
            key, value = {"mb": "mb", "x": "chunks"}.get(label.group(1), label.group(1)), label.group(2)
        elif not eq:
            if key == "sp":
                put("sequence_parallel", True, item)
                continue
            try:
                fam = family(key)
            except InputError:
                raise InputError(f"strategy {text!r}: item {item!r} is not key=value, a label part "
                                 f"(tp8, mb1, x3, zero1, sp) or a schedule name; write it like "
                                 f"{_SYNTAX}") from None
            put("schedule", fam.name, item)
            continue
        if key not in _KEYS:
            raise InputError(f"strategy {text!r}: unknown key {key!r} in {item!r}; the keys are "
                             f"{', '.join(_KEYS)}")
        field = _KEYS[key]
        value = value.strip()
        if field in _INTS:
            if not value.isdigit():
                raise InputError(f"strategy {text!r}: {key} must be a whole number (got {value!r})")
            put(field, int(value), item)
        elif field in ("sequence_parallel", "dp_overlap"):
            if value.lower() not in _FLAGS:
                raise InputError(f"strategy {text!r}: {key} must be on or off (got {value!r})")
            put(field, _FLAGS[value.lower()], item)
        elif field in _WORDS:
            words = _WORDS[field]
            if value.lower() not in words:
                raise InputError(f"strategy {text!r}: {key} must be {' or '.join(words)} (got {value!r})")
            put(field, words[value.lower()], item)
        elif field == "schedule":
            put(field, family(value).name, item)  # an unknown name lists the known ones
        else:
            put(field, value.lower(), item)
    schedule = given.setdefault("schedule", "1f1b")
    given.setdefault("chunks", family(schedule).chunks_for(None))
    given.setdefault("dp_overlap", True)
    if "layers" in lists:
        given["layers"] = tuple(lists["layers"])
    if "pools" in lists:
        given["pools"] = tuple(lists["pools"])
    elif "pool" in lists:
        if len(lists["pool"]) != 1:
            raise InputError(f"strategy {text!r}: pool takes one pool for every rank (got "
                             f"{','.join(map(str, lists['pool']))}); name each rank's with pools")
        given["pools"] = (lists["pool"][0],) * given.get("pp", 1)
    if "dp" not in given:
        tp, pp = given.get("tp", 1), given.get("pp", 1)
        if gpus is None or tp < 1 or pp < 1 or gpus % (tp * pp):
            rule = ("give it" if gpus is None else
                    f"tp*pp = {tp * pp} does not divide the {gpus} GPUs, so give it")
            raise InputError(f"strategy {text!r}: dp is missing; {rule}")
        given["dp"] = gpus // (tp * pp)
    try:
        return Strategy(**given)
    except InputError as exc:
        raise InputError(f"strategy {text!r}: {exc}") from None


def full_label(strategy: Strategy) -> str:
    """:meth:`Strategy.label` with the settings every searched strategy shares, where they differ.

    Parameters
    ----------
    strategy : Strategy

    Returns
    -------
    str
        E.g. ``tp1 pp1 dp32 mb16 1f1b rc=full, fp16, unfused attention``: the
        label, then fp16, unfused attention or no gradient-reduction overlap
        when set (the search uses bf16, FlashAttention and overlap).
    """
    extra = [text for on, text in ((strategy.precision != "bf16", strategy.precision),
                                   (strategy.attention != "flash", f"{strategy.attention} attention"),
                                   (not strategy.dp_overlap, "no overlap")) if on]
    return ", ".join([strategy.label(), *extra])


@dataclass(frozen=True)
class Ranking:
    """Where one strategy stands among a search's ranked strategies.

    Attributes
    ----------
    strategy : Strategy or None
        The strategy ranked (None for a published run pipecore cannot
        express, ``why`` says why).
    rank : int or None
        1 = best. For a strategy the search ranked, its rank; for one
        outside the searched space, the rank it would take among the
        search's ranked strategies (after those it ties with); None when it
        cannot run, does not fit or breaks the time bound.
    ranked : int
        Strategies the search ranked.
    in_space : bool
        Whether the search estimated this very strategy.
    outside : str or None
        For a strategy outside the space, which of its settings the space
        did not hold (or that the combination was not searched).
    estimate : Estimate or None
        Its estimate; None when it cannot run.
    why : str or None
        Why it has no rank.
    objective : str
        ``"time"`` or ``"cost"``, as the search.
    best : float or None
        The search's best value of the objective: seconds per iteration
        or USD per million tokens (lower is better); None if nothing ranks.
    """

    strategy: Strategy | None
    rank: int | None
    ranked: int
    in_space: bool
    outside: str | None
    estimate: Estimate | None
    why: str | None
    objective: str
    best: float | None

    def describe(self) -> str:
        """One sentence: the rank (or why none) and the objective beside the best's.

        Returns
        -------
        str
            E.g. ``rank R of N: T s per iteration, X% slower than the best
            (B s)``.
        """
        where = "" if self.in_space else f"outside the searched space ({self.outside}); "
        if self.strategy is None:
            return f"not modelled: {self.why}"
        if self.estimate is None:
            return f"{where}it cannot run: {self.why}"
        if self.rank is None:
            return f"{where}{'estimated, it would not rank' if where else 'not ranked'}: {self.why}"
        est = self.estimate
        if self.objective == "time":
            mine, value, unit = est.iteration_time, f"{est.iteration_time:.3g} s per iteration", "{:.3g} s"
            worse = "slower"
        else:
            mine, unit = est.cost_per_million_tokens, "${:.3g}"
            value, worse = f"${mine:.3g} per million tokens", "dearer"
        versus = ""
        if self.best:
            gap, best = mine / self.best - 1, unit.format(self.best)
            if abs(gap) < 5e-4:
                versus = f", as good as the best ({best})"
            else:
                share = f"{abs(gap):.1%}" if abs(gap) < 0.1 else f"{abs(gap):.0%}"
                versus = f", {share} {worse if gap > 0 else 'better'} than the best ({best})"
        if not self.ranked:
            return f"{where}estimated, it would rank first: nothing the search held ranks"
        verb = "rank" if self.in_space else "estimated, it would rank"
        return f"{where}{verb} {self.rank} of {self.ranked}: {value}{versus}"


def _check_setting(plans, arch, cluster, pool, global_batch):
    """The search was run for this model, cluster and batch (a silent mismatch would rank nonsense)."""
    for est in list(plans.estimates.values())[:1]:
        if est.global_batch != global_batch:
            raise InputError(f"rank_of: global_batch {global_batch} is not the search's "
                             f"({est.global_batch})")
        flops = est.tflops_per_gpu * 1e12 * est.iteration_time * est.gpus
        want = arch.flops_per_iteration(global_batch, recompute="none")
        if not math.isclose(flops, want, rel_tol=1e-6):
            raise InputError(f"rank_of: model {arch.name!r} is not the searched model (its "
                             f"{want:.4g} FLOPs per iteration differ from the search's {flops:.4g})")
        s = est.strategy
        ranks = s.pools if s.pools is not None else (pool,) * s.pp
        if max(ranks) >= len(cluster.pools):
            raise InputError(f"rank_of: the search used pool {max(ranks)}; the cluster has "
                             f"{len(cluster.pools)}")
        expected = sum(cluster.pools[k].price_per_gpu_hour for k in ranks) / len(ranks)
        price = est.cost_per_million_tokens / 1e6 * global_batch * arch.seq * 3600.0 / (
            est.gpus * est.iteration_time)
        if not math.isclose(price, expected, rel_tol=1e-6):
            raise InputError(f"rank_of: the cluster's price of ${expected:.4g} per GPU-hour for "
                             f"{s.label()} is not the searched one (${price:.4g})")


def _outside(plans, strategy):
    """Which settings of ``strategy`` the searched space never used."""
    cols = plans.table.to_pydict()
    searched = {f: set(cols.get(f, ())) for f in ("tp", "pp", "dp", "microbatch_size", "schedule",
                                                  "chunks", "recompute", "sequence_parallel", "zero")}
    for f in ("dp_overlap", "attention", "precision"):
        searched[f] = {getattr(e.strategy, f) for e in plans.estimates.values()}
    missing = []
    for f in fields(Strategy):
        value = getattr(strategy, f.name)
        if searched.get(f.name) and value not in searched[f.name]:
            text = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
            missing.append(f"{_NAMES[f.name]} {text}")
    if not missing:
        return "a combination the space leaves out"
    return "not searched: " + ", ".join(missing)


def rank_of(plans, strategy: Strategy, model, cluster, global_batch: int, pool: int = 0,
            max_iteration_time: float | None = None) -> Ranking:
    """Where ``strategy`` ranks among the strategies of a search.

    Parameters
    ----------
    plans : Strategies
        The result of :func:`pipecore.strategies`.
    strategy : Strategy
        Any strategy: one of the searched space, or not (it is then
        estimated and placed where the search's order would put it).
    model, cluster, global_batch, pool, max_iteration_time
        As given to :func:`pipecore.strategies` for ``plans``.

    Returns
    -------
    Ranking

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) if ``strategy`` is not a Strategy,
        or the model, cluster or global batch are not the ones the search
        ran with (checked against its estimates: model FLOPs per
        iteration, the price per GPU-hour and the batch).
    """
    from .estimate import _architecture

    if not isinstance(strategy, Strategy):
        raise InputError(f"rank_of 'strategy' must be a pipecore Strategy (got {type(strategy).__name__})")
    arch = _architecture(model)
    if not 0 <= pool < len(cluster.pools):
        raise InputError(f"rank_of 'pool' must be 0..{len(cluster.pools) - 1} (got {pool})")
    _check_setting(plans, arch, cluster, pool, global_batch)
    key = "iteration_time" if plans.objective == "time" else "cost_per_million_tokens"
    rows = plans.table.to_pylist()
    ranked = [r for r in rows if r["rank"] is not None]
    best = ranked[0][key] if ranked else None
    common = dict(strategy=strategy, ranked=len(ranked), objective=plans.objective, best=best)
    label = strategy.label()
    by_strategy = {e.strategy: e for e in plans.estimates.values()}
    row = next((r for r in rows if r["strategy"] == label), None)
    if strategy in by_strategy:
        return Ranking(rank=row["rank"], in_space=True, outside=None, estimate=by_strategy[strategy],
                       why=row["why"], **common)
    if row is not None and not math.isfinite(row["iteration_time"]):
        # A searched strategy that could not run has no estimate: the same one, when the
        # settings every searched strategy shares agree.
        shared = [{getattr(e.strategy, f) for e in plans.estimates.values()}
                  for f in ("dp_overlap", "attention", "precision")]
        mine = (strategy.dp_overlap, strategy.attention, strategy.precision)
        if all(not values or v in values for v, values in zip(mine, shared)):
            return Ranking(rank=None, in_space=True, outside=None, estimate=None, why=row["why"], **common)
    outside = _outside(plans, strategy)
    try:
        est = estimate(model, cluster, strategy, global_batch, pool=pool)
    except InputError as exc:
        return Ranking(rank=None, in_space=False, outside=outside, estimate=None,
                       why=str(exc), **common)
    why = why_not_ranked(est, max_iteration_time)
    rank = None
    if why is None:
        mine = (getattr(est, key), est.memory_per_gpu)
        rank = 1 + sum(1 for r in ranked if (r[key], r["memory_per_gpu"]) <= mine)
    return Ranking(rank=rank, in_space=False, outside=outside, estimate=est, why=why, **common)


def published_matches(model, cluster, global_batch: int, pool: int = 0) -> list:
    """Published runs of this very model on this GPU type and count, at this batch.

    A run matches when its model's dimensions (layers, hidden size, heads,
    key/value heads, MLP width and kind, sequence length, vocabulary) equal
    the model's, it ran on as many GPUs of the pool's GPU type as the pool
    has, and its global batch equals ``global_batch``.

    Parameters
    ----------
    model : Model or Architecture
    cluster : pipecore.Cluster
    global_batch : int
        Sequences per iteration.
    pool : int, default 0
        The cluster's pool.

    Returns
    -------
    list of PublishedRun
        In the data file's order (:func:`pipecore.plan.published.published_runs`).
    """
    from .estimate import _architecture
    from .published import published_runs

    arch = _architecture(model)
    pl = cluster.pools[pool]
    dims = ("layers", "hidden", "heads", "seq", "vocab", "ffn_hidden", "kv_heads", "gated_mlp")
    return [run for run in published_runs()
            if all(getattr(run.model, d) == getattr(arch, d) for d in dims)
            and run.gpu.strip().lower() == pl.gpu.name and run.gpus == pl.count
            and run.global_batch == global_batch]


def published_rankings(plans, model, cluster, global_batch: int, pool: int = 0,
                       max_iteration_time: float | None = None) -> list:
    """Each matching published run (:func:`published_matches`) and where its configuration ranks.

    Parameters
    ----------
    plans : Strategies
        The result of :func:`pipecore.strategies` for this model, cluster and batch.
    model, cluster, global_batch, pool, max_iteration_time
        As given to :func:`pipecore.strategies`.

    Returns
    -------
    list of (PublishedRun, Ranking)
        The run's strategy as :func:`pipecore.plan.validation.run_strategy`
        maps it (the strategy is None, and ``why`` says so, when pipecore
        cannot express it, e.g. fp8).

    Raises
    ------
    ValueError
        As :func:`rank_of`.
    """
    from .validation import run_strategy

    out = []
    for run in published_matches(model, cluster, global_batch, pool):
        try:
            strategy = run_strategy(run)
        except InputError as exc:
            out.append((run, Ranking(strategy=None, rank=None, ranked=0, in_space=False, outside=None,
                                     estimate=None, why=str(exc), objective=plans.objective,
                                     best=None)))
            continue
        out.append((run, rank_of(plans, strategy, model, cluster, global_batch, pool, max_iteration_time)))
    return out


def mark_line(name: str, ranking: Ranking) -> str:
    """``name: strategy: where it ranks``, as ``pipecore plan`` and its report page state it.

    Parameters
    ----------
    name : str
        E.g. ``"yours"`` or ``"published megatron-sc21-table1-39.1b"``.
    ranking : Ranking

    Returns
    -------
    str
    """
    if ranking.strategy is None:
        return f"{name}: {ranking.describe()}"
    return f"{name}: {full_label(ranking.strategy)}: {ranking.describe()}"
