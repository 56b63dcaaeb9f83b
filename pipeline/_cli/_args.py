"""The command line's options: every one with its unit and default in its help text.

`rillet --help` and `rillet COMMAND --help` are built here; `--debug` is accepted before the
command and after it. The default model of each provider comes from the one registry.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from .._agent._demo_tools import TOOLSETS
from .._core._policy import Policy
from ._log import LOG_FORMATS, LOG_LEVELS, configure_logging

__all__ = ["build_parser", "configure_from", "policy_from"]

_THINKING = ("none", "low", "medium", "high", "xhigh", "max")


class _Formatter(argparse.HelpFormatter):
    """Help text wrapped at spaces only: a model id (`claude-sonnet-4-5`) stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _OldNoRescue(argparse._StoreTrueAction):
    """`--no-fallback`, `--no-rescue`'s old name, for one release: the same switch, and one
    line on stderr saying so."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(
            "rillet: --no-fallback is deprecated and goes in the next release: use --no-rescue",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, True)


def _number(text: str, kind: type[float] | type[int], least: float, what: str) -> float:
    """A number from the command line, refused (a usage error, exit 2) below `least`."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (least <= value < float("inf")):  # (NaN too)
        raise argparse.ArgumentTypeError(f"must be {what}, not {text}")
    return value


def _seconds(text: str) -> float:
    """A deadline: more than 0 seconds."""
    value = _number(text, float, 0.0, "a positive number of seconds")
    if value == 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds, not 0")
    return value


def _count(text: str) -> int:
    """A count of retries: 0 or more."""
    return int(_number(text, int, 0, "a whole number, 0 or more"))


def _positive(text: str) -> int:
    """A count of tokens, steps, bytes or processes: 1 or more."""
    return int(_number(text, int, 1, "a whole number, 1 or more"))


def _non_negative(text: str) -> int:
    """A count that may be none at all: 0 or more."""
    return int(_number(text, int, 0, "a whole number, 0 or more"))


def _amount(text: str) -> float:
    """A temperature, a rate or a pause: 0 or more."""
    return _number(text, float, 0.0, "a number, 0 or more")


def _money(text: str) -> str:
    """An amount of money: 0 or more, kept exact (a decimal string)."""
    _number(text, float, 0.0, "an amount, 0 or more")
    return text


def _cost_options(parser: argparse.ArgumentParser, per: str) -> None:
    """`--prices` and `--max-cost`, as `run` and `serve` take them."""
    parser.add_argument(
        "--prices",
        default=None,
        metavar="genai|FILE",
        help="what the models cost: `genai` for the genai-prices table (needs the `prices` "
        "extra), or a JSON file of each model's prices per million tokens, "
        '{"gpt-4o": {"input": "2.50", "output": "10", "cached_input": "1.25"}}; '
        "each usage event then says its cost. Default: no prices",
    )
    parser.add_argument(
        "--max-cost",
        type=_money,
        default=None,
        metavar="AMOUNT",
        help=f"the most {per} may spend, in the prices' currency (needs --prices): a request "
        "it cannot pay for is not sent, and an answer is cut at what the rest buys "
        "(code max_cost). Default: no limit",
    )


