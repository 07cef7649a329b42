"""Step-by-step replay of HelixPipe's training loop, from the authors' code.

Source: github.com/code-tunnel/Megatron-LM, branch dev,
megatron/core/pipeline_parallel/attn_pipe_schedule.py, ``attention_pipeline``:
forward lines 263-588 (fold prelude, then per data repeat: warm-up attention
and parameter parts, steady loops 1 .. num_loop - 1, cool-down; rank 0's
tail of loss parts), backward lines 596-887. The loops below mirror theirs
one for one and yield labels ("P", layer, repeat, offset, fold) for a
parameter part (chunk ``loop`` of rank r is layer loop * p + r; the loss
chunk num_loop is layer L) and ("A", repeat, offset, fold) for an attention
core. The attention's layer is not in the code's labels: :func:`replay`
finds it by running the ranks against each other, with the send targets the
code uses (QKV to (rank + offset + 1) % p, O back to (rank - offset) % p).
Written from the code, not from pipecore's kernel.
"""


def forward_labels(r, p, v, folds, repeats):
    out = []
    L = v * p
    if r == 0:
        for f in range(folds):
            out.append(("P", 0, 0, 0, f))
    for k in range(repeats):
        for d in reversed(range(r)):  # warm-up attention (enumerate(reversed(range(pp_rank))))
            for f in range(folds):
                out.append(("A", k, d, f))
                if d == 0:
                    out.append(("P", r, k, 0, f))
        for d in range(1, p):  # warm-up parameter part
            for f in range(folds):
                if r == 0 and k > 0:
                    out.append(("P", L, k - 1, d, f))  # popped as repeat_idx - 1 in the backward
                out.append(("P", r, k, d, f))
                if d == p - 1:
                    out.append(("A", k, d, f))
        for loop in range(1, v):  # steady
            for d in reversed(range(p - 1)):
                for f in range(folds):
                    out.append(("A", k, d, f))
                    if d == 0:
                        out.append(("P", loop * p + r, k, 0, f))
            for d in range(1, p):
                for f in range(folds):
                    out.append(("P", loop * p + r, k, d, f))
                    if d == p - 1:
                        out.append(("A", k, d, f))
        for d in reversed(range(r, p - 1)):  # cool-down
            for f in range(folds):
                out.append(("A", k, d, f))
                if d == 0:
                    out.append(("P", L, k, 0, f))
                    if k < repeats - 1:
                        out.append(("P", 0, k + 1, 0, f))
    if r == 0:
        for d in range(1, p):
            for f in range(folds):
                out.append(("P", L, repeats - 1, d, f))
    return out


def backward_labels(r, p, v, folds, repeats):
    """The backward loops; a call whose graph spans two parts (attention then
    parameters, or the reverse) yields both, the later forward first."""
    out = []
    L = v * p
    if r == 0:
        for d in reversed(range(1, p)):
            for f in reversed(range(folds)):
                out.append(("P", L, repeats - 1, d, f))
    for k in reversed(range(repeats)):
        for d in range(r, p - 1):  # cool-down backward
            for f in reversed(range(folds)):
                if d == 0:
                    if k < repeats - 1:
                        out.append(("P", 0, k + 1, 0, f))
                    out += [("P", L, k, 0, f), ("A", k, 0, f)]
                else:
                    out.append(("A", k, d, f))
        for loop in reversed(range(1, v)):  # steady backward
            for d in reversed(range(1, p)):
                for f in reversed(range(folds)):
                    if d == p - 1:
                        out.append(("A", k, d, f))
                    out.append(("P", loop * p + r, k, d, f))
            for d in range(p - 1):
                for f in reversed(range(folds)):
                    if d == 0:
                        out.append(("P", loop * p + r, k, 0, f))
                    out.append(("A", k, d, f))
        for d in reversed(range(1, p)):  # warm-up backward, parameter part
            for f in reversed(range(folds)):
                if d == p - 1:
                    out.append(("A", k, d, f))
                out.append(("P", r, k, d, f))
                if r == 0 and k > 0:
                    out.append(("P", L, k - 1, d, f))
        for d in range(r):  # warm-up backward, attention part
            for f in reversed(range(folds)):
                if d == 0:
                    out.append(("P", r, k, 0, f))
                out.append(("A", k, d, f))
    if r == 0:
        for f in range(folds):  # lines 876-887: folds in forward order here
            out.append(("P", 0, 0, 0, f))
    return out


def replay(p, m, v, folds):
    """Run the p ranks' forward loops against each other.

    Returns per-rank programs of ("F", stage, microbatch) then ("BW", stage,
    microbatch) with stage 2j for P_j and 2j + 1 for A_j. An attention
    waits for its QKV to arrive on its rank; raises AssertionError if the
    loops deadlock or a parameter part runs where the code's O does not
    arrive.
    """
    repeats = m // (p * folds)
    labels = [forward_labels(r, p, v, folds, repeats) for r in range(p)]

    def mb(k, d, f):
        return (k * p + d) * folds + f

    done = [0] * m  # stages finished per microbatch
    qkv_at = [None] * m  # rank the last parameter part sent QKV to
    o_at = [None] * m  # rank the last attention sent O to
    pos = [0] * p
    programs = [[] for _ in range(p)]
    while any(pos[r] < len(labels[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(labels[r]):
                lab = labels[r][pos[r]]
                if lab[0] == "P":
                    _, layer, k, d, f = lab
                    i = mb(k, d, f)
                    if done[i] != 2 * layer:
                        break
                    assert layer == 0 or o_at[i] == r, (r, lab)
                    stage = 2 * layer
                    qkv_at[i] = (r + d + 1) % p
                else:
                    _, k, d, f = lab
                    i = mb(k, d, f)
                    if done[i] % 2 == 0 or qkv_at[i] != r:
                        break  # its QKV has not arrived here yet
                    stage = done[i]
                    o_at[i] = (r - d) % p
                done[i] += 1
                programs[r].append(("F", stage, i))
                pos[r] += 1
                moved = True
        assert moved, f"the loops deadlock at ranks' positions {pos}"
    assert done == [2 * v * p + 1] * m
    # Backward: the backward loops' labels must be the forward labels reversed
    # (up to rank 0's last folds); the stages follow from the forward replay.
    for r in range(p):
        stage_of = {}
        for lab, (_, s, _i) in zip(labels[r], programs[r]):
            stage_of.setdefault(lab, []).append(s)
        for lab in backward_labels(r, p, v, folds, repeats):
            s = stage_of[lab].pop()  # the latest forward of this label first
            programs[r].append(("BW", s, mb(*lab[-3:])))
    return programs
