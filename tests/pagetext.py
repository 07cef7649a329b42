"""Read a pipecore HTML report as a person does, by its parts: the headline,
the summary table, the notes and each section's settings line (for tests)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

__all__ = ["parse", "plots"]


class Page(HTMLParser):
    """Text of the elements a test looks at: the headline, the summary's
    header and rows, footnotes, and each section's settings line."""

    def __init__(self):
        super().__init__()
        self.stack: list[tuple[str, dict]] = []
        self.headline: list[str] = []
        self.summary_head: list[str] = []
        self.summary_rows: list[list[str]] = []
        self.feet: list[str] = []
        self.settings: list[str] = []
        self.h2: list[str] = []
        self.views_rows: list[str] = []
        self.views_head: list[str] = []
        self._buf: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.stack.append((tag, a))
        cls = a.get("class") or ""
        inside = {c for _t, at in self.stack for c in (at.get("class") or "").split()}
        if tag == "tr" and "summary" in inside and any(t == "tbody" for t, _ in self.stack):
            self.summary_rows.append([])
        if tag in ("p", "th", "td", "h2") or (tag == "div" and cls == "headline"):
            self._buf = []

    def handle_endtag(self, tag):
        inside = {c for _t, at in self.stack for c in (at.get("class") or "").split()}
        cls = (self.stack[-1][1].get("class") or "") if self.stack else ""
        text = " ".join("".join(self._buf or []).split())
        if tag == "p" and "headline" in inside:
            self.headline.append(text)
        elif tag == "p" and cls == "foot":
            self.feet.append(text)
        elif tag == "p" and cls == "setting":
            self.settings.append(text)
        elif tag == "h2":
            self.h2.append(text)
        elif tag == "th" and "summary" in inside:
            self.summary_head.append(text)
        elif tag == "td" and "summary" in inside and self.summary_rows:
            self.summary_rows[-1].append(text)
        elif tag == "th" and "views" in inside:
            body = any(t == "tbody" for t, _ in self.stack)
            (self.views_rows if body else self.views_head).append(text)
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self._buf is not None:
            self._buf.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(re.sub(r"<script>.*?</script>", "", text, flags=re.S))
    return page


def plots(page: str) -> dict:
    out = {}
    for m in re.finditer(r"Plotly\.newPlot\('([^']+)',(\[.*?\]),(\{.*?\}),\{\"responsive\"", page):
        out[m.group(1)] = (json.loads(m.group(2)), json.loads(m.group(3)))
    return out
