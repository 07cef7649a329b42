"""A schedule run for real on CPU ranks: checks, export, CPU pinning, the run file.

:func:`run` validates the schedule, writes its CSV and hands it to the rank
processes of :mod:`pipecore.bindings._torch_run`; with ``profile`` it writes
the run file that :func:`pipecore.bindings.torch.from_profile` and
``pipecore what-if --check`` read. Part of :mod:`pipecore.bindings.torch`,
which re-exports :func:`run`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipecore.core.ops import InputError

from ._export import from_csv, to_csv, validate

__all__ = ["run"]


def run(schedule, ranks: int | None = None, *, model: str = "mlp", hidden: int = 32,
        layers: int | None = None, batch: int | None = None, steps: int = 1, seed: int = 0,
        timeout: float = 120.0, check: bool = True, measure_transfer: bool = False,
        profile=None, pin: bool | None = None):
    """Run a schedule for real with torch's ``_PipelineScheduleRuntime`` on CPU ranks (gloo).

    One fresh Python process per rank is started (``MASTER_ADDR``
    127.0.0.1, a free port). Every rank builds the same seeded model split
    into the schedule's stages, keeps its own stages, loads the schedule's
    ``compute_only`` CSV with torch's ``_load_csv`` and calls ``step`` on
    one batch per step.

    Parameters
    ----------
    schedule : pipecore.Schedule, str or os.PathLike
        The schedule, or a CSV written by :func:`to_csv` (or torch's
        ``_dump_csv``).
    ranks : int, optional
        Must equal the schedule's devices when given (a check for the CLI).
    model : str
        ``"mlp"``: blocks of ``Linear(hidden, hidden)`` + ``Tanh``, split
        evenly into the schedule's stages; ``"tiny-transformer"``: token
        embedding, pre-norm attention blocks, vocabulary head (see
        ``_torch_run.build_model``), embedding on the first stage and head
        on the last.
    hidden : int
        Layer width.
    layers : int, optional
        Blocks in the whole model (default one per stage); a multiple of the
        stages.
    batch : int, optional
        Rows per step (default 2 per microbatch); a multiple of the
        microbatches.
    steps : int
        Steps to run (gradients are those of the first; more give timings).
    seed : int
        Seed of weights and data.
    timeout : float
        Seconds for torch's collectives; the run is abandoned (its processes
        killed) a minute after that.
    check : bool
        Compare gradients with the model trained without pipelining.
    measure_transfer : bool
        Also time a ping-pong of one activation between ranks 0 and 1.
    profile : str or os.PathLike, optional
        A folder: every rank profiles steps with ``torch.profiler`` (CPU
        activities, shapes recorded), each step inside a
        ``ProfilerStep#i`` label, and writes ``rank{r}.json``
        (Chrome/Kineto trace) there, and ``pipecore-run.json`` (the model,
        shape, profiled and reference steps, each stage's compute times
        with and without the profiler, and the machine's CPUs); read them
        with :func:`from_profile`. The first step sets torch's stages up
        and is not profiled (a one-step run profiles its only step, set-up
        included); runs of up to 4 steps profile the others; longer runs
        profile the middle ones and time the rest without the profiler as
        a reference (``RunResult.profiled_steps``,
        ``RunResult.reference_steps``), which :func:`from_profile` uses to
        take out what the profiler adds to each op.
    pin : bool, optional
        Pin rank r to the r-th CPU this process may use
        (``os.sched_setaffinity``, before gloo starts its threads), so no
        two ranks share a core and none migrates. None (default): pin when
        there are at least as many CPUs as ranks; True: pin, or refuse when
        there are fewer; False: let the OS place them.
        ``RunResult.cpus`` says where each rank ran.

    Returns
    -------
    RunResult
        Gradients, the reference and their largest difference, per-step
        times and per-op times.

    Raises
    ------
    ValueError
        If the schedule cannot be exported, ``ranks`` disagrees with it, or
        an argument is out of range.
    TimeoutError
        If the processes do not finish.
    RuntimeError
        If a rank fails (the end of its traceback included).
    """
    from . import _torch_run

    if isinstance(schedule, (str, bytes)) or hasattr(schedule, "__fspath__"):
        path = Path(schedule).resolve()  # the rank processes read it
        sched = from_csv(path)
    else:
        sched, path = schedule, None
    if ranks is not None and ranks != sched.devices:
        raise InputError(f"the schedule has {sched.devices} ranks (got ranks={ranks})")
    for what, value in (("steps", steps), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"'{what}' must be an int >= 1 (got {value!r})")
    _torch_run.build_model(model, sched.stages, hidden, seed, layers)  # bad model arguments fail here
    mapping = validate(sched)
    stages_of_rank = [[s for s in sorted(mapping) if mapping[s] == r] for r in range(sched.devices)]
    cpus = _pins(pin, sched.devices)
    kwargs = dict(stages=sched.stages, microbatches=sched.microbatches, model=model, hidden=hidden,
                  layers=layers, batch=batch, steps=steps, seed=seed, timeout=timeout, check=check,
                  measure_transfer=measure_transfer, profile=profile, cpus=cpus)
    if path is not None:
        result = _torch_run.run_csv(path, stages_of_rank, **kwargs)
    else:
        with tempfile.TemporaryDirectory(prefix="pipecore-csv-") as tmp:
            csv_path = to_csv(sched, Path(tmp) / "schedule.csv")
            result = _torch_run.run_csv(csv_path, stages_of_rank, **kwargs)
    if profile is not None:
        # What `pipecore what-if --check` needs to run other schedules on the same setup.
        import json

        from pipecore.core.cpus import local_cpus

        from ._profile import RUN_FILE

        (Path(profile) / RUN_FILE).write_text(json.dumps(
            {"schedule": sched.name, "ranks": sched.devices, "stages": sched.stages,
             "microbatches": sched.microbatches, "model": model, "hidden": hidden,
             "layers": layers, "batch": batch, "steps": steps, "seed": seed,
             "profiled_steps": result.profiled_steps,
             "reference_steps": result.reference_steps, "op_seconds": result.op_seconds(),
             "step_times": result.step_times,
             "cpus": local_cpus(),
             "pinned": cpus, "threads": result.threads, "pin": pin}, indent=1))
    return result


def _pins(pin, ranks):
    """The CPU of each rank (a list), or None to leave placement to the OS."""
    from pipecore.core.cpus import cpu_ids

    if pin not in (None, True, False):
        raise InputError(f"'pin' must be None, True or False (got {pin!r})")
    ids = cpu_ids()
    if pin is False or ids is None and pin is None:
        return None
    if ids is None:
        raise InputError("pin=True: this OS gives no CPU affinity (os.sched_setaffinity)")
    if len(ids) < ranks:
        if pin:
            raise InputError(f"pin=True needs a CPU per rank: {ranks} ranks, {len(ids)} CPUs "
                             f"this process may use ({ids})")
        return None
    return ids[:ranks]
