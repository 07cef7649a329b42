"""The asymmetric Chimera-style placement study (issue 16).

For each pipeline shape (devices p, microbatches m) the study searches
Chimera's placement space (:func:`pipecore.schedules.chimera.build_chimera`'s
``down``, ``up_placement``, ``down_layers``, ``up_layers``) and reports, in
each cell of the grid of compute and network speeds (x10 = ten times the
hardware's speed, as in :func:`pipecore.study`), the fastest asymmetric
variant against symmetric Chimera. A variant is built once and simulated in
every cell with the list scheduler (:func:`pipecore.simulate`'s numbers, bit
for bit), the kernels :func:`pipecore.study` compiles anyway; its memory is
the same in every cell (program order) and is taken once.

Memory is reported in M, one microbatch's activation of one device share
(34 s b h bytes per layer over layers / p layers, [Korthikanti] in
:mod:`pipecore.analysis.model`); training state counts 16 bytes per parameter.
A placement whose worst device needs more than the hardware's memory is
marked (``*_fits`` False).

Layer shares move in units of a quarter of a device share (1/(4p) of the
model: 8 of 128 layers at p = 4, 4 at p = 8), so the schedules stay small.

The search, per shape:

1. readings one at a time: every microbatch split ``down`` in 1..m-1;
   every ``up_placement`` permutation at p = 4 (with every split too when
   m <= 16) and, at p = 8, each single swap of the reversal, its rotations
   and the identity; for the layers,
   every one-unit move between neighbouring stages of the down pipeline,
   the up pipeline or both, and a front-light ramp (first stage half the
   last, the summaries' "1:2") on either pipeline or both;
Variants that put both replicas of some layers on one device are skipped
(that device would keep one copy of their weights: no longer two
Chimera-style pipelines).

2. local search in each cell from that cell's best so far: first
   improvement over the neighbours (``down`` +-1 and +-2, a swap of two
   up-pipeline devices, a one-unit layer move on either pipeline or both)
   until no neighbour is faster or the shape's evaluation budget is spent.
"""

from __future__ import annotations

import itertools
import json
import textwrap
import time

import numpy as np
import pyarrow as pa

from ..analysis.model import Hardware
from ..analysis.study import GRID_FACTORS, TransformerModel, describe, study_metadata
from ..core import tier
from ..core.costs import Costs, fits
from ..core.ops import InputError
from ..core.progress import reporter
from ..core.simulate import compile_schedule, simulate
from ..kernels.codes import STATUS_OK
from ..schedules.chimera import _segments
from ..schedules.registry import build

__all__ = ["asymmetric_study", "summarize_asymmetric"]

UNITS = 4  # layer units per device share


def _memory_per_share(model, p):
    """Bytes of one device share: activation of one microbatch and training state."""
    layers = model.layers / p
    act = 34 * model.seq * model.microbatch * model.hidden * layers  # Korthikanti, selective
    state = 16 * 12 * model.hidden ** 2 * layers  # 16 bytes per parameter (mixed-precision Adam)
    return act, state


def _cells(model, hardware, p, factors):
    """The grid's cells and, per cell, the Costs (bytes for memory) and Network."""
    act, state = _memory_per_share(model, p)
    cells, costs, nets = [], [], []
    for cf in factors:
        for nf in factors:
            hw = hardware.scaled(cf, nf)
            c = model.costs(hw, p)
            cells.append((cf, nf))
            costs.append(Costs(f=c.f, b=c.b, w=c.w, activation=act, weights=state))
            nets.append(model.network(hw))
    return cells, costs, nets


def _shares_a_device(key, p, m):
    """Whether a variant puts both replicas of some layers on one device
    (what ``sched.stage_devices`` would show), without building it."""
    _down, up, dl, ul, _order = key
    even = list(dl) == [UNITS] * p and list(ul) == [UNITS] * p
    ranges = _segments(None, None, p)[2] if even else _segments(list(dl), list(ul), p)[2]
    down_dev = {s: i for i, (lo, hi) in enumerate(ranges["down"]) for s in range(lo, hi)}
    return any(down_dev[s] == up[j] for j, (lo, hi) in enumerate(ranges["up"])
               for s in range(lo, hi))


