"""The book in a real browser: headless Chromium driven by Selenium and chromedriver.

Builds the book from the committed notebooks with tools/book.py into a temporary folder
(no execution: the notebooks hold their outputs; tests/book/test_book.py checks the same
build as files), then opens every page from disk and checks that it loads with no console
error (level SEVERE), that every <img> loaded and its math was typeset, and that nothing
was requested from outside the book's folder (DevTools' network events); that search
finds "GCRA"; that a hidden cell opens on click; that every chapter shows previous / next
links; and that the glossary links land on their terms. Screenshots of the landing page
and of the first chapter land in build/screenshots/ (book_index.png, book_<chapter>.png).

Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver;
CHROMIUM and CHROMEDRIVER override the paths). Without them the tests skip and say why;
with CI=true they fail instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.book.test_book import (
    BUILD_TIMEOUT,
    CHAPTERS,
    SIDEBAR,
    build_book,
    chapter_title,
)

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["index", *SIDEBAR, "search"]
SCREENSHOT_PAGES = {"index", CHAPTERS[0].stem} if CHAPTERS else {"index"}
SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
IN_CI = os.environ.get("CI", "").lower() == "true"
# (The book is built by the first test here too: see test_book.)
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 120)
LOAD_TIMEOUT = 30  # seconds for a page, its images and its scripts

# How this machine's Chromium must start (root, no screen, closed network), and a fixed size.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,1000", "--hide-scrollbars",
    # No page reaches the internet, here or on a connected laptop: the same result everywhere.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
]

IMAGES_JS = """
return Array.from(document.images).map(img => ({
  src: img.currentSrc.slice(0, 80), complete: img.complete, width: img.naturalWidth}));
"""
# Math that MathJax left as TeX (or failed on): waits for it, then must be none.
UNTYPESET_JS = """
if (!document.querySelector('.math.notranslate')) return 0;
if (!(window.MathJax && MathJax.Hub && MathJax.isReady)) return -1;
return Array.from(document.querySelectorAll('.math.notranslate')).filter(
  m => !m.querySelector('.MathJax, .MathJax_Display') || m.querySelector('.MathJax_Error')).length;
"""
TITLE_JS = """
const h = document.querySelector('article h1');
if (!h) return null;
const copy = h.cloneNode(true);
copy.querySelectorAll('.headerlink').forEach(a => a.remove());
return copy.textContent;
"""
PREV_NEXT_JS = """
const link = sel => { const a = document.querySelector(sel);
  return a && a.offsetParent !== null ? a.getAttribute('href') : null; };