def _port(text: str) -> int:
    value = int(_number(text, int, 0, "a port, 0 to 65535"))
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port, 0 to 65535, not {text}")
    return value


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The `rillet` parser and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="rillet",
        formatter_class=_Formatter,
        description="Stream LLM responses from many providers through one checked pipeline.",
        epilog="Exit codes: 0 completed, 1 error (one line on stderr says why), 2 usage error, "
        "3 approval required (a tool waits for an approval no one could give), "
        "130 cancelled (Ctrl-C), 141 stdout closed.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks (accepted after the command too)"
    )
    parser.add_argument("--version", action="version", version=f"rillet {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks"
    )

    run = _command(sub, "run", help="stream one answer to stdout", parents=[common])
    run.add_argument("prompt", help='the question ("-" reads it from stdin)')
    _provider_options(run)
    run.add_argument("--system", help="system prompt (default: none)")
    run.add_argument(
        "--max-tokens", type=_positive, help="most tokens in the answer (default: the provider's)"
    )
    run.add_argument(
        "--temperature", type=_amount, help="sampling temperature (default: the provider's)"
    )
    _cost_options(run, "the run (all its steps, with --tools)")
    run.add_argument(
        "--thinking", choices=_THINKING, help="reasoning effort (default: the provider's)"
    )
    run.add_argument("--show-reasoning", action="store_true", help="print reasoning on stderr")
    run.add_argument(
        "--output",
        choices=("text", "jsonl", "uni-jsonl"),
        default="text",
        help="text; public run events as JSONL; or MMSP UniEvents as JSONL (default: text)",
    )
    run.add_argument(
        "--no-stream",
        action="store_true",
        help="send one non-streaming request and print the whole answer once",
    )
    _agent_options(run)
    _policy_options(run)
    _log_options(run)

    replay = _command(
        sub, "replay", help="play a recorded wire file through the pipeline", parents=[common]
    )
    replay.add_argument(
        "file", type=Path, help="a recorded response body: SSE, NDJSON, or a whole JSON reply"
    )
    replay.add_argument(
        "--dialect",
        default=None,
        help="the dialect that recorded it (default: from the file's folder or suffix)",
    )
    replay.add_argument(
        "--chunk-size", type=_positive, default=64, help="bytes per chunk (default: 64)"
    )
    replay.add_argument(
        "--delay", type=_amount, default=0.0, help="seconds between chunks (default: 0)"
    )
    replay.add_argument(
        "--output", choices=("text", "jsonl", "uni-jsonl"), default="text", help="default: text"
    )

    _command(sub, "providers", help="what is configured (keys masked)", parents=[common])

    serve = _command(
        sub, "serve", help="the HTTP/SSE/WebSocket server and its live page", parents=[common]
    )
    _provider_options(serve)
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1; any other needs --server-key)",
    )
    serve.add_argument("--port", type=_port, default=8787, help="port (default: 8787; 0: any)")
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument(
        "--server-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="a file holding the key clients must send to start runs (its trailing newline "
        "stripped; default: $RILLET_SERVER_KEY, else none)",
    )
    keys.add_argument(
        "--server-key",
        default=None,
        help="the key itself (default: none); every local user can read a command line: "
        "prefer --server-key-file or $RILLET_SERVER_KEY",
    )
    serve.add_argument(
        "--show-reasoning", action="store_true", help="send the model's reasoning to the page"
    )
    serve.add_argument(
        "--show-tool-arguments", action="store_true", help="send tool call arguments to the page"
    )
    serve.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="keep run logs in this Redis (redis://host:port/db) so that every server sharing "
        "it serves every run; needs the `redis` extra. Default: in memory",
    )
    _cost_options(serve, "each run")
    serve.add_argument(
        "--no-takeover",
        dest="takeover",
        action="store_false",
        help="with --redis, end a run whose server is lost as server_lost instead of running "
        "it again on another server. Default: another server takes it over (the run's request "
        "is kept in Redis while it runs)",
    )
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="server processes sharing the port (SO_REUSEPORT), their runs shared through "
        "--redis, which N > 1 needs (default: 1, this process serves)",
    )
    serve.add_argument(
        "--tools",
        choices=TOOLSETS,
        default=None,
        help="runs (POST /v1/runs without tools of their own) are agent runs with these "
        "tools; approvals are answered at POST /v1/runs/{id}/approvals/{approval_id} with the "
        "run's act token (default: none, a run is one turn)",
    )
    serve.add_argument(
        "--ui-resume",
        action="store_true",
        help="keep an AI SDK chat's stream running when its page reloads, so useChat({ resume: "
        "true }) resumes it (GET /v1/ui/chat/{id}/stream); default: a reader that leaves stops "
        "its stream and the provider's request",
    )
    serve.add_argument(
        "--route",
        metavar="KIND[,KIND...]",
        default="",
        help="provider kinds a model name `kind/model` may route to on /v1/chat/completions "
        "and /v1/ui/chat (e.g. anthropic,gemini; their keys come from the environment). "
        "Default: none, only the server's own provider answers",
    )
    serve.add_argument(
        "--max-streams",
        type=_positive,
        default=None,
        metavar="N",
        help="provider streams running at once in each server process; past it runs wait in "
        "the queue (default: 32)",
    )
    serve.add_argument(
        "--max-queued",
        type=_non_negative,
        default=None,
        metavar="N",
        help="runs waiting for a stream; past it clients get 429 with Retry-After (default: 64)",
    )
    serve.add_argument(
        "--max-per-client",
        type=_positive,
        default=None,
        metavar="N",
        help="runs one client may hold running or queued, so no client takes the whole "
        "server (default: 16)",
    )
    _log_options(serve, default="info")  # a server's operator reads its runs and requests

    demo = _command(
        sub, "demo", help="everything, against an embedded recorded provider", parents=[common]
    )
    demo.add_argument(
        "--keep-serving",
        action="store_true",
        help="keep the live page up after the scripted turns, until Ctrl-C",
    )
    demo.add_argument("--port", type=_port, default=0, help="the page's port (default 0: any)")
    demo.add_argument("--fast", action="store_true", help="no pacing (for tests)")

    bench = _command(
        sub,
        "bench",
        help="run the benchmarks (from a checkout; `rillet bench --help` lists their options)",
        add_help=False,
    )
    bench.add_argument(
        "args", nargs=argparse.REMAINDER, help="the benchmarks' own options (see --help)"
    )
    return parser


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, **options: object
) -> argparse.ArgumentParser:
    """A subcommand's parser, wrapping its help as the main one does."""
    return sub.add_parser(name, formatter_class=_Formatter, **options)  # type: ignore[arg-type]


def _default_models() -> str:
    from ..providers._registry import KINDS

    return ", ".join(f"{kind} {spec.model}" for kind, spec in KINDS.items() if spec.model)


