"""The one progress bar (core/progress.py) of scans, compare's charts, the
study and tune: drawn when asked or on a terminal, never otherwise."""

import io

import pytest

import pipecore as pc
from pipecore.analysis.study import study
from pipecore.cli import main
from pipecore.core.progress import Progress, enabled


def test_bar_counts_and_names_its_unit():
    stream = io.StringIO()
    bar = Progress(4, True, stream=stream, unit="things")
    bar.update(3)
    bar.update(1, final=True)
    text = stream.getvalue()
    assert "100.0% 4/4" in text and "things/s" in text and text.endswith("\n")
    quiet = io.StringIO()
    Progress(4, False, stream=quiet).update(4, final=True)
    assert quiet.getvalue() == ""
    assert enabled(True) and not enabled(False)


def test_study_and_tune_progress(capsys):
    study(devices=[2], microbatches=[4, 8], names=["1f1b", "gpipe"], progress=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "shapes/s" in err
    pc.tune(2, 4, families=["1f1b", "gpipe"], generated=False, progress=True)
    assert "builds/s" in capsys.readouterr().err
    pc.tune(2, 4, families=["1f1b", "gpipe"], generated=False)  # pytest's stderr: no terminal
    assert capsys.readouterr().err == ""


def test_compare_progress_flags(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="charts need the plot extra: pip install pipecore[plot]")
    assert main(["compare", "-p", "2", "-m", "4", "--out", str(tmp_path), "--no-report",
                 "--progress"], out=io.StringIO()) == 0
    charts = len(list(tmp_path.glob("*.png")))
    err = capsys.readouterr().err
    assert charts > 0 and f"{charts}/{charts}" in err and "charts/s" in err
    assert main(["compare", "-p", "2", "-m", "4", "--out", str(tmp_path), "--no-report",
                 "--no-progress"], out=io.StringIO()) == 0
    assert capsys.readouterr().err == ""
