"""A scan resumes only from parts that verify (issue 38, item 1): truncated, empty,
foreign, renamed and stray files, a damaged manifest, a full disk, and
``pipecore verify``. The expected rows are always those of an uninterrupted run of
the same grid in another folder."""

import errno
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipecore as pc
from pipecore.cli import main
from pipecore.scan import parts as parts_mod

GRID = {
    "schedules": ["1f1b", "zb-h1", "interleaved-1f1b"],
    "devices": [2, 4],
    "microbatches": [4, 6],
    "f": [1.0, 2.0],
    "b": [1.0, 1.5],
    "part_size": 5,  # 12 shapes x 4 costs = 48 points in 10 parts; interleaved p=4 m=6 cannot be built
}


def _full(folder):
    return pq.ParquetDataset(folder).read().sort_by("config")


@pytest.fixture
def reference(tmp_path):
    ref = tmp_path / "ref"
    pc.write_scan(GRID, ref, plot=False)
    return _full(ref)


@pytest.fixture
def finished(tmp_path):
    out = tmp_path / "out"
    pc.write_scan(GRID, out, plot=False)
    return out


def _resume(out):
    with pytest.warns(pc.ScanWarning) as caught:
        summary = pc.write_scan(GRID, out, resume=True, plot=False)
    return summary, [str(w.message) for w in caught if w.category is pc.ScanWarning]


def _foreign(path):
    pq.write_table(pa.table({"x": [1]}), path)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path):
    path.write_bytes(b"")


def _flip_a_data_byte(path):
    # A byte in the first column's data pages (the file starts with the 4-byte magic).
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,reason", [
    (_foreign, "no pipecore part identity"),
    (_truncate, "not a readable Parquet file"),
    (_empty, "0 bytes"),
    (_flip_a_data_byte, "damaged data"),
])
def test_resume_recomputes_a_part_that_does_not_verify(finished, reference, damage, reason):
    victim = finished / "part-000001.parquet"
    damage(victim)
    summary, messages = _resume(finished)
    assert len(messages) == 1
    assert "part-000001.parquet" in messages[0] and reason in messages[0]
    assert "recomputed" in messages[0]
    assert summary["parts_written"] == 1
    assert summary["rows"] == reference.num_rows
    assert _full(finished).equals(reference)
    # The bad file is kept aside under a name that dataset readers and *.parquet globs skip.
    aside = finished / "_rejected-part-000001.parquet.bad"
    assert aside.exists() and not aside.name.endswith(".parquet")
    assert pc.verify_scan(finished).ok


def test_part_renamed_to_another_number_is_refused(finished, reference):
    (finished / "part-000002.parquet").write_bytes((finished / "part-000003.parquet").read_bytes())
    summary, messages = _resume(finished)
    assert any("holds part 3, not part 2" in m for m in messages)
    assert _full(finished).equals(reference)


def test_part_of_another_grid_is_refused(tmp_path, finished, reference):
    other = tmp_path / "other"
    pc.write_scan({**GRID, "f": [1.0, 3.0]}, other, plot=False)
    (finished / "part-000004.parquet").write_bytes((other / "part-000004.parquet").read_bytes())
    summary, messages = _resume(finished)
    assert any("a part of another grid" in m for m in messages)
    assert _full(finished).equals(reference)


@pytest.mark.parametrize("name,why", [
    ("part-abc.parquet", "not a part's name"),
    ("part-000099.parquet", "beyond this scan's 10 parts"),
    ("part-1.parquet", "not a part's name"),
])
def test_stray_files_are_reported_and_never_read(finished, reference, name, why):
    _foreign(finished / name)
    summary, messages = _resume(finished)
    assert len(messages) == 1 and name in messages[0] and why in messages[0]
    assert "recomputed" not in messages[0]
    assert summary["parts_written"] == 0 and summary["rows"] == reference.num_rows
    assert not (finished / name).exists()
    assert _full(finished).equals(reference)


