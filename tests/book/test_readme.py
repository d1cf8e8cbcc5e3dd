"""The README's Python examples run as written (on the embedded backend), and the paths
and commands it names exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, re.S)
TEST_NAME = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`|`(test_\w+)`")


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("source", EXAMPLES, ids=lambda s: s.splitlines()[0][:40])
def test_an_example_runs_as_written(source, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-c", source], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_repository_path_it_names_exists():
    named = set(re.findall(r"`((?:ratelimit|bench|tests|notebooks|tools)/[\w./-]+)`", README))
    named |= set(re.findall(r"\]\(((?:notebooks|ratelimit|bench|tests)/[\w./-]+)\)", README))
    assert named, "the README names no paths"
    missing = sorted(p for p in named if not (ROOT / p.split("::")[0]).exists())
    assert not missing, missing


def test_every_test_it_quotes_exists():
    """`tests/x.py::test_a`, and the bare `test_b` names that follow it in the same cell."""
    quoted = 0
    for cell in (cell for line in README.splitlines() for cell in line.split("|")):
        current = None
        for path, qualified, bare in TEST_NAME.findall(cell):
            current = path or current
            name = qualified or bare
            if name and current:
                assert re.search(rf"def {name}\b", (ROOT / current).read_text()), name
                quoted += 1
    assert quoted >= 20


def test_every_make_target_it_names_exists():
    targets = set(re.findall(r"`make ([a-z-]+)", README))
    makefile = (ROOT / "Makefile").read_text()
    missing = sorted(t for t in targets if not re.search(rf"^{t}:", makefile, re.M))
    assert not missing, missing


def test_its_generated_blocks_are_what_the_chapters_records_give():
    """The chapter table, gallery and memory figures quote the committed records only
    (`make refresh` renders them; see ratelimit.lab.readme)."""
    from ratelimit.lab import readme, records

    blocks = readme.readme_blocks(ROOT / "notebooks" / records.RECORDS_DIR)
    assert {"chapters", "gallery"} <= blocks.keys()
    for marker, body in blocks.items():
        shown = readme.between(README, readme.begin(marker), readme.end(marker))
        assert shown == body.strip("\n") + "\n", (
            f"README block {marker!r} differs from the records: run `make refresh`"
        )


def test_the_records_cover_every_chapter():
    from ratelimit.lab import records

    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert stems == list(records.CHAPTERS)


def test_the_acl_rule_is_the_generated_one():
    from ratelimit import acl

    # The rule stands on a line of its own in the README's code block.
    assert acl.rule("rl") in README.splitlines()