def _evaluate(sched, costs, nets):
    """Makespan per cell, global peak (activation + weights of the worst
    device), peak activation and per-device peaks, in bytes.

    The first cell is :func:`simulate` itself; the others run the same
    compiled kernels on that cell's costs (``compile_schedule`` and the list
    scheduler, as :func:`simulate` does) without making a Result.
    """
    res = simulate(sched, costs[0], nets[0])
    times = np.empty(len(costs))
    times[0] = res.makespan
    for c in range(1, len(costs)):
        status, *_rest, dev_free, _first = compile_schedule(sched, costs[c], nets[c]).run()
        if status != STATUS_OK:  # the list order is free of deadlock by construction
            raise RuntimeError(f"internal error: chimera variant deadlocked in cell {c}")
        times[c] = float(dev_free.max())
    device = res.peak_activation + res.static_memory
    return times, float(device.max()), float(res.peak_activation.max()), device.tolist()


def _knobs(key, p, m):
    down, up, dl, ul, order = key
    kw = {}
    if down != m // 2:
        kw["down"] = down
    if list(up) != list(range(p - 1, -1, -1)):
        kw["up_placement"] = list(up)
    if list(dl) != [UNITS] * p or list(ul) != [UNITS] * p:
        kw.update(down_layers=list(dl), up_layers=list(ul))
    if order is not None:
        kw["order"] = order
    return kw


def _reading(key, p, m):
    down, up, dl, ul, _order = key
    parts = []
    if down != m // 2:
        parts.append("split")
    if list(up) != list(range(p - 1, -1, -1)):
        parts.append("placement")
    if list(dl) != [UNITS] * p or list(ul) != [UNITS] * p:
        parts.append("layers")
    return "+".join(parts) if parts else "symmetric"


def _ramp(p):
    """Front-light shares: stage weights 1 .. 2 linearly, rounded to units."""
    total = UNITS * p
    raw = np.linspace(1.0, 2.0, p)
    raw = raw / raw.sum() * total
    out = np.maximum(np.floor(raw).astype(int), 1)
    for i in np.argsort(-(raw - out))[: total - out.sum()]:
        out[i] += 1
    return tuple(int(x) for x in out)


def _moves(layers):
    out = []
    for i in range(len(layers) - 1):
        for a, b in ((i, i + 1), (i + 1, i)):
            if layers[a] > 1:
                x = list(layers)
                x[a] -= 1
                x[b] += 1
                out.append(tuple(x))
    return out


def _neighbours(key, p, m):
    down, up, dl, ul, order = key
    out = []
    for dd in (-2, -1, 1, 2):
        if 1 <= down + dd <= m - 1:
            out.append((down + dd, up, dl, ul, order))
    for i, j in itertools.combinations(range(p), 2):
        x = list(up)
        x[i], x[j] = x[j], x[i]
        out.append((down, tuple(x), dl, ul, order))
    for x in _moves(dl):
        out.append((down, up, x, ul, order))
    for x in _moves(ul):
        out.append((down, up, dl, x, order))
    if dl == ul:
        for x in _moves(dl):
            out.append((down, up, x, x, order))
    return out


def _initial(p, m):
    rev = tuple(range(p - 1, -1, -1))
    even = (UNITS,) * p
    h = m // 2
    keys = [(h, rev, even, even, None), (h, rev, even, even, "list")]
    keys += [(k, rev, even, even, None) for k in range(1, m) if k != h]
    if p <= 4:
        keys += [(h, tuple(x), even, even, None) for x in itertools.permutations(range(p))]
    if p <= 4 and m <= 16:
        # Small enough to take every split with every placement.
        keys += [(k, tuple(x), even, even, None) for k in range(1, m)
                 for x in itertools.permutations(range(p))]
    else:
        for i, j in itertools.combinations(range(p), 2):
            x = list(rev)
            x[i], x[j] = x[j], x[i]
            keys.append((h, tuple(x), even, even, None))
        keys += [(h, tuple((d + r) % p for d in rev), even, even, None) for r in range(p)]
        keys.append((h, tuple(range(p)), even, even, None))
    for x in _moves(even):
        keys += [(h, rev, x, even, None), (h, rev, even, x, None), (h, rev, x, x, None)]
    ramp = _ramp(p)
    back = tuple(reversed(ramp))
    keys += [(h, rev, ramp, ramp, None), (h, rev, ramp, even, None), (h, rev, even, ramp, None),
             (h, rev, ramp, back, None), (h, rev, back, ramp, None)]
    seen = set()
    return [k for k in keys if not (k in seen or seen.add(k))]


