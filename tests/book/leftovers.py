"""A pytest plugin: a chapter leaves nothing behind outside `build/`.

Under nbval, each chapter's kernel starts with a temporary folder of its own (`TMPDIR`,
which Python's `tempfile` and most tools honour); once the kernel has stopped, anything
still in that folder fails the chapter's last cell, naming what was left. Loaded by
pyproject.toml's `addopts` (`-p tests.book.leftovers`); it touches nothing but nbval's
items.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_OWN = "_chapter_tmp"  # on the notebook's collector: (its folder, the TMPDIR before)


def _notebook(item: Any) -> Any:
    parent = getattr(item, "parent", None)
    return parent if type(parent).__name__ == "IPyNbFile" else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the notebook's kernel starts (with its first cell): its own TMPDIR."""
    notebook = _notebook(item)
    if notebook is None or hasattr(notebook, _OWN):
        return
    own = Path(tempfile.mkdtemp(prefix=f"{Path(str(notebook.path)).stem}-tmp-"))
    setattr(notebook, _OWN, (own, os.environ.get("TMPDIR")))
    os.environ["TMPDIR"] = str(own)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the notebook's last cell (its kernel stopped): the folder must be empty."""
    result = yield
    notebook = _notebook(item)
    if notebook is None or _notebook(nextitem) is notebook or not hasattr(notebook, _OWN):
        return result
    own, before = getattr(notebook, _OWN)
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    left = sorted(str(p.relative_to(own)) for p in own.iterdir())
    shutil.rmtree(own, ignore_errors=True)
    if left:
        raise AssertionError(
            f"{Path(str(notebook.path)).name} left {len(left)} entries in its temporary "
            f"folder (a chapter writes only under build/): {', '.join(left[:10])}"
        )
    return result
