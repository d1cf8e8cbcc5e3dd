"""Every chapter stays thin: narrative, parameters, calls into its lab module, tables,
figures and asserts. Its infrastructure lives in `ratelimit.lab` and `ratelimit.devtools`.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
MAX_CODE_LINES = 250
FIRST_SECTION_WITHIN = 25  # lines of code before the first "## " section heading

# What a chapter must not do itself: define classes, patch, signal or manage processes,
# install logging handlers.
FORBIDDEN = {
    "a class definition": re.compile(r"^\s*class\s+\w+", re.M),
    "monkeypatching": re.compile(r"\bmock\b|monkeypatch|patch\.object|setattr\("),
    "process signals": re.compile(r"\bsignal\.|os\.kill\("),
    "process control": re.compile(r"\bsubprocess\b|Popen\("),
    "a logging handler": re.compile(r"logging\.Handler|addHandler\("),
}


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def lines_before_first_section(path: Path) -> int:
    count = 0
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, re.M):
            return count
        if cell.cell_type == "code":
            count += len(cell.source.splitlines())
    return count


def test_there_are_chapters():
    assert len(CHAPTERS) >= 6


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_is_at_most_its_code_budget(path):
    lines = sum(len(source.splitlines()) for source in code_cells(path))
    assert lines <= MAX_CODE_LINES, f"{path.name}: {lines} lines of code"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_first_section_comes_early(path):
    lines = lines_before_first_section(path)
    assert lines <= FIRST_SECTION_WITHIN, f"{path.name}: {lines} lines before the first section"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_holds_no_infrastructure(path):
    source = "\n".join(code_cells(path))
    found = [what for what, pattern in FORBIDDEN.items() if pattern.search(source)]
    assert not found, f"{path.name} contains {', '.join(found)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_calls_its_own_lab_module(path):
    module = re.sub(r"^\d+_", "", path.stem)
    assert (ROOT / "ratelimit" / "lab" / "chapters" / f"{module}.py").is_file()
    assert f"ratelimit.lab.chapters import {module}" in "\n".join(code_cells(path))
