"""Tune (devices, microbatches, chunks, schedule) for a transformer with Optuna.

pipecore is the objective: each trial builds a schedule, simulates one
training iteration with roofline costs from the model and hardware, and
reports tokens per second per GPU; a trial whose worst device does not fit
in HBM is pruned. Run:

    pip install -e ".[examples]" && python examples/optuna_tune.py [trials]

Model memory per microbatch and layer follows the Zero Bubble paper's
Table 1 with fused (flash) attention, so without its 5 a s^2 b term:
34 s b h bytes of activations, of which 32 s b h stay until W. Weights,
gradients and Adam states take 16 bytes per parameter (mixed precision),
12 h^2 parameters per layer.
"""

from __future__ import annotations

import sys

import optuna

import pipecore as pc
from pipecore.analysis.study import Hardware, TransformerModel
from pipecore.core.progress import Progress, enabled

LAYERS, HIDDEN, SEQ = 32, 4096, 2048
GLOBAL_BATCH = 64  # sequences per iteration
HBM = 80e9  # bytes per GPU
HW = Hardware.preset("dgx-h100")
FAMILIES = ["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "interleaved-zb", "zb-v",
            "v-half", "v-min", "dualpipev"]
GB = 1e9


def evaluate(devices, microbatches, name, chunks):
    """Iteration time (s) and the worst device's memory (bytes) of one setting."""
    seqs = GLOBAL_BATCH // microbatches
    model = TransformerModel(layers=LAYERS, hidden=HIDDEN, seq=SEQ, microbatch=seqs)
    times = model.costs(HW, devices)
    share = LAYERS / devices
    act = share * 34 * SEQ * seqs * HIDDEN
    act_w = share * 32 * SEQ * seqs * HIDDEN
    weights = share * 12 * HIDDEN**2 * 16
    costs = pc.Costs(f=times.f, b=times.b, w=times.w, activation=act / GB,
                     activation_w=act_w / GB, weights=weights / GB)
    sched = pc.build(name, devices, microbatches, chunks=chunks)
    res = pc.simulate(sched, costs, model.network(HW))
    memory = float((res.peak_activation + res.static_memory).max()) * GB
    return res.makespan, memory


def objective(trial):
    devices = trial.suggest_categorical("devices", [4, 8, 16])
    microbatches = trial.suggest_categorical("microbatches", [8, 16, 32, 64])
    name = trial.suggest_categorical("schedule", FAMILIES)
    fam = pc.family(name)
    chunks = None
    if fam.chunks and fam.fixed_chunks is None:
        chunks = trial.suggest_categorical("chunks", [2, 3, 4])
    try:
        seconds, memory = evaluate(devices, microbatches, name, chunks)
    except ValueError as exc:  # a shape this family cannot build
        raise optuna.TrialPruned(str(exc).splitlines()[0]) from None
    trial.set_user_attr("memory_GB", memory / GB)
    trial.set_user_attr("iteration_s", seconds)
    if memory > HBM:
        raise optuna.TrialPruned(f"needs {memory / GB:.1f} GB > {HBM / GB:.0f} GB")
    return GLOBAL_BATCH * SEQ / seconds / devices  # tokens/s per GPU


def main(trials=200, seed=0):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    bar = Progress(trials, enabled(None), unit="trials")  # the scans' bar, on a terminal
    study.optimize(objective, n_trials=trials,
                   callbacks=[lambda st, tr: bar.update(1, final=len(st.trials) == trials)])
    best = study.best_trial
    print(f"best of {len(study.trials)} trials: {best.params}")
    print(f"  {best.value:,.0f} tokens/s per GPU, iteration {best.user_attrs['iteration_s']:.3f} s, "
          f"worst device {best.user_attrs['memory_GB']:.1f} GB")
    return study


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
