"""Ray backend of ``pipecore scan``: the parts of a grid evaluated as Ray tasks.

Each task evaluates a few consecutive parts with the same kernel call the
local backend makes (``grid._part_table``), so its rows are the local
backend's rows bit for bit; the driver (``scan.scans.write_scan``) writes them.
Ray is an optional extra (``pip install "pipecore[ray]"``) and is imported
only when this backend is used.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ..core.raysession import TASK_ENV, import_ray, missing_ray, session
from .grid import Grid, ScanError, _part_table, _StructureCache

__all__ = ["run_parts"]

#: Task attempts after the first: a task lost with its worker (or raising) runs again.
MAX_RETRIES = 3
#: Tasks in flight per cluster CPU: enough to keep workers busy, few enough that
#: finished but unwritten tables never pile up in the driver or the object store.
IN_FLIGHT_PER_CPU = 2
#: A task evaluates parts until it holds about this many rows (fewer tasks, less
#: per-task overhead for small parts), unless that would leave CPUs idle.
TASK_ROWS = 20_000
#: Testing aid: when set to a directory, the first attempt of every task fails
#: (it leaves a marker per part there and raises), so a test can check retries.
FAIL_ONCE_ENV = "PIPECORE_RAY_FAIL_ONCE"

# Per worker process: structure caches by grid fingerprint, so a worker builds
# each structure once across all the tasks of a scan. Few grids are kept: a
# long-lived worker may serve several scans.
_CACHES: dict[str, _StructureCache] = {}
_MAX_GRIDS = 2


def _worker_cache(grid: Grid) -> _StructureCache:
    fp = grid.fingerprint()
    cache = _CACHES.get(fp)
    if cache is None:
        while len(_CACHES) >= _MAX_GRIDS:
            _CACHES.pop(next(iter(_CACHES)))
        cache = _CACHES[fp] = _StructureCache(grid)
    return cache


def _fail_once(parts):
    """Raise on a task's first attempt when the testing aid is on (see FAIL_ONCE_ENV)."""
    folder = os.environ.get(FAIL_ONCE_ENV)
    if not folder:
        return
    markers = [Path(folder) / f"part-{k:06d}" for k in parts]
    if all(m.exists() for m in markers):
        return
    for m in markers:  # mark the whole batch: the retry then evaluates it all
        m.touch()
    raise RuntimeError(f"{FAIL_ONCE_ENV}: first attempt of parts {list(parts)} fails on purpose")


def _evaluate(grid: Grid, batch):
    """Ray task body: ``[(k, table or None, skipped), ...]`` for ``batch``.

    ``batch`` is a list of ``(k, idx)``; ``idx`` is the part's point indices
    for a sampled grid (drawn once, by the driver) and None otherwise.
    ``skipped`` holds the unbuildable structures among the part's points, so
    the driver's union equals the local backend's.
    """
    _fail_once([k for k, _ in batch])
    cache = _worker_cache(grid)
    n_net = len(grid.network_names)
    out = []
    for k, idx in batch:
        if idx is None:
            idx = grid.part_indices(k)
        # One thread: Ray runs one task per CPU; the kernel's results do not
        # depend on the thread count.
        table = _part_table(grid, idx, cache, 1)
        sids = np.unique(idx // grid.values_per_entry // n_net).tolist()
        skipped = {s: cache.skipped[s] for s in sids if s in cache.skipped}
        out.append((k, table, skipped))
    return out


def _batches(grid: Grid, parts: list, cpus: int) -> list:
    """Consecutive parts grouped into tasks of about TASK_ROWS rows, at least
    a few tasks per CPU when there are parts enough."""
    per_task = max(1, min(math.ceil(TASK_ROWS / grid.part_size),
                          math.ceil(len(parts) / (4 * cpus))))
    return [parts[i:i + per_task] for i in range(0, len(parts), per_task)]


def run_parts(grid: Grid, parts: Iterable[int], address: str | None = None
              ) -> Iterator[tuple[int, object, dict]]:
    """Evaluate parts of a grid as Ray tasks, yielding each as it completes.

    A task that fails (raises, or loses its worker) is retried up to
    ``MAX_RETRIES`` times. Each task uses one Numba thread, so a cluster
    runs one task per CPU without oversubscription; the rows do not depend
    on the thread count, so they equal the local backend's exactly.

    Parameters
    ----------
    grid : Grid
    parts : iterable of int
        Part numbers to evaluate (each ``0 <= k < grid.parts``).
    address : str, optional
        Address of a running Ray cluster (``"auto"`` finds one on this
        machine); by default a local Ray instance is started for this call
        and shut down after it. A Ray already initialised in this process
        is used as it is. On a cluster, every node needs pipecore (and its
        version of the grid's schedule families) installed.

    Yields
    ------
    tuple of (int, pyarrow.Table or None, dict)
        Part number, its rows (None when no point of the part has a shape
        that can be built), and the structures of the part that cannot be
        built (structure id to reason). Every part is yielded once, in
        completion order.

    Raises
    ------
    ScanError
        If Ray is not installed (the ``pipecore[ray]`` extra), or a part
        number is out of range.
    ray.exceptions.RayError
        If Ray cannot start or connect, or a task still fails after its
        retries (the exception of its last attempt).
    """
    ray = import_ray(ScanError(missing_ray("the Ray backend", "use the local backend")))
    parts = [int(k) for k in parts]
    for k in parts:
        if not 0 <= k < grid.parts:
            raise ScanError(f"part {k} out of range (the grid has {grid.parts} parts)")
    if not parts:
        return
    sample = grid.sample_indices()
    # Workers take the grid without its sample (the driver ships each part's
    # indices instead), so no worker draws it again and the object is small.
    shipped = copy.copy(grid)
    shipped._sample = None

    with session(ray, address) as cpus:
        env = dict(TASK_ENV)  # one kernel thread per task: no oversubscription
        if os.environ.get(FAIL_ONCE_ENV):
            env[FAIL_ONCE_ENV] = os.environ[FAIL_ONCE_ENV]
        task = ray.remote(_evaluate).options(
            num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=True,
            runtime_env={"env_vars": env})
        grid_ref = ray.put(shipped)
        batches = iter(_batches(grid, parts, cpus))
        pending = []
        limit = IN_FLIGHT_PER_CPU * cpus
        while True:
            while len(pending) < limit:
                batch = next(batches, None)
                if batch is None:
                    break
                pending.append(task.remote(grid_ref, [
                    (k, None if sample is None else grid.part_indices(k)) for k in batch]))
            if not pending:
                break
            done, pending = ray.wait(pending, num_returns=1)
            yield from ray.get(done[0])
