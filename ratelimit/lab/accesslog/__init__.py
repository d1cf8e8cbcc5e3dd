"""Access logs in, trace chunks out: the requests of a real log as the replay reads them.

    reader = LogReader("access.log", identity="user")     # the format is detected
    for chunk in reader:                                    # trace frames, each sorted by time
        ...                                                 # time, identity, cost, replica
    print(reader.problems.summary())                        # complete once iteration ends

    trace, problems = read("access.log.gz")                 # a small log, all at once

Formats (`FORMATS`), named with `format=` or detected from the first non-blank lines:

- ``clf``: Common Log Format, ``host ident user [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1"
  200 2326``; fields ``host``, ``ident``, ``user``, ``time``, ``request`` (and its parts
  ``method``, ``path``, ``protocol``), ``status``, ``bytes``;
- ``combined``: the same plus ``"referer" "agent"`` (Apache and nginx). Tokens after these
  (a custom format's extra fields) are fields ``extra1``, ``extra2``, ..., and a token
  ``name=value`` or ``name="value"`` is also the field ``name``. The time may carry a
  fraction of a second (``13:55:36.123``);
- ``jsonl``: one JSON object per line; a dotted name (``headers.x-api-key``) reaches into
  nested objects. Numbers with a fraction are read as `decimal.Decimal`, so times stay exact;
- ``csv``: a header line naming the columns, then one record per line (a quoted field
  cannot hold a line break).

A gzip-compressed log is read as it is. A file that is not a log at all (empty, binary,
prose) raises one `LogFormatError` before any chunk is produced, and so does a named
identity, cost or time field that the log does not have.

Identity: the field named by ``identity``; by default the client address (``host``, or
for jsonl and csv the first present of `ADDRESS_FIELDS`). A value that is an IP address
counts as `ratelimit.identity.address_identity` says, exactly as the HTTP layer counts it:
IPv6 per /64 (``ipv6_prefix``), IPv4 as itself. A missing value (empty or ``-``) makes the
line a bad line. Cost: 1 by default; or the integer field named by ``cost``; or
``cost(fields)`` for a callable that takes the line's fields (a dict of their text, for
jsonl the decoded object) and returns an int. A cost that is not an integer >= 1 (or a
callable that raises ValueError, TypeError, KeyError, IndexError or ArithmeticError)
makes the line a bad line.

More fields: ``fields=("agent", "status", "method", "path")`` adds one column per named
field to every chunk, the field's text as a Python str ("" where a line lacks it); for clf
and combined the names above and the extras, for jsonl and csv any (dotted) field name of
the log. A name the log does not have is one `LogFormatError`; no fields (the default)
leaves the chunks and the speed as they are, and for clf only the named spans are decoded.

Time: any UTC offset; ISO 8601 (``Z``, ``+01:00``; without an offset: UTC), CLF times, and
for jsonl and csv Unix epoch numbers too, by magnitude: below 1e11 seconds, below 1e14
milliseconds, below 1e17 microseconds, else nanoseconds. ``time`` in the trace is Unix
epoch seconds, as a float whose ``floor(time * 1000)`` is the line's exact millisecond.

Bad lines are counted per reason (`Problems.counts`: "malformed", "truncated" (the last
line, cut off without its newline), "too long" (over `MAX_LINE_BYTES`), "bad time",
"no time", "no identity", "bad cost", "blank") with the first few line numbers and
excerpts, never dropped silently and never fatal: ``parsed + skipped == lines``.

Order: lines from several servers merged into one file are out of order. Lines are held
back until they are ``reorder_s`` seconds older than the newest line seen, then released
sorted by time (ties in file order), so a chunk is sorted and, while no line is later than
that, the chunks together are the whole log sorted. A line more than ``reorder_s`` older
than a line before it is *late*: it is not lost but released with the next chunk, behind
requests already released, so the replay decides it late, as a limiter would a request
whose log line arrived late; `Problems.late` counts such lines, with examples. Memory
stays bounded by one block of the file (`BLOCK_BYTES`), ``chunk_lines`` rows, the lines
within ``reorder_s`` of the newest, and one entry per distinct identity.

Speed: Common Log Format is parsed by one compiled (numba) scan per block of bytes, and
identities are told apart by a compiled hash table, about a million lines a second end
to end; jsonl and csv are parsed line by line in Python, several times slower.

Modules: `formats` (the formats, their field names, detection), `blocks` (the file in
blocks of whole lines, the reorder buffer), `clf` (the compiled scan of clf and combined
lines), `fields` (jsonl and csv values), `identities`, `problems` (bad lines and their
reasons), `reader` (`LogReader`, `read`).
"""

from .formats import FORMATS, detect_format
from .problems import LogFormatError, Problems
from .reader import LogReader, read

__all__ = [
    "FORMATS",
    "LogFormatError",
    "LogReader",
    "Problems",
    "detect_format",
    "read",
]
