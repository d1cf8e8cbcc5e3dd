"""The landing page and the glossary: tools/landing.py and book/glossary.md."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from ratelimit.lab import readme, records

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
RECORDS = NOTEBOOKS / "data" / "records"
GLOSSARY = ROOT / "book" / "glossary.md"

TERMS = [
    "listpack", "skiplist", "EVALSHA", "NOSCRIPT", "hash tag", "TAT",
    "theoretical arrival time", "GCRA", "token bucket", "sliding log", "fixed window",
    "sliding-window counter", "Zipf distribution", "Structured Field", "Retry-After",
    "fail-open", "fail-closed", "clock skew", "near-cache", "cost", "weighted request",
]  # fmt: skip


def _load_landing():
    spec = importlib.util.spec_from_file_location("landing", ROOT / "tools" / "landing.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


landing = _load_landing()

# The chapters that exist so far (a chapter being written has neither notebook nor records).
PRESENT = [stem for stem in records.CHAPTERS if (NOTEBOOKS / f"{stem}.ipynb").exists()]


@pytest.fixture(scope="module")
def page() -> str:
    return landing.landing_page(RECORDS)


def _module(stem: str):
    return importlib.import_module(f"ratelimit.lab.chapters.{records.CHAPTERS[stem]}")


def _headline(stem: str) -> str:
    """The chapter's HEADLINE, filled here from its records file, independently."""
    values = json.loads((RECORDS / f"{stem}.json").read_text())["values"]
    return _module(stem).HEADLINE.format(**{k: v["text"] for k, v in values.items()})


def _sections(page: str, level: str = "### ") -> dict[str, str]:
    """Heading text -> the text up to the next heading of the same or a higher level."""
    parts = re.split(r"^(#{1,3} .*)$", page, flags=re.M)
    return {
        head[len(level) :]: body
        for head, body in zip(parts[1::2], parts[2::2], strict=True)
        if head.startswith(level)
    }


def _tree(tmp: Path, *, without_notebook=(), without_records=()) -> Path:
    """A notebooks folder under tmp linking to the real files, minus some; its records dir."""
    books = tmp / "notebooks"
    (books / "data" / "records").mkdir(parents=True)
    (books / "figures").mkdir()
    for stem in PRESENT:
        if stem not in without_notebook:
            (books / f"{stem}.ipynb").symlink_to(NOTEBOOKS / f"{stem}.ipynb")
        if stem not in without_records:
            (books / "data" / "records" / f"{stem}.json").symlink_to(RECORDS / f"{stem}.json")
        (books / "figures" / f"{stem}.png").symlink_to(NOTEBOOKS / "figures" / f"{stem}.png")
    return books / "data" / "records"


# ---------------------------------------------------------------- the landing page


def test_every_chapter_has_a_card_in_reading_order(page: str) -> None:
    assert PRESENT, "no chapter notebooks found"
    cards = list(_sections(page))
    expected = [f"{{doc}}`{int(s[:2])}. {_module(s).TITLE} <{s}>`" for s in PRESENT]
    assert cards == expected
    order = _sections(page, "## ")["Reading order"]
    positions = [order.index(f"<{stem}>`") for stem in PRESENT]
    assert positions == sorted(positions)


def test_each_card_shows_its_figure_and_the_recorded_headline(page: str) -> None:
    cards = _sections(page)
    for stem in PRESENT:
        body = cards[f"{{doc}}`{int(stem[:2])}. {_module(stem).TITLE} <{stem}>`"]
        paragraphs = [p.strip() for p in body.strip().split("\n\n")]
        assert paragraphs[0] == f"![{_module(stem).TITLE}](figures/{stem}.png)"
        assert paragraphs[1] == _headline(stem)
        assert "{" not in paragraphs[1].replace("{doc}", "")  # every field filled


def test_the_headline_is_the_readme_gallery_text(page: str) -> None:
    # The same record, rendered by ratelimit.lab.readme for the README's gallery.
    gallery = readme.readme_blocks(RECORDS)["gallery"]
    for stem in PRESENT:
        assert f"** {_headline(stem)} |" in gallery
        assert _headline(stem) in page


def test_reading_times_are_computed_from_the_notebooks(page: str) -> None:
    for stem in PRESENT:
        minutes = landing.reading(NOTEBOOKS / f"{stem}.ipynb").minutes
        assert isinstance(minutes, int) and minutes > 0
        assert re.search(rf"<{stem}>`: about {minutes} min \(", page)
    assert "200 a minute" in page  # the page says how it estimates


def test_a_longer_notebook_reads_longer(tmp_path: Path) -> None:
    stem = PRESENT[0]
    records_dir = _tree(tmp_path, without_notebook=[stem])
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    before = landing.reading(NOTEBOOKS / f"{stem}.ipynb")
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "word " * 1000})
    (tmp_path / "notebooks" / f"{stem}.ipynb").write_text(json.dumps(nb))
    page = landing.landing_page(records_dir)
    after = before.minutes + 1000 // landing.WORDS_PER_MINUTE
    assert re.search(rf"<{stem}>`: about {after} min \({before.words + 1000:,} words", page)


