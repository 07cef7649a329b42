"""A scan's parts on disk: how each is written, recognised and verified.

A part is ``part-NNNNNN.parquet``, written to a hidden temporary file,
synced and renamed, so it appears only whole. Its Parquet metadata names
the grid (fingerprint), the part's number, its row count and its first
and last configuration, and every data page carries a CRC. A part whose
points cannot be built leaves ``_empty-NNNNNN``, a small JSON file with the
same identity. A file counts as done only when all of that checks out: a
truncated or zero-byte file, another grid's part, a part renamed to
another number or any other Parquet file is rejected with its reason.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from .grid import MANIFEST, PART_SCHEMA, SUMMARY, ScanError

__all__ = ["PartCheck", "verify_scan"]

#: Key of a part's identity in its Parquet schema metadata.
META_KEY = b"pipecore.part"
_FORMAT = 1
_PART = re.compile(r"part-(\d{6})\.parquet")
_EMPTY = re.compile(r"_empty-(\d{6})")
#: Prefix and suffix of files a resume moved aside: Parquet dataset readers skip names
#: starting with "_", and a "*.parquet" glob (DuckDB, polars) skips the suffix.
REJECTED = "_rejected-"
REJECTED_SUFFIX = ".bad"


def part_name(k: int) -> str:
    return f"part-{k:06d}.parquet"


def empty_name(k: int) -> str:
    return f"_empty-{k:06d}"


def write_part(table, folder: Path, k: int, fingerprint: str) -> Path:
    """Write part k atomically, with its identity and page checksums."""
    configs = table.column("config")
    identity = {"format": _FORMAT, "fingerprint": fingerprint, "part": k,
                "rows": table.num_rows, "first_config": int(configs[0].as_py()),
                "last_config": int(configs[-1].as_py())}
    meta = dict(table.schema.metadata or {})
    meta[META_KEY] = json.dumps(identity).encode()
    table = table.replace_schema_metadata(meta)
    final = folder / part_name(k)
    tmp = folder / f".{part_name(k)}.{os.getpid()}.tmp"
    try:
        pq.write_table(table, tmp, write_page_checksum=True)
        with open(tmp, "rb") as fh:  # publish only what is on disk
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except OSError as exc:  # disk full, quota, I/O error: the part is not counted
        tmp.unlink(missing_ok=True)
        raise ScanError(f"could not write part {k} to {final}: {exc.strerror or exc}; the part "
                        f"is not counted (its temporary file was removed): make room and rerun "
                        f"with --resume (resume=True) to finish the scan") from exc
    except BaseException:  # Ctrl-C mid-write: leave no half part behind
        tmp.unlink(missing_ok=True)
        raise
    return final


def write_empty(folder: Path, k: int, fingerprint: str) -> Path:
    """Mark part k done with no rows (no point in it could be built)."""
    final = folder / empty_name(k)
    tmp = folder / f".{empty_name(k)}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"format": _FORMAT, "fingerprint": fingerprint, "part": k,
                                   "rows": 0}))
        os.replace(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ScanError(f"could not write {final}: {exc.strerror or exc}; make room and rerun "
                        f"with --resume (resume=True)") from exc
    return final


def part_number(name: str) -> int | None:
    """k for a file named like part k (data or empty marker), else None."""
    match = _PART.fullmatch(name) or _EMPTY.fullmatch(name)
    return int(match.group(1)) if match else None


def looks_like_part(name: str) -> bool:
    """Whether a scan could have meant this file as a part (or a marker)."""
    return (name.startswith("part-") and name.endswith(".parquet")) or name.startswith("_empty-")


def _check_identity(meta, fingerprint, k):
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        return "no pipecore part identity (not written by this version of pipecore's scan)"
    if meta.get("fingerprint") != fingerprint:
        return (f"a part of another grid (fingerprint {meta.get('fingerprint')}, this scan's is "
                f"{fingerprint})")
    if meta.get("part") != k:
        return f"holds part {meta.get('part')}, not part {k} (renamed or copied?)"
    return None


def schema_mismatch(schema) -> str | None:
    """How a part's Arrow schema differs from a scan part's (:data:`PART_SCHEMA`),
    or None: the names in order and each column's type.

    The footer holds the schema and carries no checksum (the pages do): a
    flipped byte there can turn a text column into bytes, or drop its
    dictionary, and still read.
    """
    names, want = schema.names, PART_SCHEMA.names
    if names != want:
        missing = [n for n in want if n not in names]
        extra = [n for n in names if n not in want]
        if missing or extra:
            return (f"its columns are not a scan part's (missing {missing or 'none'}, not a scan "
                    f"column: {extra or 'none'}); written by another version of pipecore, or a "
                    f"damaged footer")
        return f"its columns are in another order than a scan part's ({', '.join(names)})"
    for got, expected in zip(schema, PART_SCHEMA):
        if got.type != expected.type:
            return (f"column {got.name!r} has type {got.type} where a scan part's is "
                    f"{expected.type} (a damaged footer: the schema has no checksum)")
    return None


def check_file(path: Path, fingerprint: str, parts: int, configs=None) -> tuple[int, str | None]:
    """Verify one file of a scan folder.

    Returns (rows, None) when ``path`` is a whole part (or empty marker) of
    the scan with ``fingerprint``, else (0, why). ``configs``, when given,
    is the part's configuration numbers (ascending): the part's
    configurations must be among them.
    """
    k = part_number(path.name)
    if k is None:
        return 0, "not a part's name (part-NNNNNN.parquet with six digits)"
    if k >= parts:
        return 0, f"part {k} is beyond this scan's {parts} parts (0 to {parts - 1})"
    if path.name.startswith("_empty-"):
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            return 0, f"an empty-part marker that cannot be read ({exc})"
        why = _check_identity(meta, fingerprint, k)
        return 0, why
    try:
        handle = pq.ParquetFile(path)
        raw = (handle.schema_arrow.metadata or {}).get(META_KEY)
        meta = json.loads(raw) if raw is not None else None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        size = path.stat().st_size
        return 0, f"not a readable Parquet file ({size} bytes: truncated or damaged? {exc})"
    why = _check_identity(meta, fingerprint, k) or schema_mismatch(handle.schema_arrow)
    if why:
        return 0, why
    if handle.metadata.num_rows != meta["rows"] or meta["rows"] < 1:
        return 0, (f"holds {handle.metadata.num_rows} rows where its metadata says "
                   f"{meta['rows']}")
    try:  # reads every page: a flipped byte fails its CRC
        table = pq.read_table(path, page_checksum_verification=True)
    except (OSError, ValueError) as exc:
        return 0, f"damaged data ({exc})"
    why = schema_mismatch(table.schema)
    if why:
        return 0, why
    got = table.column("config").to_numpy()
    if int(got[0]) != meta["first_config"] or int(got[-1]) != meta["last_config"]:
        return 0, "its configurations do not match its metadata"
    if configs is not None:
        if (np.any(np.diff(got) <= 0) or got[0] < configs[0] or got[-1] > configs[-1]
                or not np.isin(got, configs).all()):
            return 0, f"holds configurations that are not part {k}'s"
    return int(meta["rows"]), None


@dataclass
class PartCheck:
    """What :func:`verify_scan` found in a scan folder.

    Attributes
    ----------
    folder : pathlib.Path
    parts : int
        Parts the grid has.
    rows : int
        Rows in the parts that verified.
    good : list of int
        Parts (data or empty) that verified.
    missing : list of int
        Parts with no file (an unfinished scan).
    bad : dict of str to str
        File name to the reason it failed, for every file named like a
        part that is not a whole part of this scan.
    finished : bool
        Whether ``_summary.json`` was written (the scan ran to its end).
    """

    folder: Path
    parts: int
    rows: int = 0
    good: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    bad: dict = field(default_factory=dict)
    finished: bool = False

    @property
    def ok(self) -> bool:
        """bool: every part present and whole, nothing else named like a part."""
        return not self.missing and not self.bad

    def report(self) -> str:
        """The findings as text, one line per problem.

        Returns
        -------
        str
        """
        lines = []
        for name, why in sorted(self.bad.items()):
            lines.append(f"bad: {self.folder / name}: {why}")
        if self.missing:
            shown = ", ".join(map(str, self.missing[:20]))
            more = f" and {len(self.missing) - 20} more" if len(self.missing) > 20 else ""
            lines.append(f"missing: parts {shown}{more} of 0 to {self.parts - 1} (the scan did "
                         f"not finish: rerun it with --resume)")
        if self.ok:
            state = "" if self.finished else f" ({SUMMARY} not written yet)"
            lines.append(f"ok: {self.folder}: {self.parts} parts, {self.rows:,} rows verified"
                         f"{state}")
        else:
            lines.append(f"{self.folder}: {len(self.bad)} bad files, {len(self.missing)} parts "
                         f"missing, {len(self.good)} of {self.parts} parts verified")
        return "\n".join(lines)


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, None when it has none.

    Raises ScanError naming the file and the way out when it is damaged.
    """
    manifest = folder / MANIFEST
    if not manifest.exists():
        return None
    way_out = (f"it records which grid {folder} holds. To continue this scan, delete {manifest} "
               f"and rerun with --resume (resume=True): every part is then verified against the "
               f"grid and those that do not match are recomputed; or use a new folder")
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        raise ScanError(f"{manifest} is damaged ({exc}); {way_out}") from None
    if not isinstance(data, dict):
        raise ScanError(f"{manifest} is damaged (a JSON {type(data).__name__}, not an object); "
                        f"{way_out}")
    for key, kind in (("fingerprint", str), ("parts", int)):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ScanError(f"{manifest} is damaged ('{key}' is {data.get(key)!r}); {way_out}")
    return data


