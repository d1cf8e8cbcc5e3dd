"""The numbers a chapter quotes, recorded by the run that measured them.

A chapter opens its records once and puts every number that its prose, the README or
the landing page quotes, as it computes it:

    from ratelimit.lab import records
    rec = records.Chapter("02_clock_skew")
    rec.put("peak_app_clock", peak, "d", "most admitted in a true second, app clocks")

What `put` does depends on RATELIMIT_SAVE_MEASUREMENTS, which the Makefile sets:

- "1" (`make refresh`): the run is the new record; `data/records/<chapter>.json`
  beside the notebooks is rewritten with it (and the README's generated parts are
  rendered from all the records afterwards, `python -m ratelimit.lab.readme`);
- "0" (`make run`, `make test`): the number is checked against the committed record,
  as the text it is quoted as; a difference raises `RecordMismatch`, so a chapter, its
  record and the README cannot drift apart;
- unset (JupyterLab): nothing is read or written, so a reader may change parameters.

The README's chapter table, gallery and member-size table are rendered from the records
by `ratelimit.lab.readme`; `fill` puts a chapter's quoted texts into a template, for the
README and for the book's landing page (`tools/landing.py`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import string
from pathlib import Path
from typing import Any

RECORDS_DIR = Path("data/records")  # beside the notebooks, which run in their own folder
NOTEBOOKS_DIR = Path("notebooks")  # from the repository's root
ENV = "RATELIMIT_SAVE_MEASUREMENTS"

# The chapters the README generates parts for, in reading order: notebook stem -> module.
CHAPTERS = {
    "00_four_algorithms": "four_algorithms",
    "01_boundary_burst": "boundary_burst",
    "02_clock_skew": "clock_skew",
    "03_memory_per_key": "memory_per_key",
    "04_atomicity_and_failures": "atomicity_and_failures",
    "05_algorithms_and_cost": "algorithms_and_cost",
    "06_capacity_planning": "capacity_planning",
    "07_http_route": "http_route",
    "08_your_traffic": "your_traffic",
}


class RecordMismatch(AssertionError):
    """A chapter computed a number that differs from its committed record."""


def _mode() -> str:
    value = os.environ.get(ENV)
    return {"1": "save", "0": "check"}.get(value or "", "off")


def path_of(chapter: str, directory: Path = RECORDS_DIR) -> Path:
    """The records file of a chapter (`chapter` is the notebook's stem)."""
    return Path(directory) / f"{chapter}.json"


def load(chapter: str, directory: Path = RECORDS_DIR) -> dict[str, Any]:
    """A chapter's committed records; a clear error when there are none."""
    path = path_of(chapter, directory)
    if not path.exists():
        raise FileNotFoundError(
            f"no records for chapter {chapter} at {path}: run `make refresh "
            f"CHAPTERS=notebooks/{chapter}.ipynb` to record them"
        )
    return json.loads(path.read_text())


class Chapter:
    """The records of one chapter's run (see the module's docstring)."""

    def __init__(
        self, chapter: str, *, backend: str | None = None, directory: Path = RECORDS_DIR
    ) -> None:
        if not re.fullmatch(r"\d\d_\w+", chapter):
            raise ValueError(f"chapter is a notebook's stem like '02_clock_skew', not {chapter!r}")
        self.chapter = chapter
        self.path = path_of(chapter, directory)
        self.mode = _mode()
        self.values: dict[str, dict[str, Any]] = {}
        self.run = {"date": datetime.date.today().isoformat(), "backend": backend}
        self._committed = load(chapter, directory) if self.mode == "check" else None

    def put(self, name: str, value: Any, fmt: str = "", what: str = "") -> Any:
        """Record `value` under `name`, quoted as `format(value, fmt)`; returns `value`."""
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ValueError(f"a record's name is lower_snake_case, not {name!r}")
        if name in self.values:
            raise ValueError(f"{self.chapter} records {name!r} twice")
        plain = value.item() if hasattr(value, "item") else value  # numpy scalars
        if not isinstance(plain, (int, float, str)):
            raise TypeError(f"record {name!r} must be a number or text, not {type(value).__name__}")
        text = format(plain, fmt)
        self.values[name] = {"value": plain, "text": text, "what": what}
        if self.mode == "check":
            self._check(name, text)
        elif self.mode == "save":
            self._write()
        return value

    def text(self, name: str) -> str:
        """How a recorded number is quoted."""
        return self.values[name]["text"]

    def _check(self, name: str, text: str) -> None:
        assert self._committed is not None
        stored = self._committed["values"].get(name)
        if stored is None:
            raise RecordMismatch(
                f"{self.chapter} has no committed record {name!r} ({self.path}): run "
                f"`make refresh CHAPTERS=notebooks/{self.chapter}.ipynb`"
            )
        if stored["text"] != text:
            raise RecordMismatch(
                f"{self.chapter} now computes {name} = {text}, its committed record says "
                f"{stored['text']} ({self.path}); the README quotes the record: run "
                f"`make refresh CHAPTERS=notebooks/{self.chapter}.ipynb` to record this run"
            )

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"chapter": self.chapter, "run": self.run, "values": self.values}
        self.path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def fill(template: str, values: dict[str, Any], where: str) -> str:
    """A template whose fields are record names, filled with the records' quoted texts
    (`values` as a records file holds them); KeyError naming `where` for a field that
    is not recorded."""
    texts = {name: v["text"] for name, v in values.items()}
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    missing = sorted(fields - texts.keys())
    if missing:
        raise KeyError(f"{where} quotes {missing}, which its chapter does not record")
    return template.format(**texts)
