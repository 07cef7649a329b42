"""Where a real pipelined step's time goes, read from torch.profiler traces (issue 39, part 2).

    python bench/runtime_anatomy.py DIR [DIR ...]

DIR is a folder ``pt.run(..., profile=DIR)`` (or ``pipecore run-torch
--profile DIR``) wrote. For every rank and profiled step the step's span is
split into:

* ``compute``: compute actions (torch's F, I, W, B) from their first
  operator to their end: what pipecore's op times model;
* ``lead-in``: compute actions from their label's start to their first
  operator: waiting for the input the runtime receives there;
* ``send`` and ``recv``: SEND_*/RECV_* actions (posting, and whatever holds
  a posting);
* ``other``: the runtime's other actions (UNSHARD, RESHARD, REDUCE_GRAD);
* ``gaps``: the step's time outside every action (the runtime's loop, the
  loss, the step's start and end).

It also prints the c10d::send operators' durations (median and 90th
percentile) and, per rank, the order of the first actions, which shows when
torch's lowering posts receives relative to the computations that consume
them. Shares are of the step's span; times are medians over profiled steps.
"""

import statistics
import sys
from pathlib import Path

from pipecore.bindings import _profile as prof

PARTS = ("compute", "lead-in", "send", "recv", "other", "gaps")


def anatomy(folder):
    """Per rank: median milliseconds of each part, the step span, and the first actions."""
    files = prof._paths(Path(folder))
    out = {}
    for i, path in enumerate(files):
        data = prof._load(path)
        rank, _ = prof._rank_of(path, data, i)
        trace = prof._parse_rank(path, data, rank)
        per_step = []
        for acts, (lo, hi) in zip(trace.steps, trace.step_spans):
            parts = dict.fromkeys(PARTS, 0.0)
            inside = 0.0
            for _name, _stage, kind, _mb, a, b, c0 in acts:
                inside += b - a
                if kind in ("F", "B", "W", "BW", "FB"):
                    parts["compute"] += b - c0
                    parts["lead-in"] += c0 - a
                elif kind.startswith("SEND"):
                    parts["send"] += b - a
                elif kind.startswith("RECV"):
                    parts["recv"] += b - a
                else:
                    parts["other"] += b - a
            parts["gaps"] = max((hi - lo) - inside, 0.0)
            parts["span"] = hi - lo
            per_step.append(parts)
        med = {k: statistics.median(p[k] for p in per_step) / 1e3 for k in PARTS + ("span",)}
        sends = sorted(d / 1e3 for _nb, d in trace.sends)
        first = [name.replace("PP:", "") for name, *_ in trace.steps[0][:12]]
        out[rank] = {"ms": med, "sends_ms": sends, "first": first}
    return out


def show(folder):
    res = anatomy(folder)
    print(f"{folder}:")
    print(f"  rank {'span':>8}" + "".join(f"{p:>9}" for p in PARTS) + "   (ms, median over steps)")
    for rank in sorted(res):
        ms = res[rank]["ms"]
        print(f"  {rank:>4} {ms['span']:>8.2f}" + "".join(f"{ms[p]:>9.2f}" for p in PARTS))
    for rank in sorted(res):
        s = res[rank]["sends_ms"]
        if s:
            p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
            print(f"  rank {rank}: {len(s)} c10d::send, median {statistics.median(s):.3f} ms, "
                  f"90th percentile {p90:.3f} ms")
        print(f"  rank {rank} first actions: {' '.join(res[rank]['first'])}")


if __name__ == "__main__":
    for d in sys.argv[1:]:
        show(d)
