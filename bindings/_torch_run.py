"""Run an exported schedule for real: torch's ``_PipelineScheduleRuntime`` on CPU ranks (gloo).

Each rank is a process started with ``torch.multiprocessing`` (spawn). Every
rank builds the same seeded model, keeps the stages the schedule places on
it, loads the schedule with torch's own ``_load_csv`` and runs ``step``. The
parent compares the gradients with those of the same model trained without
pipelining. Imported by :mod:`pipecore.bindings.torch`; needs torch.
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

MODELS = ("mlp",)


def build_model(name: str, stages: int, hidden: int = 32, seed: int = 0) -> list:
    """The model of a run, split into stages; the same on every rank for a seed.

    Parameters
    ----------
    name : str
        ``"mlp"``: stage s is ``Linear(hidden, hidden)`` followed by ``Tanh``
        (the last stage has no ``Tanh``).
    stages : int
        Number of stages S.
    hidden : int
        Width of every layer.
    seed : int
        Seed of the weights.

    Returns
    -------
    list of torch.nn.Module
        One module per stage, in model order.

    Raises
    ------
    ValueError
        For an unknown model name or a count below 1.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    if stages < 1 or hidden < 1:
        raise ValueError(f"stages and hidden must be >= 1 (got {stages}, {hidden})")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in range(stages):
        lin = nn.Linear(hidden, hidden)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(hidden, hidden, generator=gen) / hidden ** 0.5)
            lin.bias.copy_(torch.randn(hidden, generator=gen) * 0.1)
        out.append(lin if s == stages - 1 else nn.Sequential(lin, nn.Tanh()))
    return out


def make_batch(batch: int, hidden: int, seed: int = 0):
    """Inputs and targets of a run (seeded, the same on every rank)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(batch, hidden, generator=gen), torch.randn(batch, hidden, generator=gen)


def loss_fn(output, target):
    """Mean squared error of one microbatch (torch then divides the sum by m)."""
    return torch.nn.functional.mse_loss(output, target)


def reference_grads(modules, x, y, microbatches):
    """Gradients of the same model without pipelining: mean over microbatches of their losses."""
    model = nn.Sequential(*modules)
    model.zero_grad()
    total = sum(loss_fn(model(xm), ym) for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)))
    (total / microbatches).backward()
    return {s: {n: p.grad.detach().clone() for n, p in mod.named_parameters()}
            for s, mod in enumerate(modules)}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _timed(fn, log, rank, stage, kind_of):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        log.append((rank, stage, kind_of(kwargs), time.perf_counter() - t0))
        return out
    return wrapper


def _instrument(stage, log, rank):
    """Time the stage's compute calls (torch waits on receives before them and sends after)."""
    s = stage.stage_index
    stage.forward_one_chunk = _timed(stage.forward_one_chunk, log, rank, s, lambda k: "F")
    stage.backward_one_chunk = _timed(stage.backward_one_chunk, log, rank, s,
                                      lambda k: "BW" if k.get("full_backward", True) else "B")
    stage.backward_weight_one_chunk = _timed(stage.backward_weight_one_chunk, log, rank, s,
                                             lambda k: "W")


