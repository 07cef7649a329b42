"""Ray for the work pipecore spreads over a cluster (``pipecore scan --backend
ray``, ``pipecore.strategies(ray=True)``): importing it with a clear error
when the extra is missing, and starting or joining an instance quietly.

Ray is an optional extra (``pip install "pipecore[ray]"``), imported only
when one of these is used.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from .cpus import local_cpus

__all__ = ["missing_ray", "import_ray", "session", "TASK_ENV"]

#: Environment of every pipecore task: one Numba thread, since Ray runs one
#: task per CPU (more would oversubscribe them).
TASK_ENV = {"NUMBA_NUM_THREADS": "1"}


def missing_ray(what: str, instead: str) -> str:
    """The message for Ray missing: what needs it, how to install it, what else to do.

    Parameters
    ----------
    what : str
        What needs Ray, e.g. ``"the Ray backend"``.
    instead : str
        The way without Ray, e.g. ``"use the local backend"``.

    Returns
    -------
    str
    """
    return f'{what} needs Ray: pip install "pipecore[ray]" (or {instead})'


def import_ray(error: Exception):
    """The ``ray`` module, or ``error`` raised if Ray is not installed.

    Parameters
    ----------
    error : Exception
        Raised (from None) when ``import ray`` fails; its message should
        come from :func:`missing_ray`.

    Returns
    -------
    module
        ``ray``.

    Raises
    ------
    Exception
        ``error``, if Ray cannot be imported.
    """
    try:
        import ray
    except ImportError:
        raise error from None
    return ray


@contextmanager
def session(ray, address: str | None = None):
    """Ray ready for tasks for the duration of a ``with`` block; yields its CPU count.

    A Ray already initialised in this process is used as it is and left
    running. Otherwise: with ``address``, this process joins that cluster;
    without, a local instance with this process's CPUs is started. Either
    is shut down when the block ends. No dashboard, and workers' logs stay
    out of the driver's terminal.

    Parameters
    ----------
    ray : module
        From :func:`import_ray`.
    address : str, optional
        A running Ray cluster's address (``"auto"`` finds one on this machine).

    Yields
    ------
    int
        CPUs of the cluster (at least 1).

    Raises
    ------
    ray.exceptions.RayError
        If Ray cannot start or connect.
    """
    started = False
    if not ray.is_initialized():
        quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
        if address is None:
            # A local instance lives for this call only: Ray's notices about how a
            # cluster is secured or reached speak of nothing the user runs.
            ray.init(num_cpus=local_cpus(), **dict(quiet, logging_level=logging.ERROR))
        else:
            ray.init(address=address, **quiet)
        started = True
    try:
        yield max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        if started:
            ray.shutdown()
