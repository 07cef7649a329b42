"""The asymmetric Chimera-style placement study (issue 16).

For each pipeline shape (devices p, microbatches m) the study searches
Chimera's placement space (:func:`pipecore.schedules.chimera.build_chimera`'s
``down``, ``up_placement``, ``down_layers``, ``up_layers``) and reports, in
each cell of the compute x network grid, the fastest asymmetric variant
against symmetric Chimera. A variant is evaluated in all cells at once with
:func:`pipecore.scan.batch.simulate_many`.

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
import time

import numpy as np
import pyarrow as pa

from ..analysis.model import Hardware
from ..analysis.study import GRID_FACTORS, TransformerModel
from ..core import tier
from ..core.costs import Costs, Network
from ..core.simulate import simulate
from ..scan.batch import simulate_many
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
    act, state = _memory_per_share(model, p)
    cols = {k: [] for k in ("f", "b", "w", "activation", "weights", "bytes", "bandwidth", "latency")}
    cells = []
    for cf in factors:
        for nf in factors:
            hw = hardware.scaled(cf, nf)
            c = model.costs(hw, p)
            net = model.network(hw)
            cells.append((cf, nf))
            for k, v in (("f", c.f), ("b", c.b), ("w", c.w), ("activation", act),
                         ("weights", state), ("bytes", float(net.bytes)),
                         ("bandwidth", net.bandwidth), ("latency", net.latency)):
                cols[k].append(float(v))
    return cells, cols


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
                     hardware=None, factors=GRID_FACTORS, budget=800) -> tuple[pa.Table, dict]:
    """Search asymmetric Chimera-style placements over the compute x network grid.

    Parameters
    ----------
    devices, microbatches : sequence of int
        Pipeline shapes; a shape Chimera cannot build (odd p, m not a
        multiple of p) gets a row saying why.
    model : TransformerModel, optional
        Defaults to ``TransformerModel()`` (128 layers, hidden 4096, as
        :func:`pipecore.study`).
    hardware : Hardware, optional
        Defaults to ``Hardware.preset("dgx-h100")``.
    factors : sequence of float
        Compute and network scale factors (the grid is their product).
    budget : int, default 800
        Most variants evaluated per shape (each in every cell at once); the
        two symmetric baselines are always evaluated.

    Returns
    -------
    tuple of (pyarrow.Table, dict)
        The table has one row per (devices, microbatches, compute,
        network): ``chimera_time`` (symmetric Chimera, seconds),
        ``list_time`` (the symmetric placement in the list order),
        ``best_time`` and ``best_variant`` (the fastest asymmetric variant
        found, its knobs as text), ``best_reading`` (which knobs it changes:
        split, placement, layers), ``gain`` ((chimera - best) / chimera) and
        ``gain_vs_list``, ``gain_vs_symmetric`` (against the faster of the
        two symmetric orders: the gain of the asymmetry alone), the best of
        each reading alone against Chimera (``split_gain``,
        ``placement_gain``, ``layers_gain``), ``chimera_peak`` and
        ``best_peak`` (global peak memory: activation plus weights of the
        worst device, bytes), ``chimera_peak_activation`` and
        ``best_peak_activation``, ``chimera_device_peaks`` and
        ``best_device_peaks`` (per device, bytes), ``min_peak`` (the lowest
        global peak of any variant evaluated for the shape) and its
        ``min_peak_time``, ``evaluated`` (variants for the shape) and
        ``error`` (why the shape was skipped, else null). The dict holds
        ``seconds`` (wall time) and ``evaluated`` (total variants).

    Raises
    ------
    ValueError
        For non-positive factors or a bad budget.
    """
    model = TransformerModel() if model is None else model
    hardware = Hardware.preset("dgx-h100") if hardware is None else hardware
    for x in factors:
        if not x > 0:
            raise ValueError(f"grid factors must be > 0 (got {x})")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"'budget' must be an int >= 1 (got {budget!r})")
    t0 = time.perf_counter()
    rows = []
    total = 0
    for p in devices:
        cells, cols = _cells(model, hardware, p, factors)
        net = Network(bytes=1.0)
        for m in microbatches:
            try:
                build("chimera", p, m)
            except ValueError as exc:
                rows += [_empty_row(p, m, cf, nf, str(exc)) for cf, nf in cells]
                continue
            cache = {}

            def evaluate(key, p=p, m=m, cache=cache, cols=cols, net=net):
                if key not in cache:
                    sched = build("chimera", p, m, **_knobs(key, p, m))
                    if any(len(d) != 2 for d in sched.stage_devices):
                        # Both replicas of some layers on one device: one copy of
                        # their weights, no longer two Chimera-style pipelines.
                        cache[key] = None
                        return None
                    out = simulate_many(sched, cols, network=net)
                    cache[key] = (out.column("makespan").to_numpy(),
                                  float(out.column("memory_max").to_numpy()[0]),
                                  float(out.column("peak_activation_max").to_numpy()[0]))
                return cache[key]

            initial = _initial(p, m)
            sym = initial[0]
            # The two symmetric baselines always; then the readings, within budget.
            for key in initial[:max(budget, 2)]:
                evaluate(key)
            # Local search per cell from its best asymmetric variant so far.
            for c in range(len(cells)):
                asym = [k for k in cache if cache[k] is not None and _reading(k, p, m) != "symmetric"]
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
    return pa.Table.from_pylist(rows), {"seconds": time.perf_counter() - t0, "evaluated": total}


def _empty_row(p, m, cf, nf, error):
    return {"devices": p, "microbatches": m, "compute": cf, "network": nf, "chimera_time": None,
            "list_time": None, "best_time": None, "best_variant": None, "best_reading": None,
            "gain": None, "gain_vs_list": None, "gain_vs_symmetric": None, "split_gain": None,
            "placement_gain": None, "layers_gain": None, "chimera_peak": None, "best_peak": None,
            "chimera_peak_activation": None, "best_peak_activation": None,
            "chimera_device_peaks": None, "best_device_peaks": None, "min_peak": None,
            "min_peak_time": None, "evaluated": None, "error": error}


def _device_peaks(key, p, m, model):
    """Per-device peak of activation plus weights, bytes (the same in every cell)."""
    act, state = _memory_per_share(model, p)
    sched = build("chimera", p, m, **_knobs(key, p, m))
    res = simulate(sched, Costs(f=1.0, b=1.0, activation=act, weights=state))
    return (res.peak_activation + res.static_memory).tolist()


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
    sym_dev = _device_peaks(sym, p, m, model)
    rows = []
    for c, (cf, nf) in enumerate(cells):
        t = np.where(asym, times[:, c], np.inf)
        i = int(np.argmin(t))
        base = times[i_sym, c]

        def best_of(name, c=c, base=base):
            sel = [j for j, r in enumerate(reading) if r == name]
            return float((base - times[sel, c].min()) / base) if sel else None

        rows.append({
            "devices": p, "microbatches": m, "compute": cf, "network": nf,
            "chimera_time": float(base), "list_time": float(times[i_list, c]),
            "best_time": float(times[i, c]), "best_variant": str(_knobs(keys[i], p, m)),
            "best_reading": reading[i], "gain": float((base - times[i, c]) / base),
            "gain_vs_list": float((times[i_list, c] - times[i, c]) / times[i_list, c]),
            "gain_vs_symmetric": float((min(base, times[i_list, c]) - times[i, c])
                                       / min(base, times[i_list, c])),
            "split_gain": best_of("split"), "placement_gain": best_of("placement"),
            "layers_gain": best_of("layers"),
            "chimera_peak": float(peaks[i_sym]), "best_peak": float(peaks[i]),
            "chimera_peak_activation": float(acts[i_sym]), "best_peak_activation": float(acts[i]),
            "chimera_device_peaks": sym_dev, "best_device_peaks": _device_peaks(keys[i], p, m, model),
            "min_peak": float(peaks[i_min]), "min_peak_time": float(times[i_min, c]),
            "evaluated": len(keys), "error": None})
    return rows


def summarize_asymmetric(table: pa.Table, info: dict | None = None) -> str:
    """Text summary: per cell, the best asymmetric variant against symmetric Chimera.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`asymmetric_study`.
    info : dict, optional
        Its second return value (adds the wall time).

    Returns
    -------
    str

    Raises
    ------
    None
        Nothing beyond errors of the objects it is given.
    """
    gb = 1e9
    lines = ["asymmetric Chimera-style placement vs symmetric Chimera (gain > 0: faster; "
             "peaks: activation + weights, GB)",
             "  S    m  compute  network  vs-chimera  vs-best-sym  reading                 global peak "
             "sym -> best  lowest found"]
    for r in table.to_pylist():
        if r["error"] is not None:
            continue
        lines.append(f"{r['devices']:>3}  {r['microbatches']:>3}  {r['compute']:>7g}  "
                     f"{r['network']:>7g}  {100 * r['gain']:>+9.2f}%  "
                     f"{100 * r['gain_vs_symmetric']:>+10.2f}%  "
                     f"{r['best_reading']:<22}  {r['chimera_peak'] / gb:>8.2f} -> "
                     f"{r['best_peak'] / gb:>6.2f}  {r['min_peak'] / gb:>8.2f}")
    mid = [r for r in table.to_pylist() if r["error"] is None and r["compute"] == 1.0
           and r["network"] == 1.0]
    if mid:
        lines.append("per-device peaks (GB), symmetric Chimera -> fastest variant, compute and "
                     "network x1:")
        for r in mid:
            sym = " ".join(f"{x / gb:.1f}" for x in r["chimera_device_peaks"])
            best = " ".join(f"{x / gb:.1f}" for x in r["best_device_peaks"])
            lines.append(f"  S={r['devices']} m={r['microbatches']}: [{sym}] -> [{best}]  "
                         f"{r['best_variant']}")
    skipped = sorted({(r["devices"], r["microbatches"]) for r in table.to_pylist()
                      if r["error"] is not None})
    if skipped:
        lines.append("not buildable: " + ", ".join(f"S={p} m={m}" for p, m in skipped))
    if info:
        lines.append(f"{info['evaluated']} variants evaluated in {info['seconds']:.1f} s")
    return "\n".join(lines)
