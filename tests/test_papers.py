"""Every schedule family says where it comes from (issue 52, part 6):
``Family.paper``, and ``pipecore families`` listing it within 120 columns."""

import datetime
import json

import pytest

import pipecore as pc
from pipecore.cli import main
from pipecore.schedules import registry


def _run(argv, capsys):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_every_registered_family_has_a_paper_with_an_https_link():
    for name in pc.schedules():
        paper = pc.family(name).paper
        assert isinstance(paper, pc.Paper), f"{name} has no paper"
        assert paper.url.startswith("https://"), (name, paper.url)
        assert paper.authors.strip() and paper.title.strip() and paper.venue.strip()
        # GPipe (2018 on arXiv) is the oldest schedule pipecore builds.
        assert 2018 <= paper.year <= datetime.date.today().year, (name, paper.year)
        citation = paper.citation()
        assert paper.title in citation and str(paper.year) in citation and paper.authors in citation


def test_families_citing_one_address_cite_it_the_same_way():
    # A paper cited by several families (zero bubble, controllable memory) is
    # one text: the same address must not carry two titles, venues or years.
    seen = {}
    for name in pc.schedules():
        p = pc.family(name).paper
        key = (p.authors, p.title, p.venue, p.year)
        assert seen.setdefault(p.url, (name, key))[1] == key, (
            f"{name} and {seen[p.url][0]} cite {p.url} differently")


def test_zb_v_cites_the_version_of_the_paper_that_has_it():
    # ZB-V is in the arXiv version of the zero-bubble paper (section 6); the
    # ICLR 2024 version has ZB-H1 and ZB-H2 only (the authors' project page).
    assert "arxiv.org/abs/2401.10241" in pc.family("zb-v").paper.url
    assert pc.family("zb-h1").paper.venue == "ICLR 2024"


@pytest.mark.parametrize("field, value, match", [
    ("url", "http://arxiv.org/abs/1811.06965", "https"),
    ("title", "  ", "title"),
    ("year", "2019", "year"),
    ("year", True, "year"),
])
def test_a_bad_paper_is_an_error_naming_the_field(field, value, match):
    args = {"authors": "Huang et al.", "title": "GPipe", "venue": "NeurIPS 2019", "year": 2019,
            "url": "https://arxiv.org/abs/1811.06965"} | {field: value}
    with pytest.raises(ValueError, match=match):
        pc.Paper(**args)


def test_a_family_whose_paper_is_not_a_paper_is_refused():
    fam = pc.family("gpipe")
    with pytest.raises(ValueError, match="'paper' must be a pipecore Paper"):
        registry.Family("x", fam.builder, fam.formula, paper="GPipe, 2019")


def test_families_lists_every_family_within_120_columns(capsys):
    code, out, _ = _run(["families"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 120
    starts = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    for name in pc.schedules():
        assert name in starts, f"{name} has no entry"
        assert pc.family(name).paper.url in out
    assert "options: waves" in out  # hanayo's option


def test_families_stays_within_120_columns_for_long_text(monkeypatch, capsys):
    # A family registered by a user, with a long summary, options and note,
    # and one without a paper.
    fam = pc.family("gpipe")
    long = pc.Paper("A. Author, B. Author and C. Author", "A title " * 20, "Some Venue 2024", 2024,
                    "https://example.org/" + "x" * 150, note="a note " * 30)
    monkeypatch.setitem(registry._REGISTRY, "zz-long", registry.Family(
        "zz-long", fam.builder, fam.formula, summary="word " * 40, options=("opt",) * 30,
        paper=long))
    monkeypatch.setitem(registry._REGISTRY, "zz-none", registry.Family(
        "zz-none", fam.builder, fam.formula, summary="no paper"))
    code, out, _ = _run(["families"], capsys)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 120
    entry = out.split("\nzz-none", 1)[1].split("\n\n", 1)[0]
    assert "paper:   none recorded" in entry


def test_families_json_has_every_family_and_its_paper(capsys):
    code, out, _ = _run(["families", "--json"], capsys)
    assert code == 0
    records = json.loads(out)
    assert [r["name"] for r in records] == pc.schedules()
    by_name = {r["name"]: r for r in records}
    assert by_name["zb-v"]["chunks"] == {"takes": True, "default": 2, "fixed": 2}
    assert by_name["zb-v"]["split"] is True
    assert by_name["hanayo"]["options"] == ["waves"]
    for r in records:
        paper = pc.family(r["name"]).paper
        assert r["paper"]["url"] == paper.url and r["paper"]["citation"] == paper.citation()


def test_list_still_prints_names_and_summaries(capsys):
    code, out, _ = _run(["list"], capsys)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == pc.schedules()
