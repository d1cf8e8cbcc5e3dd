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
identity, cost or time field that the log does not have. Binary means more than half of
its first 64 KiB is not text (`formats.BINARY_SHARE`); below that, a NUL or other binary
byte spoils only the line it is in. The format is judged by the first 20 non-blank lines
or, when those fit no format (or not the one named), by a wider sample spread over the
first 4 MiB and, in a plain file, over the rest: a log is refused only when few of its
lines fit, never for a bad head. A gzip file cut off or damaged gives the lines read
up to that point, and `Problems.stopped` (a warning in the summary) says why reading
stopped, after which line and at which byte of the compressed file; one with no
readable line at all is a `LogFormatError`.

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
excerpts, never dropped silently and never fatal: ``parsed + skipped == lines``. A clf or
combined line whose client, time and request can be read is a request even when a field
after them cannot (a status that is not one, an unclosed user-agent quote, a control byte,
a line cut short): it is counted in `Problems.partial`, with examples, and its unreadable
fields are empty (so a partial line has no identity if that is what ``identity`` names).

Order: lines from several servers merged into one file are out of order. They are put
back in order within ``reorder_s`` seconds by a rule of the file's content alone, so that
the same log gives the same chunks' rows, the same late lines and the same plan however
it is read (block size, ``chunk_lines``, gzip or not). Reading line j, every held line at
least ``reorder_s`` older than the newest line up to j is released; the lines released at
one line go out sorted by time (ties in file order), the lines after them later. Hence a
line more than ``reorder_s`` older than a line before it is *late*: it is not lost but
released as soon as it is read, behind requests already released, so the replay decides
it late, as a limiter would a request whose log line arrived late; `Problems.late` counts
such lines, with examples. Every other line is released in time order. A chunk holds at
most ``chunk_lines`` rows and is sorted by time: a late line starts a new chunk. Memory
stays bounded by one block of the file (`BLOCK_BYTES`), ``chunk_lines`` rows, the lines
within ``reorder_s`` of the newest, and one entry per distinct identity.

Speed: Common Log Format is parsed by one compiled (numba) scan per block of bytes, and
identities are told apart by a compiled hash table; jsonl and csv are parsed line by line
in Python, several times slower (`make bench` measures a big clf log). The compiled parts
release the GIL, and a thread reads ahead (``read_ahead`` chunks, `ahead`) while the
caller works on the chunk before, so reading and planning share two cores; the chunks
are the same with or without it. ``identity_dtype="category"`` gives the identity column
as a categorical of the names met so far, which a planner groups by code.

Modules: `formats` (the formats, their field names, detection), `blocks` (the file in
blocks of whole lines, the reorder buffer), `clf` (the compiled scan of clf and combined
lines), `fields` (jsonl and csv values), `identities`, `problems` (bad lines and their
reasons), `ahead` (reading ahead in a thread), `reader` (`LogReader`, `read`).
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