@tier.compiled()  # many simulations: compile at once, no interpreted budget
def asymmetric_study(devices=(4, 8), microbatches=(4, 8, 16, 32, 64), model=None,
                     hardware=None, factors=GRID_FACTORS, budget=800,
                     progress=None) -> tuple[pa.Table, dict]:
    """Search asymmetric Chimera-style placements over the grid of compute and network speeds.

    Parameters
    ----------
    devices, microbatches : sequence of int
        Pipeline shapes; a shape Chimera cannot build (odd p, m not a
        multiple of p) gets a row saying why.
    model : TransformerModel, optional
        Defaults to ``TransformerModel()`` (128 layers, hidden 4096, as
        :func:`pipecore.study`).
    hardware : Hardware, optional
        Defaults to ``Hardware.preset("dgx-h100")``; its ``hbm_bytes`` is
        the memory a placement must fit.
    factors : sequence of float
        Compute and network speed factors (the grid is their product; x10
        is ten times the hardware's speed).
    budget : int, default 800
        Most variants evaluated per shape (each in every cell at once); the
        two symmetric baselines are always evaluated.
    progress : bool, None or "lines", optional
        A progress bar per shape (default: when stderr is a terminal);
        ``"lines"``: a plain line at least every few seconds, for logs.

    Returns
    -------
    tuple of (pyarrow.Table, dict)
        The table has one row per (devices, microbatches, compute_speed,
        network_speed): ``chimera_time`` (symmetric Chimera, seconds),
        ``list_time`` (the symmetric placement in the list order),
        ``best_time`` and ``best_variant`` (the fastest asymmetric variant
        found, its knobs as text), ``best_reading`` (which knobs it changes:
        split, placement, layers), ``gain`` ((chimera - best) / chimera) and
        ``gain_vs_list``, ``gain_vs_symmetric`` (against the faster of the
        two symmetric orders: the gain of the asymmetry alone), the best of
        each reading alone against Chimera (``split_gain``,
        ``placement_gain``, ``layers_gain``); memory in M (``m_bytes``:
        the bytes of one M at this S): ``chimera_peak`` and ``best_peak``
        (global peak memory: activation plus weights of the worst device),
        ``chimera_peak_activation`` and ``best_peak_activation``,
        ``chimera_device_peaks`` and ``best_device_peaks`` (per device),
        ``min_peak`` (the lowest global peak of any variant evaluated for
        the shape) and its ``min_peak_time``; ``device_memory`` (the
        hardware's memory, M) and ``chimera_fits``, ``best_fits``,
        ``min_peak_fits`` (the peak is within it); ``evaluated`` (variants
        for the shape) and ``error`` (why the shape was skipped, else
        null). The schema's metadata records the model, hardware and units
        (:func:`pipecore.analysis.study.study_metadata`, with memory bytes
        per M per S under ``pipecore.m_bytes``). The dict holds ``seconds``
        (wall time), ``evaluated`` (total variants), ``model``,
        ``hardware`` and ``factors``.

    Raises
    ------
    ValueError
        For non-positive factors or a bad budget.
    """
    model = TransformerModel() if model is None else model
    hardware = Hardware.preset("dgx-h100") if hardware is None else hardware
    for x in factors:
        if not x > 0:
            raise InputError(f"grid factors must be > 0 (got {x})")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InputError(f"'budget' must be an int >= 1 (got {budget!r})")
    t0 = time.perf_counter()
    rows = []
    total = 0
    devices, microbatches = list(devices), list(microbatches)
    shapes = [(p, m) for p in devices for m in microbatches]
    with reporter(len(shapes), progress, "asymmetric search", unit="shapes") as bar:
        for p in devices:
            cells, cell_costs, cell_nets = _cells(model, hardware, p, factors)
            for m in microbatches:
                bar.update(0, note=f"p={p} m={m}, {total} variants so far")
                try:
                    build("chimera", p, m, variant="direct")
                except ValueError as exc:
                    rows += [_empty_row(p, m, cf, nf, str(exc)) for cf, nf in cells]
                    bar.update(1, final=(p, m) == shapes[-1])
                    continue
                cache = {}

                def evaluate(key, p=p, m=m, cache=cache, costs=cell_costs, nets=cell_nets,
                             before=total):
                    if key not in cache:
                        # Both replicas of some layers on one device: one copy of
                        # their weights, no longer two Chimera-style pipelines.
                        if _shares_a_device(key, p, m):
                            cache[key] = None
                            return None
                        # The study compares placements, not joins of units:
                        # symmetric Chimera keeps direct concatenation.
                        sched = build("chimera", p, m, variant="direct", **_knobs(key, p, m))
                        if any(len(d) != 2 for d in sched.stage_devices):
                            cache[key] = None
                            return None
                        cache[key] = _evaluate(sched, costs, nets)
                        bar.update(0, note=f"p={p} m={m}, {before + len(cache)} variants so far")
                    return cache[key]

                initial = _initial(p, m)
                sym = initial[0]
                # The two symmetric baselines always; then the readings, within budget.
                for key in initial[:max(budget, 2)]:
                    evaluate(key)
                # Local search per cell from its best asymmetric variant so far.
                for c in range(len(cells)):
                    asym = [k for k in cache if cache[k] is not None
                            and _reading(k, p, m) != "symmetric"]
                    if not asym:
                        break
                    cur = min(asym, key=lambda k, c=c: (cache[k][0][c], str(k)))
                    improved = True
                    while improved and len(cache) < budget:
                        improved = False
                        for nb in _neighbours(cur, p, m):
                            if _reading(nb, p, m) == "symmetric" or len(cache) >= budget:
                                continue
                            got = evaluate(nb)
                            if got is not None and got[0][c] < cache[cur][0][c]:
                                cur, improved = nb, True
                                break
                total += len(cache)
                rows += _shape_rows(p, m, cells, cache, sym, model, hardware)
                bar.update(1, final=(p, m) == shapes[-1])
    table = pa.Table.from_pylist(rows)
    meta = study_metadata(model, hardware, factors)
    meta[b"pipecore.m_bytes"] = json.dumps(
        {str(p): _memory_per_share(model, p)[0] for p in devices}).encode()
    return table.replace_schema_metadata(meta), {
        "seconds": time.perf_counter() - t0, "evaluated": total, "model": model,
        "hardware": hardware, "factors": list(factors)}