return [link('.prev-next-area a.left-prev'), link('.prev-next-area a.right-next')];
"""
LOCAL = ("data:", "blob:")  # besides the book's own files


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the browser tests are required, not optional)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The book of the committed notebooks, as `make run` builds it, without executing."""
    return build_book(tmp_path_factory)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            _missing(f"{path} not found: apt-get install -y {package}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        _missing(f"selenium is not installed ({exc}): make setup")

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    # "performance": the DevTools events, where every request the page made shows up.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # An explicit driver path: Selenium Manager (which would download one) never runs.
    service = Service(executable_path=CHROMEDRIVER, log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(options=options, service=service)
    tree = []
    try:
        tree = psutil.Process(service.process.pid).children(recursive=True)  # Chromium's
        driver.set_page_load_timeout(LOAD_TIMEOUT)
        yield driver
    finally:
        driver.quit()  # stops chromedriver, which stops Chromium
        _, alive = psutil.wait_procs(tree, timeout=10)
        for proc in alive:  # only processes this fixture started, by PID
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


def _wait(driver, condition, timeout: float = LOAD_TIMEOUT) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(condition)


def _load(driver, url: str) -> None:
    """Opens URL and waits for the document, its images and its math."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get_log("performance")
    driver.get(url)
    _wait(driver, lambda d: d.execute_script("return document.readyState") == "complete"
          and all(img["complete"] for img in d.execute_script(IMAGES_JS))
          and d.execute_script(UNTYPESET_JS) == 0)


def _requests(driver, book: Path) -> list[str]:
    """Every URL the book's pages asked for since the last _load (documents, scripts, fonts...);
    not what the browser's own pages (chrome://) load."""
    events = (json.loads(entry["message"])["message"] for entry in driver.get_log("performance"))
    return [e["params"]["request"]["url"] for e in events
            if e["method"] == "Network.requestWillBeSent"
            and e["params"].get("documentURL", "").startswith(book.as_uri())]


def _screenshot(driver, name: str) -> Path:
    """The whole page, figures included: the window grows to the page's height first."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / f"book_{name}.png"
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(int(height), 1000), 20_000))
    assert driver.save_screenshot(str(shot)), f"no screenshot of {name}"
    driver.set_window_size(1280, 1000)
    return shot


@pytest.mark.parametrize("name", PAGES)
def test_page_loads_offline_without_errors(name: str, book: Path, browser) -> None:
    _load(browser, (book / f"{name}.html").as_uri())
    if name == "search":  # its index arrives by script, after the load event
        _wait(browser, lambda d: d.execute_script("return typeof Search !== 'undefined' "
                                                  "&& Search._index !== null"))
    images = browser.execute_script(IMAGES_JS)
    requests = _requests(browser, book)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    shot = _screenshot(browser, name) if name in SCREENSHOT_PAGES else None
    print(f"{name}: {len(images)} images, {len(requests)} requests, {len(errors)} console "
          f"errors" + (f", screenshot {shot.relative_to(ROOT)}" if shot else ""))

    assert not errors, "console errors:\n" + "\n".join(e["message"] for e in errors)
    assert not [img["src"] for img in images if img["width"] <= 0], "images that did not load"
    assert requests, "no request seen: the DevTools log is not recording"
    assert not [url for url in requests if not url.startswith((book.as_uri(), *LOCAL))]

    if name in {nb.stem for nb in CHAPTERS}:
        nb = next(nb for nb in CHAPTERS if nb.stem == name)
        title = browser.execute_script(TITLE_JS)
        assert title is not None and re.sub(r"\s+", " ", title).strip() == chapter_title(nb)
        assert images, f"{name}: a chapter without a single figure"
        # Previous / next, shown at the foot of the page, follow the reading order.
        order = ["index", *SIDEBAR]
        i = order.index(name)
        assert browser.execute_script(PREV_NEXT_JS) == [f"{order[i - 1]}.html",
                                                        f"{order[i + 1]}.html"]


def test_landing_page_links_every_chapter(book: Path, browser) -> None:
    _load(browser, (book / "index.html").as_uri())
    sidebar = browser.execute_script(
        "return Array.from(document.querySelectorAll('.bd-sidebar-primary nav.bd-docs-nav a'))"
        ".map(a => a.getAttribute('href'))")
    assert sidebar == ["#"] + [f"{p}.html" for p in SIDEBAR]  # "#": the landing page itself
    in_text = set(browser.execute_script(
        "return Array.from(document.querySelectorAll('article a')).map(a => a.getAttribute('href'))"
    ))
    assert {f"{nb.stem}.html" for nb in CHAPTERS} <= in_text, "a chapter the landing page omits"


def test_search_finds_gcra(book: Path, browser) -> None:
    _load(browser, (book / "search.html").as_uri() + "?q=GCRA")
    _wait(browser, lambda d: d.execute_script(
        "return document.querySelectorAll('#search-results ul.search li').length > 0 "
        "|| /no documents|did not match/i.test(document.body.innerText)"))
    hits = browser.execute_script(
        "return Array.from(document.querySelectorAll('#search-results ul.search li a'))"
        ".map(a => a.getAttribute('href'))")
    pages = {h.split("?")[0].split("#")[0] for h in hits}
    print(f"GCRA: {len(hits)} results, {sorted(pages)}")
    assert {f"{nb.stem}.html" for nb in CHAPTERS} & pages, "no chapter found for GCRA"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, "\n".join(e["message"] for e in errors)


def test_hidden_cell_opens_on_click(book: Path, browser) -> None:
    """A cell tagged hide-input shows its output; its code appears on a click on the toggle."""
    from selenium.webdriver.common.by import By

    for nb in CHAPTERS:
        _load(browser, (book / f"{nb.stem}.html").as_uri())
        toggles = browser.find_elements(By.CSS_SELECTOR, "details.hide.above-input")
        if toggles:
            break
    else:
        pytest.fail("no chapter has a hidden cell")
    details = toggles[0]
    code = details.find_element(By.CSS_SELECTOR, "div.cell_input")
    assert details.get_attribute("open") is None and not code.is_displayed()
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", details)
    details.find_element(By.TAG_NAME, "summary").click()
    _wait(browser, lambda d: code.is_displayed(), timeout=5)
    assert details.get_attribute("open") is not None
    assert code.text.strip(), "the hidden cell opened on no code"


def test_glossary_links_land_on_their_terms(book: Path, browser) -> None:
    """Every link to a glossary term, on every page, opens on that term's entry."""
    targets: set[str] = set()
    for name in PAGES:
        _load(browser, (book / f"{name}.html").as_uri())
        targets |= set(browser.execute_script(
            "return Array.from(document.querySelectorAll('a[href*=\"#term-\"]'))"
            ".map(a => a.href)"))
    assert targets, "no page links to a glossary term"
    missing = []
    for url in sorted(targets):
        _load(browser, url)
        anchor = url.split("#", 1)[1]
        if not browser.execute_script("return document.getElementById(arguments[0]) !== null",
                                      anchor):
            missing.append(url)
    assert not missing


def test_chromium_is_what_the_tests_drove(browser) -> None:
    """Debian's Chromium and a chromedriver of the same major version, not a download."""
    caps = browser.capabilities
    driver_version = caps["chrome"]["chromedriverVersion"].split()[0]
    assert caps["browserName"] in {"chrome", "chromium"}
    assert caps["browserVersion"].split(".")[0] == driver_version.split(".")[0]
    assert shutil.which(CHROMEDRIVER) is not None
