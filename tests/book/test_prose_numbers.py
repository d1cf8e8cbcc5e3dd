"""No number in a chapter's prose is typed by hand.

A number the text of a chapter quotes comes from its run: a code cell glues it
(`myst_nb.glue("name", value)`, in a cell tagged `remove-cell`; nbval compares the glued
value's text like any output) and the markdown pastes it (`` {glue:text}`name:,.1f` ``), so
text and outputs cannot drift. What is not a result may stay typed:

- a chapter's stated inputs: a literal of its `parameters` cell (a `_MS` or `_S`
  parameter also in seconds or milliseconds);
- chapter, section, figure and exercise numbers, years, RFC and draft numbers, HTTP
  status codes, versions (Redis 7, Python 3.12), list markers;
- what a chapter lists in its notebook metadata `stated_numbers`: a number that is a
  fact, not a result, with the reason (`{"128": "Redis's default
  zset-max-listpack-entries"}`);
- anything in inline code, code blocks, math, link targets, HTML comments and glue roles.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))

# Removed before looking for numbers: each is not prose, or pastes a computed value.
NOT_PROSE = [
    re.compile(r"^(`{3,}|:{3,}).*?^\1[ \t]*$", re.M | re.S),  # fenced blocks, directives
    re.compile(r"<!--.*?-->", re.S),
    re.compile(r"\$\$.*?\$\$", re.S),
    re.compile(r"(?<!\\)\$[^$\n]+\$"),
    re.compile(r"\{[a-z:-]+\}`[^`]*`"),  # roles: {glue:text}`name`, {term}`...`, {ref}`...`
    re.compile(r"`[^`\n]+`"),
    re.compile(r"\[\d+\]\([^)]*\)"),  # a link whose text is a chapter's number
    re.compile(r"\]\([^)]*\)"),  # a link's target (its text stays)
    re.compile(r"\]\[[^\]]*\]"),
    re.compile(r"^\s*\([^)]+\)=\s*$", re.M),  # MyST targets
    re.compile(r"^#+\s+\d+(\.\d+)*\.?", re.M),  # a heading's own number
    re.compile(r"^\s*(\d+\.|[-*+])\s", re.M),  # list markers
    re.compile(r"\{[a-z-]+\}", re.I),  # a directive's or role's name left alone
]
# Numbers that name, not measure.
NAMING = re.compile(
    r"(?ix)"
    r"\b(?:chapters?|sections?|§|figures?|fig\.|exercises?|solutions?|steps?|parts?|items?"
    r"|tables?|rfc|draft[-\w]*?-|redis|python|http/|version|v|rule|cells?|pep|iso)"
    r"\s*\d+(?:\.\d+)*(?:\s*(?:(?:,|and|to|or|-|–)\s*\d+(?:\.\d+)*))*"
    r"|\b(?:19|20)\d\d\b(?!\s*(?:ms|s|us|requests|keys|bytes|B|checks|%))"
    r"|\b(?:401|403|404|429|500|502|503|504)\b"  # HTTP statuses
    r"|(?:answer(?:s|ed)?|HTTP|status|code)\s+(?:200|204|400)\b|\b(?:200|400)(?=\s*(?:s\b|OK\b|or|and))"
    r"|\[\d+\]"  # a link whose text is a chapter's number
    r"|\b\d{1,2}\s+(?:January|February|March|April|May|June|July|August|September|October"
    r"|November|December)\b"
    r"|\b[A-Z]+\d+\b"  # identifiers like P99, S3
    r"|\bp\d+(?:\.\d+)?\b"  # percentiles' names: p50, p99.9
    r"|\b\d+(?:st|nd|rd|th)\b(?=\s+(?:percentile|of|in|chapter|section|request|check))"
    r"|\b(?:one|two)-\d+\b"
)
NUMBER = re.compile(r"(?<![\w.])\d[\d,_]*(?:\.\d+)?")


def markdown_cells(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]


def stated_inputs(nb: nbformat.NotebookNode) -> set[str]:
    """The chapter's parameters (and the metadata's `stated_numbers`), as typed numbers."""
    found: set[str] = set(nb.metadata.get("stated_numbers", {}))
    for cell in nb.cells:
        if cell.cell_type != "code" or "parameters" not in cell.metadata.get("tags", []):
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                for const in ast.walk(node.value):
                    if isinstance(const, ast.Constant) and isinstance(const.value, int | float):
                        found |= _spellings(const.value)
                        for name in names:
                            if name.endswith("_MS"):
                                found |= _spellings(const.value / 1000)
                            if name.endswith(("_S", "_SECONDS")):
                                found |= _spellings(const.value * 1000)
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        found |= {n.replace(",", "") for n in NUMBER.findall(const.value)}
    return found


def _spellings(value: float) -> set[str]:
    """How a parameter may be written in prose: 1000, 1,000, 1.5, 0.5."""
    if isinstance(value, bool):
        return set()
    if float(value).is_integer():
        return {str(int(value))}
    return {repr(float(value)), f"{value:g}"}


def unglued_numbers(path: Path) -> list[str]:
    """`cell N: <number> in "...context..."` for each typed number in the prose."""
    nb = nbformat.read(path, as_version=4)
    allowed = stated_inputs(nb)
    found = []
    for index, source in markdown_cells(nb):
        text = source
        for pattern in NOT_PROSE:
            text = pattern.sub(" ", text)
        text = NAMING.sub(" ", text)
        for match in NUMBER.finditer(text):
            number = match.group().rstrip(",").replace(",", "").replace("_", "")
            if number in allowed:
                continue
            start, end = max(0, match.start() - 40), match.end() + 40
            context = " ".join(text[start:end].split())
            found.append(f'cell {index}: {match.group()} in "{context}"')
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_every_number_in_the_prose_comes_from_the_run(chapter):
    typed = unglued_numbers(chapter)
    assert not typed, f"{len(typed)} typed numbers in {chapter.name}:\n" + "\n".join(typed)


def test_the_scan_finds_a_typed_number_and_passes_glued_ones(tmp_path):
    """The scan itself: a typed result is found; glued, coded, naming and stated
    numbers are not."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["stated_numbers"] = {"128": "Redis's default zset-max-listpack-entries"}
    nb.cells = [
        nbformat.v4.new_code_cell(
            "LIMIT = 10\nWINDOW_MS = 2000", metadata={"tags": ["parameters"]}
        ),
        nbformat.v4.new_markdown_cell(
            "## 3. Results\n\nAt {glue:text}`share:.1%` rejected, with `LIMIT = 99` and a "
            "limit of 10 per 2 s window (chapter 4, RFC 6585, HTTP 429, Redis 7, in 2015, "
            "p99), and 128 entries in a listpack, the log admitted 11 in one second."
        ),
    ]
    path = tmp_path / "09_scan.ipynb"
    nbformat.write(nb, path)
    typed = unglued_numbers(path)
    assert [t.split(" in ")[0] for t in typed] == ["cell 1: 11"], typed
