"""The shape of the code that the next engineer reads (issue 40's bars), checked from the source.

Each check reads pipecore/ as text or as a syntax tree (the module size
check reads bindings/ too); none imports the package. The limits come from
../shared/DESIGN.md and issue 40: a kernel takes a few named carriers (at
most 12 parameters), a module holds one idea (at most 800 lines), measured
timings live in bench/ and the CHANGELOG, not in comments, and
docs/architecture.md's "where a change goes" table names paths that exist.
"""

import ast
import io
import pathlib
import re
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipecore"
SOURCES = sorted(PACKAGE.rglob("*.py"))
# bindings/ installs as pipecore.bindings (pyproject.toml): its modules count for size too.
BINDINGS = sorted((ROOT / "bindings").rglob("*.py"))

MAX_KERNEL_PARAMETERS = 12
MAX_MODULE_LINES = 800
MAX_TIMING_LINES = 5

# A figure with a time unit ("1.1 s", "0.3-0.5 s", "5 µs", "2-3 ns/B") or a
# speed ratio ("8-10x faster", "costs 6x"). Case matters: "2 S m" counts
# rows; "s b h" (sequence x batch x hidden) is a model formula, "4s" a term.
_TIMING = re.compile(
    r"\d[\d.,]*(?:-\d[\d.]*)?(?: s\b| seconds\b| ?(?:ms|µs|us|ns)\b)(?!\s+b\b)"
    r"|\d[\d.]*(?:-\d[\d.]*)?x (?:faster|slower)"
    r"|\bcosts? \d[\d.]*x\b"
)


def _is_kernel(node):
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("njit", "jit"):
            return True
    return False


def _comment_and_docstring_lines(path):
    """(line number, text) of every comment and docstring line of a file."""
    source = path.read_text()
    out = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU")[:3] in ('"""', "'''"):
            before = tokens[i - 1].type if i else tokenize.NEWLINE
            if before in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE, tokenize.NL,
                          tokenize.ENCODING):
                out.extend((tok.start[0] + k, text) for k, text in enumerate(tok.string.splitlines()))
    return out


def test_the_timing_pattern_finds_what_it_should():
    # Hand-written lines: the first six quote timings, the others do not.
    hits = ["# 1f1b built in 1.1 s against 1.8-2.2 s", "costs 2-3 ns/B here",
            "then they are 8-10x faster than numpy", "they measured 0.3-0.5 s slower",
            "a call costs 6x here", "under 20 ms"]
    misses = ["activation bytes 34 s b h per layer", "4 devices and 8 microbatches",
              "the time unit is seconds", "forward s b h (24h + 4s)", "2 S m rows each",
              "# queue 2s: stage s's F"]
    assert all(_TIMING.search(line) for line in hits)
    assert not any(_TIMING.search(line) for line in misses)


def test_no_kernel_takes_more_than_twelve_parameters():
    over = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _is_kernel(node):
                n = len(node.args.args) + len(node.args.kwonlyargs)
                if n > MAX_KERNEL_PARAMETERS:
                    over.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} takes {n}")
    assert not over, ("kernels over 12 parameters (pass named carriers, "
                      "../shared/DESIGN.md):\n" + "\n".join(over))


def test_no_module_over_800_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in SOURCES + BINDINGS
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules over 800 lines (one idea per file):\n" + "\n".join(long)


def test_comments_do_not_quote_timings():
    quoted = [f"{p.relative_to(ROOT)}:{ln}: {text.strip()}" for p in SOURCES
              for ln, text in _comment_and_docstring_lines(p) if _TIMING.search(text)]
    assert len(quoted) <= MAX_TIMING_LINES, (
        f"{len(quoted)} comment or docstring lines quote timings (at most {MAX_TIMING_LINES}; "
        "figures go to bench/ and CHANGELOG.md):\n" + "\n".join(quoted))


def test_no_docstring_says_raises_none():
    pattern = re.compile(r"^\s*Raises\n\s*-+\n\s*None\s*$", re.MULTILINE)
    found = [str(p.relative_to(ROOT)) for p in SOURCES if pattern.search(p.read_text())]
    assert not found, "a Raises section that says None is left out (numpydoc): " + ", ".join(found)


def test_no_tuple_of_arrays_read_by_number():
    # ``something.units[9]``-style reads of a carrier: an attribute subscripted
    # by an integer literal, where the attribute names a kernel carrier.
    carriers = ("units", "program", "structure", "params", "outputs", "scratch", "cols")
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and node.value.attr in carriers and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, int)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.value.attr}[{node.slice.value}]")
    assert not found, "carriers read by position:\n" + "\n".join(found)


def test_architecture_table_names_paths_that_exist():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Where a change goes", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("|") and "---" not in line][1:]
    assert len(rows) >= 6, "the table lost its rows"
    missing = []
    for row in rows:
        for path in re.findall(r"`([\w./<>-]+\.(?:py|txt|md))`", row):
            if "<" in path:  # a pattern such as schedules/<name>.py: its folder must exist
                folder = path.split("<", 1)[0]
                candidates = [ROOT / "pipecore" / folder, ROOT / folder]
                if not any(c.is_dir() for c in candidates):
                    missing.append(f"{path} (folder {folder})")
                continue
            candidates = [ROOT / "pipecore" / path, ROOT / path]
            if not any(c.exists() for c in candidates):
                missing.append(path)
    assert not missing, "docs/architecture.md names paths that do not exist: " + ", ".join(missing)
