"""Compile pipecore's Numba kernels into the cache ahead of use.

A fresh install compiles each kernel the first time a call needs it (minutes
in all; bench/compile_times.py times those of the main job). ``pipecore warm`` (or
:func:`warm`) runs every kernel once at a tiny size, with the size
thresholds that keep small calls on numpy lowered to zero, so that later
processes load them from Numba's cache (``__pycache__`` beside the
package, or ``NUMBA_CACHE_DIR``): for container images, CI machines, and
the test suite, which starts it on the idle core (tests/conftest.py).

The kernels compile with the argument types of pipecore's own calls, so a
warmed cache serves those calls; a kernel met with other types compiles as
it would have anyway.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from .core.ops import InputError


@contextlib.contextmanager
def _thresholds_at_zero():
    """Send every size-gated call to its kernel (undone on exit)."""
    from .core import optable, rules, tier
    from .schedules import bitpipe, block_kernels, chimera, construct, dualpipe, generate

    saved = []
    for mod, name in ((construct, "SCATTER_MIN_OPS"), (rules, "FAST_MIN_OPS"),
                      (optable, "FAST_MIN_OPS"),
                      (generate, "ZBV_KERNEL_MIN_OPS"), (generate, "GREEDY_KERNEL_MIN_OPS"),
                      (bitpipe, "BITPIPE_KERNEL_MIN_OPS"), (chimera, "CHIMERA_KERNEL_MIN_OPS"),
                      (dualpipe, "DUALPIPE_KERNEL_MIN_OPS"),
                      (block_kernels, "_KERNEL_MIN_OPS"), (tier, "INTERPRET_MAX_OPS")):
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, 0)
    try:
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


def _steps():
    """Each step of :data:`STEPS` by name: small, valid pipecore calls."""
    import pipecore as pc

    unit = pc.Costs(f=1.0, b=1.0, w=1.0, comm=0.1, activation=1.0, activation_w=0.5)
    net = pc.Network.uniform(bytes=1.0, bandwidth=2.0, latency=0.1)

    def simulate():
        for fam in ("1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "chimera", "dualpipev"):
            s = pc.build(fam, 4, 8)
            pc.simulate(s, unit)
            pc.simulate(s, unit, network=net)

    def adaptive():
        pc.adaptive.adaptive_v(4, 8, unit, 4.0)

    def batch():
        s = pc.build("zb-h1", 4, 8)
        table = {"f": np.array([1.0, 2.0]), "b": np.array([1.0, 2.0]),
                 "w": np.array([1.0, 1.0]), "comm": np.array([0.1, 0.2])}
        pc.simulate_many(s, table, net)
        pc.simulate_many(s, table, net, method="list")

    def builders():
        for fam in pc.schedules():  # every family builds at p=4, m=8
            pc.build(fam, 4, 8)

    def generators():
        pc.generate.zbv_greedy(4, 8, unit)
        pc.generate.memory_greedy([0, 1, 2, 3], 8, unit)

    def recompute_offload():
        s = pc.build("1f1b", 4, 8)
        pc.simulate(pc.recompute(s, stages=[0]), unit)
        pc.simulate(pc.offload(s, stages=[0]), pc.Costs(f=1.0, b=1.0, w=1.0, offload=0.5))

    def search():
        pc.search.local_search(pc.build("1f1b", 4, 8), unit, max_evals=200)

    def variation():
        pc.monte_carlo(pc.build("1f1b", 4, 8), unit, pc.Jitter.lognormal(0.1), draws=64)

    def tune():
        pc.tune(4, 8, unit, memory_limit=4.0)

    return {"simulate_many": batch, "builders": builders, "adaptive": adaptive,
            "generate": generators, "local search": search, "monte carlo": variation,
            "recompute and offload": recompute_offload, "tune": tune, "simulate": simulate}


# The order warm() runs them in: the test suite meets simulate's kernels at
# once (and compiles them itself); the batch kernels, the slowest to
# compile, a minute later.
STEPS = ("simulate_many", "builders", "adaptive", "generate", "local search", "monte carlo",
         "recompute and offload", "tune", "simulate")


def warm(out=None, steps=None) -> dict:
    """Compile every kernel pipecore's calls use into Numba's cache.

    Parameters
    ----------
    out : file-like, optional
        Where to print one line per step (its seconds); None prints nothing.
    steps : sequence of str, optional
        Run only these of :data:`STEPS` (default all, in that order).

    Returns
    -------
    dict
        Seconds per step, in the order run (a step whose kernels were
        already cached takes well under a second).

    Raises
    ------
    ValueError
        If ``steps`` names an unknown step.
    Exception
        Whatever a step raises (each is a small, valid pipecore call).
    """
    known = _steps()
    chosen = list(STEPS) if steps is None else list(steps)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise InputError(f"unknown warm-up step {unknown[0]!r}; steps are {', '.join(STEPS)}")
    seconds = {}
    with _thresholds_at_zero():
        for name in chosen:
            t0 = time.perf_counter()
            known[name]()
            seconds[name] = time.perf_counter() - t0
            if out is not None:
                print(f"{seconds[name]:7.2f} s  {name}", file=out, flush=True)
    return seconds


if __name__ == "__main__":
    warm(None if "--quiet" in sys.argv else sys.stdout)
