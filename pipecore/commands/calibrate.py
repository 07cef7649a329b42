"""``pipecore calibrate``: measure this machine's GEMMs, memory, kernels and collectives
with torch (``pipecore[torch]``) and write them, with the constants they give, as a
hardware file that ``pipecore plan --hardware`` and :meth:`pipecore.Cluster.from_file` read."""

from __future__ import annotations

import sys
import textwrap

from ..core.ops import InputError
from ..core.progress import Progress, enabled
from .options import output_file, positive_int, write_file

__all__ = ["calibrate_arguments", "calibrate_command"]

WIDTH = 120


def calibrate_arguments(p):
    from ..plan.hardware import GPU

    p.add_argument("--out", default="hardware.toml", metavar="FILE",
                   help="the hardware file to write (default hardware.toml): [gpus.NAME] and "
                        "[clusters.local] entries of the presets' form, each value with its source, and "
                        "the raw [measurements]")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="the torch device to measure (default cpu; cuda: the GPUs, one rank each)")
    p.add_argument("--ranks", type=positive_int, default=None,
                   help="processes the collectives run on (>= 2, at most the CPUs or GPUs; default 2 on "
                        "a CPU, every GPU on cuda)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="a CPU rank's threads for the GEMMs and the copy (default: CPUs / ranks)")
    p.add_argument("--quick", action="store_true",
                   help="the smallest shapes and sizes, 3 repetitions: seconds, rough figures")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timed repetitions per figure, median taken (default 7; 3 with --quick)")
    p.add_argument("--like", choices=GPU.presets(), default=None,
                   help="a GPU preset whose data-sheet peaks (FLOP/s, memory bandwidth) are kept, so "
                        "MFU is against the data sheet (default: the peaks are the measured rates)")
    p.add_argument("--price-per-gpu-hour", type=float, default=None, metavar="USD",
                   help="USD per device-hour, for the planner's costs (default: none, costs are NaN)")
    p.add_argument("--progress", action="store_true", default=None,
                   help="draw a progress bar (default: when stderr is a terminal)")


def _size(nbytes):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _seconds(s):
    return f"{s * 1e6:.3g} us" if s < 1e-3 else f"{s * 1e3:.3g} ms"


def calibrate_command(args, out):
    try:
        from pipecore.bindings._hardware import measure_hardware
    except ImportError as exc:
        print(f"pipecore: calibrate measures with PyTorch: {exc}; install it with: "
              f"pip install 'pipecore[torch]'", file=sys.stderr)
        return 2
    from ..analysis.calibration import KINDS, read_measurements
    from ..plan.calibrate import (
        calibrated_gpu,
        calibration_toml,
        gemm_error,
        gpu_entry,
        gpu_key,
        measurements_toml,
    )

    output_file("--out", args.out)  # a missing folder is said now, not after the measuring
    price = args.price_per_gpu_hour
    if price is not None and not 0 <= price < float("inf"):
        raise InputError(f"--price-per-gpu-hour must be USD per device-hour, finite and >= 0, got {price}")
    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            bar = Progress(total, enabled(args.progress), unit="measurements")
        bar.update(1, final=done == total)

    table = measure_hardware(args.device, args.ranks, args.quick, args.threads, args.repeats,
                             progress=progress)
    if args.like is not None:
        table["like"] = args.like
    try:
        text = calibration_toml(table, price_per_gpu_hour=price)
    except InputError as exc:  # keep what took minutes to measure; it can be refitted
        write_file(args.out, "--out", lambda p: p.write_text(measurements_toml(table)))
        raise InputError(f"{exc} (the measurements alone are in {args.out}: refit them with "
                         f"pc.GPU.calibrate({args.out!r}, like=...))") from None
    path = write_file(args.out, "--out", lambda p: p.write_text(text))
    meas = read_measurements(table)
    gpu = calibrated_gpu(meas)
    entry = gpu_entry(meas)
    meta = meas.meta
    rate, best = meas.gemm_rate()
    rates = [2.0 * r["m"] * r["n"] * r["k"] * r["batch"] / r["seconds"] for r in meas.gemm]
    bw, row = meas.memory_bandwidth()
    units = meta.get("compute_units", 1)
    where = (f"{units} thread{'s' if units > 1 else ''} per rank" if meta.get("device") == "cpu" else
             f"{units} SMs")
    said = [f"{meta.get('device_name', 'device')} ({meta.get('device', 'torch')}, {where}, "
            f"{meta.get('ranks', '?')} ranks)", meta.get("dtype"),
            f"torch {meta['torch']}" if "torch" in meta else None,
            f"host {meta['host']}" if "host" in meta else None, meta.get("date")]
    lines = textwrap.wrap("pipecore calibrate: " + ", ".join(s for s in said if s), WIDTH,
                          subsequent_indent="  ")
    shape = "x".join(str(best[d]) for d in ("m", "n", "k")) + (f" batch {best['batch']}" if best["batch"] > 1
                                                                else "")
    lines.append(f"{'GEMM':<15} best {rate / 1e9:.4g} GFLOP/s at {shape} (higher is faster); {len(rates)} "
                 f"shapes from {min(rates) / 1e9:.3g} to {max(rates) / 1e9:.3g} GFLOP/s")
    lines.append(f"{'':<15} shape model: k_half {gpu.gemm_k_half:g}, tile exponent "
                 f"{gpu.gemm_tile_exponent:g}, e_max {gpu.gemm_max_efficiency:.3f}; RMS log-time error "
                 f"{gemm_error(gpu, meas):.0%} over the shapes")
    lines.append(f"{'memory':<15} {bw / 1e9:.4g} GB/s (a {row['op']} moving {_size(row['bytes'])}, read + "
                 f"written; higher is faster)")
    lines.append(f"{'kernel':<15} {_seconds(gpu.kernel_overhead)} per tiny kernel (lower is faster)")
    for kind in KINDS:
        f = meas.collective(kind)
        what = "bandwidth" if kind == "p2p" else "busbw"
        lines.append(f"{kind:<15} {what} {f['busbw'] / 1e9:.4g} GB/s at {_size(f['largest']['bytes'])}, "
                     f"{_seconds(f['latency'])} at {_size(f['smallest']['bytes'])}"
                     f"{' one way' if kind == 'p2p' else ''} ({meta.get('backend')}, {f['ranks']} ranks)")
    lines.append("(GB = 1e9 bytes; busbw: nccl-tests' bus bandwidth; higher bandwidth and lower latency are "
                 "faster)")
    lines += textwrap.wrap(f"wrote {path}: [gpus.{gpu_key(meas)}], [clusters.local] (each value with its "
                           f"source) and [measurements]", WIDTH, subsequent_indent="  ",
                           break_long_words=False, break_on_hyphens=False)
    if entry["peak_flops"] == rate:
        lines += textwrap.wrap("peak_flops is the measured best GEMM rate (no data sheet: --like PRESET "
                               "keeps one), so MFU reads as a share of what this device reached",
                               WIDTH, subsequent_indent="  ")
    lines += textwrap.wrap(f"next: pipecore plan --model megatron-1.7b --hardware {path} --global-batch 32",
                           WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    out.write("\n".join(lines) + "\n")
    return 0
