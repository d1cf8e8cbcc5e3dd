"""A chapter's check cells are hidden in the book, as the landing page promises.

A code cell whose job is asserting carries a tag that puts it behind a toggle or off the
page: `hide-input`, `hide-cell`, `remove-input` or `remove-cell` (it still runs, under
nbval and in the book). A cell's job is asserting when it asserts and shows the reader
nothing (no value it ends on, no print, no figure, no display; recording a number is
not showing it), or when it asserts more than `MAX_VISIBLE_ASSERTS` times: a teaching
cell may keep an assert or two beside the table or figure it shows, as chapters 0 and 1
do, and leaves the rest of its checks to a hidden cell after it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))

HIDING_TAGS = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
# Calls whose output a reader sees.
SHOWING_CALLS = {"print", "display", "show", "Markdown", "HTML"}
# Calls that record a number for the text and the README: a cell may end on one (its
# value is displayed then, but it is not what the cell shows).
RECORDING_CALLS = {"put", "glue"}
MAX_VISIBLE_ASSERTS = 2


def _python(source: str) -> str:
    """The cell's Python: IPython magics and shell lines blanked (top-level `await` parses)."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )


def _called_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _shows(tree: ast.Module) -> bool:
    """The cell ends on a value (IPython displays it), or prints, displays or plots."""
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        value = last.value.value if isinstance(last.value, ast.Await) else last.value
        if not (isinstance(value, ast.Call) and _called_name(value) in RECORDING_CALLS):
            return True
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call))
    return any(_called_name(call) in SHOWING_CALLS for call in calls)


def asserts(source: str) -> int:
    """How many assert statements the cell holds (in loops and branches too)."""
    return sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(_python(source))))


def only_asserts(source: str) -> bool:
    """The cell asserts and shows nothing."""
    return asserts(source) > 0 and not _shows(ast.parse(_python(source)))


def is_check(source: str) -> bool:
    """The cell's job is asserting: it only asserts, or asserts more than a teaching
    cell does."""
    return only_asserts(source) or asserts(source) > MAX_VISIBLE_ASSERTS


def visible_checks(path: Path) -> list[str]:
    """`cell N: <first line>` for each check cell the book would show."""
    found = []
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type != "code" or HIDING_TAGS & set(cell.metadata.get("tags", [])):
            continue
        if is_check(cell.source):
            first = next((line for line in cell.source.splitlines() if line.strip()), "")
            found.append(f"cell {index} ({asserts(cell.source)} asserts): {first.strip()[:70]}")
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_every_check_cell_is_hidden(chapter):
    shown = visible_checks(chapter)
    assert not shown, (
        f"{len(shown)} check cells of {chapter.name} are visible; tag them hide-input:\n"
        + "\n".join(shown)
    )


@pytest.mark.parametrize(
    ("source", "check"),
    [
        ("assert x == 1", True),
        ("y = f(x)\nassert y > 0\nrec.put('y', y)", True),
        ("for a in xs:\n    assert a > 0", True),
        ("t = table(x)\nassert len(t) == 3\nt", False),  # ends on the table it shows
        ("assert x\nprint(f'{x} admitted')", False),
        ("fig = figure()\nassert fig.axes\nplt.show()", False),
        ("# NBVAL_IGNORE_OUTPUT\nawait run()\nassert done()", True),
        ("total = sum(xs)", False),  # no assert: not a check
        ("t = table(x)\nassert a\nassert b\nassert c\nt", True),  # mostly checks
    ],
)
def test_a_check_cell_asserts_and_shows_nothing_or_asserts_a_lot(source, check):
    assert is_check(source) == check