def _ping_pong(rank, peer, shape, rounds):
    """One-way time of a send of ``shape`` between two ranks: half a round trip, median."""
    buf = torch.zeros(shape)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if rank < peer:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def _worker(rank, cfg):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["port"])
    torch.set_num_threads(1)  # ranks share a few cores; one thread each keeps them from fighting
    dist.init_process_group("gloo", rank=rank, world_size=cfg["ranks"],
                            timeout=datetime.timedelta(seconds=cfg["timeout"]))
    try:
        S, m = cfg["stages"], cfg["microbatches"]
        modules = build_model(cfg["model"], S, cfg["hidden"], cfg["seed"])
        x, y = make_batch(cfg["batch"], cfg["hidden"], cfg["seed"])
        mine = cfg["stages_of_rank"][rank]
        stages = [PipelineStage(modules[s], s, S, torch.device("cpu")) for s in mine]
        runtime = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn)
        runtime._load_csv(cfg["csv"], format="compute_only")  # torch's loader, validator, lowering
        log = []
        for st in stages:
            _instrument(st, log, rank)
        args = (x,) if 0 in mine else ()
        target = y if S - 1 in mine else None
        step_times, grads, op_times = [], None, []
        for i in range(cfg["steps"]):
            for s in mine:
                modules[s].zero_grad(set_to_none=True)
            log.clear()
            dist.barrier()
            t0 = time.perf_counter()
            runtime.step(*args, target=target)
            dist.barrier()
            step_times.append(time.perf_counter() - t0)
            if i == 0:
                grads = {s: {n: p.grad.detach().clone() for n, p in modules[s].named_parameters()}
                         for s in mine}
            op_times.append(list(log))
        transfer = None
        if cfg["measure_transfer"] and rank in (0, 1) and cfg["ranks"] >= 2:
            transfer = _ping_pong(rank, 1 - rank, (cfg["batch"] // m, cfg["hidden"]), 50)
        torch.save({"grads": grads, "step_times": step_times, "op_times": op_times,
                    "transfer": transfer}, Path(cfg["out"]) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@dataclass
class RunResult:
    """What a real run measured.

    Attributes
    ----------
    ranks, stages, microbatches : int
        Shape of the run.
    grads : dict
        ``{stage: {parameter name: tensor}}`` after the first step.
    reference : dict or None
        The same, from the model trained without pipelining.
    max_abs_error : float or None
        Largest absolute difference between ``grads`` and ``reference``.
    grads_match : bool or None
        ``torch.allclose`` (rtol 1e-5, atol 1e-6) on every gradient.
    step_times : list of float
        Seconds per ``step`` (between barriers), the slowest rank's, per step.
    op_times : list of list of tuple
        Per step, ``(rank, stage, kind, seconds)`` of every timed compute
        call, rank by rank in the order each rank ran them; kind is ``"F"``,
        ``"B"`` (input), ``"W"`` or ``"BW"``.
    transfer : float or None
        One-way time of one activation between two ranks (ping-pong), seconds.
    """

    ranks: int
    stages: int
    microbatches: int
    grads: dict
    reference: dict | None
    max_abs_error: float | None
    grads_match: bool | None
    step_times: list = field(default_factory=list)
    op_times: list = field(default_factory=list)
    transfer: float | None = None


def run_csv(csv_path, stages_of_rank, *, stages, microbatches, model="mlp", hidden=32, batch=None,
            steps=1, seed=0, timeout=120.0, check=True, measure_transfer=False) -> RunResult:
    """Spawn one process per rank and run the CSV with torch's runtime (see ``pt.run``)."""
    ranks = len(stages_of_rank)
    batch = 2 * microbatches if batch is None else batch
    if batch % microbatches:
        raise ValueError(f"batch {batch} must be a multiple of microbatches {microbatches}")
    with tempfile.TemporaryDirectory(prefix="pipecore-run-") as out:
        cfg = {"port": _free_port(), "ranks": ranks, "stages": stages, "microbatches": microbatches,
               "model": model, "hidden": hidden, "batch": batch, "seed": seed, "steps": steps,
               "timeout": timeout, "csv": str(csv_path), "stages_of_rank": stages_of_rank,
               "out": out, "measure_transfer": measure_transfer}
        ctx = mp.start_processes(_worker, args=(cfg,), nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout + 60
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the run did not finish in {timeout + 60:.0f} s")
        finally:
            for proc in ctx.processes:  # only our own children, by their handles
                if proc.is_alive():
                    proc.kill()
        parts = [torch.load(Path(out) / f"rank{r}.pt") for r in range(ranks)]
    grads = {s: g for part in parts for s, g in part["grads"].items()}
    step_times = [max(part["step_times"][i] for part in parts) for i in range(steps)]
    op_times = [[op for part in parts for op in part["op_times"][i]] for i in range(steps)]
    transfer = next((p["transfer"] for p in parts if p["transfer"] is not None), None)
    reference = err = match = None
    if check:
        x, y = make_batch(batch, hidden, seed)
        reference = reference_grads(build_model(model, stages, hidden, seed), x, y, microbatches)
        err, match = 0.0, True
        for s, named in reference.items():
            for n, want in named.items():
                got = grads[s][n]
                err = max(err, float((got - want).abs().max()))
                match = match and bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6))
    return RunResult(ranks, stages, microbatches, grads, reference, err, match, step_times, op_times,
                     transfer)
