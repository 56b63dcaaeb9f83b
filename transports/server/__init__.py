"""rillet's delivery server: runs started over HTTP, their events fanned out over SSE and
WebSocket from the hub, an MMSP-compatible streaming endpoint, and the live page.

Endpoints:

- `GET /`: the live page (`static/index.html`).
- `POST /v1/runs`: start a run (`{"prompt"}` or `{"messages", ...}`); the server key when one is
  configured; answers 201 `{"run_id", "token", "act_token", "events_url", "ws_url"}`. The
  token (also in the URLs) reads that run only; the act token, in this response only, acts on
  it: `DELETE /v1/runs/{id}` with it (`Authorization: Bearer`, or the server key) cancels the
  run, on any server sharing its Redis (handed to the one that runs it), and its approvals are
  answered with it.
- `GET /v1/runs/{id}/events`: the run events as SSE, `id: <run_id>:<seq>`, resumable by
  `Last-Event-ID` (which wins) or `?after=<seq>`; a comment every `heartbeat` seconds of
  silence; 204 when the cursor is already at the end of a finished run (an EventSource then
  stops reconnecting).
- `GET /v1/runs/{id}/ws`: the same events as WebSocket text frames, resumable by `?after=`.
  Close codes: 1000 after `run.done`, 1013 fell behind (resume), 1008 policy (`not_found`,
  `cursor_invalid`, `cursor_expired`, `too_many_subscribers`, `rate_limited`, `not_json`),
  1009 message too big, 1003 binary message, 1007 invalid UTF-8.
- `POST /v1/stream`, `GET /v1/models`: MMSP's server wire (UniEvents as SSE `data:` lines ended
  by `data: [DONE]`; errors as `{"error": {"type", "message", ...}}`).
- `GET /healthz`; `GET /metrics` (Prometheus text format; the `metrics` extra, else 501);
  `GET /metrics.json` (the counters as JSON).

Logs (`rillet.transports.server`, never a handler of its own): a line per request (`.access`),
per run start and end, and a warning with the cause in words of every provider failure.

Security: the server key is compared in constant time; a run's read token reads only that run and
acts on nothing, and an unknown run and a wrong token get the same bytes; provider keys, provider
messages (but for an invalid request's, with the key scrubbed) and request headers never reach a
response or a log line; bodies over `max_body` get 413, subscribers over the per-run or per-client
limit 429 (WS 1008), a request head not complete within `head_timeout` a closed connection. A server
bound to loopback answers only requests whose `Host` is a loopback name (DNS rebinding), and any
state-changing request or WebSocket whose `Origin` is another site is refused (403).

Capacity is explicit (`Limits`): a cap on connections, a write deadline, a process-wide
admission of provider streams with a bounded queue and a per-client share, per-client
subscriber limits; a client is what it cannot choose (its address, and the server key when it
sends it), and an `X-Rillet-Session` only splits its share.

The package, by concept: `_config` (what is served, the limits), `_serve` (binding, the accept
loop, the sweep), `_routing` (connections, routes, Host and Origin checks), `_shared` (what
handlers share and the checks they all make), `_capacity` (client identity, admission), `_runs`
(the runs API), `_workers` (several processes on one port, `workers`), `_control` (cancels and
approval answers handed to the server that drives the run, over Redis), `_fanout` (one pump for
SSE and WebSocket subscribers), `_mmsp` (MMSP's server wire), `_streamed` (a streamed body
watched against its client), `_page`, `_metrics` (what both metrics endpoints count), `_log`
(the log lines), `_replies`. Every byte sequence that goes on the wire is built in
`rillet._core._encode`.
"""

from rillet._core._public import fixup_module_metadata as _fixup_module_metadata

from ._api import serve as serve
from ._config import Limits as Limits
from ._config import ServerConfig as ServerConfig
from ._config import ServerConfigError as ServerConfigError
from ._workers import WorkerFailed as WorkerFailed

__all__ = ["Limits", "ServerConfig", "ServerConfigError", "WorkerFailed", "serve"]

_fixup_module_metadata(__name__, globals())
