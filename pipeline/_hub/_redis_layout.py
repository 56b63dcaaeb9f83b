"""The layout of run logs in Redis: a run's keys, the Lua scripts that create, append to and
describe a run, and a stream entry read back as an `Entry` (`_redis` uses them).

One hash slot per run (the `{<run_id>}` hash tag keeps a run's keys together on a Redis
Cluster):

- `rillet:{<run_id>}:run`, a hash: `state` (`open`, then `done`), `access` (hex: the digests
  of the run's read and act tokens, so any server can authorize the run's readers and actors),
  `owner` (the id of the hub that produces the run: only its appends are taken, so a producer
  another server took the run from is fenced off for good), and while the run is open, `spec`
  (what another server needs to take the run over, when its producer allows it), and `kept`
  once its provider said it keeps the reply (a background response's id: a taker reads it
  again rather than asking anew).
- `rillet:{<run_id>}:log`, the stream. Entry `<seq>-0` holds the event's JSON, encoded once, in
  field `e`: an SSE `Last-Event-ID` is a stream cursor, and Redis itself refuses a duplicate or
  out-of-order entry id.
- `rillet:{<run_id>}:lease`, a string that expires: the lease of the server driving the open
  run, set when it opens, renewed by each append and on a timer, deleted with `run.done`. An
  open run without it has lost its server: `CLAIM` takes it over, or `LOST` ends it, once,
  whoever notices first.
- `rillet:leases`, a sorted set of open runs by the time (ms since the epoch, the producer's
  clock) their lease runs out, renewed with it: where servers look for runs whose server is
  gone. A hint only: the lease key decides.
"""

from __future__ import annotations

from typing import Any

from .._core._runevents import decode_run_event
from ._hub import Entry

__all__ = [
    "APPEND",
    "CLAIM",
    "CREATE",
    "FIELD",
    "INFO",
    "KEEP",
    "LEASES",
    "LOST",
    "RENEW",
    "entry",
    "keys",
    "lease_key",
    "safe_url",
    "seq",
    "text",
]

FIELD = b"e"
LEASES = "rillet:leases"

# KEYS: run, log, lease. ARGV: access (hex, may be empty), open_ttl_ms, lease_ms, owner, spec
# (may be empty: the run is not to be taken over). 1 when created, 0 if it exists.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'state', 'open', 'access', ARGV[1], 'owner', ARGV[4])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'spec', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
return 1
"""

# KEYS: run, log, lease. ARGV: maxlen, open_ttl_ms, retention_ms, done (1/0), lease_ms, owner,
# then (id, json) pairs whose seqs are consecutive. Only the run's owner appends (another is
# fenced off: `RILLET_FENCED`). A duplicate or out-of-order first id is refused by XADD
# itself, before anything is written; a gap is refused here. An append renews the lease;
# `run.done` ends it and drops the run's spec.
APPEND = """
local meta = redis.call('HMGET', KEYS[1], 'state', 'owner')
local state = meta[1]
if not state then return redis.error_reply('RILLET_UNKNOWN unknown run') end
if state ~= 'open' then return redis.error_reply('RILLET_DONE run is done') end
if meta[2] and meta[2] ~= ARGV[6] then
  return redis.error_reply('RILLET_FENCED another server produces this run')
end
local first = tonumber(string.match(ARGV[7], '^(%d+)'))
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local last = 0
if top[1] then last = tonumber(string.match(top[1][1], '^(%d+)')) end
if first > last + 1 then
  return redis.error_reply('RILLET_GAP expected seq ' .. (last + 1) .. ', got ' .. first)
end
for i = 7, #ARGV, 2 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], ARGV[i], 'e', ARGV[i + 1])
end
local ttl = ARGV[2]
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'state', 'done')
  redis.call('HDEL', KEYS[1], 'spec')
  redis.call('DEL', KEYS[3])
  ttl = ARGV[3]
else
  redis.call('SET', KEYS[3], ARGV[6], 'PX', ARGV[5])
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return last
"""

# KEYS: run, lease. ARGV: lease_ms, owner. Renews the lease of an open run this owner
# produces: 1, or 0 when the run is done, forgotten or another's (another server may have ended
# it as lost, or taken it over).
RENEW = """
local meta = redis.call('HMGET', KEYS[1], 'state', 'owner')
if meta[1] ~= 'open' then return 0 end
if meta[2] and meta[2] ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[1])
return 1
"""

# KEYS: run. ARGV: owner, id. Keeps the id of the reply the run's provider keeps (its
# background response), for a server that takes the run over: 1, or 0 when the run is done,
# forgotten or another's.
KEEP = """
local meta = redis.call('HMGET', KEYS[1], 'state', 'owner')
if meta[1] ~= 'open' or meta[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'kept', ARGV[2])
return 1
"""

# KEYS: run, log, lease. ARGV: owner, lease_ms. Takes over an open run whose lease has
# expired and that has a spec: the owner becomes ARGV[1] (the old producer's appends are
# refused from now on) and holds the lease. {last id, spec, access, last entry's JSON or '',
# kept reply's id or ''} when taken; {} when the run is done, forgotten, leased, or not to be
# taken over.
CLAIM = """
local meta = redis.call('HMGET', KEYS[1], 'state', 'spec', 'access', 'kept')
if meta[1] ~= 'open' or not meta[2] then return {} end
if redis.call('EXISTS', KEYS[3]) == 1 then return {} end
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local last, data = '0-0', ''
if top[1] then
  last = top[1][1]
  for i = 1, #top[1][2], 2 do
    if top[1][2][i] == 'e' then data = top[1][2][i + 1] end
  end
end
return {last, meta[2], meta[3] or '', data, meta[4] or ''}
"""

# KEYS: run, log, lease. ARGV: seq, json, retention_ms, maxlen. Ends an open run whose lease
# has expired with the given `run.done`, if its seq is still the next: 1 when appended; 0 when
# the run is done, forgotten or leased; -1 when another entry came first (read again).
LOST = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local last = 0
if top[1] then last = tonumber(string.match(top[1][1], '^(%d+)')) end
if last + 1 ~= tonumber(ARGV[1]) then return -1 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], ARGV[1] .. '-0', 'e', ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'done')
redis.call('HDEL', KEYS[1], 'spec')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""

# KEYS: run, log, lease. {} for an unknown run, else {state, access, first id, last id,
# leased (1/0), can be taken over (1/0)}.
INFO = """
local meta = redis.call('HMGET', KEYS[1], 'state', 'access', 'spec')
if not meta[1] then return {} end
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local f, l = '0-0', '0-0'
if first[1] then f = first[1][1] end
if last[1] then l = last[1][1] end
local spec = 0
if meta[3] then spec = 1 end
return {meta[1], meta[2] or '', f, l, redis.call('EXISTS', KEYS[3]), spec}
"""


def keys(run_id: str) -> tuple[str, str]:
    """The run's hash and stream keys (one hash slot)."""
    return f"rillet:{{{run_id}}}:run", f"rillet:{{{run_id}}}:log"


def lease_key(run_id: str) -> str:
    """The key of the run's lease (the same hash slot as its others)."""
    return f"rillet:{{{run_id}}}:lease"


def seq(entry_id: bytes | str) -> int:
    """The seq of a stream entry id `<seq>-0`."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


def text(value: Any) -> str:
    """A reply's value as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def entry(entry_id: bytes | str, fields: Any) -> Entry:
    """An `Entry` from a stream entry: the stored JSON as is, decoded once for `event`."""
    data = fields[FIELD]
    return Entry(seq(entry_id), decode_run_event(data), data)


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://…@{rest.rpartition('@')[2]}"
