"""pipecore.warm: compiling the kernels ahead of use."""

import io

import pytest

import pipecore.warm as warm_mod
from pipecore.cli import main
from pipecore.core import rules
from pipecore.schedules import construct, generate


def test_every_step_is_listed_once():
    assert sorted(warm_mod._steps()) == sorted(warm_mod.STEPS)
    assert len(set(warm_mod.STEPS)) == len(warm_mod.STEPS)


def test_a_step_runs_and_the_thresholds_come_back():
    before = (construct.SCATTER_MIN_OPS, rules.FAST_MIN_OPS, generate.ZBV_KERNEL_MIN_OPS)
    seconds = warm_mod.warm(steps=["simulate"])
    assert list(seconds) == ["simulate"] and seconds["simulate"] >= 0
    assert (construct.SCATTER_MIN_OPS, rules.FAST_MIN_OPS, generate.ZBV_KERNEL_MIN_OPS) == before


def test_thresholds_come_back_when_a_step_fails(monkeypatch):
    def boom():
        assert construct.SCATTER_MIN_OPS == 0  # inside a step every gate is open
        raise RuntimeError("step failed")

    monkeypatch.setattr(warm_mod, "_steps", lambda: {"simulate": boom})
    before = construct.SCATTER_MIN_OPS
    with pytest.raises(RuntimeError, match="step failed"):
        warm_mod.warm(steps=["simulate"])
    assert construct.SCATTER_MIN_OPS == before > 0


def test_unknown_step_is_named():
    with pytest.raises(ValueError, match=r"unknown warm-up step 'sweep'; steps are simulate_many"):
        warm_mod.warm(steps=["sweep"])


def test_cli_prints_a_line_per_step(monkeypatch):
    monkeypatch.setattr(warm_mod, "STEPS", ("simulate",))
    out = io.StringIO()
    assert main(["warm"], out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("s  simulate")
