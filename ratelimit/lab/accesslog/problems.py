"""What went wrong reading a log: the reasons a line is bad, the verdict codes the
parsers give a line, and `Problems`, their tally (`ratelimit.lab.accesslog`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

EXAMPLES_PER_REASON = 5
"""Bad lines kept as examples, per reason (and late lines)."""

EXCERPT_CHARS = 120

MALFORMED = "malformed"
TRUNCATED = "truncated"
TOO_LONG = "too long"
BAD_TIME = "bad time"
NO_TIME = "no time"
NO_IDENTITY = "no identity"
BAD_COST = "bad cost"
BLANK = "blank"

# Line verdicts (the clf scan gives the first five), and the reasons they stand for.
_OK, _BLANK, _MALFORMED, _BAD_TIME, _TOO_LONG, _NO_TIME, _NO_IDENTITY, _BAD_COST = range(8)
_PARTIAL = 8  # client, time and request read, a later field not: a request all the same
_TRUNCATED = -1
_REASONS = {
    _BLANK: BLANK,
    _MALFORMED: MALFORMED,
    _BAD_TIME: BAD_TIME,
    _TOO_LONG: TOO_LONG,
    _NO_TIME: NO_TIME,
    _NO_IDENTITY: NO_IDENTITY,
    _BAD_COST: BAD_COST,
    _TRUNCATED: TRUNCATED,
}
_NO_NS = np.iinfo(np.int64).min  # "not a time"
_HEADER = 99  # a csv header's verdict: neither a request nor a bad line


class LogFormatError(ValueError):
    """The file is not a log this module reads (empty, binary, unknown format), or it
    lacks a field that was named."""


# --- what went wrong -----------------------------------------------------------------


@dataclass
class Problems:
    """The lines that did not become requests, and the lines that came late.

    ``lines``: lines read (blank and bad ones included; a csv header is not counted);
    ``parsed``: lines that became requests; ``counts``: reason -> bad lines;
    ``examples``: (1-based line number, reason, excerpt), the first few per reason;
    ``late``: lines more than ``reorder_s`` older than a line before them (still
    requests, decided late); ``late_examples``: the first few, as examples are;
    ``partial``: clf and combined lines whose client, time and request were read but a
    later field not (still requests); ``partial_examples``: the first few;
    ``stopped``: why and where reading ended before the end of the file ("" when it
    did not: a gzip file cut off or damaged).
    """

    lines: int = 0
    parsed: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    examples: list[tuple[int, str, str]] = field(default_factory=list)
    late: int = 0
    late_examples: list[tuple[int, str, str]] = field(default_factory=list)
    reorder_s: float = 300.0
    partial: int = 0
    partial_examples: list[tuple[int, str, str]] = field(default_factory=list)
    stopped: str = ""

    @property
    def skipped(self) -> int:
        """Bad lines: ``lines - parsed``."""
        return sum(self.counts.values())

    def summary(self) -> str:
        """A few lines for people: what was skipped and why, the first examples, and
        how many lines came late."""
        if not self.skipped:
            out = [f"all {self.lines:,} lines parsed"]
        else:
            parts = []
            for reason, count in sorted(self.counts.items(), key=lambda kv: -kv[1]):
                where = [line for line, why, _ in self.examples if why == reason]
                more = ", ..." if count > len(where) else ""
                label = "line" if count == 1 else "lines"
                parts.append(f"{count:,} {reason} ({label} {', '.join(map(str, where))}{more})")
            out = [f"{self.skipped:,} of {self.lines:,} lines skipped: " + ", ".join(parts)]
            out += [f"  line {line} ({why}): {text}" for line, why, text in self.examples[:10]]
        if self.late:
            where = ", ".join(str(line) for line, _, _ in self.late_examples)
            more = ", ..." if self.late > len(self.late_examples) else ""
            out.append(
                f"{self.late:,} lines more than {self.reorder_s:g} s older than a line before "
                f"them (lines {where}{more}): decided late, not dropped"
            )
        if self.partial:
            where = ", ".join(str(line) for line, _, _ in self.partial_examples)
            more = ", ..." if self.partial > len(self.partial_examples) else ""
            label = "line" if self.partial == 1 else "lines"
            out.append(
                f"{self.partial:,} partial ({label} {where}{more}): client, time and request "
                "read but a later field not; counted as requests"
            )
        if self.stopped:
            out.append(f"warning: {self.stopped}")
        return "\n".join(out)

    def _bad(self, reason: str, lines: np.ndarray, excerpt: Callable[[int], str]) -> None:
        """Count `lines` (1-based numbers, ascending) as bad for `reason`; `excerpt(i)`
        gives the text of the i-th of them."""
        if not len(lines):
            return
        kept = sum(1 for _, why, _ in self.examples if why == reason)
        self.counts[reason] = self.counts.get(reason, 0) + len(lines)
        for i in range(min(len(lines), EXAMPLES_PER_REASON - kept)):
            self.examples.append((int(lines[i]), reason, excerpt(i)))
        self.examples.sort(key=lambda example: example[0])

    def _partial(self, lines: np.ndarray, excerpt: Callable[[int], str]) -> None:
        """Count `lines` (ascending) as partial; `excerpt(i)`: the i-th one's text."""
        self.partial += len(lines)
        for i in range(min(len(lines), EXAMPLES_PER_REASON - len(self.partial_examples))):
            self.partial_examples.append((int(lines[i]), "partial", excerpt(i)))


def _excerpt(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    return text[:EXCERPT_CHARS]
