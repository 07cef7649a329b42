"""What if another schedule ran: every family ranked on one profiled run's costs.

Part of :mod:`pipecore.bindings.torch`, which re-exports :func:`what_if`,
:func:`format_what_if` and :class:`WhatIfRanking`.
"""

from __future__ import annotations

import statistics

import numpy as np

from pipecore.core.ops import InputError

from ._profile import Profile, from_profile

__all__ = ["WhatIfRanking", "what_if", "format_what_if", "oversubscribed"]


def oversubscribed(ranks: int, cpus: int, whose: str = "the run's machine") -> str | None:
    """A warning when a run has more ranks than CPUs, else None.

    Parameters
    ----------
    ranks : int
        Processes of the run (one per rank).
    cpus : int
        CPUs they shared.
    whose : str
        Whose CPUs these are, for the text (e.g. ``"this machine"``).

    Returns
    -------
    str or None
    """
    if ranks <= cpus:
        return None
    def plural(n, word):
        return f"{n} {word}{'' if n == 1 else 's'}"

    return (f"{plural(ranks, 'rank')} on {plural(cpus, 'CPU')} ({whose}): the ranks took turns "
            f"on the cores, so the measured times are dominated by the operating system's "
            f"scheduler, which pipecore does not model (its devices all run at once); run at "
            f"most {plural(cpus, 'rank')} here, or on a machine with at least {plural(ranks, 'CPU')}")


class WhatIfRanking(list):
    """:func:`what_if`'s rows (a list, fastest first) and what the ranking rests on.

    Attributes
    ----------
    left_out : list of dict
        Families asked for but not ranked: ``schedule`` and ``reason``.
    profiled : dict
        The profiled schedule's own prediction: ``schedule`` (the family
        whose order it is, or ``"profiled"``), ``microbatches``,
        ``predicted`` and ``measured`` (median step), both in seconds,
        ``error`` (``predicted / measured - 1``: negative when the
        prediction is low), ``steps`` (how many steps the median is of)
        and ``measured_steps``: ``"reference"`` when the costs were
        corrected with the run's unprofiled steps (then those are
        measured), else ``"profiled"``.
    warnings : list of str
        What makes the measured times untrustworthy (ranks beyond CPUs).
    """

    def __init__(self, rows=(), left_out=(), profiled=None, warnings=()):
        super().__init__(rows)
        self.left_out = list(left_out)
        self.profiled = profiled
        self.warnings = list(warnings)


def _first_line(exc):
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def what_if(profile, schedules="all", microbatches: int | None = None) -> WhatIfRanking:
    """Every family that builds on the profiled setup, ranked by predicted step time.

    Parameters
    ----------
    profile : Profile or str or os.PathLike
        A :class:`Profile`, or what :func:`from_profile` reads.
    schedules : "all" or sequence of str
        Family names; ``"all"`` is every registered family.
    microbatches : int, optional
        Default: the profiled run's.

    Returns
    -------
    WhatIfRanking
        A list of rows, fastest first: ``schedule``, ``stages``,
        ``predicted`` (s), ``peak_activation`` (worst device, in units of
        one device share's activation for one microbatch; the profile has
        no memory sizes) and ``profiled`` (True for the schedule family
        that ran). Its ``left_out`` names every family asked for that is
        not ranked and why: it cannot build the shape, or it replicates a
        stage on two ranks (``chimera``, ``dualpipe``, ``bitpipe``:
        torch's runtime runs every stage on exactly one rank). Its
        ``profiled`` holds the profiled schedule's own prediction beside
        its measured step, and ``warnings`` a warning when the run had more
        ranks than CPUs (the run file's count; without one, this
        machine's).

    Raises
    ------
    ValueError
        As :func:`from_profile`, for an unknown family name, or if no
        family builds the shape.
    """
    from pipecore.core.cpus import local_cpus
    from pipecore.schedules.registry import family
    from pipecore.schedules.registry import schedules as all_names

    prof = profile if isinstance(profile, Profile) else from_profile(profile)
    names = list(all_names()) if schedules == "all" else list(schedules)
    for n in names:
        family(n)  # unknown names fail here, with the list of families
    m = prof.microbatches if microbatches is None else microbatches
    rows, left_out = [], []
    ran = prof.schedule.to_actions()
    ran_family = None
    for n in names:
        try:
            res = prof.predict(n, microbatches=m)
        except ValueError as exc:
            left_out.append({"schedule": n, "reason": f"does not build {prof.ranks} ranks x {m} "
                                                      f"microbatches: {_first_line(exc)}"})
            continue
        shared = [(s, devs) for s, devs in enumerate(res.schedule.stage_devices) if len(devs) > 1]
        if shared:
            s, devs = shared[0]
            left_out.append({"schedule": n, "reason": (
                f"runs stage {s} on ranks {', '.join(str(int(d)) for d in devs)} (a replicated "
                f"stage); torch's runtime runs every stage on exactly one rank")})
            continue
        same = res.schedule.to_actions() == ran
        if same and m == prof.microbatches and ran_family is None:
            ran_family = n
        rows.append({"schedule": n, "stages": res.schedule.stages, "predicted": res.makespan,
                     "peak_activation": float(np.max(res.peak_activation)), "profiled": same})
    if not rows:
        why = "; ".join(f"{r['schedule']}: {r['reason']}" for r in left_out)
        raise InputError(f"no family builds {prof.ranks} ranks and {m} microbatches ({why})")
    rows.sort(key=lambda r: r["predicted"])
    own = prof.predict(prof.schedule).makespan
    # Costs without the profiler's share are compared with the steps run without it.
    ref = prof.reference_times
    measured = statistics.median(ref) if ref else prof.measured
    profiled = {"schedule": ran_family or "profiled", "microbatches": prof.microbatches,
                "predicted": own, "measured": measured, "error": own / measured - 1,
                "steps": len(ref or prof.step_times),
                "measured_steps": "reference" if prof.reference_times else "profiled"}
    if prof.cpus is not None:
        warning = oversubscribed(prof.ranks, prof.cpus)
    else:
        warning = oversubscribed(prof.ranks, local_cpus(),
                                 "this machine's; the traces do not record the run's")
    return WhatIfRanking(rows, left_out, profiled, [warning] if warning else [])


