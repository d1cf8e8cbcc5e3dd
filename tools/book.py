"""Build the book: execute the chapters, assemble a Sphinx source folder, build the HTML.

Usage: python tools/book.py [--execute-into DIR] [--src SRC] [--out OUT] NOTEBOOK ...

With --execute-into, each notebook is first executed from a clean kernel into DIR (two
at a time: the kernels are single-threaded and the machine has two cores) and the book
is made of those copies; without it, of the notebooks as given (the tests build the
committed ones that way, without running anything). Then SRC is filled with book/'s
configuration and pages, the landing page (tools/landing.py), the chapters and
notebooks/figures/, and Sphinx (myst-nb, sphinx-book-theme) writes OUT, whose
index.html is the entry. Nothing outside DIR, SRC and OUT is written.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BOOK_DIR = ROOT / "book"  # conf.py and the pages that are not chapters
FIGURES_DIR = ROOT / "notebooks" / "figures"  # the gallery, which the landing page shows
RECORDS_DIR = ROOT / "notebooks" / "data" / "records"
LANDING = ROOT / "tools" / "landing.py"
WIDGET_TAG = "explore-widget"  # ratelimit.lab.plotting.WIDGET_TAG, without importing the lab
TIMINGS = ".timings.json"  # in the execution folder: how long each chapter took last time
LAST_PAGES = ("api", "glossary")  # after the chapters in the sidebar, in this order
TOCTREE_BLOCK = re.compile(r"^(`{3,}|:{3,})\{toctree\}.*?^\1[ \t]*$\n?", re.M | re.S)


def execute(notebooks: list[Path], out_dir: Path, jobs: int = 2) -> list[Path]:
    """Execute each notebook from a clean kernel into OUT_DIR, JOBS at a time; returns the copies.

    The slowest chapters (as timed by the previous run) start first, so the two workers
    finish close together. The first failure stops the rest and raises.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    timings_path = out_dir / TIMINGS
    try:
        last = json.loads(timings_path.read_text("utf-8"))
    except (OSError, ValueError):
        last = {}
    order = sorted(notebooks, key=lambda nb: -last.get(nb.name, float("inf")))
    took: dict[str, float] = {}

    def run(nb: Path) -> None:
        start = time.monotonic()
        cmd = [sys.executable, __file__, "--execute-one", str(nb), str(out_dir / nb.name)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        took[nb.name] = round(time.monotonic() - start, 1)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise RuntimeError(f"{nb} failed to execute (exit {done.returncode})")
        print(f"  executed {nb.name} in {took[nb.name]:.1f} s", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures: list[Future[None]] = [pool.submit(run, nb) for nb in order]
        finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f.exception() for f in finished if f.exception() is not None]
        if failed:
            for future in futures:
                future.cancel()
            pool.shutdown(wait=True)
            raise failed[0]  # type: ignore[misc]
    timings_path.write_text(json.dumps(last | took, indent=1, sort_keys=True) + "\n", "utf-8")
    return [out_dir / nb.name for nb in notebooks]


def execute_one(source: Path, dest: Path) -> None:
    """Run SOURCE from a clean kernel in its own folder (as nbconvert --execute does) into DEST.

    The slider cells are left out: the book drops them anyway (they need a live kernel),
    and executing an ipywidgets cell headless now and then stalls nbclient until its
    timeout (jupyter/nbclient#312), which would stall the whole build.
    """
    from nbclient import NotebookClient

    notebook = nbformat.read(source, as_version=4)
    notebook.cells = [c for c in notebook.cells if WIDGET_TAG not in c.metadata.get("tags", [])]
    client = NotebookClient(notebook, timeout=600, record_timing=False, kernel_name="python3",
                            resources={"metadata": {"path": str(source.parent.resolve())}})
    client.execute()
    nbformat.write(notebook, dest)


def book_chapter(source: Path, dest: Path) -> None:
    """Copy a chapter for the book: without ipywidgets state, and without its slider cells,
    which need a live kernel (their markdown sends the reader to JupyterLab)."""
    notebook = nbformat.read(source, as_version=4)
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        tags = cell.metadata.get("tags", [])
        if WIDGET_TAG in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
    nbformat.write(notebook, dest)


def landing_page() -> str:
    """The landing page's MyST Markdown (tools/landing.py), made from the records."""
    spec = importlib.util.spec_from_file_location("landing", LANDING)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.landing_page(RECORDS_DIR)


def toctree(docnames: list[str]) -> str:
    """The sidebar: the chapters in reading order, then the glossary (hidden on the page)."""
    entries = "\n".join(docnames)
    return f"\n\n```{{toctree}}\n:hidden:\n:maxdepth: 1\n\n{entries}\n```\n"


def assemble(chapters: list[Path], src: Path) -> list[str]:
    """Fill SRC (emptied first) with everything Sphinx reads; returns the sidebar's pages."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for item in sorted(BOOK_DIR.iterdir()):
        if item.name.startswith((".", "_")) and item.name != "_static":
            continue  # __pycache__ and editors' files
        if item.is_dir():
            shutil.copytree(item, src / item.name)
        else:
            shutil.copy2(item, src / item.name)
    if FIGURES_DIR.is_dir():
        shutil.copytree(FIGURES_DIR, src / "figures")
    for nb in chapters:
        book_chapter(nb, src / nb.name)

    pages = sorted(p.stem for p in src.glob("*.md") if p.stem != "index")
    extra = [p for p in pages if p not in LAST_PAGES] + [p for p in LAST_PAGES if p in pages]
    docnames = [nb.stem for nb in chapters] + extra
    # The sidebar lists what is built here, so a toctree of the landing page's own gives way.
    index = TOCTREE_BLOCK.sub("", landing_page()).rstrip() + "\n"
    (src / "index.md").write_text(index + toctree(docnames), "utf-8")
    return docnames


def mathjax_dir() -> Path:
    """MathJax 2, as jupyter-server-mathjax ships it (no CDN)."""
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def build(src: Path, out: Path) -> None:
    """Sphinx's HTML build of SRC into OUT (emptied first); a warning fails it."""
    doctrees = src / ".doctrees"
    if out.exists():
        shutil.rmtree(out)
    cmd = [
        sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
        "-d", str(doctrees), str(src), str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    shutil.copytree(mathjax_dir(), out / "_static" / "mathjax")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "report",
                        help="the HTML book (OUT/index.html)")
    parser.add_argument("--src", type=Path, default=ROOT / "build" / "book-src",
                        help="the assembled Sphinx sources")
    parser.add_argument("--execute-into", type=Path, metavar="DIR",
                        help="execute the notebooks into DIR first and build from those")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once")
    parser.add_argument("--execute-one", nargs=2, type=Path, metavar=("NOTEBOOK", "DEST"),
                        help=argparse.SUPPRESS)  # one worker of --execute-into
    parser.add_argument("notebooks", nargs="*", type=Path, help="chapters, in reading order")
    args = parser.parse_args(argv)
    if args.execute_one:
        execute_one(*args.execute_one)
        return 0

    missing = [nb for nb in args.notebooks if not nb.is_file()]
    if missing:
        parser.error("no such notebook: " + ", ".join(map(str, missing)))
    chapters = list(args.notebooks)
    if args.execute_into is not None and chapters:
        start = time.monotonic()
        print(f"Executing {len(chapters)} chapters into {args.execute_into}/ "
              f"({args.jobs} at a time)", flush=True)
        chapters = execute(chapters, args.execute_into, args.jobs)
        print(f"Executed in {time.monotonic() - start:.1f} s", flush=True)

    start = time.monotonic()
    assemble(chapters, args.src)
    build(args.src, args.out)
    index = (args.out / "index.html").resolve()
    print(f"Book ({len(chapters)} chapters) built in {time.monotonic() - start:.1f} s: {index}")
    print(f"Open it with: file://{index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
