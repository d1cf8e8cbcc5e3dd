"""The HTML report in a real browser: headless Chromium driven by Selenium and chromedriver.

Builds the report from the committed notebooks with tools/report.py into a temporary folder
(nbconvert without executing: the notebooks hold their outputs), then opens the index and
every chapter it links to and checks that every <img> loaded, that the console shows no
error (level SEVERE) and that each chapter starts with its heading. A screenshot of each
page lands in build/screenshots/.

Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver;
CHROMIUM and CHROMEDRIVER override the paths). Without them the tests skip and say why;
with CI=true they fail instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))  # what `make run` reports
PAGES = ["index"] + [nb.stem for nb in CHAPTERS]
SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
IN_CI = os.environ.get("CI", "").lower() == "true"
LOAD_TIMEOUT = 30  # seconds for a page and its images

# How this machine's Chromium must start (root, no screen, closed network), and a fixed size.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,1000", "--hide-scrollbars",
    # No page reaches the internet, here or on a connected laptop: the same result everywhere.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
]

EXTERNAL_RE = re.compile(
    r"""<(?:script|link|img|iframe)\b[^>]*?(?:src|href)=["']?(https?://[^"' >]+)""",
    re.IGNORECASE,
)

IMAGES_JS = """
return Array.from(document.images).map(img => ({
  src: img.currentSrc.slice(0, 80), complete: img.complete, width: img.naturalWidth}));
"""
FIRST_HEADING_JS = """
const h = document.querySelector('h1, h2, h3, h4, h5, h6');
if (!h) return null;
const copy = h.cloneNode(true);
copy.querySelectorAll('.anchor-link').forEach(a => a.remove());
return copy.textContent;
"""


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the browser tests are required, not optional)")
    pytest.skip(reason)


def _load_report_module():
    spec = importlib.util.spec_from_file_location("report", ROOT / "tools" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of the committed notebooks, as `make run` writes it, without executing."""
    assert CHAPTERS, "no notebooks/[0-9]*.ipynb to report"
    out = tmp_path_factory.mktemp("report")
    cmd = [sys.executable, str(ROOT / "tools" / "report.py"), "--out", str(out)]
    done = subprocess.run(cmd + [str(nb) for nb in CHAPTERS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.glob("*.html")) == sorted(f"{p}.html" for p in PAGES)
    return out


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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
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


@pytest.fixture(scope="module")
def titles() -> dict[str, str]:
    """Each chapter's first markdown heading, as tools/report.py reads it."""
    report_module = _load_report_module()
    return {nb.stem: report_module.chapter_title(nb) for nb in CHAPTERS}


def _open(driver, page: Path) -> dict:
    """Loads PAGE, waits for its images; returns what the checks need."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(page.as_uri())
    WebDriverWait(driver, LOAD_TIMEOUT).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
        and all(img["complete"] for img in d.execute_script(IMAGES_JS))
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / f"{page.stem}.png"
    # The whole page, figures included: grow the window to the page's height first.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(int(height), 1000), 20_000))
    assert driver.save_screenshot(str(shot)), f"no screenshot of {page.name}"
    driver.set_window_size(1280, 1000)
    return {
        "images": driver.execute_script(IMAGES_JS),
        "heading": driver.execute_script(FIRST_HEADING_JS),
        "links": driver.execute_script(
            "return Array.from(document.querySelectorAll('a[href$=\".html\"]'))"
            ".map(a => [a.getAttribute('href'), a.textContent])"
        ),
        "severe": [e for e in driver.get_log("browser") if e["level"] == "SEVERE"],
        "external": EXTERNAL_RE.findall(page.read_text(encoding="utf-8")),
        "shot": shot,
    }


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\u00b6", "")).strip()


@pytest.mark.parametrize("name", PAGES)
def test_page_renders(name: str, report: Path, browser, titles: dict[str, str]) -> None:
    seen = _open(browser, report / f"{name}.html")
    errors = seen["severe"]
    print(f"{name}: {len(seen['images'])} images, {len(errors)} console errors, "
          f"screenshot {seen['shot'].relative_to(ROOT)}")

    broken = [img["src"] for img in seen["images"] if img["width"] <= 0]
    assert not broken, f"{name}: images that did not load: {broken}"
    assert not errors, "console errors:\n" + "\n".join(e["message"] for e in errors)
    assert not seen["external"], f"{name}: loads from the internet: {seen['external']}"
    assert seen["shot"].stat().st_size > 0
    if name == "index":
        # The index links every chapter under its title, in order, to a page that exists.
        assert seen["links"] == [[f"{nb.stem}.html", titles[nb.stem]] for nb in CHAPTERS]
        assert seen["heading"] is not None and _normalise(seen["heading"]) == "Rate-limit lab"
    else:
        assert seen["images"], f"{name}: a chapter without a single figure"
        assert seen["heading"] is not None, f"{name}: no heading at all"
        assert _normalise(seen["heading"]) == titles[name]


def test_chromium_is_what_the_tests_drove(browser) -> None:
    """Debian's Chromium and a chromedriver of the same major version, not a download."""
    caps = browser.capabilities
    driver_version = caps["chrome"]["chromedriverVersion"].split()[0]
    assert caps["browserName"] in {"chrome", "chromium"}
    assert caps["browserVersion"].split(".")[0] == driver_version.split(".")[0]
    assert shutil.which(CHROMEDRIVER) is not None


def test_report_is_self_contained(report: Path) -> None:
    """A report that needs no network: no page loads anything from the internet."""
    external = {p.name: EXTERNAL_RE.findall(p.read_text(encoding="utf-8"))
                for p in sorted(report.glob("*.html"))}
    assert not {name: urls for name, urls in external.items() if urls}
