"""The book tools/book.py builds, read as files: pages, navigation, glossary, offline.

Builds the committed notebooks once per test process (no execution: they hold their
outputs) into a temporary folder, as `make run` does with the freshly executed copies;
tests/book/test_report_browser.py opens the same build in a real browser.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))  # what `make run` executes
# The reading order after the landing page: the chapters, the benchmarks, the API
# reference, the glossary.
SIDEBAR = [nb.stem for nb in CHAPTERS] + ["benchmarks", "api", "glossary"]
BUILD_TIMEOUT = 300  # seconds; about 10 s here
# The first test in a process builds the book, bounded by BUILD_TIMEOUT: pytest-timeout's
# default would cut a slow build (a busy machine) short and fail every test after it.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 120)

# An asset the browser would fetch from another host (a link out, <a href>, is fine).
EXTERNAL_ASSET = re.compile(
    r"""<(?:script|link|img|iframe|source|video|audio|embed|object)\b[^>]*?"""
    r"""\b(?:src|href|data|srcset)\s*=\s*["']?\s*((?:https?:)?//[^"' >]+)""",
    re.IGNORECASE,
)
EXTERNAL_CSS = re.compile(r"""(?:@import|url\()\s*["']?\s*((?:https?:)?//[^"')\s]+)""")
HREF = re.compile(r"""<a\b[^>]*?\bhref="([^"]*)\"""", re.IGNORECASE)
IDS = re.compile(r"""\bid="([^"]+)\"""")

_BUILT: dict[str, Path | str] = {}


def build_book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The book of the committed notebooks, built once per test process; returns its folder."""
    if "out" not in _BUILT:
        assert CHAPTERS, "no notebooks/[0-9]*.ipynb to build"
        base = tmp_path_factory.mktemp("book")
        cmd = [sys.executable, str(ROOT / "tools" / "book.py"), "--src", str(base / "src"),
               "--out", str(base / "report"), *map(str, CHAPTERS)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT)
        _BUILT["out"] = base / "report" if done.returncode == 0 else done.stdout + done.stderr
    out = _BUILT["out"]
    assert isinstance(out, Path), f"tools/book.py failed:\n{out}"
    return out


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_book(tmp_path_factory)


def pages(book: Path) -> dict[str, str]:
    """Every HTML page of the book, by file name."""
    return {p.name: p.read_text("utf-8") for p in sorted(book.glob("*.html"))}


def chapter_title(path: Path) -> str:
    """A notebook's first markdown heading, without inline markup: its page's title."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                match = re.match(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", line)
                if match:
                    return re.sub(r"[*_`]+", "", match.group(1)).strip()
    return path.stem


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def test_every_page_is_built(book: Path) -> None:
    built = set(pages(book))
    expected = {"index.html", "search.html", "genindex.html"} | {f"{p}.html" for p in SIDEBAR}
    assert expected <= built, f"missing: {sorted(expected - built)}"
    assert (book / "searchindex.js").stat().st_size > 1000  # the offline full-text index
    assert (book / "_static" / "mathjax" / "MathJax.js").is_file()


def test_no_page_loads_anything_from_another_host(book: Path) -> None:
    found = {name: EXTERNAL_ASSET.findall(text) for name, text in pages(book).items()}
    for css in sorted((book / "_static").rglob("*.css")):
        found[str(css.relative_to(book))] = EXTERNAL_CSS.findall(css.read_text("utf-8"))
    assert not {name: urls for name, urls in found.items() if urls}


def test_math_is_served_from_the_book(book: Path) -> None:
    """Pages with math load MathJax from _static/, never a CDN."""
    for name, text in pages(book).items():
        for src in re.findall(r"""<script[^>]*\bsrc="([^"]*MathJax[^"]*)\"""", text, re.I):
            assert src.startswith("_static/mathjax/MathJax.js"), (name, src)


def test_sidebar_lists_the_chapters_then_the_reference_pages(book: Path) -> None:
    index = pages(book)["index.html"]
    nav = index[index.index('class="bd-sidebar-primary'):]
    nav = nav[: nav.index("</nav>")]
    hrefs = [h for h in HREF.findall(nav) if h.endswith(".html")]
    assert hrefs == [f"{p}.html" for p in SIDEBAR]


