"""Plan a real public access log as a user would, and keep what chapter 8 and the README
show of it: the plan's JSON, the per-route plan's JSON, the figure and where the log
came from.

    python tools/real_log.py apache_logs \
        --source 'elastic/examples@bc53b58: Common Data Formats/apache_logs/apache_logs'

The log is elastic/examples' `apache_logs` (10,000 combined lines, Apache-2.0); it is
not in this repository, so neither `make run` nor CI runs this: the outputs are
committed, and this script is how they are made again. Both plans run through the
command line (`python -m ratelimit.lab plan`), without measuring Redis (the server
time per check comes from the bench record), so the JSON is what a user gets.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
from pathlib import Path

from ratelimit.lab.__main__ import main as plan_main

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "notebooks" / "data" / "real_log"
FIGURE = ROOT / "notebooks" / "figures" / "08_real_log.png"
LIMIT = "60/min"
ROUTES = ("/blog/*=10/min,name=blog", "/presentations/*=30/min,name=presentations")
WHERE = ("method=GET",)


def commands(log: Path, out: Path, figure: Path) -> dict[str, list[str]]:
    """The two `plan` command lines, by the name of the JSON document each writes."""
    common = [str(log), "--no-measure", "--no-progress"]
    routes = [a for route in ROUTES for a in ("--route", route)]
    where = [a for w in WHERE for a in ("--where", w)]
    return {
        "plan": ["plan", *common, "--limit", LIMIT, "--json", str(out / "plan.json"),
                 "--plot", str(figure)],  # fmt: skip
        "routes": ["plan", *common, *routes, *where, "--json", str(out / "routes.json")],
    }


def run(log: Path, source: str, out: Path = OUT, figure: Path = FIGURE) -> dict[str, object]:
    """Plan `log` both ways into `out` (and `figure`); returns the source document."""
    out, figure = out.resolve(), figure.resolve()
    out.mkdir(parents=True, exist_ok=True)
    figure.parent.mkdir(parents=True, exist_ok=True)
    # Planned from the log's own folder, so that the documents name the log, not a path
    # of this machine.
    done = commands(Path(log.name), out, figure)
    for name, argv in done.items():
        with contextlib.chdir(log.resolve().parent), contextlib.redirect_stdout(io.StringIO()):
            code = plan_main(argv)
        if code != 0:
            raise SystemExit(f"plan ({name}) failed with exit {code}")
    data = log.read_bytes()
    described = {
        "source": source,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "lines": data.count(b"\n"),
        "limit": LIMIT,
        "routes": list(ROUTES),
        "where": list(WHERE),
        # As typed in the log's folder, the outputs named without their folder.
        "commands": {
            name: [Path(a).name if a.startswith(str(out)) or a == str(figure) else a
                   for a in argv]
            for name, argv in done.items()
        },  # fmt: skip
    }
    (out / "source.json").write_text(json.dumps(described, indent=1) + "\n")
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the access log to plan")
    parser.add_argument("--source", required=True, help="where the log came from, as cited")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the JSON documents")
    parser.add_argument("--figure", type=Path, default=FIGURE, help="the figure's file")
    args = parser.parse_args(argv)
    described = run(args.log, args.source, args.out, args.figure)
    print(f"planned {described['lines']:,} lines of {args.log} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