def test_empty_part_marker_is_verified_too(tmp_path):
    grid = {"schedules": ["interleaved-1f1b"], "devices": [4], "microbatches": [6, 8],
            "f": [1.0, 2.0], "part_size": 2}  # part 0: m=6, which cannot be built
    out = tmp_path / "out"
    pc.write_scan(grid, out, plot=False)
    marker = out / "_empty-000000"
    assert json.loads(marker.read_text())["part"] == 0
    marker.write_text("")  # what an earlier pipecore wrote, or a damaged marker
    with pytest.warns(pc.ScanWarning, match="_empty-000000"):
        summary = pc.write_scan(grid, out, resume=True, plot=False)
    assert summary["parts_written"] == 1 and marker.exists()
    assert pc.verify_scan(out).ok


@pytest.mark.parametrize("text,what", [
    ('{"fingerprint": "abc", "par', "Unterminated string"),      # truncated
    ("[1, 2]", "a JSON list, not an object"),
    ('{"parts": 10}', "'fingerprint' is None"),
])
def test_damaged_manifest_names_the_file_and_the_way_out(finished, reference, text, what):
    manifest = finished / "_scan.json"
    manifest.write_text(text)
    with pytest.raises(pc.ScanError) as info:
        pc.write_scan(GRID, finished, resume=True, plot=False)
    message = str(info.value)
    assert str(manifest) in message and what in message
    assert "delete" in message and "--resume" in message
    # The way out works: without the manifest, resume verifies the parts against the grid.
    manifest.unlink()
    summary = pc.write_scan(GRID, finished, resume=True, plot=False)
    assert summary["parts_written"] == 0
    assert _full(finished).equals(reference)
    assert json.loads(manifest.read_text())["fingerprint"] == pc.Grid.from_dict(GRID).fingerprint()


def test_no_manifest_and_parts_of_another_grid_is_refused(tmp_path, finished):
    (finished / "_scan.json").unlink()
    with pytest.raises(pc.ScanError, match="parts of another grid"):
        pc.write_scan({**GRID, "f": [1.0, 3.0]}, finished, resume=True, plot=False)
    with pytest.raises(pc.ScanError, match="no _scan.json"):
        pc.write_scan(GRID, finished, plot=False)  # without resume: refused, with the way out


def test_disk_full_mid_part_is_a_clear_error_and_resume_finishes(tmp_path, reference, monkeypatch):
    out = tmp_path / "out"
    real = pq.write_table
    calls = []

    def full_on_third(table, where, **kw):
        calls.append(where)
        if len(calls) == 3:
            with open(where, "wb") as fh:  # a partial file, as a full disk leaves it
                fh.write(b"PAR1 half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, **kw)

    monkeypatch.setattr(parts_mod.pq, "write_table", full_on_third)
    with pytest.raises(pc.ScanError) as info:
        pc.write_scan(GRID, out, plot=False)
    monkeypatch.setattr(parts_mod.pq, "write_table", real)
    message = str(info.value)
    assert "part 2" in message and "No space left on device" in message
    assert "not counted" in message and "--resume" in message
    assert sorted(p.name for p in out.glob("part-*")) == ["part-000000.parquet",
                                                          "part-000001.parquet"]
    assert not list(out.glob(".*"))  # no temporary file left behind
    summary = pc.write_scan(GRID, out, resume=True, plot=False)
    assert summary["parts_written"] == 8
    assert _full(out).equals(reference)


def test_cli_verify_names_every_bad_part(finished, capsys):
    assert main(["verify", str(finished)]) == 0
    assert "ok:" in capsys.readouterr().out
    _truncate(finished / "part-000003.parquet")
    (finished / "part-000005.parquet").unlink()
    _foreign(finished / "part-zzz.parquet")
    assert main(["verify", str(finished)]) == 1
    text = capsys.readouterr().out
    assert "part-000003.parquet: not a readable Parquet file" in text
    assert "missing: parts 3, 5" in text
    assert "part-zzz.parquet: not a part's name" in text


def test_cli_verify_of_a_folder_without_manifest(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    assert "has no _scan.json" in capsys.readouterr().err


def test_cli_scan_resume_says_what_it_set_aside(tmp_path, finished, capsys):
    grid_file = tmp_path / "grid.toml"
    grid_file.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in GRID.items()) + "\n")
    _empty(finished / "part-000006.parquet")
    assert main(["scan", str(grid_file), "--out", str(finished), "--resume", "--no-plot"]) == 0
    err = capsys.readouterr().err
    assert "set aside" in err and "part-000006.parquet" in err and "0 bytes" in err


