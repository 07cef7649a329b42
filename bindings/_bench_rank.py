"""One rank of ``pipecore calibrate``'s collectives: all-reduce, reduce-scatter,
all-gather and a point-to-point ping-pong over a few message sizes.

A rank runs this file as ``__main__`` (``_torch_run.launch_ranks``; arguments
CONFIG RANK) with torch and the standard library only: importing pipecore
(numba and the rest) would cost each rank seconds. Every rank writes the
seconds of each repetition to ``rank{r}.json``; the parent
(:mod:`pipecore.bindings._hardware`) takes, per repetition, the slowest
rank, then the median.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "p2p")
#: Bytes one timed loop should move at least, so small messages are timed over many calls.
LOOP_BYTES = 1 << 24
MAX_INNER = 50


def _ops(kind, count, ranks, rank, device):
    """The call that runs one ``kind`` on ``count`` float32 elements (whole buffer)."""
    full = torch.ones(count, device=device)
    part = torch.ones(count // ranks, device=device)
    # torch 2.13 names these *_single; earlier releases *_tensor.
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if kind == "all-reduce":
        return lambda: dist.all_reduce(full)
    if kind == "reduce-scatter":
        return lambda: scatter(part, full)
    if kind == "all-gather":
        return lambda: gather(full, part)
    if rank == 0:  # p2p: a round trip between ranks 0 and 1; the others wait at the barriers
        return lambda: (dist.send(full, 1), dist.recv(full, 1))
    if rank == 1:
        return lambda: (dist.recv(full, 0), dist.send(full, 0))
    return None


def _worker(rank, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["port"])
    if cfg.get("cpus"):
        os.sched_setaffinity(0, {cfg["cpus"][rank]})  # one core per rank, before gloo starts threads
    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ranks = cfg["ranks"]
    dist.init_process_group(cfg["backend"], rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(seconds=cfg["timeout"]))
    rows = []
    try:
        for kind in KINDS:
            for size in cfg["sizes"]:
                count = max(ranks, size // 4 // ranks * ranks)  # a whole share per rank
                op = _ops(kind, count, ranks, rank, device)
                inner = max(1, min(MAX_INNER, LOOP_BYTES // (4 * count)))
                for _ in range(cfg["warmup"]):
                    if op is not None:
                        op()
                sync()
                samples = []
                for _ in range(cfg["repeats"]):
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    if op is not None:
                        for _ in range(inner):
                            op()
                    sync()
                    # p2p: one call is a round trip; a send is half of it.
                    samples.append((time.perf_counter() - t0) / inner / (2 if kind == "p2p" else 1))
                if op is not None:
                    rows.append({"kind": kind, "bytes": 4 * count, "samples": samples})
        Path(cfg["out"], f"rank{rank}.json").write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _worker(int(sys.argv[2]), json.loads(Path(sys.argv[1]).read_text()))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip torch's slow interpreter teardown: everything is written
