"""The book's landing page, written from the chapters and their records.

Usage: python tools/landing.py [--records notebooks/data/records] > index.md

`landing_page()` returns MyST Markdown: what the lab is for, the reading order with a
reading time per chapter, one card per chapter (its figure, referenced as
`figures/<stem>.png` beside the page, and its headline), the run's date, backend and
Redis version, and a hidden toctree. Nothing on it is typed by hand: titles and
headlines come from the chapter modules (`TITLE`, `HEADLINE`) filled from the committed
records (`ratelimit.lab.records`), reading times from the notebooks themselves.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratelimit.lab import records

RECORDS_DIR = Path("notebooks/data/records")

# Reading time: prose at an unhurried technical pace, plus a short look at each figure
# and table (they are read, not skimmed, but they are not prose either).
WORDS_PER_MINUTE = 200
SECONDS_PER_EXHIBIT = 15

# What a page does not show: myst-nb drops these cells (or their outputs).
REMOVED_CELL = "remove-cell"
REMOVED_OUTPUT = "remove-output"

WORD = re.compile(r"\w")  # a token counts as a word when it holds a letter or digit
LINK_TARGET = re.compile(r"\]\([^)]*\)")  # an address is not read
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$", re.M)
REDIS_VERSION = re.compile(r"\bRedis (\d+(?:\.\d+)+)")


@dataclass(frozen=True)
class Reading:
    """What a reader meets on a chapter's page: words of prose, figures and tables."""

    words: int
    figures: int
    tables: int

    @property
    def minutes(self) -> int:
        """Whole minutes, rounded up, never below one."""
        seconds = self.words * 60 / WORDS_PER_MINUTE
        seconds += (self.figures + self.tables) * SECONDS_PER_EXHIBIT
        return max(1, math.ceil(seconds / 60))


def _text(source: str | list[str]) -> str:
    return source if isinstance(source, str) else "".join(source)


def reading(notebook: Path) -> Reading:
    """Count the words of the markdown cells and the figures and tables a page shows."""
    nb = json.loads(Path(notebook).read_text())
    words = figures = tables = 0
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if REMOVED_CELL in tags:
            continue
        if cell["cell_type"] == "markdown":
            prose = LINK_TARGET.sub("]", HTML_COMMENT.sub("", _text(cell["source"])))
            words += sum(1 for token in prose.split() if WORD.search(token))
            tables += len(TABLE_RULE.findall(prose))
        elif cell["cell_type"] == "code" and REMOVED_OUTPUT not in tags:
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if "image/png" in data or "image/svg+xml" in data:
                    figures += 1
                elif "<table" in _text(data.get("text/html", "")):
                    tables += 1
    return Reading(words, figures, tables)


@dataclass(frozen=True)
class Card:
    """One chapter as the landing page shows it."""

    stem: str
    number: int
    title: str
    headline: str
    reading: Reading
    figure: str  # relative to the page
    run: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.number}. {self.title}"


def cards(records_dir: Path = RECORDS_DIR) -> list[Card]:
    """A card per chapter of `records.CHAPTERS`, in reading order.

    A chapter with neither a notebook nor records yet is left out; one with only one of
    the two, or without its gallery figure, is an error that says what is missing.
    """
    records_dir = Path(records_dir)
    notebooks = records_dir.parent.parent  # notebooks/data/records -> notebooks
    out = []
    for stem, module_name in records.CHAPTERS.items():
        notebook = notebooks / f"{stem}.ipynb"
        recorded = records.path_of(stem, records_dir)
        if not notebook.exists() and not recorded.exists():
            continue  # a chapter still being written
        if not notebook.exists():
            raise FileNotFoundError(f"{recorded} records chapter {stem}, but {notebook} is missing")
        stored = records.load(stem, records_dir)  # says how to record them when missing
        figure = notebooks / "figures" / f"{stem}.png"
        if not figure.exists():
            raise FileNotFoundError(
                f"chapter {stem} has no gallery figure {figure}: run `make refresh "
                f"CHAPTERS=notebooks/{stem}.ipynb` to write it"
            )
        module = importlib.import_module(f"ratelimit.lab.chapters.{module_name}")
        where = f"ratelimit.lab.chapters.{module_name}.HEADLINE"
        out.append(
            Card(
                stem=stem,
                number=int(stem[:2]),
                title=module.TITLE,
                headline=records.fill(module.HEADLINE, stored["values"], where),
                reading=reading(notebook),
                figure=f"figures/{stem}.png",
                run=stored.get("run") or {},
            )
        )
    return out


def _doc(text: str, stem: str) -> str:
    return f"{{doc}}`{text} <{stem}>`"


