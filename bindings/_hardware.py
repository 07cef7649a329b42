"""``pipecore calibrate``'s measurements: GEMMs, memory, kernels and collectives with torch.

:func:`measure_hardware` times, on the local torch device (CPU or CUDA),

* GEMMs over a small set of shapes (a k sweep at fixed m = n, an m = n
  sweep at fixed k, a transformer layer's four GEMMs and attention's two
  batched ones), in float32 on a CPU and bfloat16 on a GPU;
* a large copy (bytes read plus written per second) at a few sizes;
* a chain of dependent tiny kernels (seconds per kernel);
* all-reduce, reduce-scatter, all-gather and a point-to-point ping-pong
  between ``ranks`` local processes (gloo on a CPU, one rank per core;
  nccl on GPUs, one rank per GPU) over a few message sizes.

Each figure is the median of repetitions after warm-up; a repetition
loops the call enough times to last a few milliseconds (on CUDA between two
``torch.cuda.synchronize``). It returns the ``measurements`` table that
:mod:`pipecore.analysis.calibration` reads. Part of
:mod:`pipecore.bindings.torch`, which re-exports :func:`measure_hardware`.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pipecore.core.cpus import local_cpus
from pipecore.core.ops import InputError

__all__ = ["measure_hardware", "gemm_shapes"]

DEVICES = ("cpu", "cuda")
MIB = 1 << 20


def gemm_shapes(device="cpu", quick=False):
    """The GEMM shapes ``(m, n, k, batch)`` :func:`measure_hardware` times.

    A k sweep at one m = n (it determines the shape model's k_half), an
    m = n sweep at one k (its tile exponent), a transformer layer of
    hidden size h on t tokens (QKV ``t x 3h x h``, projection ``t x h x h``,
    MLP ``t x 4h x h`` and ``t x h x 4h``) and attention's batched GEMMs
    (heads x ``s x s x d`` and ``s x d x s``).

    Parameters
    ----------
    device : {"cpu", "cuda"}
        A GPU gets shapes about eight times larger on each side.
    quick : bool
        The smallest set (seconds on a CPU core), for a smoke test.

    Returns
    -------
    list of tuple of int
        Distinct shapes, in the order they are timed.

    Raises
    ------
    InputError
        An unknown device.
    """
    if device not in DEVICES:
        raise InputError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if quick:
        side, ks, sides, (h, t), (heads, s, d) = 64, (16, 64, 256), (16, 32, 64), (64, 64), (4, 32, 16)
    elif device == "cpu":
        side, ks, sides, (h, t), (heads, s, d) = 512, (64, 256, 1024, 2048), (64, 128, 256, 512, 1024), \
            (1024, 1024), (16, 512, 64)
    else:
        side, ks, sides, (h, t), (heads, s, d) = 4096, (256, 1024, 4096, 16384), \
            (256, 512, 1024, 2048, 4096, 8192), (8192, 4096), (64, 2048, 128)
    shapes = [(side, side, k, 1) for k in ks] + [(x, x, side, 1) for x in sides]
    shapes += [(t, 3 * h, h, 1), (t, h, h, 1), (t, 4 * h, h, 1), (t, h, 4 * h, 1),
               (s, s, d, heads), (s, d, s, heads)]
    return list(dict.fromkeys(shapes))


def _sizes(device, quick):
    """Copy buffer bytes and collective message bytes."""
    if quick:
        return [4 * MIB, 64 * MIB], [8, 4 * MIB]
    if device == "cpu":
        return [4 * MIB, 64 * MIB, 512 * MIB], [8, 64 * 1024, MIB, 16 * MIB, 64 * MIB]
    return [64 * MIB, 1024 * MIB], [8, 64 * 1024, MIB, 16 * MIB, 256 * MIB]


def _timed(call, sync, repeats, warmup, min_seconds):
    """Median seconds per call and each repetition's, the call looped to last ``min_seconds``."""
    for _ in range(warmup):
        call()
    sync()
    t0 = time.perf_counter()
    call()
    sync()
    once = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(10_000, math.ceil(min_seconds / once)))
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            call()
        sync()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples), samples


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _version():
    """pipecore's version as installed (the package itself sits above the bindings' layer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pipecore")
    except PackageNotFoundError:
        return "unknown"


def _host_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check(device, ranks, threads):
    if device not in DEVICES:
        raise InputError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise InputError("device 'cuda': torch sees no CUDA GPU here (torch.cuda.is_available() is "
                             "False); measure the CPU with device 'cpu'")
        have, what = torch.cuda.device_count(), "CUDA GPUs"
    else:
        have, what = local_cpus(), "CPUs this process may use"
    ranks = min(have, 2) if ranks is None and device == "cpu" else have if ranks is None else ranks
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise InputError(f"ranks must be an integer >= 2 (the collectives need two processes), got {ranks!r}")
    if ranks > have:
        raise InputError(f"ranks={ranks} is more than the {have} {what}: ranks would take turns and the "
                         f"collectives would time the scheduler; give ranks <= {have}")
    if device == "cpu":
        threads = max(1, have // ranks) if threads is None else threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InputError(f"threads must be an integer >= 1, got {threads!r}")
    return ranks, threads


def measure_hardware(device="cpu", ranks=None, quick=False, threads=None, repeats=None,
                     timeout=600.0, progress=None):
    """Measure this machine with torch: GEMMs, memory, kernel overhead, collectives.

    Parameters
    ----------
    device : {"cpu", "cuda"}
        The torch device. A CPU "device" is one rank's share of the cores:
        the GEMMs and the copy run on ``threads`` threads.
    ranks : int, optional
        Processes the collectives run on (>= 2; at most the CPUs, or the
        GPUs, there are). Default 2 on a CPU, every GPU on CUDA.
    quick : bool
        Small shapes and sizes, few repetitions: seconds, for a smoke test
        (the figures are rough: small buffers may sit in cache).
    threads : int, optional
        A CPU rank's threads; default the CPUs divided among the ranks.
    repeats : int, optional
        Timed repetitions per figure (default 7; 3 with ``quick``).
    timeout : float
        Seconds for the collectives' processes.
    progress : callable, optional
        Called as ``progress(done, total)`` after each measurement.

    Returns
    -------
    dict
        The ``measurements`` table (``pipecore.analysis.calibration``):
        text fields naming the host, device and date, ``ranks``,
        ``compute_units``, ``memory_bytes``, ``kernel_seconds`` and the
        ``gemm``, ``memory`` and ``collectives`` rows.

    Raises
    ------
    InputError
        An unknown device, no CUDA GPU, ranks below 2 or above the CPUs (or
        GPUs), a bad thread or repeat count.
    RuntimeError, TimeoutError
        If a collective rank fails or hangs.
    """
    ranks, threads = _check(device, ranks, threads)
    repeats = (3 if quick else 7) if repeats is None else repeats
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats must be an integer >= 1, got {repeats!r}")
    cuda = device == "cuda"
    shapes = gemm_shapes(device, quick)
    copies, messages = _sizes(device, quick)
    total, done = len(shapes) + len(copies) + 2, 0

    def step():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    if cuda:
        props = torch.cuda.get_device_properties(0)
        dev, dtype, sync = torch.device("cuda", 0), torch.bfloat16, torch.cuda.synchronize
        name, units, memory = props.name, props.multi_processor_count, float(props.total_memory)
    else:
        dev, dtype, sync = torch.device("cpu"), torch.float32, (lambda: None)
        host = _host_memory()
        name, units, memory = _cpu_name(), threads, None if host is None else host / ranks
    table = {"tool": "pipecore calibrate", "host": socket.gethostname(), "device": device,
             "device_name": name,
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "torch": torch.__version__, "pipecore": _version(),
             "dtype": str(dtype).removeprefix("torch."), "backend": "nccl" if cuda else "gloo",
             "ranks": ranks, "compute_units": units}
    if memory is not None:
        table["memory_bytes"] = memory
    saved = torch.get_num_threads()
    min_seconds = 0.002 if quick else 0.02
    warmup = 1 if quick else 2
    try:
        if not cuda:
            torch.set_num_threads(threads)
        gemm = []
        for m, n, k, batch in shapes:
            a = torch.randn(batch, m, k, device=dev).to(dtype)
            b = torch.randn(batch, k, n, device=dev).to(dtype)
            c = torch.empty(batch, m, n, device=dev, dtype=dtype)
            med, samples = _timed(lambda a=a, b=b, c=c: torch.bmm(a, b, out=c), sync, repeats, warmup,
                                  min_seconds)
            gemm.append({"m": m, "n": n, "k": k, "batch": batch, "seconds": med, "samples": samples})
            del a, b, c
            step()
        memory_rows = []
        for size in copies:
            src = torch.ones(size // 4, device=dev)
            dst = torch.empty_like(src)
            med, samples = _timed(lambda s=src, d=dst: d.copy_(s), sync, repeats, warmup, min_seconds)
            memory_rows.append({"op": "copy", "bytes": 2 * 4 * (size // 4), "seconds": med,
                                "samples": samples})
            del src, dst
            step()
        x, one = torch.zeros(1, device=dev), torch.ones(1, device=dev)
        chain = 200 if quick else 1000

        def tiny():
            for _ in range(chain):
                x.add_(one)  # each waits for the one before: launch plus the gap between kernels

        med, samples = _timed(tiny, sync, repeats, warmup, min_seconds)
        table["kernel_seconds"] = med / chain
        step()
    finally:
        torch.set_num_threads(saved)
    collectives = _collectives(device, ranks, messages, repeats, 1 if quick else 3, timeout)
    step()
    table.update(gemm=gemm, memory=memory_rows, collectives=collectives)
    return table


def _collectives(device, ranks, sizes, repeats, warmup, timeout):
    """The collective rows: per repetition the slowest rank, the median of those."""
    from ._run import _pins
    from ._torch_run import _free_port, launch_ranks

    cpus = _pins(None, ranks) if device == "cpu" else None
    with tempfile.TemporaryDirectory(prefix="pipecore-calibrate-") as out:
        cfg = {"port": _free_port(), "ranks": ranks, "device": device,
               "backend": "nccl" if device == "cuda" else "gloo", "cpus": cpus, "sizes": sizes,
               "repeats": repeats, "warmup": warmup, "timeout": timeout, "out": out}
        cfg_path = Path(out) / "config.json"
        cfg_path.write_text(json.dumps(cfg))
        launch_ranks(Path(__file__).with_name("_bench_rank.py"), cfg_path, ranks, timeout + 60,
                     "pipecore calibrate's collectives")
        parts = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(ranks)]
    merged = {}
    for part in parts:
        for row in part:
            merged.setdefault((row["kind"], row["bytes"]), []).append(row["samples"])
    rows = []
    for (kind, nbytes), per_rank in merged.items():
        samples = [max(s) for s in zip(*per_rank)]
        rows.append({"kind": kind, "ranks": ranks, "bytes": nbytes, "seconds": statistics.median(samples),
                     "samples": samples})
    return rows