def test_reading_counts_what_a_page_shows(tmp_path: Path) -> None:
    def cell(kind, source, tags=(), outputs=()):
        body = {"cell_type": kind, "metadata": {"tags": list(tags)}, "source": source}
        return body | ({"outputs": list(outputs)} if kind == "code" else {})

    png = {"output_type": "display_data", "data": {"image/png": "x"}}
    html = {"output_type": "execute_result", "data": {"text/html": "<table></table>"}}
    nb = {"cells": [
        cell("markdown", "# Title, [a link](https://example.com/a/b) <!-- not read -->"),
        cell("markdown", "| a | b |\n| --- | --- |\n| 1 | 2 |"),
        cell("markdown", "hidden words", tags=["remove-cell"]),
        cell("code", "x", outputs=[png, html]),
        cell("code", "x", tags=["remove-cell"], outputs=[png]),
        cell("code", "x", tags=["remove-output"], outputs=[html]),
    ]}  # fmt: skip
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    got = landing.reading(path)
    # "Title," "[a" "link]" and the table's a b 1 2: marks and addresses are not words
    assert (got.words, got.figures, got.tables) == (3 + 4, 1, 2)
    assert got.minutes == 1


def test_the_run_metadata_appears(page: str) -> None:
    run = _sections(page, "## ")["The run behind these numbers"]
    versions = set()
    for stem in PRESENT:
        meta = json.loads((RECORDS / f"{stem}.json").read_text())["run"]
        row = next(line for line in run.splitlines() if f"<{stem}>`" in line)
        assert meta["date"] in row
        if meta["backend"]:
            assert meta["backend"] in row
        versions |= set(re.findall(r"Redis (\d+\.\d+\.\d+)", meta["backend"] or ""))
    assert versions, "no chapter's records name a Redis version"
    for version in versions:
        assert f"Redis {version} (chapter" in run


def test_a_chapter_still_being_written_is_left_out(tmp_path: Path) -> None:
    stem = PRESENT[-1]
    page = landing.landing_page(_tree(tmp_path, without_notebook=[stem], without_records=[stem]))
    assert f"<{stem}>" not in page and stem not in page
    assert f"<{PRESENT[0]}>`" in page


def test_a_notebook_without_records_fails_clearly(tmp_path: Path) -> None:
    stem = PRESENT[0]
    with pytest.raises(FileNotFoundError, match=rf"no records for chapter {stem}.*make refresh"):
        landing.landing_page(_tree(tmp_path, without_records=[stem]))


def test_records_without_a_notebook_fail_clearly(tmp_path: Path) -> None:
    stem = PRESENT[0]
    with pytest.raises(FileNotFoundError, match=rf"{stem}.ipynb is missing"):
        landing.landing_page(_tree(tmp_path, without_notebook=[stem]))


def test_a_missing_figure_fails_clearly(tmp_path: Path) -> None:
    records_dir = _tree(tmp_path)
    stem = PRESENT[0]
    (tmp_path / "notebooks" / "figures" / f"{stem}.png").unlink()
    with pytest.raises(FileNotFoundError, match="no gallery figure"):
        landing.landing_page(records_dir)


def test_the_page_ends_with_a_hidden_toctree(page: str) -> None:
    block = re.search(r"```\{toctree\}\n(.*?)```\s*$", page, re.S)
    assert block, "no toctree at the end of the page"
    lines = block.group(1).splitlines()
    assert ":hidden:" in lines
    entries = [line for line in lines if line and not line.startswith(":")]
    assert entries == [*PRESENT, "benchmarks", "api", "glossary"]


def test_the_command_line_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert landing.main(["--records", str(RECORDS)]) == 0
    assert capsys.readouterr().out == landing.landing_page(RECORDS)


# ---------------------------------------------------------------- the glossary


def glossary_entries(text: str) -> dict[str, str]:
    """Term -> definition, read from the page's one {glossary} block."""
    blocks = re.findall(r"^```\{glossary\}\n(.*?)^```$", text, re.S | re.M)
    assert len(blocks) == 1, "the glossary page holds one {glossary} block"
    groups: list[tuple[list[str], list[str]]] = []  # (terms, definition lines)
    after_term = False
    for line in blocks[0].splitlines():
        if not line.strip() or (not groups and line.startswith(":")):  # blank, or an option
            after_term = False
        elif not line[0].isspace():  # a term; consecutive terms share one definition
            if not after_term:
                groups.append(([], []))
            groups[-1][0].append(line.strip())
            after_term = True
        else:
            assert groups, f"a definition without a term: {line!r}"
            groups[-1][1].append(line.strip())
            after_term = False
    return {term: " ".join(lines) for terms, lines in groups for term in terms}


def test_the_glossary_defines_every_listed_term() -> None:
    entries = glossary_entries(GLOSSARY.read_text())
    missing = [term for term in TERMS if term not in entries]
    assert not missing, f"the glossary lacks {missing}"
    for term, definition in entries.items():
        assert len(definition.split()) >= 8, f"{term!r} has no real definition"
    assert entries["TAT"] == entries["theoretical arrival time"]
    assert entries["fail-open"] == entries["fail-closed"]


def test_every_term_link_resolves(page: str) -> None:
    defined = {term.lower() for term in glossary_entries(GLOSSARY.read_text())}
    used = re.findall(r"\{term\}`([^`<]+)`", page + GLOSSARY.read_text())
    assert used
    assert {term.lower() for term in used} <= defined


def test_the_glossary_parser_reads_grouped_terms() -> None:
    text = "```{glossary}\na\nb\n  one two\n  three\n\nc\n  four\n```\n"
    assert glossary_entries(text) == {"a": "one two three", "b": "one two three", "c": "four"}


def test_the_glossary_is_a_book_page() -> None:
    text = GLOSSARY.read_text()
    assert text.startswith("# Glossary\n")