def _provider_options(p: argparse.ArgumentParser) -> None:
    from ..providers._registry import PROVIDER_KINDS

    p.add_argument(
        "--provider",
        default=os.environ.get("RILLET_PROVIDER", "openai"),
        help=f"{', '.join(PROVIDER_KINDS)}, or a base URL of an OpenAI-compatible server "
        "(default: $RILLET_PROVIDER, else openai)",
    )
    p.add_argument(
        "--model",
        help=f"model id (default per provider: {_default_models()}; mmsp and a URL have none)",
    )
    p.add_argument(
        "--base-url",
        help="the provider's API base URL (default: its official one, or its *_BASE_URL "
        "variable); a key from the environment is not sent to another URL",
    )
    p.add_argument("--api-key", help="the key to send (default: the provider's *_API_KEY)")


def _policy_options(p: argparse.ArgumentParser) -> None:
    d = Policy()
    p.add_argument(
        "--initial-timeout",
        type=_seconds,
        default=d.initial_event_timeout,
        metavar="SECONDS",
        help="wait for the first event (default: %(default)g s)",
    )
    p.add_argument(
        "--event-timeout",
        type=_seconds,
        default=d.per_event_timeout,
        metavar="SECONDS",
        help="wait between events (default: %(default)g s)",
    )
    p.add_argument(
        "--total-timeout",
        type=_seconds,
        default=d.total_timeout,
        metavar="SECONDS",
        help="the whole streamed answer (default: %(default)g s)",
    )
    p.add_argument(
        "--retries",
        type=_count,
        default=d.transport_retries,
        help="retries after connection errors, 5xx and broken streams (default: %(default)s)",
    )
    p.add_argument(
        "--rate-limit-retries",
        type=_count,
        default=d.rate_limit_retries,
        help="retries after 429/503/529, waiting as the provider says (default: %(default)s)",
    )
    p.add_argument(
        "--no-rescue",
        action="store_true",
        help="turn off the rescue: the one non-streaming request to this provider when "
        "streaming is hopeless (other providers to try are --fallback's chain)",
    )
    p.add_argument("--no-fallback", action=_OldNoRescue, dest="no_rescue", help=argparse.SUPPRESS)
    p.add_argument(
        "--rpm",
        type=_amount,
        default=0.0,
        help="requests per minute to this provider (default: 0, no limiter)",
    )


def _agent_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tools",
        choices=TOOLSETS,
        default=None,
        help="run the agent loop with these tools: demo is get_weather, get_time and "
        "delete_file (which asks for approval and only pretends). Default: no tools",
    )
    p.add_argument(
        "--max-steps",
        type=_positive,
        default=8,
        help="most model requests of an agent run (default: %(default)s)",
    )
    p.add_argument(
        "--no-input",
        action="store_true",
        help="never ask: a tool that needs approval ends the run with exit code 3 "
        "(also when stdin is not a terminal)",
    )
    p.add_argument(
        "--fallback",
        dest="chain",
        default=None,
        metavar="PROVIDER[:MODEL],...",
        help="the chain: providers to try in order when the first fails, e.g. "
        "anthropic,openai:gpt-4o (each with its own key from the environment). Default: none",
    )


def _log_options(p: argparse.ArgumentParser, default: str = "warning") -> None:
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help=f"log records at this level and above to stderr (default: {default}; "
        "debug with --debug)",
    )
    p.set_defaults(default_log_level=default)
    p.add_argument(
        "--log-format", choices=LOG_FORMATS, default="text", help="log lines (default: text)"
    )


def configure_from(args: argparse.Namespace) -> None:
    """Configure logging as `--log-level` / `--log-format` (and `--debug`) say."""
    default = getattr(args, "default_log_level", "warning")
    level = args.log_level or ("debug" if args.debug else default)
    configure_logging(level, args.log_format)


def costs_from(args: argparse.Namespace) -> dict[str, Any]:
    """`prices` and `max_cost` as `--prices` and `--max-cost` give them (run options)."""
    from .._core._cost import as_money, load_prices
    from .._core._errors import ConfigurationError
    from ._exits import EXIT_USAGE, CliError

    if args.max_cost is not None and args.prices is None:
        raise CliError(
            "--max-cost needs --prices to count the money",
            "add --prices genai (pip install 'rillet[prices]'), or --prices FILE.json",
            code=EXIT_USAGE,
        )
    if args.prices is None:
        return {}
    try:
        prices = load_prices(args.prices)
    except ConfigurationError as exc:
        raise CliError(f"--prices: {exc}", code=EXIT_USAGE) from None
    return {"prices": prices, "max_cost": as_money(args.max_cost)}


def policy_from(args: argparse.Namespace) -> Policy:
    """The turn's policy from the timeout and retry options."""
    return Policy(
        initial_event_timeout=args.initial_timeout,
        per_event_timeout=args.event_timeout,
        total_timeout=args.total_timeout,
        transport_retries=args.retries,
        rate_limit_retries=args.rate_limit_retries,
        rescue=not args.no_rescue,
        requests_per_minute=args.rpm,
    )