_MEMORY = ("chimera_peak", "best_peak", "chimera_peak_activation", "best_peak_activation",
           "chimera_device_peaks", "best_device_peaks", "min_peak", "m_bytes", "device_memory",
           "chimera_fits", "best_fits", "min_peak_fits")


def _empty_row(p, m, cf, nf, error):
    row = {"devices": p, "microbatches": m, "compute_speed": cf, "network_speed": nf,
           "chimera_time": None, "list_time": None, "best_time": None, "best_variant": None,
           "best_reading": None, "gain": None, "gain_vs_list": None, "gain_vs_symmetric": None,
           "split_gain": None, "placement_gain": None, "layers_gain": None}
    row.update({k: None for k in _MEMORY})
    row.update(min_peak_time=None, evaluated=None, error=error)
    return row


def _shape_rows(p, m, cells, cache, sym, model, hardware):
    keys = [k for k in cache if cache[k] is not None]
    times = np.array([cache[k][0] for k in keys])  # variants x cells
    peaks = np.array([cache[k][1] for k in keys])
    acts = np.array([cache[k][2] for k in keys])
    reading = [_reading(k, p, m) for k in keys]
    asym = np.array([r != "symmetric" for r in reading])
    i_sym = keys.index(sym)
    i_list = keys.index((sym[0], sym[1], sym[2], sym[3], "list"))
    i_min = int(np.argmin(np.where(asym, peaks, np.inf)))
    # Bytes are computed, M reported: one microbatch's activation of one device share.
    unit = _memory_per_share(model, p)[0]
    limit = hardware.hbm_bytes

    def in_m(x):
        return [v / unit for v in x] if isinstance(x, list) else float(x) / unit

    rows = []
    for c, (cf, nf) in enumerate(cells):
        t = np.where(asym, times[:, c], np.inf)
        i = int(np.argmin(t))
        base = times[i_sym, c]

        def best_of(name, c=c, base=base):
            sel = [j for j, r in enumerate(reading) if r == name]
            return float((base - times[sel, c].min()) / base) if sel else None

        rows.append({
            "devices": p, "microbatches": m, "compute_speed": cf, "network_speed": nf,
            "chimera_time": float(base), "list_time": float(times[i_list, c]),
            "best_time": float(times[i, c]), "best_variant": str(_knobs(keys[i], p, m)),
            "best_reading": reading[i], "gain": float((base - times[i, c]) / base),
            "gain_vs_list": float((times[i_list, c] - times[i, c]) / times[i_list, c]),
            "gain_vs_symmetric": float((min(base, times[i_list, c]) - times[i, c])
                                       / min(base, times[i_list, c])),
            "split_gain": best_of("split"), "placement_gain": best_of("placement"),
            "layers_gain": best_of("layers"),
            "chimera_peak": in_m(peaks[i_sym]), "best_peak": in_m(peaks[i]),
            "chimera_peak_activation": in_m(acts[i_sym]), "best_peak_activation": in_m(acts[i]),
            "chimera_device_peaks": in_m(cache[sym][3]),
            "best_device_peaks": in_m(cache[keys[i]][3]),
            "min_peak": in_m(peaks[i_min]), "m_bytes": float(unit),
            "device_memory": in_m(limit) if np.isfinite(limit) else None,
            "chimera_fits": bool(fits(peaks[i_sym], limit)), "best_fits": bool(fits(peaks[i], limit)),
            "min_peak_fits": bool(fits(peaks[i_min], limit)),
            "min_peak_time": float(times[i_min, c]), "evaluated": len(keys), "error": None})
    return rows


