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
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from ..analysis.frontier import pareto_front
from ..core.progress import Progress as _Progress
from ..output.plots import plot_pareto as _plot_pareto
from . import parts as _parts
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

__all__ = ["Grid", "scan", "scan_part", "write_scan", "verify_scan", "ScanError", "ScanWarning",
           "pareto_front"]

verify_scan = _parts.verify_scan


class ScanWarning(UserWarning):
    """A file in a scan folder that a resume set aside (its name and the reason)."""

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
        ``memory_max``, ``fits`` and ``error`` (null, or why the row has no
        answer). Points whose shape cannot be built (a family's
        constraint) yield no row: a :class:`ScanWarning` at the end names
        them and why (:func:`write_scan` lists them in its summary).

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
    if cache.skipped:  # said, not silently dropped
        shapes = ["/".join(map(str, grid._structures[s])) + f": {why}"
                  for s, why in sorted(cache.skipped.items())]
        warnings.warn(f"scan left out {len(shapes)} shape(s) that cannot be built (no rows): "
                      + "; ".join(shapes[:5]) + (" ..." if len(shapes) > 5 else ""),
                      ScanWarning, stacklevel=2)


# -- durable output: see parts.py for how a part is written and verified ---------


def _publish(table, folder, k, fingerprint):
    """Write part k (or its empty marker); returns its rows and rows with an error."""
    if table is None:
        _parts.write_empty(folder, k, fingerprint)
        return 0, 0
    _parts.write_part(table, folder, k, fingerprint)
    error = table.column("error")
    return table.num_rows, len(error) - error.null_count


def write_scan(grid, out, resume: bool = False, backend: str = "local", address=None,
               progress=None, plot: bool = True) -> dict:
    """Evaluate a grid into a Parquet dataset, one file per part.

    A part becomes visible only when complete (written to a hidden
    temporary file, synced, then renamed), so a scan killed at any moment
    leaves only whole parts; ``resume=True`` verifies them (the grid's
    fingerprint, the part's number, rows and configurations in its
    metadata, a CRC on every page), keeps those that verify and writes
    exactly the rows an uninterrupted run would. Any other file named like
    a part (truncated, empty, another grid's, a stray name) is moved aside
    to ``_rejected-NAME.bad`` with a :class:`ScanWarning` saying why, and
    the part is recomputed.

    Parameters
    ----------
    grid : Grid, mapping or path to a TOML grid file
    out : str or Path
        Output folder (created). It holds ``part-NNNNNN.parquet`` files,
        ``_scan.json`` (the grid, to check a resume against),
        ``_summary.json`` and ``_pareto.png`` when done (names starting with "_" or
        "." are skipped by Parquet dataset readers).
    resume : bool
        Continue a scan of the same grid in ``out`` (also one whose
        ``_scan.json`` was deleted: its parts are verified against ``grid``).
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
        shapes with their reasons, seconds, configs/s, and ``rejected``
        (file name -> reason and where it was moved).

    Raises
    ------
    ScanError
        For a bad grid, a non-empty ``out`` holding another scan (or any
        scan without ``resume``), a damaged ``_scan.json`` (naming it and
        the way out), a part that cannot be written (disk full: the part is
        not counted and a later resume finishes it), or an unknown backend.
    """
    grid = _as_grid(grid)
    if backend not in ("local", "ray"):
        raise ScanError(f"'backend' must be 'local' or 'ray' (got {backend!r})")
    if backend == "ray":
        import importlib.util

        from ..core.raysession import missing_ray

        if importlib.util.find_spec("ray") is None:  # before anything is written to ``out``
            raise ScanError(missing_ray("the Ray backend", "use the local backend"))
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ScanError(f"'out' {str(folder)!r} is a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    fp = grid.fingerprint()
    manifest = _parts.read_manifest(folder)
    if manifest is not None:
        if manifest["fingerprint"] != fp:
            raise ScanError(f"{str(folder)!r} holds a scan of a different grid "
                            f"(fingerprint {manifest['fingerprint']} != {fp}); use a new folder")
        if not resume:
            raise ScanError(f"{str(folder)!r} already holds this scan; pass resume=True "
                            f"(--resume) to continue it, or use a new folder")
    elif not resume and any(_parts.looks_like_part(p.name) for p in folder.iterdir()):
        raise ScanError(f"{str(folder)!r} holds part files but no {MANIFEST}; pass resume=True "
                        f"(--resume) to verify them against this grid and continue, or use a "
                        f"new folder")
    for stale in folder.glob(".*.tmp"):  # left by a killed run
        stale.unlink()
    done, kept_rows, bad = _parts.survey(folder, fp, grid.parts, grid.part_indices)
    if manifest is None:
        foreign = sorted(n for n, why in bad.items() if why.startswith("a part of another grid"))
        if foreign:
            raise ScanError(f"{str(folder)!r} has no {MANIFEST} and holds parts of another grid "
                            f"({', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}); "
                            f"use a new folder")
        (folder / MANIFEST).write_text(json.dumps(
            {"fingerprint": fp, "grid": grid.describe(), "points": grid.points,
             "rows": grid.rows, "parts": grid.parts}, indent=1))
    rejected = {}
    for name, why in bad.items():  # never read as data: moved out of the dataset
        target = _parts.set_aside(folder, name)
        rejected[name] = {"reason": why, "moved_to": target.name}
        warnings.warn(f"{folder / name}: {why}; moved to {target.name}"
                      + (" and recomputed" if _parts.part_number(name) is not None
                         and _parts.part_number(name) < grid.parts else ""),
                      ScanWarning, stacklevel=2)
    todo = [k for k in range(grid.parts) if k not in done]
    sizes = {k: min(grid.part_size, grid.rows - k * grid.part_size) for k in range(grid.parts)}
    enabled = sys.stderr.isatty() if progress is None else bool(progress)
    bar = _Progress(sum(sizes[k] for k in todo), enabled)
    t0 = time.perf_counter()
    written = failed = 0
    skipped = {}
    if backend == "local":
        cache = _StructureCache(grid)
        for k in todo:
            table = _part_table(grid, grid.part_indices(k), cache, threads())
            rows, errors = _publish(table, folder, k, fp)
            written += rows
            failed += errors
            bar.update(sizes[k])
        skipped = cache.skipped
    else:
        from .ray import run_parts

        for k, table, sk in run_parts(grid, todo, address):
            rows, errors = _publish(table, folder, k, fp)
            written += rows
            failed += errors
            skipped.update(sk)
            bar.update(sizes[k])
    bar.update(0, final=True)
    seconds = time.perf_counter() - t0
    summary = {"fingerprint": fp, "parts": grid.parts, "parts_written": len(todo),
               "rows_written": written, "seconds": seconds,
               "configs_per_s": (sum(sizes[k] for k in todo) / seconds) if seconds > 0 else None,
               "skipped": {"/".join(map(str, grid._structures[s])): why
                           for s, why in sorted(skipped.items())}}
    summary["rows"] = kept_rows + written
    summary["rows_with_error_written"] = failed
    summary["rejected"] = rejected
    if plot:
        summary["plot"] = _plot_pareto(folder)
    (folder / SUMMARY).write_text(json.dumps(summary, indent=1))
    return summary

