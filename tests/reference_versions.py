"""Slow, independent reading of weight versions: walk each device's program
op by op, as a runtime would, counting updates and stashing versions.

The rule (the same one pipecore.analysis.steady.weight_versions states): a
stage applies step t's update right after the last backward of step t's
microbatches in its program; a step takes the number of updates applied so
far, on its own stage ("stage") or on stage 0 ("input"), when its first
forward reaches that stage; a version stays in memory from its update until
it is neither the newest nor needed by a later backward.
"""


def reference_versions(schedule, k, sync):
    """Return (version, held): version[(stage, mb)] and held[stage]."""
    programs = schedule.programs()
    m = schedule.microbatches
    step_size = {}
    for j in range(m):
        step_size[j // k] = step_size.get(j // k, 0) + 1
    # Each device runs one stage; stage 0 first, so "input" can read it.
    owner = {prog[0][1]: prog for prog in programs if prog}
    admitted = {}  # (stage, step) -> version
    version = {}
    held = {}
    for s in sorted(owner):
        prog = owner[s]
        applied = 0
        grads = {}
        born = {0: 0}  # version -> position of its birth
        superseded = {}
        last_use = {}
        for x, (kind, _stage, j) in enumerate(prog):
            t = j // k
            if kind == "F":
                if (s, t) not in admitted:
                    admitted[(s, t)] = applied if sync == "stage" or s == 0 else admitted[(0, t)]
                version[(s, j)] = admitted[(s, t)]
            elif kind in ("BW", "W"):
                last_use[version[(s, j)]] = x
                grads[t] = grads.get(t, 0) + 1
                if grads[t] == step_size[t]:
                    superseded[applied] = x + 1
                    applied += 1
                    born[applied] = x + 1
        # A version lives on [born, max(superseded, last use + 1)).
        most = 0
        for x in range(len(prog) + 1):
            alive = 0
            for v, b in born.items():
                end = max(superseded.get(v, len(prog) + 1), last_use.get(v, -1) + 1)
                alive += b <= x < end
            most = max(most, alive)
        held[s] = most
    return version, held
