"""The shipped examples run and say something true."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def test_optuna_example_finds_a_setting_that_fits():
    import optuna_tune

    study = optuna_tune.main(trials=40, seed=1)
    best = study.best_trial
    # Re-evaluate the winner independently of the study's bookkeeping.
    chunks = best.params.get("chunks")
    seconds, memory = optuna_tune.evaluate(best.params["devices"], best.params["microbatches"],
                                           best.params["schedule"], chunks)
    assert memory <= optuna_tune.HBM
    assert best.value == optuna_tune.GLOBAL_BATCH * optuna_tune.SEQ / seconds / best.params["devices"]
    # Every completed trial fits; the pruned ones are the ones that do not (or cannot be built).
    for t in study.trials:
        if t.state.name == "COMPLETE":
            assert t.user_attrs["memory_GB"] * 1e9 <= optuna_tune.HBM
