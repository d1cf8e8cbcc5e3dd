"""Drop the ipywidgets state nbconvert stores in executed notebooks.

Usage: python tools/strip_widget_state.py NOTEBOOK ...

The state holds fresh random model ids on every run; without it a re-run of an
unchanged chapter leaves the committed file as it was. Nothing reads it: the report
leaves the slider cells' outputs out, and JupyterLab rebuilds widgets from a live kernel.
"""

from __future__ import annotations

import sys

import nbformat


def main(paths: list[str]) -> None:
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        if notebook.metadata.pop("widgets", None) is not None:
            nbformat.write(notebook, path)


if __name__ == "__main__":
    main(sys.argv[1:])