def format_what_if(rows, measured=None) -> str:
    """The what-if table (milliseconds), with measured times when given.

    Parameters
    ----------
    rows : list of dict
        From :func:`what_if`. When it is a :class:`WhatIfRanking`, the text goes
        on with the profiled schedule's own prediction against its measured
        step, the families left out and why, and the warnings.
    measured : dict of str to float, optional
        Measured step times (s) by schedule, e.g. from ``--check``.

    Returns
    -------
    str

    Raises
    ------
    KeyError
        If a row lacks a field.
    """
    measured = measured or {}
    head = f"{'#':>4} {'schedule':<17} {'stages':>6} {'predicted ms':>12} {'peak act':>8}"
    if measured:
        head += f" {'measured ms':>11} {'error':>7}"
    lines = [head]
    for i, r in enumerate(rows, 1):
        line = (f"{i:>4} {r['schedule'] + (' *' if r['profiled'] else ''):<17} {r['stages']:>6} "
                f"{r['predicted'] * 1e3:>12.2f} {r['peak_activation']:>8.2f}")
        if r["schedule"] in measured:
            got = measured[r["schedule"]]
            line += f" {got * 1e3:>11.2f} {r['predicted'] / got - 1:>+7.1%}"
        lines.append(line)
    lines += _wrap("* the profiled schedule; peak act: activations held at once on the worst "
                   "device, in microbatch shares" + ("; error: predicted / measured - 1"
                                                     if measured else ""))
    own = getattr(rows, "profiled", None)
    if own:
        steps = ("unprofiled reference" if own.get("measured_steps") == "reference"
                 else "profiled")
        lines += _wrap(f"profiled schedule ({own['schedule']}, {own['microbatches']} "
                       f"microbatches): predicted {own['predicted'] * 1e3:.2f} ms, measured "
                       f"{own['measured'] * 1e3:.2f} ms (median of {own['steps']} {steps} "
                       f"steps): {_error_text(own['error'])}")
    left = getattr(rows, "left_out", None)
    if left:
        lines.append(f"left out ({len(left)}):")
        width = max(len(r["schedule"]) for r in left)
        for r in left:
            lines += _wrap(f"{r['schedule']:<{width}}  {r['reason']}", "  ", " " * (width + 4))
    for w in getattr(rows, "warnings", ()):
        lines += _wrap(f"warning: {w}")
    return "\n".join(lines)


def _wrap(text, first="", rest="  "):
    """A sentence as lines of at most 120 columns (a terminal's)."""
    import textwrap

    return textwrap.wrap(text, 120, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False)


def _error_text(error):
    """A signed relative error in words: "prediction -55.3% (55.3% low)"."""
    if abs(error) < 5e-4:
        return "prediction within 0.1% of the measurement"
    return f"prediction {error:+.1%} ({abs(error):.1%} {'low' if error < 0 else 'high'})"
