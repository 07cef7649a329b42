"""Per-op reference builders of the schedule families with closed-form builders.

Each is the plain loop a family was first written as: per-device programs of
``(kind, stage, microbatch)`` tuples. The tests compare the vectorised
builders (numpy at small shapes, the Numba kernels of kernels/slots.py at
scale) with them op for op; the package never calls them.
"""

from pipecore.schedules import ProgramBuilder, programs_to_schedule

__all__ = ["gpipe_reference", "one_f_one_b_reference", "split_1f1b_reference",
           "looped_bfs_reference", "interleaved_reference", "interleaved_zb_reference",
           "zb_v_reference"]


def gpipe_reference(devices, microbatches):
    """Per-op reference of :func:`pipecore.schedules.gpipe.build_gpipe`."""
    programs = []
    for d in range(devices):
        prog = [("F", d, j) for j in range(microbatches)]
        prog += [("BW", d, j) for j in range(microbatches)]
        programs.append(prog)
    return programs_to_schedule("gpipe", programs, devices)


def one_f_one_b_reference(devices, microbatches, warmup):
    """Warm-up forwards, then alternate backward/forward, then drain.

    ``warmup[d]`` forwards run before device d's first backward. The per-op
    reference of ``schedules.onef1b._one_f_one_b_slots``; programs, not a
    Schedule.
    """
    programs = []
    m = microbatches
    for d in range(devices):
        k = warmup[d]
        prog = [("F", d, j) for j in range(k)]
        for j in range(m - k):
            prog.append(("BW", d, j))
            prog.append(("F", d, k + j))
        prog += [("BW", d, j) for j in range(m - k, m)]
        programs.append(prog)
    return programs


def split_1f1b_reference(devices, microbatches, warmup, lag, name):
    """1F1B-style programs with a split backward (the per-op reference of
    ``schedules.zerobubble.split_1f1b_slots``).

    Device d runs ``warmup[d]`` forwards, then for each microbatch j: B(j),
    the W that is ``lag[d]`` microbatches behind (W(j - lag[d])), and the
    next forward; the lagging W ops run at the end. A lag of d's lets device
    d fill its cool-down waits with weight gradients.
    """
    m = microbatches
    programs = []
    for d in range(devices):
        k = min(warmup[d], m)
        prog = [("F", d, j) for j in range(k)]
        for j in range(m):
            prog.append(("B", d, j))
            if j - lag[d] >= 0:
                prog.append(("W", d, j - lag[d]))
            if j + k < m:
                prog.append(("F", d, j + k))
        prog += [("W", d, j) for j in range(max(0, m - lag[d]), m)]
        programs.append(prog)
    return programs_to_schedule(name, programs, devices)


def looped_bfs_reference(devices, microbatches, chunks=2):
    """Per-op reference of :func:`pipecore.schedules.bfs.build_looped_bfs`."""
    p, m, v = devices, microbatches, chunks
    programs = []
    for d in range(p):
        prog = [("F", c * p + d, j) for c in range(v) for j in range(m)]
        prog += [("BW", c * p + d, j) for c in reversed(range(v)) for j in reversed(range(m))]
        programs.append(prog)
    return programs_to_schedule("looped-bfs", programs, p)


def interleaved_reference(devices, microbatches, chunks=2):
    """Per-op reference of :func:`pipecore.schedules.interleaved.build_interleaved`."""
    p, m, v = devices, microbatches, chunks
    total = m * v

    def fwd(d, k):
        return ("F", ((k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    def bwd(d, k):
        return ("BW", (v - 1 - (k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    programs = []
    for d in range(p):
        warm = total if m == p else min(2 * (p - d - 1) + (v - 1) * p, total)
        prog = [fwd(d, k) for k in range(warm)]
        for j in range(total - warm):
            prog.append(fwd(d, warm + j))
            prog.append(bwd(d, j))
        prog += [bwd(d, j) for j in range(total - warm, total)]
        programs.append(prog)
    return programs_to_schedule("interleaved-1f1b", programs, p)


def interleaved_zb_reference(devices, microbatches, chunks=2):
    """Per-op reference of :func:`pipecore.schedules.interleaved.build_interleaved_zb`."""
    p, m, v = devices, microbatches, chunks
    r = m // max(1, m // p)  # microbatches per round
    total = m * v
    programs = []
    for d in range(p):
        warm = min((v - 1) * r + p - 1 - d, total)
        prog = ProgramBuilder()
        pending = []
        for k in range(warm):
            prog.emit("F", ((k // r) % v) * p + d)
        for k in range(total):
            if warm + k < total:
                prog.emit("F", (((warm + k) // r) % v) * p + d)
            pending.append(prog.emit("B", (v - 1 - (k // r) % v) * p + d))
            if k >= d:
                prog.emit("W", pending.pop(0))
        for stage in pending:
            prog.emit("W", stage)
        programs.append(prog.ops)
    return programs_to_schedule("interleaved-zb", programs, p)


def zb_v_reference(devices, microbatches):
    """Per-op reference of :func:`pipecore.schedules.vshape.build_zb_v`."""
    p, m = devices, microbatches
    n = max(m, 2 * p - 1)
    programs = []
    for d in range(p):
        c0, c1 = d, 2 * p - 1 - d
        prog = ProgramBuilder()
        emit = prog.emit
        for _ in range(2 * (p - d) - 1):
            emit("F", c0)
        for _ in range(d):
            emit("F", c1)
            emit("F", c0)
        for _ in range(p - d):
            emit("F", c1)
            emit("B", c1)
            emit("W", c1)
        while prog.issued("F", c1) < prog.issued("F", c0) or prog.issued("F", c0) < n:
            if prog.issued("F", c0) < n:
                emit("F", c0)
            emit("B", c0)
            emit("W", c0)
            emit("F", c1)
            emit("B", c1)
            emit("W", c1)
        for _ in range(d):
            emit("B", c0)
            emit("B", c1)
        for _ in range(p - d):
            emit("B", c0)
            emit("W", c0)
        while prog.issued("W", c1) < prog.issued("B", c1):
            emit("W", c1)
        while prog.issued("W", c0) < prog.issued("B", c0):
            emit("W", c0)
        programs.append([op for op in prog.ops if op[2] < m])
    return programs_to_schedule("zb-v", programs, p)
