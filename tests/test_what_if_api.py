"""Issue 8's user-facing calls, end to end, exactly as the issue writes them."""

import pipecore as pc


def test_the_issue_example_runs_end_to_end():
    model = pc.Model.transformer(layers=48, hidden=5120, heads=40, seq=4096, vocab=128000,
                                 microbatch=1)
    hw = pc.Hardware.preset("h100-nvlink")
    plan = pc.partition(model, devices=8, chunks=2, schedule="zb-v", hardware=hw)
    assert plan.gain > 0 and "faster than uniform by" in plan.report()
    res = pc.simulate(plan.schedule, plan.costs, stragglers={3: 1.3},
                      jitter=pc.Jitter.lognormal(0.05, seed=1))
    calm = pc.simulate(plan.schedule, plan.costs, jitter=pc.Jitter.lognormal(0.05, seed=1))
    w = pc.what_if(res, remove_stragglers=True)
    # Without the straggler, the same jitter draw: exactly the calm run.
    assert w.counterfactual == calm.makespan < res.makespan
    assert set(w.per_device) == {3} and w.per_device[3] == res.makespan - calm.makespan
    # Device 3 holds the largest share of the critical path.
    share = w.share.to_pylist()
    assert max(share, key=lambda r: r["total"])["device"] == 3
    assert "device 3" in w.report()