@pytest.mark.parametrize("module", ["ratelimit", "ratelimit.sync", "ratelimit.http"])
def test_the_api_reference_documents_every_public_name(book: Path, module: str) -> None:
    """Each name of a module's `__all__` has its entry (an anchor `module.name`), and the
    entries carry text from the docstrings, not just names."""
    public = importlib.import_module(module).__all__
    assert public, module
    page = pages(book)["api.html"]
    documented = set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', page))
    assert not [name for name in public if f"{module}.{name}" not in documented]
    assert {f"{module}.SlidingWindowLimiter.check", f"{module}.SlidingWindowLimiter.peek",
            f"{module}.SlidingWindowLimiter.reset"} <= documented or module == "ratelimit.http"
    # The limiters' inherited methods are wanted; what every exception inherits is noise.
    noise = (".with_traceback", ".add_note", ".args")
    assert not [d for d in documented if d.rsplit(".", 2)[0] == module and d.endswith(noise)]
    text = _text(page)
    assert "Admit or reject one request of" in text  # check's docstring, as written


def test_the_benchmarks_page_shows_the_recorded_tables(book: Path) -> None:
    from bench import readme

    page = _text(pages(book)["benchmarks.html"])
    first = readme.render(json.loads(readme.RECORD.read_text())).splitlines()[0]
    assert first.split(";")[0] in page  # "The latest recorded run: <its date>"
    assert pages(book)["benchmarks.html"].count("<table") >= 5


def test_every_chapter_has_previous_and_next(book: Path) -> None:
    """Previous/next follow the reading order: landing page, chapters, glossary."""
    order = ["index", *SIDEBAR]
    built = pages(book)
    for i, stem in enumerate(order[1:-1], start=1):
        text = built[f"{stem}.html"]
        prev = re.search(r'<a class="left-prev"[^>]*href="([^"]+)"', text)
        nxt = re.search(r'<a class="right-next"[^>]*href="([^"]+)"', text)
        assert prev and prev.group(1) == f"{order[i - 1]}.html", stem
        assert nxt and nxt.group(1) == f"{order[i + 1]}.html", stem


def test_chapter_pages_are_titled_by_their_heading(book: Path) -> None:
    built = pages(book)
    for nb in CHAPTERS:
        h1 = re.search(r"<h1>(.*?)</h1>", built[f"{nb.stem}.html"], re.S)
        assert h1, nb.stem
        assert _text(re.sub(r'<a class="headerlink".*?</a>', "", h1.group(1))) == chapter_title(nb)


def test_glossary_links_resolve(book: Path) -> None:
    built = pages(book)
    ids = {name: set(IDS.findall(text)) for name, text in built.items()}
    terms = {i for i in ids["glossary.html"] if i.startswith("term-")}
    assert len(terms) >= 5, "a glossary of at least a few terms"
    links = {(name, href) for name, text in built.items() for href in HREF.findall(text)
             if "#term-" in href}
    broken = []
    for name, href in sorted(links):
        page, _, anchor = href.partition("#")
        if anchor not in ids.get(page or name, set()):
            broken.append(f"{name}: {href}")
    assert not broken
    # The chapters use the glossary's terms and link to them.
    chapters_linking = {name for name, _ in links if name[:-5] in {nb.stem for nb in CHAPTERS}}
    assert chapters_linking, "no chapter links to a glossary term"


def _tagged(nb: Path, tag: str) -> int:
    cells = nbformat.read(nb, as_version=4).cells
    return sum(tag in c.metadata.get("tags", []) for c in cells if c.cell_type == "code")


def test_tagged_cells_are_hidden_and_sliders_removed(book: Path) -> None:
    """hide-input and hide-cell put a cell behind a toggle (still on the page); remove-cell and
    the slider cells are gone."""
    built = pages(book)
    hidden = 0
    for nb in CHAPTERS:
        text = built[f"{nb.stem}.html"]
        toggles = text.count('<p class="collapsed admonition-title">Show code cell source</p>')
        cells = text.count('<p class="collapsed admonition-title">Show code cell content</p>')
        assert toggles == _tagged(nb, "hide-input"), f"{nb.stem}: hide-input cells"
        assert cells == _tagged(nb, "hide-cell"), f"{nb.stem}: hide-cell cells"
        hidden += toggles + cells
        assert "application/vnd.jupyter.widget-view+json" not in text, nb.stem
        assert "explorer(" not in text, f"{nb.stem}: the slider cell is still shown"
    assert hidden, "no chapter hides a cell"


def _book_module():
    spec = importlib.util.spec_from_file_location("book_tool", ROOT / "tools" / "book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_book_chapter_drops_widget_state_and_slider_cells(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    notebook.cells = [
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["hide-input"]}),
        nbformat.v4.new_code_cell("explorer(f)", metadata={"tags": ["explore-widget"]}),
    ]
    source, dest = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(notebook, source)
    before = source.read_bytes()
    _book_module().book_chapter(source, dest)
    copy = nbformat.read(dest, as_version=4)
    assert "widgets" not in copy.metadata
    assert [c.metadata["tags"] for c in copy.cells] == [
        ["hide-input"], ["explore-widget", "remove-cell"]]
    assert source.read_bytes() == before  # the notebook given is left alone
