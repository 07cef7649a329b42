"""Where the docs extensions write their pages, and how.

Every page they make lives under docs/generated/ (ignored by git). A page
is rewritten only when its text changes, so a warm build rereads only what
moved.
"""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
OUT = DOCS / "generated"


def write_pages(pages: dict[str, str], out: Path = OUT) -> None:
    """Write ``{relative path: text}`` under ``out``, leaving unchanged files alone."""
    for rel, text in pages.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def title(text: str, underline: str = "=") -> str:
    """An rst section title."""
    return f"{text}\n{underline * len(text)}\n"


def summary(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line (empty if none)."""
    if not doc:
        return ""
    first = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in first.splitlines())
