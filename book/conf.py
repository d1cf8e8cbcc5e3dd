"""Sphinx configuration of the book `make run` builds (tools/book.py assembles its sources).

The chapters are notebooks executed by `make run` just before the build: the book shows
those outputs and never runs a kernel itself. Every page reads offline: no asset comes
from another host (MathJax is served from the build, copied from jupyter-server-mathjax).
"""

from __future__ import annotations

project = "Rate-limit lab"
author = "the rate-limit lab's authors"
copyright = "the rate-limit lab's authors, MIT licence"  # noqa: A001  (Sphinx's name)

extensions = ["myst_nb", "sphinx.ext.mathjax", "sphinx.ext.autodoc"]

# The API reference (api.md) reads the installed library's docstrings. Signatures keep
# their annotations as written (strings, `from __future__ import annotations`), and
# members come in the order the source defines them.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True

# Sources are exactly what tools/book.py copied here; anything else is a leftover.
exclude_patterns = ["_build", ".doctrees", "**.ipynb_checkpoints"]

# Notebooks keep the outputs `make run` just produced; kernels are never started here.
nb_execution_mode = "off"
# The slider cells are dropped (they need a live kernel), so no widget JavaScript from a CDN.
nb_ipywidgets_js: dict[str, dict[str, str]] = {}
# Markdown outputs (a chapter's computed headline) are read as MyST, like the cells.
nb_render_markdown_format = "myst"
nb_merge_streams = True

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "attrs_inline"]
myst_heading_anchors = 3
# tools/book.py fails the build on a warning (a `{term}` not in glossary.md, a broken
# cross-reference); Pygments' Lua lexer trips on some valid Lua and then highlights it anyway.
suppress_warnings = ["misc.highlighting_failure"]

html_theme = "sphinx_book_theme"
html_title = "Rate-limit lab"
html_static_path: list[str] = []
html_copy_source = False
html_show_sourcelink = False
# Search result snippets would be fetched with fetch(), which file:// pages cannot do.
html_show_search_summary = False
html_last_updated_fmt = None
# A mode the theme knows from the first visit (an empty one logs a console error); light
# keeps pages and screenshots the same on every machine.
html_context = {"default_mode": "light"}
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "navigation_with_keys": False,
}

# MathJax 2 from the build itself (tools/book.py copies it to _static/mathjax), with the
# STIX web fonts that package ships; `\(..\)` and `\[..\]` are what Sphinx writes. MyST marks
# each page `tex2jax_ignore`, so only the math it parsed (class "math") is typeset; its own
# MathJax settings are for MathJax 3/4 and stay off.
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
myst_update_mathjax = False
mathjax2_config = {
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                "processClass": "tex2jax_process|mathjax_process|math|output_area",
                "processEscapes": False, "processRefs": False, "processEnvironments": False},
    # MathJax declares a blank fallback font at url('about:blank'), which a file:// page may
    # not load (a console error); the font installed under that name, i.e. none, does as well.
    "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web",
                 "imageFont": None,
                 "styles": {"@font-face": {"font-family": "MathJax_Blank",
                                           "src": "local('MathJax_Blank')"}}},
    "showMathMenu": False,
    "messageStyle": "none",
}
