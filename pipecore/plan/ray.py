"""``pipecore.strategies(ray=True)``: the strategies of a search estimated as Ray tasks.

Each task estimates a run of consecutive strategies with the very function
the serial search calls per strategy (``search._row``, handed in), so its
rows and estimates are the serial search's; the driver puts them back in
the space's order, and :func:`pipecore.strategies` ranks them as it ranks
its own.
"""

from __future__ import annotations

import math

from ..core.raysession import TASK_ENV, session

__all__ = ["estimate_all"]

#: Tasks per cluster CPU: a few, so a CPU that finishes early takes another
#: and one slow run of strategies does not hold up the whole search.
TASKS_PER_CPU = 4
#: Fewest strategies per task: about those that share one pipeline shape in
#: the default space, whose schedule a worker then builds once.
MIN_PER_TASK = 16


def _estimate_run(row, run):
    """Ray task body: ``[(row, Estimate or None), ...]`` for the strategies of ``run``."""
    return [row(s) for s in run]


def _runs(n: int, cpus: int) -> list:
    """(start, stop) of consecutive strategies per task."""
    per = max(MIN_PER_TASK, math.ceil(n / (TASKS_PER_CPU * cpus)))
    return [(i, min(n, i + per)) for i in range(0, n, per)]


def estimate_all(ray, address, row, candidates, progress=None):
    """Rows and estimates of ``candidates`` as the serial loop of :func:`pipecore.strategies` makes them.

    Parameters
    ----------
    ray : module
        ``ray`` (from :func:`pipecore.core.raysession.import_ray`).
    address : str or None
        As :func:`pipecore.strategies`.
    row : callable
        ``row(strategy)`` -> ``(row dict, Estimate or None)``, the serial
        search's; picklable (it is shipped to the workers once).
    candidates : list of Strategy
        The space, in its order.
    progress : callable, optional
        Called as ``progress(done, total)`` as each task's strategies come back.

    Returns
    -------
    tuple of (list of dict, dict)
        One row per candidate, in order (without ranks), and the
        estimates by candidate index, in index order.

    Raises
    ------
    ray.exceptions.RayError
        If Ray cannot start or connect, or a task fails.
    """
    n = len(candidates)
    if not n:
        return [], {}
    rows, estimates = [None] * n, {}
    with session(ray, address) as cpus:
        task = ray.remote(_estimate_run).options(num_cpus=1, runtime_env={"env_vars": dict(TASK_ENV)})
        row_ref = ray.put(row)  # with the model and the cluster: shipped once, not per task
        pending = {task.remote(row_ref, candidates[a:b]): a for a, b in _runs(n, cpus)}
        done = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            start = pending.pop(ready[0])
            out = ray.get(ready[0])
            for i, (r, est) in enumerate(out, start):
                rows[i] = r
                if est is not None:
                    estimates[i] = est
            done += len(out)
            if progress is not None:
                progress(done, n)
    return rows, dict(sorted(estimates.items()))