def _footer_flips(data):
    """Each byte of a Parquet file's footer (its metadata: the schema, the row groups'
    offsets and statistics, the key-value metadata) flipped in turn, with its offset."""
    length = int.from_bytes(data[-8:-4], "little")  # the footer's length, before "PAR1"
    for i in range(len(data) - 8 - length, len(data) - 8):
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        yield i, bytes(flipped)


def test_verify_catches_every_footer_flip_that_changes_the_schema(finished, tmp_path):
    # Issue 52: the footer has no checksum (the pages do), and 18 of an audit's 9,921
    # single-byte flips turned a text column's type (string to binary, or its
    # dictionary dropped) while the part still read: verify passed and resume kept it.
    victim = finished / "part-000001.parquet"
    clean = victim.read_bytes()
    expected = pq.read_table(victim)
    fingerprint = pc.Grid.from_dict(GRID).fingerprint()
    work = tmp_path / "part-000001.parquet"
    changed = 0
    for i, data in _footer_flips(clean):
        try:  # the schema as any reader sees it (parsed from memory: fast)
            schema = pq.ParquetFile(pa.BufferReader(data)).schema_arrow.remove_metadata()
        except (OSError, ValueError):
            continue  # unreadable: check_file's first read fails the same way
        if schema.equals(expected.schema.remove_metadata()):
            continue
        changed += 1
        work.write_bytes(data)
        rows, why = parts_mod.check_file(work, fingerprint, 10)
        assert why is not None and rows == 0, (i, schema)
    # The flips do reach the schema: the premise of this test (19 flips here, pyarrow 26).
    assert changed > 0


def _retyped(path, column):
    """``path`` rewritten with ``column``'s dictionary of strings stored as bytes, its
    pipecore identity kept: what a flipped footer byte does."""
    table = pq.read_table(path)
    field = table.schema.field(column)
    schema = table.schema.set(table.schema.get_field_index(column),
                              field.with_type(pa.dictionary(pa.int32(), pa.binary())))
    pq.write_table(table.cast(schema), path)


def test_verify_and_resume_refuse_a_part_with_another_schema(finished, reference):
    _retyped(finished / "part-000002.parquet", "schedule")
    check = pc.verify_scan(finished)
    assert not check.ok
    assert "column 'schedule' has type dictionary<values=binary" in check.bad["part-000002.parquet"]
    assert "part-000002.parquet" in check.report()
    summary, messages = _resume(finished)
    assert any("part-000002.parquet" in m and "column 'schedule'" in m for m in messages)
    assert summary["parts_written"] == 1
    assert _full(finished).equals(reference)


def test_report_of_a_scan_names_the_part_it_cannot_use(finished, tmp_path):
    # A part whose schema differs from the others' (one verify would reject).
    _retyped(finished / "part-000004.parquet", "network")
    with pytest.raises(pc.InputError) as info:
        pc.report(str(finished), tmp_path / "r.html")
    message = str(info.value)
    assert "part-000004.parquet" in message and "column 'network'" in message
    assert "pipecore verify" in message
    # A part that cannot be read at all.
    _retyped(finished / "part-000004.parquet", "network")
    _truncate(finished / "part-000006.parquet")
    with pytest.raises(pc.InputError, match="cannot read scan part .*part-000006.parquet"):
        pc.report(str(finished), tmp_path / "r.html")
