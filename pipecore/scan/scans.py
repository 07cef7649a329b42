"""Design-space scans: a grid of schedules, shapes, costs and networks,
evaluated in batched kernel calls, streamed as Arrow record batches and
written as a Parquet dataset that survives interruption.

The grid's points are numbered: the index runs over (schedule, devices,
microbatches, chunks, network) first and the cost axes last, so
consecutive points share a schedule structure and replay side by side
(see ``kernels.replay``). Parts are contiguous runs of that numbering (or of the
sorted sample), so a part's rows depend only on the grid and the part
number: a resumed scan writes exactly the rows an uninterrupted one would.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..analysis.frontier import pareto_front
from ..core.progress import Progress as _Progress
from ..output.plots import plot_pareto as _plot_pareto
from .batch import threads
from .grid import (  # noqa: F401  (re-exported: scan's public names and the parts ray reuses)
    MANIFEST,
    SUMMARY,
    VALUE_AXES,
    Grid,
    ScanError,
    _as_grid,
    _part_table,
    _StructureCache,
)

__all__ = ["Grid", "scan", "scan_part", "write_scan", "ScanError", "pareto_front"]

def scan_part(grid, k: int, cache=None) -> pa.Table | None:
    """Evaluate part k of a grid.

    Parameters
    ----------
    grid : Grid, mapping or path
    k : int
        Part number, ``0 <= k < grid.parts``.
    cache : optional
        Structure cache shared across calls (internal).

    Returns
    -------
    pyarrow.Table or None
        The part's rows, or None when every point in it has a shape that
        cannot be built.

    Raises
    ------
    ScanError
        For a bad grid or part number.
    """
    grid = _as_grid(grid)
    cache = cache or _StructureCache(grid)
    return _part_table(grid, grid.part_indices(k), cache, threads())


def scan(grid, parts=None) -> Iterator[pa.RecordBatch]:
    """Evaluate a grid, streaming one Arrow record batch per part.

    Parameters
    ----------
    grid : Grid, mapping or path to a TOML grid file
    parts : iterable of int, optional
        Which parts (default all, in order).

    Yields
    ------
    pyarrow.RecordBatch
        Columns ``config`` (the point's index), ``schedule``, ``devices``,
        ``microbatches``, ``chunks``, ``network``, the cost and network
        columns, ``memory_limit``, then ``makespan``, ``bubble_ratio``,
        ``bubble_rate``, ``throughput``, ``peak_activation_max``,
        ``memory_max`` and ``fits``. Points whose shape cannot be built (a
        family's constraint) yield no row; :func:`write_scan` lists them.

    Raises
    ------
    ScanError
        For a bad grid.
    """
    grid = _as_grid(grid)
    cache = _StructureCache(grid)
    for k in (range(grid.parts) if parts is None else parts):
        table = scan_part(grid, k, cache)
        if table is not None:
            yield from table.to_batches(max_chunksize=table.num_rows)


# -- durable output -------------------------------------------------------

def _part_name(k):
    return f"part-{k:06d}.parquet"


def _write_atomic(table, folder, k):
    final = folder / _part_name(k)
    tmp = folder / f".{_part_name(k)}.{os.getpid()}.tmp"
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:  # publish only what is on disk
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:  # Ctrl-C mid-write: leave no half part behind
        tmp.unlink(missing_ok=True)
        raise


def _empty_marker(folder, k):
    # A part with no buildable point leaves a marker so resume knows it is done.
    final = folder / f"_empty-{k:06d}"
    final.write_text("")


def _done_parts(folder):
    done = set()
    for path in folder.iterdir():
        name = path.name
        if name.startswith("part-") and name.endswith(".parquet"):
            done.add(int(name[5:11]))
        elif name.startswith("_empty-"):
            done.add(int(name[7:13]))
    return done





def write_scan(grid, out, resume: bool = False, backend: str = "local", address=None,
               progress=None, plot: bool = True) -> dict:
    """Evaluate a grid into a Parquet dataset, one file per part.

    A part becomes visible only when complete (written to a hidden
    temporary file, synced, then renamed), so a scan killed at any moment
    leaves only whole parts; ``resume=True`` skips them and writes exactly
    the rows an uninterrupted run would.

    Parameters
    ----------
    grid : Grid, mapping or path to a TOML grid file
    out : str or Path
        Output folder (created). It holds ``part-NNNNNN.parquet`` files,
        ``_scan.json`` (the grid, to check a resume against),
        ``_summary.json`` and ``_pareto.png`` when done (names starting with "_" or
        "." are skipped by Parquet dataset readers).
    resume : bool
        Continue a scan of the same grid in ``out``.
    backend : {"local", "ray"}
        Where parts are evaluated; ``"ray"`` needs the ``pipecore[ray]``
        extra.
    address : str, optional
        Ray cluster address (``"auto"`` for a running one); a local Ray
        instance by default.
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
    plot : bool
        Write ``_pareto.png`` (makespan over the bubble-free ideal
        ``m (f + b + w)`` vs memory of the worst device, per family) when
        matplotlib is installed.

    Returns
    -------
    dict
        The summary also written to ``_summary.json``: rows, parts, skipped
        shapes with their reasons, seconds, configs/s.

    Raises
    ------
    ScanError
        For a bad grid, a non-empty ``out`` holding another scan (or any
        scan without ``resume``), or an unknown backend.
    """
    grid = _as_grid(grid)
    if backend not in ("local", "ray"):
        raise ScanError(f"'backend' must be 'local' or 'ray' (got {backend!r})")
    if backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # before anything is written to ``out``
            raise ScanError('the Ray backend needs Ray: pip install "pipecore[ray]" '
                            '(or use the local backend)')
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / MANIFEST
    fp = grid.fingerprint()
    if manifest.exists():
        old = json.loads(manifest.read_text())
        if old.get("fingerprint") != fp:
            raise ScanError(f"{str(folder)!r} holds a scan of a different grid "
                            f"(fingerprint {old.get('fingerprint')} != {fp}); use a new folder")
        if not resume:
            raise ScanError(f"{str(folder)!r} already holds this scan; pass resume=True "
                            f"(--resume) to continue it, or use a new folder")
    else:
        if any(p.name.startswith("part-") for p in folder.iterdir()):
            raise ScanError(f"{str(folder)!r} holds part files but no {MANIFEST}; use a new folder")
        manifest.write_text(json.dumps({"fingerprint": fp, "grid": grid.describe(),
                                        "points": grid.points, "rows": grid.rows,
                                        "parts": grid.parts}, indent=1))
    for stale in folder.glob(".part-*.tmp"):  # left by a killed run
        stale.unlink()
    done = _done_parts(folder)
    todo = [k for k in range(grid.parts) if k not in done]
    sizes = {k: min(grid.part_size, grid.rows - k * grid.part_size) for k in range(grid.parts)}
    enabled = sys.stderr.isatty() if progress is None else bool(progress)
    bar = _Progress(sum(sizes[k] for k in todo), enabled)
    t0 = time.perf_counter()
    written = 0
    skipped = {}
    # Testing aid: seconds to pause after each part, so a test can kill a scan mid-run.
    delay = float(os.environ.get("PIPECORE_SCAN_DELAY", "0") or 0)
    if backend == "local":
        cache = _StructureCache(grid)
        for k in todo:
            if delay:
                time.sleep(delay)
            table = _part_table(grid, grid.part_indices(k), cache, threads())
            if table is None:
                _empty_marker(folder, k)
            else:
                _write_atomic(table, folder, k)
                written += table.num_rows
            bar.update(sizes[k])
        skipped = cache.skipped
    else:
        from .ray import run_parts

        for k, table, sk in run_parts(grid, todo, address):
            if table is None:
                _empty_marker(folder, k)
            else:
                _write_atomic(table, folder, k)
                written += table.num_rows
            skipped.update(sk)
            bar.update(sizes[k])
    bar.update(0, final=True)
    seconds = time.perf_counter() - t0
    summary = {"fingerprint": fp, "parts": grid.parts, "parts_written": len(todo),
               "rows_written": written, "seconds": seconds,
               "configs_per_s": (sum(sizes[k] for k in todo) / seconds) if seconds > 0 else None,
               "skipped": {"/".join(map(str, grid._structures[s])): why
                           for s, why in sorted(skipped.items())}}
    summary["rows"] = sum(pq.ParquetFile(f).metadata.num_rows
                          for f in folder.glob("part-*.parquet"))
    if plot:
        summary["plot"] = _plot_pareto(folder)
    (folder / SUMMARY).write_text(json.dumps(summary, indent=1))
    return summary

