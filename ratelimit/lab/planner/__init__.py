"""Plan a limit policy on an access log: whom each candidate limit hurts, and how big
Redis must be to enforce it.

    from ratelimit.lab import planner
    planner.parse_limit("100/min")                        # (100, 60.0)
    plan = planner.plan_log("access.log", ["100/min", "1000/h"], measure=False)
    print(plan.table())                                   # what `plan` prints
    plan.to_dict()                                        # what `plan --json` writes

`plan_log` reads the log once, in chunks (`accesslog.LogReader`, bounded memory), and
decides every request under every candidate (limit x algorithm) as it goes, with one
compiled replayer per candidate (`fastreplay.Replayer`) whose state is carried from
chunk to chunk. `plan_trace` does the same on trace tables already in memory.

What a candidate reports, and how it is counted:

- Every request is decided at its logged time, in the order the reader gives
  (sorted by time; a line that arrives too late is decided where it appears). A
  request whose cost exceeds the candidate's limit (or GCRA's burst, the limit) can
  never be admitted: the library refuses it with ValueError before asking Redis. Such
  requests are counted apart, as `refused` (and `identities_refused`), and are neither
  decided, nor checks, nor keys.
- `rejected` counts the requests the limiter rejected; `identities_rejected` the
  identities rejected at least once. Shares are of all the log's requests and
  identities.
- `busiest_affected`: the identities rejected or refused at least once, busiest
  (most requests) first.
- `peak_admitted`: the most cost admitted to one identity in any rolling window
  (t - W, t] of the candidate's window W, in whole ms as the limiters stamp requests.
  At most the limit for the sliding log; more for the others (a fixed window lets
  twice it through across a boundary).

When and who (`timeline`), per candidate:

- `rejected_by_hour`: rejected requests per hour of day, UTC (24 counts, 00:00 first).
- `longest_throttled`: the `top` identities with the longest throttled stretch. A
  stretch is a run of an identity's rejected requests with no admitted one between:
  from its first rejected request to the identity's next admitted request, or to one
  window after the run's last rejected request if that comes first (a client that
  stops asking stops counting; so does a run the log ends during). Each entry:
  `identity`, `longest_throttled_s`, `throttled_from_utc`, `throttled_until_utc`,
  `rejected` (all the identity's rejected requests).
- `offenders`: the `top` identities rejected most (ties: more requests, then by
  name): `identity`, `agent` (its most frequent user agent, from the trace's `agent`
  column; null without one), `requests`, `rejected`, `longest_throttled_s`.

`plan --csv DIR` writes the tables as CSV (`export.write_csv`: candidates.csv,
recommended.csv, rejected_by_hour.csv, longest_throttled.csv, offenders.csv,
busiest_affected.csv) and `plan --plot FILE` the figures in one image
(`export.write_figure`, `plots.plan_figure`: the peaks per window, rejections by
hour, the longest stretches), its format from FILE's suffix.

Timestamp resolution (`resolution`): `resolution_ms` (of `log`) is the coarsest of 1
min, 1 s, 100 ms, 10 ms and 1 ms that every stamp is a multiple of (1 ms: the plan's
own; finer stamps are decided at the ms). A candidate whose window is less than 10
times that (1 s stamps: windows under 10 s) carries `stamps` (null otherwise):
`resolution_ms`, `rejected` and `identities_rejected` as planned, and
`rejected_spread`, `identities_rejected_spread` replayed with the requests of each
stamp spread evenly over the unit that follows it, in their order (the j-th of n at
stamp + floor((2j + 1) x unit / 2n): deterministic); the two bracket how much the
coarse stamps can move the result. Shown in the table when any candidate is coarse.

The Redis plan of a candidate:

- `keys`: the most identities whose keys are alive at one instant. A key lives one
  key lifetime L after a request (the TTL the limiter gives its state,
  `Policy.state_ttl_ms()`: one window, two for the sliding-window counter). So
  `keys` = max over t of the number of identities with a request in (t - L, t]:
  conservative, since a rejected request does not refresh every algorithm's TTL.
  Computed exactly in one streaming pass, with one timestamp per identity; a late
  line counts from the latest time already read.
- `memory_bytes`: each key at its identity's own peak, i.e. holding `peak_admitted`
  units of that identity (its most admitted in one window, at least 1), sized with
  `capacity.bytes_per_key` from the measured table of chapter 3
  (`ratelimit/lab/data/memory_per_key.csv`, sorted-set log members), plus the shard's
  per-key overhead; and the `keys` heaviest such keys alive together. No instant can
  need more, so this is an upper bound. `bytes_per_key` is their mean.
- `peak_checks_per_s`: the most requests (checks, one EVALSHA each, admitted or not)
  in any rolling second (t - 1 s, t] of the whole log: the peak, not the mean
  (`mean_checks_per_s`, over the log's span or 1 s if shorter, is given for
  comparison). `commands_per_s` counts every check's script commands on the admit
  path, the costlier (`capacity.script_commands`).
- Server time per check: measured now on the reader's Redis with `INFO commandstats`
  (`capacity.measure_server_time`, which writes scratch keys and deletes them) when
  one is named (`redis_url`, else REDIS_URL; never a Redis nobody named) and answers,
  else what the latest `make bench` recorded (`bench/record.json`,
  `capacity.server_time_from_bench`); `server_time.kind` says which, and `note` why
  a measurement was not used. With neither, the plan says so and leaves the
  check-bound figures out (null).
- Shards: `capacity.plan_fleet` with the chapter 6 shard (`capacity.Shard`:
  `shard_memory_bytes` of data memory, `headroom` kept free, 64 bytes of per-key
  overhead): enough shards for the memory and for the checks, whichever needs more.

Which limit to pick (`recommend`): for each window and algorithm planned,

- per-client peaks: each identity's most requested cost (every request, admitted or
  not) in one rolling window (t - W, t]; their `p50`, `p90`, `p99`, `p99_9` (observed
  values: the smallest peak with at least that share of clients at or below it) and
  `max`;
- the recommended limit: the smallest limit per W that affects (rejects or refuses at
  least once) at most the share `affect` of the clients (default 1%, i.e. at most
  floor(share x identities) clients), with the requests it rejects and refuses. For
  the sliding log on a trace in time order it follows from the peaks: a client is
  first rejected exactly when its demand in one window exceeds the limit (until then
  the log held its demand), so the answer is the (k+1)-th largest peak, k the clients
  allowed. For every algorithm the answer is found by replaying the kept requests
  with the compiled replayers, bisecting on the limit (clients affected fall as the
  limit grows: tested against a sweep of every limit), starting from the sliding
  log's answer; the limit found qualifies and the one below it does not, both
  replayed. A request decided late (stamped before what its client's state already
  holds, see `reorder_s`) can be rejected at every limit by some algorithms (GCRA,
  the fixed window): when the busiest client's peak does not reach the share, the
  algorithm's largest limit is replayed, the clients it still affects are
  `unavoidable`, and the answer is the smallest limit that affects at most
  max(allowed, unavoidable) clients (the report says so under the table).
  `plots.peaks_figure` draws the peaks with the recommended limits marked.

Memory: besides the reader's chunk, one small record per identity (its code, counts,
last request) per candidate, plus each replayer's state and the admitted stamps of
each identity's last window (and the `windowpeaks.WindowPeaks` reorder margin): it
grows with the identities and with what one window holds, never with the log's length.
The recommendation (on unless `affect=None`) and the spread replay (on unless
`spread_coarse=False`) keep every request's identity code, time and cost (20 bytes a
request) to replay limits on: in memory up to `kept.MEMORY_ROWS` requests, then in a
temporary file read back a block at a time (`kept.KeptTrace`), so memory stays
bounded and the disk holds the rest until the plan ends.

Routes, filters and cost functions (`plan --route`, `--where`, `--cost MODULE:FUNCTION`)
are `routes` (`plan_routes`, `plan_where`): each route planned with its own limit and
key, on the requests the filters keep.

Modules: `limits` (reading "100/min"), `servertime` (`choose_server_time`), `measures`
(keys alive at once), `planning` (`plan_trace`, `plan_log`), `sources` (many logs
as one: `plan_logs`), `distributed` (the same plan on Dask), `recommend` (the
recommendation), `kept` (the requests kept to replay), `timeline` (when and who),
`resolution` (timestamps), `results` (the dataclasses and `SCHEMA`), `report`
(`LogPlan.table`), `plots` (the figures, matplotlib), `export` (CSV and image files).

JSON document (`LogPlan.to_dict()`, `plan --json OUT`); the field names of each
object are listed in `SCHEMA`, one place:

- top level: `schema` (this layout's version, 1), `log`, `server_time`, `shard`,
  `memory_table` (path of the bytes-per-key table), `candidates` (a list), `affect`
  (the share of clients a recommended limit may affect; null: none asked),
  `recommended` (a list, one per algorithm and window planned).
- `log`: `path`, `example` (true for the lab's example log), `format`,
  `identity_field`, `cost` (how a request's cost was read: "1 per request", a field's
  name, or a function's), `requests`, `identities`, `start_utc`, `end_utc` (ISO 8601),
  `duration_s`, `problems`, `resolution_ms` (below), `where` (null, or when the requests
  were chosen by `routes`' filters or a route: `conditions`, `requests_read` and `kept`).
- `problems` (the reader's bad lines): `lines`, `parsed`, `skipped`, `late` (lines
  logged more than the reader's reorder window after later ones, decided late),
  `partial` (requests whose later fields could not be read), `stopped` (why and where
  reading ended early, e.g. a cut gzip; "" when it read to the end), `counts` (reason
  -> lines), `examples`, `late_examples` and `partial_examples` (lists of `line`,
  `reason`, `excerpt`: the first few), `summary` (the reader's words).
- `server_time`: `kind` ("measured", "bench" or "none"), `source`, `date`, `note`,
  `us_per_check` (algorithm -> microseconds).
- `shard`: `memory_bytes`, `headroom`, `key_overhead_bytes`, `checks_per_s` (null:
  the server time per check alone limits a shard).
- a candidate: `limit_text`, `limit`, `window_s`, `algorithm`, `label`, `requests`,
  `rejected`, `rejected_share`, `refused`, `refused_share`, `identities`,
  `identities_rejected`, `identities_rejected_share`, `identities_refused`,
  `peak_admitted`, `peak_admitted_ratio` (over the limit), `peak_identity`,
  `busiest_affected` (a list of `identity`, `requests`, `rejected`, `refused`,
  `peak_admitted`), `redis` (null when no request reaches Redis), `rejected_by_hour`,
  `longest_throttled`, `offenders`, `stamps` (above).
- `redis`: `keys`, `key_lifetime_s`, `bytes_per_key`, `memory_bytes`,
  `peak_checks_per_s`, `mean_checks_per_s`, `us_per_check`, `redis_cpu_cores`,
  `commands_per_s`, `shard_checks_per_s`, `shards_for_memory`, `shards_for_checks`,
  `shards`, `keys_per_shard` (the check-bound ones null without a server time).
- a `recommended` entry: `algorithm`, `label`, `window_s`, `window_ms`, `limit` (per
  window), `limit_text` ("45/s"), `affect`, `requests`, `rejected`, `rejected_share`,
  `refused`, `refused_share` (of all requests, under that limit), `identities`,
  `identities_affected` (rejected or refused at least once),
  `identities_affected_share`, `peaks` (`p50` .. `max` above), `replays` (limits
  replayed to find it), `unavoidable` (clients affected even at the largest limit,
  when more than the share allows; else 0) and `unavoidable_why` (why, or null).
"""

from .limits import format_limit, parse_limit
from .planning import DEFAULT_SHARD, plan_log, plan_trace
from .results import SCHEMA, Affected, CandidatePlan, LogPlan, LogSummary, RedisPlan
from .servertime import (
    DEFAULT_ALGORITHMS,
    ServerTimeChoice,
    choose_server_time,
    default_bench_record,
    default_memory_table,
)
from .sources import plan_logs

__all__ = [
    "DEFAULT_ALGORITHMS",
    "DEFAULT_SHARD",
    "SCHEMA",
    "Affected",
    "CandidatePlan",
    "LogPlan",
    "LogSummary",
    "RedisPlan",
    "ServerTimeChoice",
    "choose_server_time",
    "default_bench_record",
    "default_memory_table",
    "format_limit",
    "parse_limit",
    "plan_log",
    "plan_logs",
    "plan_trace",
]