def survey(folder: Path, fingerprint: str, parts: int, configs_of=None):
    """Every file named like a part in ``folder``, verified.

    Returns (done, rows, bad): the parts that verified, their rows, and
    name -> reason for the files that did not.
    """
    done, rows, bad = set(), 0, {}
    for path in sorted(folder.iterdir()):
        if not looks_like_part(path.name) or not path.is_file():
            continue
        k = part_number(path.name)
        configs = configs_of(k) if (configs_of is not None and k is not None and k < parts) \
            else None
        n, why = check_file(path, fingerprint, parts, configs)
        if why is None and k in done:
            why = f"part {k} is already done by another file"
        if why is None:
            done.add(k)
            rows += n
        else:
            bad[path.name] = why
    return done, rows, bad


def set_aside(folder: Path, name: str) -> Path:
    """Move a rejected file out of the dataset (readers skip names starting with '_')."""
    target = folder / f"{REJECTED}{name.lstrip('_')}{REJECTED_SUFFIX}"
    os.replace(folder / name, target)
    return target


def verify_scan(folder) -> PartCheck:
    """Check a scan folder: every part present, whole and of this scan.

    Parameters
    ----------
    folder : str or os.PathLike
        A folder written by :func:`pipecore.write_scan` (``pipecore scan``).

    Returns
    -------
    PartCheck
        ``ok`` is True when every part of the grid is present and verifies
        and no other file is named like a part; ``report()`` lists each
        problem with the file's name and the reason.

    Raises
    ------
    ScanError
        If the folder does not exist or its ``_scan.json`` is missing or
        damaged.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ScanError(f"{folder} is not a folder")
    manifest = read_manifest(folder)
    if manifest is None:
        raise ScanError(f"{folder} has no {MANIFEST}: not a scan folder (or its manifest was "
                        f"deleted: rerun the scan with --resume to write it again)")
    parts = manifest["parts"]
    done, rows, bad = survey(folder, manifest["fingerprint"], parts)
    return PartCheck(folder=folder, parts=parts, rows=rows, good=sorted(done),
                     missing=[k for k in range(parts) if k not in done], bad=bad,
                     finished=(folder / SUMMARY).exists())
