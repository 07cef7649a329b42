"""How a result was obtained, in words: its costs, network, stragglers and
jitter, and what differs between several results' settings."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..core.costs import Costs, Network

__all__ = ["describe_costs", "describe_jitter", "describe_network", "describe_setting",
           "describe_stragglers", "setting_differences", "setting_text"]


def _value(x) -> str:
    """A cost field in words: a scalar, or a per-stage vector (short ones in
    full, longer ones as their range)."""
    if np.ndim(x) == 0:
        return f"{float(x):g}"
    arr = np.asarray(x, dtype=np.float64)
    if arr.size <= 4:
        return "[" + ", ".join(f"{v:g}" for v in arr.tolist()) + "] per stage"
    return f"{arr.min():g} to {arr.max():g} per stage"


def _cost_fields(costs: Costs) -> tuple[dict, dict]:
    """The time and the memory fields of a Costs that shape a result, as
    ``{name: value in words}``; optional ones only when set."""
    c = costs
    times = {k: _value(getattr(c, k)) for k in ("f", "b", "w", "comm")}
    for k in ("bw", "r", "offload"):
        if getattr(c, k) is not None:
            times[k] = _value(getattr(c, k))
    if np.any(np.asarray(c.overhead) != 0):
        times["overhead"] = _value(c.overhead)
    if np.any(np.asarray(c.evict) != 0):
        times["evict"] = _value(c.evict)
    if c.fb_factor != 1.0:
        times["fb_factor"] = f"{c.fb_factor:g}"
    if c.host_link_devices != 1:
        times["host_link_devices"] = str(c.host_link_devices)
    memory = {k: _value(getattr(c, k)) for k in ("activation", "activation_w", "weights")}
    if np.any(np.asarray(c.checkpoint) != 0):
        memory["checkpoint"] = _value(c.checkpoint)
    return times, memory


def _fields(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())


def describe_costs(costs: Costs) -> str:
    """The op times and memory of a :class:`Costs` in one line, with units.

    Times are per microbatch and device share of the model, in cost units;
    memory is in M. Optional fields (recompute, offload, overhead, ...)
    appear only when set.

    Parameters
    ----------
    costs : Costs

    Returns
    -------
    str
    """
    times, memory = _cost_fields(costs)
    return (f"costs {_fields(times)} (times per microbatch and device share, in cost units); "
            f"memory {_fields(memory)} (in M: activation per microbatch, weights per device "
            "share)")


def describe_network(network: Network | None) -> str:
    """A :class:`Network` in words ("none" without one).

    Parameters
    ----------
    network : Network or None

    Returns
    -------
    str
    """
    if network is None:
        return "none (each transfer takes comm)"
    n = network
    text = f"bytes={_value(n.bytes)} bandwidth={n.bandwidth:g} latency={n.latency:g}"
    if n.devices_per_node is not None:
        text += (f", {n.devices_per_node} devices per node, between nodes bandwidth="
                 f"{n.inter_bandwidth:g} latency={n.inter_latency:g}")
    if np.any(np.asarray(n.grad_bytes) != 0):
        text += f", grad_bytes={_value(n.grad_bytes)}"
    return text


def describe_stragglers(stragglers) -> str:
    """Stragglers as given to :func:`pipecore.simulate`, in words.

    Parameters
    ----------
    stragglers : mapping of int to float, array_like or None

    Returns
    -------
    str
        "none", e.g. "device 3 at 1.3x op time", or the range of per-op
        factors.
    """
    if stragglers is None:
        return "none"
    if isinstance(stragglers, Mapping):
        slow = sorted((int(d), float(f)) for d, f in stragglers.items())
        if not slow:
            return "none"
        return ", ".join(f"device {d} at {f:g}x" for d, f in slow) + " op time"
    arr = np.asarray(stragglers, dtype=np.float64)
    return f"per-op time factors {arr.min():g}x to {arr.max():g}x" if arr.size else "none"


def describe_jitter(jitter, draw: int = 0) -> str:
    """A :class:`pipecore.Jitter` and the draw a simulation used, in words.

    Parameters
    ----------
    jitter : Jitter or None
    draw : int, default 0

    Returns
    -------
    str
        "none", or e.g. "lognormal sigma=0.1 per op, seed 1, draw 0".
    """
    if jitter is None:
        return "none"
    dist = getattr(jitter, "dist", type(jitter).__name__)
    if dist == "empirical":
        facs = getattr(jitter, "factors", ())
        spread = (f"{len(facs)} empirical factors {min(facs):g}x to {max(facs):g}x"
                  if facs else "empirical factors")
    else:
        spread = f"{dist} sigma={getattr(jitter, 'sigma', float('nan')):g}"
    return (f"{spread} per {getattr(jitter, 'per', 'op')}, seed {getattr(jitter, 'seed', 0)}, "
            f"draw {draw}")


def _cause(kind: str, stragglers=None, jitter=None, draw: int = 0) -> str:
    """A departure from the formula's assumptions, named for a note."""
    if kind == "jitter":
        return f"jitter ({describe_jitter(jitter, draw)})"
    many = not isinstance(stragglers, Mapping) or len(stragglers) > 1
    return f"{'stragglers' if many else 'straggler'} ({describe_stragglers(stragglers)})"


def describe_setting(result) -> dict:
    """How a result was obtained, part by part, in words.

    Parameters
    ----------
    result : Result

    Returns
    -------
    dict of str to dict or str
        ``shape`` (devices and microbatches), ``costs`` and ``memory``
        (``{field: value}``), ``network``, ``stragglers``, ``jitter``.
    """
    s = result.schedule
    times, memory = _cost_fields(result.costs)
    return {"shape": f"p={s.devices} devices, m={s.microbatches} microbatches",
            "costs": times, "memory": memory,
            "network": describe_network(result.network),
            "stragglers": describe_stragglers(getattr(result, "stragglers", None)),
            "jitter": describe_jitter(getattr(result, "jitter", None), getattr(result, "draw", 0))}


def setting_text(setting: dict, only=None) -> str:
    """A :func:`describe_setting` dict in one line, e.g. "costs: f=1 b=2 w=0
    comm=0 · memory: ... · network: none · stragglers: none · jitter: none".

    Parameters
    ----------
    setting : dict
        From :func:`describe_setting`.
    only : dict of str to set, optional
        The parts (and, for ``costs`` and ``memory``, the fields) to show;
        all by default.

    Returns
    -------
    str
    """
    out = []
    for part, value in setting.items():
        if only is not None and part not in only:
            continue
        if isinstance(value, dict):
            keep = {k: v for k, v in value.items() if only is None or k in only[part]}
            value = _fields(keep)
        out.append(value if part == "shape" else f"{part}: {value}")
    return " \u00b7 ".join(out)


def setting_differences(settings: list[dict]) -> dict:
    """What differs between settings: ``{part: set of fields}`` (for
    ``costs`` and ``memory`` the fields that differ, else ``{part}``).

    Parameters
    ----------
    settings : list of dict
        From :func:`describe_setting`, one per result compared.

    Returns
    -------
    dict of str to set
        Empty when all are the same (or there is one).
    """
    if len(settings) < 2:
        return {}
    out = {}
    for part in settings[0]:
        values = [s[part] for s in settings]
        if isinstance(values[0], dict):
            keys = list(dict.fromkeys(k for v in values for k in v))
            diff = {k for k in keys if len({v.get(k, "-") for v in values}) > 1}
            if diff:
                out[part] = diff
        elif len(set(values)) > 1:
            out[part] = {part}
    return out


# --- the rows in order, and what to read first --------------------------------