def summarize_asymmetric(table: pa.Table, info: dict | None = None, setup: bool = True) -> str:
    """Text summary: per cell, the best asymmetric variant against symmetric Chimera.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`asymmetric_study`.
    info : dict, optional
        Its second return value (adds the wall time, the model and the
        hardware).
    setup : bool, default True
        Start with the model, hardware, grid and units (from ``info``);
        False leaves them out (when the study's summary said them).

    Returns
    -------
    str
    """
    rows = table.to_pylist()
    ok = [r for r in rows if r["error"] is None]
    lines = ["asymmetric Chimera-style placement vs symmetric Chimera (gain > 0: the variant "
             "is faster)"]
    if setup and info and "model" in info:
        lines += describe(info["model"], info["hardware"], info["factors"])
    units = sorted({(r["devices"], r["m_bytes"], r["device_memory"]) for r in ok})
    for p, unit, limit in units:
        cap = ("" if limit is None else f"; the device's {limit * unit / 1e9:g} GB are "
               f"{limit:.2f} M")
        lines += textwrap.wrap(f"memory at p={p}: M = {unit / 1e9:.3g} GB, one microbatch's "
                               f"activation of one device share{cap}", 120,
                               subsequent_indent="  ")
    if units:
        lines.append("peaks: activation + training state (16 bytes per parameter) of the worst "
                     "device")
    lines.append("  S    m  compute  network  vs-chimera  vs-best-sym  "
                 "reading                 global peak (M) sym -> best  lowest found")

    def peak(value, fit):
        return f"{value:.2f}{'' if fit else '!'}"

    over = 0
    for r in ok:
        over += (not r["chimera_fits"]) + (not r["best_fits"]) + (not r["min_peak_fits"])
        lines.append(f"{r['devices']:>3}  {r['microbatches']:>3}  {'x%g' % r['compute_speed']:>7}  "
                     f"{'x%g' % r['network_speed']:>7}  {100 * r['gain']:>+9.2f}%  "
                     f"{100 * r['gain_vs_symmetric']:>+10.2f}%  "
                     f"{r['best_reading']:<22}  {peak(r['chimera_peak'], r['chimera_fits']):>9} -> "
                     f"{peak(r['best_peak'], r['best_fits']):>7}  "
                     f"{peak(r['min_peak'], r['min_peak_fits']):>12}")
    if over:
        lines.append("!: more than the device's memory: the placement does not fit this "
                     "hardware as modelled")
    mid = [r for r in ok if r["compute_speed"] == 1.0 and r["network_speed"] == 1.0]
    if mid:
        lines.append("per-device peaks (M), symmetric Chimera -> fastest variant, compute and "
                     "network speed x1:")
        for r in mid:
            sym = " ".join(f"{x:.2f}" for x in r["chimera_device_peaks"])
            best = " ".join(f"{x:.2f}" for x in r["best_device_peaks"])
            lines += textwrap.wrap(f"p={r['devices']} m={r['microbatches']}: [{sym}] -> [{best}]  "
                                   f"{r['best_variant']}", 120, initial_indent="  ",
                                   subsequent_indent="    ")
    skipped = {}
    for r in rows:
        if r["error"] is not None:
            skipped.setdefault(r["error"], set()).add((r["devices"], r["microbatches"]))
    for error, shapes in sorted(skipped.items()):
        lines += textwrap.wrap("not buildable: " + ", ".join(f"p={p} m={m}"
                                                             for p, m in sorted(shapes))
                               + f" ({error})", 120, subsequent_indent="  ")
    if info:
        lines.append(f"{info['evaluated']} variants evaluated in {info['seconds']:.1f} s")
    return "\n".join(lines)
