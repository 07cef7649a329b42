"""Run an exported schedule for real: torch's ``_PipelineScheduleRuntime`` on CPU ranks (gloo).

Each rank is a fresh Python process running this file (``python -c`` with
runpy, see ``_LAUNCH``; arguments CONFIG RANK), so a caller's script needs
no ``if __name__ == "__main__"`` guard, unlike ``multiprocessing``'s spawn.
Every rank builds the same seeded model, keeps the stages the schedule places on
it, loads the schedule with torch's own ``_load_csv`` and runs ``step``. The
parent compares the gradients with those of the same model trained without
pipelining. Imported by :mod:`pipecore.bindings.torch`; needs torch.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from pipecore.core.ops import InputError

MODELS = ("mlp", "tiny-transformer")

#: tiny-transformer's shape: vocabulary, tokens per row, attention heads.
VOCAB, SEQ, HEADS = 256, 16, 4


class _Block(nn.Module):
    """Pre-norm transformer block: self-attention then a 4x MLP, each residual."""

    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class _Embed(nn.Module):
    """Token and learned position embeddings."""

    def __init__(self, d):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(SEQ, d))

    def forward(self, ids):
        return self.tok(ids) + self.pos[: ids.shape[1]]


class _Head(nn.Module):
    """Final norm and the projection to the vocabulary (logits, flattened for the loss)."""

    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, x):
        return self.out(self.ln(x)).reshape(-1, VOCAB)


def build_model(name: str, stages: int, hidden: int = 32, seed: int = 0,
                layers: int | None = None) -> list:
    """The model of a run, split into stages; the same on every rank for a seed.

    Parameters
    ----------
    name : str
        ``"mlp"``: ``layers`` blocks of ``Linear(hidden, hidden)`` and
        ``Tanh`` (the last block has no ``Tanh``), ``layers / stages``
        consecutive blocks per stage. ``"tiny-transformer"``: a token
        embedding (vocabulary 256, 16 positions) on the first stage,
        ``layers`` pre-norm blocks (4-head attention, 4x MLP) of width
        ``hidden``, ``layers / stages`` per stage, and the norm and
        vocabulary head on the last stage: the first and last stages carry
        more work than the others.
    stages : int
        Number of stages S.
    hidden : int
        Width of every layer (a multiple of 4 for the transformer's heads).
    seed : int
        Seed of the weights.
    layers : int, optional
        Blocks in the whole model (default: one per stage); a multiple of S.

    Returns
    -------
    list of torch.nn.Sequential
        One module per stage, in model order.

    Raises
    ------
    ValueError
        For an unknown model name, a count below 1, layers not a multiple
        of stages, or a transformer width not a multiple of the heads.
    """
    if name not in MODELS:
        raise InputError(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    layers = stages if layers is None else layers
    if stages < 1 or hidden < 1 or layers < 1:
        raise InputError(f"stages, hidden and layers must be >= 1 (got {stages}, {hidden}, {layers})")
    if layers % stages:
        raise InputError(f"layers ({layers}) must be a multiple of stages ({stages})")
    if name == "tiny-transformer":
        if hidden % HEADS:
            raise InputError(f"tiny-transformer: hidden ({hidden}) must be a multiple of the "
                             f"{HEADS} heads")
        torch.manual_seed(seed)  # torch's own initialisation, seeded: the same on every rank
        blocks = [_Block(hidden) for _ in range(layers)]
        per = layers // stages
        mods = [list(blocks[s * per:(s + 1) * per]) for s in range(stages)]
        mods[0].insert(0, _Embed(hidden))
        mods[-1].append(_Head(hidden))
        return [nn.Sequential(*m) for m in mods]
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for i in range(layers):
        lin = nn.Linear(hidden, hidden)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(hidden, hidden, generator=gen) / hidden ** 0.5)
            lin.bias.copy_(torch.randn(hidden, generator=gen) * 0.1)
        blocks += [lin] if i == layers - 1 else [lin, nn.Tanh()]
    per = 2 * (layers // stages)  # Linear + Tanh per block (the final block is one module shorter)
    return [nn.Sequential(*blocks[s * per:(s + 1) * per]) for s in range(stages)]


def make_batch(batch: int, hidden: int, seed: int = 0, model: str = "mlp"):
    """Inputs and targets of a run (seeded, the same on every rank).

    For ``tiny-transformer``: token ids ``(batch, SEQ)`` and next-token
    targets flattened to ``(batch * SEQ,)``."""
    gen = torch.Generator().manual_seed(seed + 1)
    if model == "tiny-transformer":
        ids = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=gen)
        return ids[:, :-1].contiguous(), ids[:, 1:].reshape(-1).contiguous()
    return torch.randn(batch, hidden, generator=gen), torch.randn(batch, hidden, generator=gen)


def loss_fn(output, target):
    """Mean loss of one microbatch (torch then divides the sum by m): MSE, or cross
    entropy when the target holds token ids."""
    if target.dtype == torch.long:
        return torch.nn.functional.cross_entropy(output, target)
    return torch.nn.functional.mse_loss(output, target)


def reference_grads(modules, x, y, microbatches):
    """Gradients of the same model without pipelining: mean over microbatches of their losses."""
    model = nn.Sequential(*modules)
    model.zero_grad()
    total = sum(loss_fn(model(xm), ym) for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)))
    (total / microbatches).backward()
    return {s: {n: p.grad.detach().clone() for n, p in mod.named_parameters()}
            for s, mod in enumerate(modules)}


def profiled_steps(steps: int) -> list:
    """Indices of the steps a profiled run of ``steps`` steps profiles.

    The first step sets torch's stages up (shape inference, communication
    buffers) and is never profiled, except in a one-step run, which
    profiles its only step, set-up included. Runs of 2-4 steps profile
    every step after the first. Runs of 5 or more profile the middle of
    the steps after the first and leave about half of them unprofiled
    around it (:func:`reference_steps`): the same work timed without the
    profiler, which slows each operator it records.

    Parameters
    ----------
    steps : int
        Steps of the run (>= 1).

    Returns
    -------
    list of int
        Indices into the run's ``step_times``.
    """
    if steps <= 4:
        return list(range(1 if steps > 1 else 0, steps))
    rest = steps - 1
    before = max(1, (rest // 2) // 2)
    return list(range(1 + before, 1 + before + rest - rest // 2))


def reference_steps(steps: int) -> list:
    """A profiled run's unprofiled steps after the first, as indices: those
    :func:`profiled_steps` leaves out for a run of ``steps`` (none up to 4)."""
    prof = set(profiled_steps(steps))
    return [i for i in range(1, steps) if i not in prof] if steps > 4 else []


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


def _instrument_p2p(module, log, rank):
    """Time torch's posting of sends/receives and its waits on them (module globals it calls)."""
    module._batch_p2p = _timed(module._batch_p2p, log, rank, -1, lambda k: "post")
    module._wait_batch_p2p = _timed(module._wait_batch_p2p, log, rank, -1, lambda k: "wait")


