"""The `rillet` command line (also `python -m rillet`).

`rillet run "question"` streams the answer to stdout as it arrives; progress and diagnostics go
to stderr. Exit codes: 0 completed, 1 error, 3 approval required, 130 cancelled (Ctrl-C keeps the
partial text and still writes the final `run.done` line in JSONL mode), 141 when stdout's reader
goes away. Errors are one line with a hint; `--debug` shows tracebacks.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import trio

from ._errors import RilletError
from ._policy import Outcome, Policy
from ._request import ThinkingLevel, TurnRequest, user

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._turn import Sink, TurnResult
    from .providers._base import Provider

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_APPROVAL = 3
EXIT_CANCELLED = 130
EXIT_PIPE = 141

_THINKING = ("none", "low", "medium", "high", "xhigh", "max")


class CliError(Exception):
    """A one-line error for the user, with an optional hint."""

    def __init__(self, message: str, hint: str = "") -> None:
        self.hint = hint
        super().__init__(message)


def _version() -> str:
    from . import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rillet",
        description="Stream LLM responses from many providers through one checked pipeline.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"rillet {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="stream one answer to stdout")
    run.add_argument("prompt", help='the question ("-" reads it from stdin)')
    _provider_options(run)
    run.add_argument("--system", help="system prompt")
    run.add_argument("--max-tokens", type=int)
    run.add_argument("--temperature", type=float)
    run.add_argument("--thinking", choices=_THINKING, help="reasoning effort")
    run.add_argument("--show-reasoning", action="store_true", help="print reasoning on stderr")
    run.add_argument(
        "--output",
        choices=("text", "jsonl", "uni-jsonl"),
        default="text",
        help="text; public run events as JSONL; or MMSP UniEvents as JSONL",
    )
    run.add_argument("--no-stream", action="store_true", help="print the whole answer once")
    _policy_options(run)

    replay = sub.add_parser("replay", help="play a recorded wire file through the pipeline")
    replay.add_argument("file", type=Path)
    replay.add_argument(
        "--dialect",
        default=None,
        help="the dialect that recorded it (default: from the file's folder or suffix)",
    )
    replay.add_argument("--chunk-size", type=int, default=64)
    replay.add_argument("--delay", type=float, default=0.0, help="seconds between chunks")
    replay.add_argument("--output", choices=("text", "jsonl", "uni-jsonl"), default="text")

    sub.add_parser("providers", help="what is configured (keys masked)")

    serve = sub.add_parser("serve", help="the HTTP/SSE/WebSocket server and its live page")
    _provider_options(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8787)
    serve.add_argument("--server-key", default=None, help="key required to start runs")
    serve.add_argument("--show-reasoning", action="store_true")
    serve.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="keep run logs in this Redis (redis://host:port/db) so that every server sharing "
        "it serves every run; needs the `redis` extra. Default: in memory",
    )

    demo = sub.add_parser("demo", help="everything, against an embedded recorded provider")
    demo.add_argument("--keep-serving", action="store_true", help="keep the page up at the end")
    demo.add_argument("--port", type=int, default=0, help="the page's port (0: any free one)")
    demo.add_argument("--fast", action="store_true", help="no pacing (for tests)")

    bench = sub.add_parser("bench", help="run the benchmarks (python -m bench)")
    bench.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _provider_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--provider",
        default=os.environ.get("RILLET_PROVIDER", "openai"),
        help="openai, openai-responses, anthropic, gemini, ollama, mmsp, or a base URL of an "
        "OpenAI-compatible server",
    )
    p.add_argument("--model")
    p.add_argument("--base-url")
    p.add_argument("--api-key", help="overrides the provider's environment variable")


def _policy_options(p: argparse.ArgumentParser) -> None:
    d = Policy()
    p.add_argument("--initial-timeout", type=float, default=d.initial_event_timeout)
    p.add_argument("--event-timeout", type=float, default=d.per_event_timeout)
    p.add_argument("--total-timeout", type=float, default=d.total_timeout)
    p.add_argument("--retries", type=int, default=d.transport_retries)
    p.add_argument("--rate-limit-retries", type=int, default=d.rate_limit_retries)
    p.add_argument("--no-fallback", action="store_true", help="no non-streaming rescue")
    p.add_argument("--rpm", type=float, default=0.0, help="requests per minute (0: no limiter)")


def _policy(args: argparse.Namespace) -> Policy:
    return Policy(
        initial_event_timeout=args.initial_timeout,
        per_event_timeout=args.event_timeout,
        total_timeout=args.total_timeout,
        transport_retries=args.retries,
        rate_limit_retries=args.rate_limit_retries,
        fallback=not args.no_fallback,
        requests_per_minute=args.rpm,
    )


def _provider(args: argparse.Namespace) -> Provider:
    from .providers._registry import ConfigurationError, provider_from_env

    try:
        return provider_from_env(
            args.provider, model=args.model, base_url=args.base_url, api_key=args.api_key
        )
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None


def _request(args: argparse.Namespace) -> TurnRequest:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise CliError("empty prompt", "pass a question, or '-' to read it from stdin")
    thinking: ThinkingLevel | None = args.thinking
    return TurnRequest(
        messages=[user(prompt)],
        system_prompt=args.system,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        thinking_level=thinking,
    )


def _sinks(output: str, *, show_reasoning: bool, no_stream: bool = False) -> list[Sink]:
    from rillet.transports.sinks import JSONLSink, TerminalSink

    if output == "jsonl":
        return [JSONLSink(sys.stdout.buffer, kind="run")]
    if output == "uni-jsonl":
        return [JSONLSink(sys.stdout.buffer, kind="uni")]
    if no_stream:
        return [TerminalSink(out=io.StringIO(), show_reasoning=show_reasoning)]
    return [TerminalSink(show_reasoning=show_reasoning)]


def _exit_code(result: TurnResult, sinks: Sequence[Any]) -> int:
    if any(getattr(s, "broken_pipe", False) for s in sinks):
        return EXIT_PIPE
    if result.outcome is Outcome.CANCELLED:
        return EXIT_CANCELLED
    if result.ok and (result.message.finish_reason or "stop") != "length":
        return EXIT_OK
    return EXIT_ERROR


async def _run_turn_cli(
    request: TurnRequest,
    provider: Provider,
    sinks: list[Sink],
    policy: Policy,
    *,
    reasoning: bool,
    client: Any = None,
) -> TurnResult:
    """Run a turn; Ctrl-C cancels it (the sinks still get `run.done`)."""
    from ._turn import run_turn

    async with trio.open_nursery() as nursery:
        turn = await nursery.start(
            lambda task_status: run_turn(
                request,
                provider,
                sinks=sinks,
                policy=policy,
                reasoning=reasoning,
                client=client,
                task_status=task_status,
            )
        )

        async def on_sigint() -> None:
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    turn.cancel()
                    return

        nursery.start_soon(on_sigint)
        result: TurnResult = await turn.result()
        nursery.cancel_scope.cancel()
    return result


def _cmd_run(args: argparse.Namespace) -> int:
    provider = _provider(args)
    request = _request(args)
    sinks = _sinks(args.output, show_reasoning=args.show_reasoning, no_stream=args.no_stream)
    result = trio.run(
        lambda: _run_turn_cli(
            request, provider, sinks, _policy(args), reasoning=args.show_reasoning
        )
    )
    if args.no_stream and args.output == "text" and result.ok:
        _write_stdout(result.text + ("" if result.text.endswith("\n") else "\n"))
    return _exit_code(result, sinks)


def _cmd_replay(args: argparse.Namespace) -> int:
    import httpx
    from rillet.transports.replay import ReplayTransport

    from .providers._base import Provider

    path: Path = args.file
    if not path.is_file():
        raise CliError(f"no such file: {path}")
    dialect_name = args.dialect or _guess_dialect(path)
    dialect = _dialect_by_name(dialect_name)
    provider = Provider(dialect, "http://replay.invalid", "replay")
    transport = ReplayTransport(path, chunk_size=args.chunk_size, delay=args.delay)
    sinks = _sinks(args.output, show_reasoning=False)
    request = TurnRequest(messages=[user("(replay)")])

    async def go() -> TurnResult:
        async with httpx.AsyncClient(transport=transport) as client:
            return await _run_turn_cli(
                request,
                provider,
                sinks,
                Policy(transport_retries=0, fallback=False),
                reasoning=False,
                client=client,
            )

    return _exit_code(trio.run(go), sinks)


def _dialect_by_name(name: str) -> Any:
    from ._errors import ConfigurationError
    from .providers._registry import dialect_from_name

    try:
        return dialect_from_name(name)
    except ConfigurationError as exc:
        raise CliError(str(exc), "pass --dialect with one of those") from None


def _guess_dialect(path: Path) -> str:
    from .providers._registry import DIALECT_NAMES

    if path.parent.name in DIALECT_NAMES:
        return path.parent.name
    if path.suffix == ".ndjson":
        return "ollama"
    raise CliError(f"cannot tell which dialect recorded {path.name}", "pass --dialect")


def _cmd_providers(_: argparse.Namespace) -> int:
    from .providers._registry import describe_providers

    for entry in describe_providers():
        ready = "ready" if entry.get("ready") else f"needs {entry.get('missing')}"
        key = entry.get("api_key") or "-"
        print(f"{entry['kind']:<18} {entry['base_url']:<48} key {key:<8} {ready}")
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    try:
        from bench.__main__ import main as bench_main
    except ImportError:
        raise CliError(
            "the benchmarks are not installed", "run them from a checkout: make bench"
        ) from None
    bench_main(list(args.args))
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    from ._hub import HubUnavailable
    from .providers._base import Secret

    try:
        from rillet.transports.server import ServerConfig, serve
    except ImportError:  # pragma: no cover - the server ships with the package
        raise CliError("the server is not available in this installation") from None
    provider = _provider(args)
    key = Secret(args.server_key) if args.server_key else None
    config = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=key,
        provider=provider,
        models=[provider.model],
        reasoning=args.show_reasoning,
        redis_url=args.redis,
    )
    if args.redis is not None:
        try:
            import coredis  # noqa: F401
        except ImportError:
            raise CliError(
                "--redis needs the coredis package", "pip install 'rillet[redis]'"
            ) from None

    refused: list[str] = []

    async def go() -> None:
        try:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(
                    lambda task_status: serve(config, task_status=task_status)
                )
                print(f"rillet serving {url}/", file=sys.stderr, flush=True)
        except* HubUnavailable as group:  # Redis did not answer: no fallback to memory
            refused.extend(str(exc) for exc in group.exceptions)
        except* KeyboardInterrupt:  # Ctrl-C arrives through the server's nursery
            interrupted.append(True)

    interrupted: list[bool] = []
    try:
        trio.run(go)
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    if interrupted:
        return EXIT_CANCELLED
    if refused:
        raise CliError(
            f"not serving: {refused[0]}", "start Redis, fix --redis, or leave it out for memory"
        )
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return trio.run(
        lambda: run_demo(keep_serving=args.keep_serving, port=args.port, fast=args.fast)
    )


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        raise SystemExit(EXIT_PIPE) from None


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> NoReturn:
    """The console script's entry point."""
    parser = _parser()
    args = parser.parse_args(argv)
    commands = {
        "run": _cmd_run,
        "replay": _cmd_replay,
        "providers": _cmd_providers,
        "serve": _cmd_serve,
        "demo": _cmd_demo,
        "bench": _cmd_bench,
    }
    if args.command is None:
        parser.print_help(sys.stderr)
        raise SystemExit(EXIT_USAGE)
    try:
        code = commands[args.command](args)
    except CliError as exc:
        print(f"rillet: {exc}" + (f" ({exc.hint})" if exc.hint else ""), file=sys.stderr)
        code = EXIT_ERROR
    except RilletError as exc:
        if args.debug:
            raise
        print(f"rillet: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = EXIT_ERROR
    except KeyboardInterrupt:
        code = EXIT_CANCELLED
    except BrokenPipeError:
        code = EXIT_PIPE
    if code == EXIT_PIPE:
        _quiet_stdout()
    raise SystemExit(code)
