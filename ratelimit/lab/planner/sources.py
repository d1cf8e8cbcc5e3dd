"""Many logs as one: a day of rotated files, or the logs of several servers, planned as
the one log they make together (`LogSet`, `expand_logs`, `plan_logs`).

    logs = LogSet(expand_logs(["logs/access.log*"]))     # globs; gzip or not
    plan = plan_logs(["logs/access.log*"], ["100/min"], measure=False)
    plan = plan_logs(paths, ["100/min"], engine="dask")   # on a Dask cluster

Each file is read by its own `accesslog.LogReader` (its format detected, its own
reorder window, its own bad and late lines; a combined log's user agents too, to name
offenders, as `plan_log` reads one log), and their requests are merged in time
order: rotated files follow one another, servers' files interleave. The result is the
plan of the concatenated log sorted by time; within one millisecond, requests keep the
order of the files as given, then of their lines.

A line a reader releases *late* (logged more than its reorder window before a line
already read from the same file) is decided late, as in a single log: it is placed
where its file's newest time so far (its *key*) puts it, after every request of the
other files logged before that time. The merged order is thus a sort by (key, file,
position in the file), a function of each file alone, which is what lets the Dask
engine (`ratelimit.lab.planner.distributed`) give the very same plan.

Memory: each file's reader (bounded, see `accesslog`), plus the rows of the files read
ahead while another file catches up: at most about one chunk per file when the files
cover the same hours, more when one file starts much later than another.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..timebase import seconds_to_ms
from .limits import _candidate_limit
from .planning import _NoRequests, describer, plan_trace
from .results import LogPlan
from .servertime import DEFAULT_ALGORITHMS

ENGINES = ("local", "dask")
_SHOWN_PATHS = 4  # a plan of many files names this many of them


def expand_logs(logs: Sequence[str | Path]) -> list[Path]:
    """The files named by `logs`, in the order given: a path is itself, a pattern with
    `*`, `?` or `[` that is not an existing file its matches in name order (`~` expanded).
    A file named twice counts once. ValueError, naming it, for a pattern that matches no
    file or a path that is not a file."""
    if isinstance(logs, str | Path):
        logs = [logs]
    found: dict[Path, None] = {}
    for given in logs:
        text = str(Path(given).expanduser())
        path = Path(text)
        if not path.exists() and glob.has_magic(text):
            matches = sorted(Path(m) for m in glob.glob(text) if Path(m).is_file())
            if not matches:
                raise ValueError(f"no file matches {given}")
            found.update(dict.fromkeys(matches))
            continue
        if not path.is_file():
            why = "no such file" if not path.exists() else "not a file"
            raise ValueError(f"cannot read {given}: {why}")
        found[path] = None
    if not found:
        raise ValueError("give at least one log")
    return list(found)


def shown_paths(paths: Sequence[Path]) -> str:
    """How a plan names its logs: the path of one, the first few of many."""
    names = [str(p) for p in paths]
    if len(names) <= _SHOWN_PATHS:
        return ", ".join(names)
    return ", ".join(names[:_SHOWN_PATHS]) + f" and {len(names) - _SHOWN_PATHS} more"


def merged_problems(paths: Sequence[Path], problems: Sequence[Any]) -> Any:
    """One `accesslog.Problems` for several files' readers: counts summed, examples
    kept in file order (the first few per reason), each excerpt prefixed with its
    file's name since line numbers are the file's own."""
    from ..accesslog import Problems
    from ..accesslog.problems import EXAMPLES_PER_REASON

    if len(problems) == 1:
        return problems[0]
    out = Problems(reorder_s=problems[0].reorder_s)
    for path, found in zip(paths, problems, strict=True):
        out.lines += found.lines
        out.parsed += found.parsed
        out.late += found.late
        for reason, count in found.counts.items():
            out.counts[reason] = out.counts.get(reason, 0) + count
        for line, reason, text in found.examples:
            if sum(1 for _, why, _ in out.examples if why == reason) < EXAMPLES_PER_REASON:
                out.examples.append((line, reason, f"{path.name}: {text}"))
        for line, reason, text in found.late_examples:
            if len(out.late_examples) < EXAMPLES_PER_REASON:
                out.late_examples.append((line, reason, f"{path.name}: {text}"))
    return out


def _joined(values: Sequence[str]) -> str:
    return ", ".join(dict.fromkeys(values))


@dataclass
class KeyedRows:
    """Requests with where the merge puts them: `key` (the file's newest ms so far),
    `file` (its index) and `pos` (its position in the file's stream)."""

    seconds: np.ndarray  # float Unix seconds, as the reader gives them
    ms: np.ndarray  # whole ms
    key: np.ndarray
    file: np.ndarray
    pos: np.ndarray
    identity: np.ndarray  # object
    cost: np.ndarray
    agent: np.ndarray  # object: the user agent, "" when the reader gives none

    def __len__(self) -> int:
        return len(self.ms)

    def take(self, index: Any) -> KeyedRows:
        return KeyedRows(*(getattr(self, f)[index] for f in _FIELDS))

    @staticmethod
    def concat(parts: Sequence[KeyedRows]) -> KeyedRows:
        if len(parts) == 1:
            return parts[0]
        return KeyedRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))

    def merged(self) -> KeyedRows:
        """These rows in the merge's order: by key, then file, then position."""
        return self.take(np.lexsort((self.pos, self.file, self.key)))


