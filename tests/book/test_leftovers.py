"""The leftovers plugin (tests/book/leftovers.py) on two small notebooks of its own: one
that leaves a file in its temporary folder fails, naming the file; one that cleans up
passes, its kernel working in a temporary folder of the chapter's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def run_nbval(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell("1 + 1")]
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    # Stored without outputs or counts: nbval runs the cells without comparing them.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval-lax",
         "--nbval-current-env", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
         str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_chapter_that_leaves_a_temporary_file_fails_naming_it(tmp_path):
    done = run_nbval(
        tmp_path,
        "import tempfile\nopen(tempfile.mkstemp(prefix='left-behind-')[1], 'w').close()",
    )
    assert done.returncode != 0, done.stdout
    assert "chapter.ipynb left 1 entries" in done.stdout and "left-behind-" in done.stdout


def test_a_chapter_that_cleans_up_passes(tmp_path):
    done = run_nbval(
        tmp_path,
        "import tempfile, os\nwith tempfile.TemporaryDirectory() as d:\n"
        "    open(os.path.join(d, 'x'), 'w').close()\n"
        "assert os.path.basename(tempfile.gettempdir()).startswith('chapter-tmp-')",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