def _thread_count():
    """Threads of this process now (Linux), or None where /proc has no task list."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _worker(rank, cfg):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as torch_schedules
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["port"])
    if cfg.get("cpus"):
        # Before gloo starts its threads: they inherit the rank's one core, so a rank's
        # communication competes with its own compute, never with another rank's.
        os.sched_setaffinity(0, {cfg["cpus"][rank]})
    torch.set_num_threads(1)  # ranks share a few cores; one thread each keeps them from fighting
    dist.init_process_group("gloo", rank=rank, world_size=cfg["ranks"],
                            timeout=datetime.timedelta(seconds=cfg["timeout"]))
    threads = _thread_count()
    try:
        S, m = cfg["stages"], cfg["microbatches"]
        modules = build_model(cfg["model"], S, cfg["hidden"], cfg["seed"], cfg["layers"])
        x, y = make_batch(cfg["batch"], cfg["hidden"], cfg["seed"], cfg["model"])
        mine = cfg["stages_of_rank"][rank]
        stages = [PipelineStage(modules[s], s, S, torch.device("cpu")) for s in mine]
        runtime = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn)
        runtime._load_csv(cfg["csv"], format="compute_only")  # torch's loader, validator, lowering
        log = []
        for st in stages:
            _instrument(st, log, rank)
        _instrument_p2p(torch_schedules, log, rank)
        args = (x,) if 0 in mine else ()
        target = y if S - 1 in mine else None
        step_times, grads, op_times = [], None, []
        prof = None
        profiled = profiled_steps(cfg["steps"]) if cfg.get("profile") else []
        first, last = (profiled[0], profiled[-1]) if profiled else (None, None)
        if first is not None:
            from torch.profiler import ProfilerActivity, profile
            prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        for i in range(cfg["steps"]):
            for s in mine:
                modules[s].zero_grad(set_to_none=True)
            dist.barrier()
            log.clear()
            if prof is not None and i == first:
                prof.start()
            # perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process of the machine.
            t0 = time.perf_counter()
            if prof is not None and first <= i <= last:
                # The label torch.profiler's own step() writes, so user traces read the same way.
                with torch.profiler.record_function(f"ProfilerStep#{i}"):
                    runtime.step(*args, target=target)
            else:
                runtime.step(*args, target=target)
            step_times.append((t0, time.perf_counter()))
            if prof is not None and i == last:
                prof.stop()  # the steps after it are the unprofiled reference
            dist.barrier()
            if i == 0:
                grads = {s: {n: p.grad.detach().clone() for n, p in modules[s].named_parameters()}
                         for s in mine}
            op_times.append(list(log))
        if prof is not None:
            Path(cfg["profile"]).mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(Path(cfg["profile"]) / f"rank{rank}.json"))
        transfer = None
        if cfg["measure_transfer"] and rank in (0, 1) and cfg["ranks"] >= 2:
            transfer = _ping_pong(rank, 1 - rank, (cfg["batch"] // m, cfg["hidden"]), 50)
        torch.save({"grads": grads, "step_times": step_times, "op_times": op_times,
                    "transfer": transfer, "threads": threads,
                    "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else None}, Path(cfg["out"]) / f"rank{rank}.pt")
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
        Seconds per ``step``: from the first rank's start (all leave a
        barrier together) to the last rank's end.
    op_times : list of list of tuple
        Per step, ``(rank, stage, kind, seconds)`` of every timed call, rank
        by rank in the order each rank ran them; kind is ``"F"``, ``"B"``
        (input), ``"W"`` or ``"BW"`` for compute (stage >= 0), ``"post"``
        (torch posting sends/receives) or ``"wait"`` (waiting on them) with
        stage -1.
    transfer : float or None
        One-way time of one activation between two ranks (ping-pong), seconds.
    rank_times : list of list of float
        Per step, each rank's own seconds in ``step``.
    profiled_steps : list of int
        Indices into ``step_times`` of the steps ``torch.profiler``
        recorded (empty for a run without ``profile``).
    cpus : list of list of int
        Per rank, the CPUs it could run on (one each when pinned).
    threads : list of int or None
        Per rank, its threads once gloo had started (torch's one compute
        thread, gloo's and the interpreter's): they share the rank's CPUs.
    reference_steps : list of int
        Indices of a profiled run's unprofiled steps after the first (empty
        for runs of up to 4 steps and runs without ``profile``): the same
        ops timed without the profiler.
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
    rank_times: list = field(default_factory=list)
    profiled_steps: list = field(default_factory=list)
    cpus: list = field(default_factory=list)
    threads: list = field(default_factory=list)
    reference_steps: list = field(default_factory=list)

    def iteration_time(self, warmup: int = 1) -> float:
        """Median seconds per step, leaving out the first ``warmup`` steps (when there are more).

        Parameters
        ----------
        warmup : int
            Steps to leave out (torch sets up its stages in the first).

        Returns
        -------
        float

        Raises
        ------
        ValueError
            If the run has no steps.
        """
        if not self.step_times:
            raise InputError("the run has no steps")
        times = self.step_times[warmup:] if len(self.step_times) > warmup else self.step_times
        return statistics.median(times)

    def op_seconds(self) -> dict:
        """Mean seconds of each stage's compute kind, profiled and unprofiled.

        Returns
        -------
        dict
            ``{"stage,kind": {"profiled": s, "reference": s}}`` over
            the ``profiled_steps`` and ``reference_steps`` (a side
            without steps is left out); the ratio is what the profiler
            added to that kind's time in this run.
        """
        out: dict = {}
        for side, steps in (("profiled", self.profiled_steps), ("reference", self.reference_steps)):
            samples: dict = {}
            for i in steps:
                for _rank, stage, kind, seconds in self.op_times[i]:
                    if stage >= 0:
                        samples.setdefault(f"{stage},{kind}", []).append(seconds)
            for key, values in samples.items():
                # Means, as from_profile's costs: the profiler's long calls count in the ratio.
                out.setdefault(key, {})[side] = statistics.fmean(values)
        return out


# A rank runs this file without importing the pipecore package (numba and
# the rest: 1.3 s alone, about 4 s when four ranks share two cores) and
# without this folder on sys.path (its torch.py would shadow torch).
_LAUNCH = ("import runpy, sys\n"
           "if sys.path and sys.path[0] == '':\n"  # -c puts the working folder first
           "    sys.path.pop(0)\n"
           "sys.argv = sys.argv[1:]\n"
           "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def launch_ranks(script, cfg_path, ranks, timeout, what):
    """Run ``script`` as ``ranks`` fresh processes (arguments CONFIG RANK) and wait for them.

    Each runs the file as ``__main__`` (``_LAUNCH``); a rank that fails or
    a run that outlasts ``timeout`` seconds ends every process started here.

    Parameters
    ----------
    script : str or os.PathLike
        The file each rank runs.
    cfg_path : str or os.PathLike
        Its configuration (the ranks' first argument).
    ranks : int
        Processes.
    timeout : float
        Seconds for all of them.
    what : str
        The run, for messages (``"the torch run"``).

    Raises
    ------
    TimeoutError
        If they do not finish in time.
    RuntimeError
        If a rank exits with an error (the end of its traceback included).
    """
    procs = [subprocess.Popen([sys.executable, "-c", _LAUNCH, str(script), str(cfg_path), str(r)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r in range(ranks)]
    errors = {}
    try:
        deadline = time.monotonic() + timeout
        for r, proc in enumerate(procs):
            _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            if proc.returncode != 0:
                errors[r] = err
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{what} did not finish in {timeout:.0f} s") from None
    finally:
        for proc in procs:  # only the processes started here, by their handles
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors:
        # The rank that failed first explains it; the others usually fail on the lost peer.
        rank, err = min(errors.items(), key=lambda kv: ("Traceback" not in kv[1], kv[0]))
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise RuntimeError(f"rank {rank} of {what} failed (exit {procs[rank].returncode}):\n{tail}")


def run_csv(csv_path, stages_of_rank, *, stages, microbatches, model="mlp", hidden=32, layers=None,
            batch=None, steps=1, seed=0, timeout=120.0, check=True,
            measure_transfer=False, profile=None, cpus=None) -> RunResult:
    """Spawn one process per rank and run the CSV with torch's runtime (see ``pt.run``)."""
    ranks = len(stages_of_rank)
    batch = 2 * microbatches if batch is None else batch
    if batch % microbatches:
        raise InputError(f"batch {batch} must be a multiple of microbatches {microbatches}")
    with tempfile.TemporaryDirectory(prefix="pipecore-run-") as out:
        cfg = {"port": _free_port(), "ranks": ranks, "stages": stages, "microbatches": microbatches,
               "model": model, "hidden": hidden, "layers": layers, "batch": batch, "seed": seed,
               "steps": steps,
               "timeout": timeout, "csv": str(csv_path), "stages_of_rank": stages_of_rank,
               "out": out, "measure_transfer": measure_transfer, "cpus": cpus,
               "profile": None if profile is None else str(Path(profile).resolve())}
        cfg_path = Path(out) / "config.json"
        cfg_path.write_text(json.dumps(cfg))
        launch_ranks(__file__, cfg_path, ranks, timeout + 60, "the torch run")
        parts = [torch.load(Path(out) / f"rank{r}.pt") for r in range(ranks)]
    grads = {s: g for part in parts for s, g in part["grads"].items()}
    # A step spans from the first rank's start to the last rank's end (one clock for all processes).
    step_times = [max(part["step_times"][i][1] for part in parts)
                  - min(part["step_times"][i][0] for part in parts) for i in range(steps)]
    rank_times = [[part["step_times"][i][1] - part["step_times"][i][0] for part in parts]
                  for i in range(steps)]
    op_times = [[op for part in parts for op in part["op_times"][i]] for i in range(steps)]
    transfer = next((p["transfer"] for p in parts if p["transfer"] is not None), None)
    reference = err = match = None
    if check:
        x, y = make_batch(batch, hidden, seed, model)
        reference = reference_grads(build_model(model, stages, hidden, seed, layers), x, y,
                                    microbatches)
        err, match = 0.0, True
        for s, named in reference.items():
            for n, want in named.items():
                got = grads[s][n]
                err = max(err, float((got - want).abs().max()))
                match = match and bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6))
    return RunResult(ranks, stages, microbatches, grads, reference, err, match, step_times, op_times,
                     transfer, rank_times, profiled_steps(steps) if profile is not None else [],
                     [part.get("cpus") for part in parts], [part.get("threads") for part in parts],
                     reference_steps(steps) if profile is not None else [])


if __name__ == "__main__":
    _worker(int(sys.argv[2]), json.loads(Path(sys.argv[1]).read_text()))
    # Everything is saved: skip torch's interpreter teardown, which took 3-5 s
    # per run here (four ranks on two cores). A failure above exits normally.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
