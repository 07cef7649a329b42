"""The command line's answers to mistyped flags and unusable files (issue 37,
item 7): the subcommand's usage, the closest valid flag, one line naming the
path."""

import pytest

from pipecore.cli import main


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_mistyped_flag_gets_the_subcommands_usage_and_a_suggestion(capsys):
    code, _, err = _run(["simulate", "1f1b", "-p", "4", "-m", "8", "--memory-limt", "3"], capsys)
    assert code == 2
    assert "usage: pipecore simulate" in err  # not the top-level usage
    assert "did you mean --memory-limit?" in err
    assert "--memory-limt" in err


def test_unknown_flag_is_reported_before_a_missing_required_one(capsys):
    code, _, err = _run(["simulate", "1f1b", "--devics", "8", "-m", "4"], capsys)
    assert code == 2
    assert "did you mean --devices?" in err
    assert "usage: pipecore simulate" in err


def test_flag_with_no_close_name_gets_usage_without_a_guess(capsys):
    code, _, err = _run(["table", "1f1b", "-p", "4", "-m", "8", "--zzzzzz"], capsys)
    assert code == 2
    assert "usage: pipecore table" in err
    assert "unrecognized argument --zzzzzz" in err
    assert "did you mean" not in err


def test_mistyped_command_gets_a_suggestion(capsys):
    code, _, err = _run(["simlate", "1f1b"], capsys)
    assert code == 2
    assert "did you mean simulate?" in err


@pytest.mark.parametrize("argv", [
    ["simulate", "1f1b", "-p", "2", "-m", "4", "--micro", "3"],      # an abbreviation argparse takes
    ["simulate", "1f1b", "-p2", "-m", "4", "--f", "-1"],               # -p2, a negative value
    ["simulate", "1f1b", "-p", "2", "-m", "4", "--bandwidth=3", "--bytes", "1"],
])
def test_valid_spellings_pass_the_check(argv, capsys):
    code, out, err = _run(argv, capsys)
    # --f -1 reaches Costs and is refused there, by name; the others run.
    if "-1" in argv:
        assert code == 2 and "Costs 'f' must be >= 0" in err
    else:
        assert code == 0, err
        assert "makespan" in out


@pytest.mark.parametrize("option", ["--parquet", "--trace", "--gantt"])
def test_output_file_in_a_missing_folder_is_one_line_naming_it(option, tmp_path, capsys):
    target = tmp_path / "missing" / "x.out"
    code, out, err = _run(["simulate", "1f1b", "-p", "2", "-m", "4", option, str(target)], capsys)
    assert code == 2
    assert out == ""  # refused before anything was simulated or written
    # One sentence, wrapped to 120 columns (continuations indented by two).
    lines = err.strip().replace("\n  ", " ").splitlines()
    assert len(lines) == 1, err
    assert str(target) in lines[0] and "does not exist" in lines[0] and option in lines[0]


def test_output_file_that_is_a_folder(tmp_path, capsys):
    code, _, err = _run(["simulate", "1f1b", "-p", "2", "-m", "4", "--gantt", str(tmp_path)],
                        capsys)
    assert code == 2
    assert err.strip().replace("\n  ", " ").count("\n") == 0 and "is a folder" in err


def test_unreadable_input_file_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    code, _, err = _run(["run-torch", str(missing), "--ranks", "2"], capsys)
    assert code == 2
    assert "Traceback" not in err
    assert err.strip().replace("\n  ", " ").count("\n") == 0 and str(missing) in err


def test_output_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = _run(["compare", "-p", "2", "-m", "4", "--out", str(blocker / "sub")], capsys)
    assert code == 2
    assert "Traceback" not in err
    assert err.strip().replace("\n  ", " ").count("\n") == 0 and str(blocker) in err


def test_grid_file_that_is_a_folder(tmp_path, capsys):
    code, _, err = _run(["scan", str(tmp_path), "--out", str(tmp_path / "r")], capsys)
    assert code == 2
    assert "is a folder" in err and str(tmp_path) in err


def test_simulate_memory_limit_says_whether_it_fits(capsys):
    # 1f1b p=4 holds p - d activations on device d (FIELD.md's table): device 0 peaks at 4 M,
    # plus one device share of weights (simulate's default --weights 1) = 5 M.
    code, out, _ = _run(["simulate", "1f1b", "-p", "4", "-m", "8", "--memory-limit", "3"], capsys)
    assert code == 0
    assert "memory_max           5" in out
    assert "no: device 0 needs 5 M" in out
    code, out, _ = _run(["simulate", "1f1b", "-p", "4", "-m", "8", "--memory-limit", "5",
                         "--json"], capsys)
    import json

    data = json.loads(out)
    assert data["fits"] is True and data["memory_max"] == 5.0 and data["memory_limit"] == 5.0


def test_a_reader_that_left_ends_the_command_quietly(capsys):
    # `pipecore list | head -1`: writing to a closed pipe is no error worth a traceback.
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    assert main(["list"], out=ClosedPipe()) == 141
    assert capsys.readouterr().err == ""