PURPOSE = """\
# Rate-limit lab

Four Redis rate limiters, each one Lua script, and a book of chapters that drive them
with synthetic traffic and measure what they do. The lab is for three jobs:

- **Learning what a limit means.** "10 per second" admits different requests under a
  {term}`fixed window`, a {term}`sliding log`, a {term}`sliding-window counter` and
  {term}`GCRA`; the chapters replay the same traffic through all four and show where
  they part: at a window boundary, under {term}`clock skew`, under concurrency, when
  Redis fails.
- **Sizing Redis for a limit policy.** From a policy (keys, limit, window) and a traffic
  scenario to bytes per key, checks per second and the number of shards, with the
  memory and server time measured on a real Redis.
- **Keeping the claims true.** Every chapter is committed with its outputs and re-runs
  under nbval in strict mode in `make test`, which CI runs: a table, a printed number or
  an assert that no longer holds fails the build, and every number quoted below comes
  from the recorded run, not from a keyboard.

Each page hides its setup and check cells behind a toggle (they still run), and the
chapters pose exercises: predict a number, then open the hidden solution, whose answer
the notebook asserts. Terms in the text link to the {doc}`glossary`; every public name
of the library is in the {doc}`api`, generated from its docstrings, and the latest
recorded `make bench` is on the {doc}`benchmarks` page.
"""


def _reading_order(chapters: list[Card]) -> list[str]:
    total = sum(card.reading.minutes for card in chapters)
    lines = [
        "## Reading order",
        "",
        "Read them in this order: later chapters lean on the results of earlier ones.",
        "",
    ]
    for card in chapters:
        exhibits = card.reading.figures + card.reading.tables
        lines.append(
            f"{card.number}. {_doc(card.title, card.stem)}: about {card.reading.minutes} min "
            f"({card.reading.words:,} words, {exhibits} figures and tables)"
        )
    lines += [
        "",
        f"About {total} minutes in all. A reading time is estimated from the chapter "
        f"itself: the words of its text at {WORDS_PER_MINUTE} a minute, plus "
        f"{SECONDS_PER_EXHIBIT} s for each figure and table it shows, rounded up; "
        "code and the exercises' solutions are extra.",
    ]
    return lines


def _card(card: Card) -> list[str]:
    return [
        f"### {_doc(card.label, card.stem)}",
        "",
        f"![{card.title}]({card.figure})",
        "",
        card.headline,
        "",
        f"About {card.reading.minutes} min.",
    ]


def _run(chapters: list[Card]) -> list[str]:
    dates = sorted({str(card.run.get("date")) for card in chapters if card.run.get("date")})
    if not dates:
        when = "The records name no date."
    elif len(dates) == 1:
        when = f"Every chapter's numbers were recorded on {dates[0]}."
    else:
        when = (
            f"The chapters' numbers were recorded between {dates[0]} and {dates[-1]}, "
            "each on the date in the table."
        )
    versions = {}
    for card in chapters:
        match = REDIS_VERSION.search(str(card.run.get("backend") or ""))
        if match:
            versions.setdefault(match.group(1), []).append(str(card.number))
    if versions:
        redis = "; ".join(
            f"Redis {version} (chapter{'s' if len(where) > 1 else ''} {', '.join(where)})"
            for version, where in sorted(versions.items())
        )
        redis = f"The Redis version the records name: {redis}."
    else:
        redis = "No chapter's records name a Redis version."
    lines = [
        "## The run behind these numbers",
        "",
        f"{when} {redis} A chapter whose records name no backend did not record one; "
        "its page says what it ran on.",
        "",
        "| chapter | recorded on | backend |",
        "| --- | --- | --- |",
    ]
    for card in chapters:
        backend = card.run.get("backend") or "not named in its records"
        lines.append(f"| {_doc(card.label, card.stem)} | {card.run.get('date', '')} | {backend} |")
    return lines


def landing_page(records_dir: Path = RECORDS_DIR) -> str:
    """The landing page (the book's index) as MyST Markdown."""
    chapters = cards(records_dir)
    if not chapters:
        raise FileNotFoundError(f"no chapter has records under {records_dir}")
    parts = [PURPOSE.rstrip("\n"), "", *_reading_order(chapters), "", "## The chapters", ""]
    for card in chapters:
        parts += [*_card(card), ""]
    parts += [*_run(chapters), ""]
    parts += ["```{toctree}", ":hidden:", ":maxdepth: 1", ""]
    parts += [card.stem for card in chapters]
    parts += ["benchmarks", "api", "glossary", "```", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=RECORDS_DIR)
    args = parser.parse_args(argv)
    sys.stdout.write(landing_page(args.records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