_FIELDS = ("seconds", "ms", "key", "file", "pos", "identity", "cost", "agent")


def open_reader(path: str | Path, **options: Any) -> Any:
    """`accesslog.LogReader` on `path`, reading the user agent too when the log is
    combined (offenders are named with it), as `plan_log` reads one log."""
    from ..accesslog import LogReader

    reader = LogReader(path, **options)
    if reader.format == "combined" and "fields" not in options:
        reader = LogReader(path, **options | {"format": "combined", "fields": ("agent",)})
    return reader


def keyed_chunks(reader: Any, file: int) -> Iterator[KeyedRows]:
    """A reader's chunks as `KeyedRows` of file number `file`: keys never go back."""
    horizon: int | None = None
    done = 0
    for chunk in reader:
        n = len(chunk)
        if n == 0:
            continue
        seconds = chunk["time"].to_numpy(dtype=np.float64)
        ms = seconds_to_ms(seconds)
        key = np.maximum.accumulate(ms)
        if horizon is not None:
            key = np.maximum(key, horizon)
        horizon = int(key[-1])
        yield KeyedRows(
            seconds,
            ms,
            key,
            np.full(n, file, dtype=np.int64),
            np.arange(done, done + n, dtype=np.int64),
            chunk["identity"].to_numpy(dtype=object),
            chunk["cost"].to_numpy(),
            (
                chunk["agent"].to_numpy(dtype=object)
                if "agent" in chunk.columns
                else np.full(n, "", dtype=object)
            ),
        )
        done += n


