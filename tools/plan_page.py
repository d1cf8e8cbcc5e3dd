"""`make plan`: chapter 8 ("Your traffic") run on an access log, as a notebook and a page.

    python tools/plan_page.py --out build/plan --limit 100/min [--log access.log]
                              [--identity FIELD] [--format clf|combined|jsonl|csv]

Without --log the chapter plans the lab's example log. What can be checked without a
kernel is checked first (the log is a readable file, the limit and the format parse);
then papermill runs the chapter with its parameters cell filled, into OUT/08_your_traffic.ipynb,
and OUT/08_your_traffic.html is that notebook without its code: the prose's glued values
pasted in as the book pastes them (myst-nb's own formatting), glossary roles as plain
words, the glue cells and the values they display left out.

Any failure is one line on stderr, `make plan: error: ...`, naming the cause (the
chapter's own exception message when the chapter stopped, never papermill's traceback):
exit status 2 for a bad limit or format, 1 for anything else.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "08_your_traffic.ipynb"
PROG = "make plan"
# The chapter's own refusals: their message is the whole story. Anything else is a fault of
# the chapter on this log, so the line also says where it stopped.
EXPECTED = {"LogFormatError", "FileNotFoundError", "PermissionError", "OSError"}
ROLE = re.compile(r"\{([a-z:-]+)\}`([^`]*)`")


class Failed(Exception):
    """One line for the user, and the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def check(log: str | None, limit: str, format: str | None) -> None:
    """Refuse, before any kernel starts, what the chapter would refuse later."""
    from ratelimit.lab import accesslog, planner

    try:
        planner.parse_limit(limit)
    except ValueError as exc:
        raise Failed(f"LIMIT={limit!r}: {_first_line(exc)}", status=2) from None
    if format is not None and format not in accesslog.FORMATS:
        raise Failed(f"FORMAT={format!r}: not one of {', '.join(accesslog.FORMATS)}", 2)
    if log is not None:
        path = Path(log)
        if not path.exists():
            raise Failed(f"cannot read {log}: no such file")
        if not path.is_file():
            raise Failed(f"cannot read {log}: not a file")
        if not os.access(path, os.R_OK):
            raise Failed(f"cannot read {log}: permission denied")


def execute(out: Path, parameters: dict[str, Any]) -> Path:
    """Run the chapter with papermill into `out`; a chapter that stops raises `Failed`
    with its exception's message."""
    import papermill

    notebook = out / CHAPTER.name
    notebook.with_suffix(".html").unlink(missing_ok=True)  # a page left from another log
    # The kernel writes its own warnings (one about TCP transport, each run) to the stderr it
    # inherits: into a file beside the notebook, so that stderr carries only our one line.
    kernel_log = notebook.with_suffix(".kernel.log")
    saved = os.dup(2)
    try:
        with open(kernel_log, "wb") as sink:
            os.dup2(sink.fileno(), 2)
            _run(papermill, notebook, parameters)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return notebook


def _run(papermill: Any, notebook: Path, parameters: dict[str, Any]) -> None:
    from papermill.exceptions import PapermillExecutionError

    try:
        papermill.execute_notebook(
            str(CHAPTER),
            str(notebook),
            parameters=parameters,
            cwd=str(CHAPTER.parent),
            progress_bar=False,
            log_output=False,
            kernel_name="python3",
        )
    except PapermillExecutionError as exc:
        message = _first_line(exc.evalue)
        if exc.ename not in EXPECTED:
            message += f" ({exc.ename} in cell {exc.cell_index}; the notebook so far: {notebook})"
        raise Failed(message) from None
    except Exception as exc:  # the kernel died, or papermill refused the notebook
        raise Failed(f"the chapter did not run: {type(exc).__name__}: {_first_line(exc)}") from None


def glued(notebook: Any) -> dict[str, str]:
    """The values the chapter glued (myst-nb `glue`), by name: their text/plain."""
    values = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is not None:
                values[name] = output["data"]["text/plain"]
    return values


def paste(text: str, values: dict[str, str]) -> str:
    """`text` with each `{glue:text}`name:spec`` replaced by its glued value, formatted
    as the book formats it, and any other role (`{term}`word``) by its words."""
    from myst_nb.core.variables import format_plain_text

    def one(match: re.Match[str]) -> str:
        role, body = match.groups()
        if role != "glue:text":
            return re.sub(r"\s*<[^>]*>$", "", body)  # {term}`words <target>`: the words
        name, _, spec = body.partition(":")
        if name not in values:
            return body
        return format_plain_text(values[name], spec)

    return ROLE.sub(one, text)


def page(notebook_path: Path) -> Path:
    """The executed notebook as HTML without code, glue pasted, glue cells left out."""
    import nbformat
    from myst_nb.core.variables import format_plain_text
    from nbconvert import HTMLExporter

    notebook = nbformat.read(notebook_path, as_version=4)
    values = glued(notebook)
    cells = []
    for cell in notebook.cells:
        if "remove-cell" in cell.metadata.get("tags", []):
            continue
        if cell.cell_type == "markdown":
            cell.source = paste(cell.source, values)
        elif cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if "scrapbook" not in o.get("metadata", {})]
        cells.append(cell)
    notebook.cells = cells
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)  # fmt: skip
    title = f"Your traffic: {format_plain_text(values.get('log_name', repr('a log')), '')}"
    body, _ = exporter.from_notebook_node(notebook, resources={"metadata": {"name": title}})
    html = notebook_path.with_suffix(".html")
    html.write_text(body, encoding="utf-8")
    return html


def main(argv: list[str] | None = None) -> int:
    """Check, run, render; one line on stderr and a non-zero status on any failure."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder for the notebook and page")
    parser.add_argument("--log", help="the access log (default: the lab's example log)")
    parser.add_argument("--limit", required=True, help="the limit to plan for, e.g. 100/min")
    parser.add_argument("--identity", help="the field naming a client (default: its address)")
    parser.add_argument("--format", help="the log's format (default: detected)")
    args = parser.parse_args(argv)
    try:
        check(args.log, args.limit, args.format)
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Failed(f"cannot write {out}: {exc.strerror or exc}") from None
        parameters: dict[str, Any] = {"LIMIT": args.limit}
        if args.log is not None:
            parameters["LOG"] = str(Path(args.log).resolve())
        if args.identity:
            parameters["IDENTITY"] = args.identity
        if args.format:
            parameters["FORMAT"] = args.format
        html = page(execute(out, parameters))
    except Failed as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    print(f"{PROG}: {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
