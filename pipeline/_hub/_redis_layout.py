"""The layout of run logs in Redis: a run's keys, the Lua scripts that create, append to and
describe a run, and a stream entry read back as an `Entry` (`_redis` uses them).

One hash slot per run (the `{<run_id>}` hash tag keeps a run's keys together on a Redis
Cluster):

- `rillet:{<run_id>}:run`, a hash: `state` (`open`, then `done`) and `access` (hex: the digests
  of the run's read and act tokens, so any server can authorize the run's readers and actors).
- `rillet:{<run_id>}:log`, the stream. Entry `<seq>-0` holds the event's JSON, encoded once, in
  field `e`: an SSE `Last-Event-ID` is a stream cursor, and Redis itself refuses a duplicate or
  out-of-order entry id.
- `rillet:{<run_id>}:lease`, a string that expires: the lease of the server driving the open
  run, set when it opens, renewed by each append and on a timer, deleted with `run.done`. An
  open run without it has lost its server: `LOST` ends it, once, whoever notices first.
"""

from __future__ import annotations

from typing import Any

from .._core._runevents import decode_run_event
from ._hub import Entry

__all__ = [
    "APPEND",
    "CREATE",
    "FIELD",
    "INFO",
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

# KEYS: run, log, lease. ARGV: access (hex, may be empty), open_ttl_ms, lease_ms. 1 when
# created, 0 if it exists.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'state', 'open', 'access', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[3])
return 1
"""

# KEYS: run, log, lease. ARGV: maxlen, open_ttl_ms, retention_ms, done (1/0), lease_ms, then
# (id, json) pairs whose seqs are consecutive. A duplicate or out-of-order first id is refused
# by XADD itself, before anything is written; a gap is refused here. An append renews the
# lease; `run.done` ends it.
APPEND = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return redis.error_reply('RILLET_UNKNOWN unknown run') end
if state ~= 'open' then return redis.error_reply('RILLET_DONE run is done') end
local first = tonumber(string.match(ARGV[6], '^(%d+)'))
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local last = 0
if top[1] then last = tonumber(string.match(top[1][1], '^(%d+)')) end
if first > last + 1 then
  return redis.error_reply('RILLET_GAP expected seq ' .. (last + 1) .. ', got ' .. first)
end
for i = 6, #ARGV, 2 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], ARGV[i], 'e', ARGV[i + 1])
end
local ttl = ARGV[2]
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'state', 'done')
  redis.call('DEL', KEYS[3])
  ttl = ARGV[3]
else
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[5])
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return last
"""

# KEYS: run, lease. ARGV: lease_ms. Renews the lease of an open run: 1, or 0 when the run is
# done or forgotten (another server may have ended it as lost).
RENEW = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
return 1
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
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""

# KEYS: run, log, lease. {} for an unknown run, else {state, access, first id, last id,
# leased (1/0)}.
INFO = """
local meta = redis.call('HMGET', KEYS[1], 'state', 'access')
if not meta[1] then return {} end
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local f, l = '0-0', '0-0'
if first[1] then f = first[1][1] end
if last[1] then l = last[1][1] end
return {meta[1], meta[2] or '', f, l, redis.call('EXISTS', KEYS[3])}
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