class LogSet:
    """Several access logs read as one, as trace chunks (`time`, `identity`, `cost`)
    in the merged order (see the module docstring), each chunk sorted by time. The
    options are `accesslog.LogReader`'s, the same for every file; every file is opened
    (and its format detected) at once, so a file that is not a log fails before any is
    read. `problems` (merged) is complete when an iteration ends."""

    def __init__(self, paths: Sequence[str | Path], **options: Any) -> None:
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("give at least one log")
        self.readers = [open_reader(p, **options) for p in self.paths]
        self._agents = any(r.format == "combined" for r in self.readers)

    @property
    def format(self) -> str:
        return _joined([r.format for r in self.readers])

    @property
    def identity_field(self) -> str:
        return _joined([r.identity_field for r in self.readers])

    @property
    def problems(self) -> Any:
        return merged_problems(self.paths, [r.problems for r in self.readers])

    def __iter__(self) -> Iterator[pd.DataFrame]:
        if len(self.readers) == 1:
            yield from self.readers[0]
            return
        for rows in self._merged():
            # plan_trace takes chunks sorted by time: a late row starts a new one.
            cuts = np.flatnonzero(rows.ms[1:] < rows.ms[:-1]) + 1
            for lo, hi in zip([0, *cuts], [*cuts, len(rows)], strict=True):
                columns = {
                    "time": rows.seconds[lo:hi],
                    "identity": rows.identity[lo:hi],
                    "cost": rows.cost[lo:hi],
                }
                if self._agents:
                    columns["agent"] = rows.agent[lo:hi]
                yield pd.DataFrame(columns)

    def _merged(self) -> Iterator[KeyedRows]:
        """Rows in the merge's order, released once no file can still give an earlier
        key: the smallest newest key among the files not yet read to the end."""
        streams = [keyed_chunks(r, i) for i, r in enumerate(self.readers)]
        held: list[KeyedRows | None] = [None] * len(streams)
        newest = [-np.inf] * len(streams)
        live = set(range(len(streams)))
        while live:
            i = min(live, key=lambda j: (newest[j], j))  # the file holding the others back
            rows = next(streams[i], None)
            if rows is None:
                live.discard(i)
            else:
                newest[i] = float(rows.key[-1])
                held[i] = rows if held[i] is None else KeyedRows.concat([held[i], rows])
            mark = min((newest[j] for j in live), default=np.inf)
            ready = []
            for j, rows_j in enumerate(held):
                if rows_j is None:
                    continue
                # Keys equal to the mark may still come from a file before this one.
                cut = len(rows_j) if mark == np.inf else int(np.searchsorted(rows_j.key, mark))
                if cut:
                    ready.append(rows_j.take(slice(0, cut)))
                    held[j] = rows_j.take(slice(cut, None)) if cut < len(rows_j) else None
            if ready:
                yield KeyedRows.concat(ready).merged()


def plan_logs(
    logs: Sequence[str | Path] | str | Path,
    limits: Sequence[Any],
    algorithms: Sequence[str] | None = None,
    *,
    engine: str = "local",
    scheduler: str | None = None,
    workers: int | None = None,
    format: str | None = None,
    identity: str | None = None,
    cost: str | Callable[[dict[str, Any]], int] | None = None,
    time: str | None = None,
    reorder_s: float = 300.0,
    chunk_lines: int = 1_000_000,
    read_ahead: int = 1,
    progress: bool | None = None,
    example: bool = False,
    **planning: Any,
) -> LogPlan:
    """`plan_log` over several logs (paths or globs, see `expand_logs`) read as one
    (`LogSet`). `engine="dask"` replays on a Dask cluster, `scheduler` its address
    (None: a local cluster of `workers` single-threaded worker processes, started for
    this plan and closed after); the plan is the same, key for key
    (`ratelimit.lab.planner.distributed`). The other options are `plan_log`'s.
    ValueError for a pattern matching nothing and for bad options; LogFormatError
    for a file that is not a log, or logs holding no request."""
    from .. import accesslog

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    algorithms = list(DEFAULT_ALGORITHMS if algorithms is None else algorithms)
    limits = list(limits)
    for spec in limits:
        _candidate_limit(spec)  # bad limits fail before a log is read
    paths = expand_logs(logs if not isinstance(logs, str | Path) else [logs])
    options = dict(format=format, identity=identity, cost=cost, time=time,
                   reorder_s=reorder_s, chunk_lines=chunk_lines, read_ahead=read_ahead)  # fmt: skip
    if engine == "dask":
        from .distributed import plan_on_dask

        return plan_on_dask(
            paths, limits, algorithms, scheduler=scheduler, workers=workers,
            reader_options=options, example=example, **planning,
        )  # fmt: skip
    if scheduler is not None or workers is not None:
        raise ValueError("scheduler and workers go with engine='dask'")
    logset = LogSet(paths, progress=progress, **options)

    describe = describer(logset, shown_paths(paths), example, cost)

    try:
        return plan_trace(logset, limits, algorithms, describe=describe, **planning)
    except _NoRequests:
        summary = logset.problems.summary()
        where = shown_paths(paths)
        raise accesslog.LogFormatError(f"{where} holds no request to plan on: {summary}") from None
