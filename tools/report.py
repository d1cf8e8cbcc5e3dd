"""Build the HTML report of the executed notebooks.

Usage: python tools/report.py --out build/report [NOTEBOOK ...]

Converts all given notebooks to HTML with a single nbconvert run (start-up dominates its
cost), then writes OUT/index.html linking each chapter under its first markdown heading.
With no notebooks it still writes an index that says so. Uses the standard library, plus
nbformat/nbconvert from the project's venv when there is something to convert.
"""

from __future__ import annotations

import argparse
import html
import re
import subprocess
import sys
from pathlib import Path

from ratelimit.lab.plotting import WIDGET_TAG

HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
INLINE_MARKUP = re.compile(r"[*_`]+")

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Rate-limit lab: report</title>
<style>
  body {{ font-family: system-ui, sans-serif; max-width: 46rem; margin: 3rem auto;
         padding: 0 1rem; line-height: 1.5; color: #222; }}
  h1 {{ font-size: 1.6rem; margin-bottom: 0.2rem; }}
  p.lead {{ color: #555; margin-top: 0; }}
  ol {{ padding-left: 0; list-style: none; }}  /* chapter titles carry their own numbers */
  li {{ margin: 0.4rem 0; }}
  a {{ color: #0b5cad; text-decoration: none; }}
  a:hover {{ text-decoration: underline; }}
  .file {{ color: #777; font-size: 0.85rem; margin-left: 0.4rem; }}
</style>
</head>
<body>
<h1>Rate-limit lab</h1>
<p class="lead">{lead}</p>
{body}
</body>
</html>
"""


def chapter_title(path: Path) -> str:
    """The notebook's first markdown heading, without inline markup; else its file name."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            match = HEADING.match(line)
            if match:
                title = INLINE_MARKUP.sub("", match.group(1)).strip()
                if title:
                    return title
    return path.stem


# nbconvert's template links require.js and MathJax from a CDN. The chapters use
# neither (no maths, no JavaScript outputs), and the report must read offline.
EXTERNAL_SCRIPT = re.compile(r'<script[^>]*\ssrc="https?://[^"]*"[^>]*>\s*</script>\s*')


def convert_to_html(notebooks: list[Path], out: Path) -> None:
    """One nbconvert process for all notebooks; outputs land in OUT as <stem>.html,
    without the scripts nbconvert would fetch from the internet."""
    cmd = [
        sys.executable, "-m", "nbconvert", "--to", "html", "--output-dir", str(out),
        # Slider cells need a live kernel: the static page keeps their code only.
        "--TagRemovePreprocessor.enabled=True",
        f'--TagRemovePreprocessor.remove_all_outputs_tags={{"{WIDGET_TAG}"}}',
    ]  # fmt: skip
    subprocess.run(cmd + [str(nb) for nb in notebooks], check=True)
    for nb in notebooks:
        page = out / f"{nb.stem}.html"
        page.write_text(EXTERNAL_SCRIPT.sub("", page.read_text("utf-8")), "utf-8")


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def render_index(chapters: list[tuple[str, str, str]]) -> str:
    if not chapters:
        lead = "No chapters yet."
        body = (
            "<p>There are no numbered notebooks in <code>notebooks/</code>. "
            "Add one such as <code>notebooks/01_boundary_burst.ipynb</code> and run "
            "<code>make run</code> again.</p>"
        )
    else:
        lead = f"{plural(len(chapters), 'chapter')}, executed by <code>make run</code>."
        items = "\n".join(
            f'  <li><a href="{html.escape(href, quote=True)}">{html.escape(title)}</a>'
            f'<span class="file">{html.escape(name)}</span></li>'
            for href, title, name in chapters
        )
        body = f"<ol>\n{items}\n</ol>"
    return PAGE.format(lead=lead, body=body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/report"), help="report folder")
    parser.add_argument("notebooks", nargs="*", type=Path, help="chapters, in reading order")
    args = parser.parse_args(argv)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    missing = [nb for nb in args.notebooks if not nb.is_file()]
    if missing:
        parser.error("no such notebook: " + ", ".join(map(str, missing)))

    # Drop pages of chapters that were renamed or removed since the last build.
    for stale in out.glob("*.html"):
        stale.unlink()

    chapters = []
    if args.notebooks:
        convert_to_html(args.notebooks, out)
        for nb in args.notebooks:
            chapters.append((f"{nb.stem}.html", chapter_title(nb), nb.name))

    index = out / "index.html"
    index.write_text(render_index(chapters), encoding="utf-8")
    print(f"Report ({plural(len(chapters), 'chapter')}): {index}")
    print(f"Open it with: file://{index.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
