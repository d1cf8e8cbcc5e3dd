"""The explore sliders in the real JupyterLab UI: headless Chromium drives a live Lab.

Writes a two-cell notebook into a temporary root folder (a `figure(limit=10)` that draws a
line plot, then `explorer(figure, limit=(1, 50))` from ratelimit.lab.plotting), starts
`jupyter lab` on it the way tests/test_lab.py does (loopback, free port, a token of this
run's own, stopped by its PID with the kernels it started), opens the notebook in Chromium
(the driver of tests/book/test_report_browser.py), runs all cells through the "Run" menu, waits
for the slider and the figure drawn below it, moves the slider with the keyboard and waits
for the figure to be drawn again. A screenshot lands in build/screenshots/lab_widgets.png.

Without chromium/chromedriver/selenium the test skips and says why; with CI=true it fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.book.test_lab import Lab, running_lab
from tests.book.test_report_browser import SHOTS, browser  # noqa: F401  (a fixture)

NOTEBOOK = "widgets.ipynb"
UI_TIMEOUT = 60  # seconds for Lab to load, the kernel to start and the widget to show
REDRAW_TIMEOUT = 30  # seconds for the figure to be drawn again after the slider moved

FIGURE_CELL = """\
import matplotlib.pyplot as plt

def figure(limit=10):
    fig, ax = plt.subplots(figsize=(4, 2.5))
    xs = list(range(limit + 1))
    ax.plot(xs, [x * x for x in xs])
    ax.set_title(f"limit={limit}")
    return fig
"""
EXPLORER_CELL = """\
from ratelimit.lab.plotting import explorer

explorer(figure, limit=(1, 50))
"""

# The slider of the widget's own output and the figure its Output widget shows below it.
SLIDER = ".jp-OutputArea .jupyter-widgets.widget-slider"
HANDLE = SLIDER + " .noUi-handle"
READOUT = SLIDER + " .widget-readout"
FIGURE_IMG = ".jp-OutputArea .jupyter-widgets .jp-OutputArea-output img"


def _notebook() -> dict:
    def code(source: str) -> dict:
        return {"id": f"cell-{len(source)}", "cell_type": "code", "execution_count": None,
                "metadata": {},
                "outputs": [], "source": source.splitlines(keepends=True)}

    return {
        "cells": [code(FIGURE_CELL), code(EXPLORER_CELL)],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@pytest.fixture(scope="module")
def widget_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """`jupyter lab` as tests/test_lab.py starts it, on a temporary root with NOTEBOOK."""
    root = tmp_path_factory.mktemp("lab-root")
    (root / NOTEBOOK).write_text(json.dumps(_notebook(), indent=1), encoding="utf-8")
    with running_lab(root, tmp_path_factory.mktemp("jupyter")) as server:
        yield server


def _screenshot(driver) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "lab_widgets.png"
    assert driver.save_screenshot(str(shot)), "no screenshot"
    return shot


def _run_all_cells(driver) -> None:
    """Run > Run All Cells, through Lab's own menu bar."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, UI_TIMEOUT)
    for item, label in (("lm-MenuBar-item", "Run"), ("lm-Menu-item", "Run All Cells")):
        xpath = (f"//li[contains(@class,'{item}')]"
                 f"[.//div[contains(@class,'{item}Label')][normalize-space()='{label}']]")
        wait.until(ec.element_to_be_clickable((By.XPATH, xpath))).click()


def test_explorer_slider_redraws_the_figure(browser, widget_lab: Lab) -> None:  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException as Stale
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    # "localhost", not 127.0.0.1: the browser's resolver rules map every other name (IP
    # literals included) to NOTFOUND, so that no page reaches the internet.
    url = widget_lab.url(f"/lab/tree/{NOTEBOOK}").replace("//127.0.0.1:", "//localhost:", 1)
    driver.get(url)
    try:
        # The notebook open and its kernel idle before anything runs.
        WebDriverWait(driver, UI_TIMEOUT).until(lambda d: len(d.find_elements(
            By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell.jp-CodeCell")) == 2)
        WebDriverWait(driver, UI_TIMEOUT).until(lambda d: d.find_elements(
            By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']"
        ) or d.find_elements(By.XPATH, "//*[contains(@class,'jp-StatusBar')]"
                                       "//*[contains(text(),'Idle')]"))
        _run_all_cells(driver)

        def first_figure(d):
            imgs = d.find_elements(By.CSS_SELECTOR, FIGURE_IMG)
            if d.find_elements(By.CSS_SELECTOR, HANDLE) and imgs:
                return imgs[0].get_attribute("src") or False
            return False

        # The page redraws the figure as it likes: an element found one moment may be
        # replaced the next, which is a reason to look again, not a failure.
        before = WebDriverWait(driver, UI_TIMEOUT, ignored_exceptions=(Stale,)).until(
            first_figure
        )
        readout = driver.find_element(By.CSS_SELECTOR, READOUT).text.strip()
        assert readout == "10", f"the slider starts at {readout!r}, not figure's default 10"

        handle = driver.find_element(By.CSS_SELECTOR, HANDLE)
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", handle)
        handle.click()
        handle.send_keys(Keys.ARROW_RIGHT)

        def new_figure(d):
            imgs = d.find_elements(By.CSS_SELECTOR, FIGURE_IMG)
            src = imgs[0].get_attribute("src") if len(imgs) == 1 else None
            return src if src and src != before else False

        redraw = WebDriverWait(driver, REDRAW_TIMEOUT, ignored_exceptions=(Stale,))
        after = redraw.until(new_figure)
        redraw.until(lambda d: d.find_element(
            By.CSS_SELECTOR, READOUT).text.strip() == "11")
    except TimeoutException as exc:
        shot = _screenshot(driver)
        pytest.fail(f"timed out in the Lab UI ({exc.msg}); screenshot {shot}\n"
                    f"server log:\n{widget_lab.log_tail()}")
    shot = _screenshot(driver)
    print(f"figure src {before[:40]}... -> {after[:40]}...; screenshot {shot}")
    assert before.startswith(("data:image/png", "blob:")), before[:80]
    assert after.startswith(("data:image/png", "blob:")), after[:80]
    assert after != before
