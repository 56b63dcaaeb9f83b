"""The `rillet` command line (also `python -m rillet`).

`rillet run "question"` streams the answer to stdout as it arrives; progress and diagnostics go
to stderr. With `--tools demo` it runs the agent loop (`_agent.py`). Exit codes: 0 completed,
1 error (or an answer cut off at the token limit), 2 usage error (unknown option, missing
argument), 3 approval required (a tool waits for an approval and no one could be asked: stdin is
not a terminal, or `--no-input`), 130 cancelled (Ctrl-C keeps the partial text and still writes
the final `run.done` line in JSONL mode), 141 when stdout's reader goes away. Every failure is
one line on stderr, in every output mode, naming its cause and what to do (`_explain.py`);
`--debug`, anywhere on the line, adds the traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

import attrs
import trio

from .._core._errors import RilletError
from .._core._explain import explain, filtered_line, mask_keys
from .._core._policy import Outcome, Policy
from .._core._request import ThinkingLevel, TurnRequest, user
from .._core._runevents import RunDone
from .._turn._turn import SinkBatch
from ._args import build_parser, configure_from, costs_from, policy_from
from ._exits import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    CliError,
)
from ._log import log_run_end
from ._stdout import ReaderGone, cancel_when_gone

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from decimal import Decimal

    from .._agent._loop import AgentResult
    from .._core._dialect import Provider
    from .._turn._turn import Sink, TurnResult

__all__ = ["main"]


def _provider(args: argparse.Namespace) -> Provider:
    from ..providers._registry import ConfigurationError, provider_from_env

    try:
        provider = provider_from_env(
            args.provider, model=args.model, base_url=args.base_url, api_key=args.api_key
        )
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None
    _note_unsent_key(args.provider, provider)
    return provider


def _key_envs(kind: str) -> tuple[str, ...]:
    """The environment variables a kind reads its key from."""
    from ..providers._registry import COMPATIBLE, KINDS

    spec = KINDS.get(kind)
    if spec is None:
        spec = COMPATIBLE if kind.lower().startswith(("http://", "https://")) else None
    return spec.key_envs if spec is not None else ()


def _key_hint(kind: str, provider: Provider, api_key: str | None) -> str | None:
    """Where the key in use came from, for the advice after an authentication failure."""
    if api_key:
        return "--api-key"
    if provider.api_key is None and getattr(provider.dialect, "token_provider", None) is not None:
        # a token from the cloud's own credentials (Application Default Credentials...)
        if kind.startswith("vertex"):
            return "GOOGLE_APPLICATION_CREDENTIALS (or gcloud auth application-default login)"
        if kind.startswith("azure"):
            return "the Azure sign-in (az login), or set AZURE_OPENAI_API_KEY"
        return "the credentials the access token comes from"
    for name in _key_envs(kind):
        if os.environ.get(name, "").strip():
            return name if provider.api_key is not None else "--api-key"
    names = _key_envs(kind)
    return f"{names[0]} or --api-key" if names else "--api-key"


def _note_unsent_key(kind: str, provider: Provider) -> None:
    """Say so when a key set in the environment is not sent (it only goes to its own URL)."""
    if provider.api_key is not None:
        return
    for name in _key_envs(kind):
        if os.environ.get(name, "").strip():
            host = urlsplit(provider.base_url).netloc or provider.base_url
            print(
                f"rillet: note: {name} is set but not sent to {host} (a key from the environment "
                "goes only to its own provider's URL); pass --api-key to send one there",
                file=sys.stderr,
            )
            return


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


@attrs.define(eq=False)
class _Output:
    """How `run` and `replay` show a turn: the output mode and the terminal's options."""

    mode: str = "text"
    show_reasoning: bool = False
    no_stream: bool = False


@attrs.define(eq=False)
class _WithoutErrorLine:
    """A terminal sink minus its own `error: <code>` line: the command line prints the cause
    in words instead (one line per failure)."""

    sink: Any

    @property
    def broken_pipe(self) -> bool:
        """Whether stdout's reader went away."""
        return bool(getattr(self.sink, "broken_pipe", False))

    async def deliver(self, batch: SinkBatch) -> None:
        """Pass the batch on without an error `run.done`."""
        run = [e for e in batch.run if not (type(e) is RunDone and e.status == "error")]
        if len(run) != len(batch.run):
            batch = SinkBatch(run, batch.uni)
        await self.sink.deliver(batch)

    async def close(self) -> None:
        """Close the terminal sink."""
        await self.sink.close()


async def _open_sinks(
    stack: contextlib.AsyncExitStack, output: _Output, *, spinner: bool | None = None
) -> list[Sink]:
    from rillet.transports.sinks import JSONLSink, TerminalSink

    if output.mode == "jsonl":
        return [ReaderGone(JSONLSink(sys.stdout.buffer, kind="run"))]
    if output.mode == "uni-jsonl":
        return [ReaderGone(JSONLSink(sys.stdout.buffer, kind="uni"))]
    out = io.StringIO() if output.no_stream else None
    # `open` runs the spinner's ticker: it counts the seconds until the first token arrives
    terminal = await stack.enter_async_context(
        TerminalSink.open(out=out, show_reasoning=output.show_reasoning, spinner=spinner)
    )
    return [ReaderGone(_WithoutErrorLine(terminal))]


def _terminal_of(sink: Any) -> Any:
    """The terminal sink inside the command line's wrappers (JSONL sinks as they are)."""
    while isinstance(sink, ReaderGone | _WithoutErrorLine):
        sink = sink.sink
    return sink


def _exit_code(result: TurnResult, sinks: Sequence[Any]) -> int:
    if any(getattr(s, "broken_pipe", False) for s in sinks):
        return EXIT_PIPE
    if result.outcome is Outcome.CANCELLED:
        return EXIT_CANCELLED
    if not result.ok or result.message.finish_reason == "length" or result.filtered:
        return EXIT_ERROR  # (an answer cut short comes home incomplete)
    return EXIT_OK


async def _run_turn_cli(
    request: TurnRequest,
    provider: Provider | list[Provider],
    output: _Output,
    policy: Policy,
    *,
    client: Any = None,
    **costs: Any,
) -> tuple[TurnResult, list[Sink]]:
    """Run a turn; Ctrl-C cancels it (the sinks still get `run.done`). `costs`: the run's
    `prices` and `max_cost`, if given."""
    from .._turn._api import run_turn

    async with contextlib.AsyncExitStack() as stack:
        sinks = await _open_sinks(stack, output)
        async with trio.open_nursery() as nursery:
            turn = await nursery.start(
                lambda task_status: run_turn(
                    request,
                    provider,
                    sinks=sinks,
                    policy=policy,
                    reasoning=output.show_reasoning,
                    client=client,
                    stream=not output.no_stream,
                    task_status=task_status,
                    **costs,
                )
            )

            async def on_sigint() -> None:
                with trio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        turn.cancel()
                        return

            nursery.start_soon(on_sigint)
            nursery.start_soon(cancel_when_gone, sinks, turn.cancel)
            result: TurnResult = await turn.result()
            nursery.cancel_scope.cancel()
    return result, sinks


def _spent(cost: Decimal | None, mode: str) -> None:
    """With `--prices`, what the run cost, on stderr after the answer (the JSON Lines carry it
    in their `usage` events already)."""
    if cost is not None and mode == "text":
        print(f"rillet: cost {cost}", file=sys.stderr)


def _report(result: TurnResult, provider: Provider, *, key_hint: str | None, debug: bool) -> None:
    """The one line on stderr that says why a turn did not complete (nothing when it did)."""
    if result.outcome is Outcome.CANCELLED:
        return
    if result.ok:
        if result.code == "max_cost":
            print(f"rillet: {explain(result.error, provider)}", file=sys.stderr)
        elif result.message.finish_reason == "length":
            print(
                "rillet: the answer was cut off at the token limit (finish reason length) — "
                "raise --max-tokens",
                file=sys.stderr,
            )
        if result.filtered:
            print(f"rillet: {filtered_line(result.provider_finish_reason)}", file=sys.stderr)
        return
    if debug and result.error is not None:
        # an error built from the provider's reply was never raised, so it may have no frames:
        # its facts (status, the provider's error type...) say the rest
        text = "".join(traceback.format_exception(result.error))
        facts = {k: v for k, v in vars(result.error).items() if not k.startswith("_")}
        text += f"{type(result.error).__name__} facts: {facts}\n"
        print(mask_keys(text, provider), end="", file=sys.stderr)
    line = explain(result.error, provider, attempts=result.attempts, key_hint=key_hint)
    print(f"rillet: {line}", file=sys.stderr, flush=True)


def _chain_after(spec: str | None) -> list[Provider]:
    """The rest of the chain, as `--fallback` names it: each provider configured from the
    environment."""
    from ..providers._registry import ConfigurationError, provider_from_env
    from ._agent import parse_chain

    chain: list[Provider] = []
    for kind, model in parse_chain(spec):
        try:
            chain.append(provider_from_env(kind, model=model))
        except ConfigurationError as exc:
            raise CliError(f"--fallback {kind}: {exc}") from None
        _note_unsent_key(kind, chain[-1])
    if spec is not None and not chain:
        raise CliError("--fallback names no provider", "pass PROVIDER[:MODEL],...")
    return chain


def _cmd_run(args: argparse.Namespace) -> int:
    configure_from(args)
    costs = costs_from(args)  # a usage error before any other
    provider = _provider(args)
    chain = [provider, *_chain_after(args.chain)]
    request = _request(args)
    output = _Output(args.output, args.show_reasoning, args.no_stream)
    if args.tools is not None:
        return _cmd_run_agent(args, chain, request, output, costs)
    result, sinks = trio.run(
        lambda: _run_turn_cli(
            request, chain if len(chain) > 1 else provider, output, policy_from(args), **costs
        )
    )
    answered = result.provider or provider
    log_run_end(result, answered)
    if args.no_stream and args.output == "text" and result.ok:
        _write_stdout(result.text + ("" if result.text.endswith("\n") else "\n"))
    _report(
        result,
        answered,
        key_hint=_key_hint(args.provider, provider, args.api_key) if answered is provider else None,
        debug=args.debug,
    )
    _spent(result.cost(), args.output)
    return _exit_code(result, sinks)


def _cmd_run_agent(
    args: argparse.Namespace,
    chain: list[Provider],
    request: TurnRequest,
    output: _Output,
    costs: dict[str, Any],
) -> int:
    from .._agent._demo_tools import toolset
    from ._agent import AgentTerminal, agent_outcome, run_agent_cli

    if args.max_steps < 1:
        raise CliError("--max-steps must be at least 1")
    interactive = not args.no_input and sys.stdin.isatty()
    text = output.mode == "text"

    async def go() -> tuple[AgentResult, list[Sink]]:
        async with contextlib.AsyncExitStack() as stack:
            # a y/N question and a ticking spinner cannot share the terminal's last line
            sinks = await _open_sinks(stack, output, spinner=False if interactive else None)
            if text:
                sinks = [ReaderGone(AgentTerminal(_terminal_of(s))) for s in sinks]
            result = await run_agent_cli(
                request,
                chain,
                toolset(args.tools),
                sinks,
                interactive=interactive,
                max_steps=args.max_steps,
                policy=policy_from(args),
                reasoning=output.show_reasoning,
                tool_arguments=text,
                stream=not output.no_stream,
                **costs,
            )
        return result, sinks

    result, sinks = trio.run(go)
    answered = result.provider or chain[0]
    if args.no_stream and text and result.ok:
        _write_stdout(result.text + ("" if result.text.endswith("\n") else "\n"))
    if any(getattr(s, "broken_pipe", False) for s in sinks):
        return EXIT_PIPE
    code, line = agent_outcome(result)
    if line:
        print(f"rillet: {line}", file=sys.stderr)
    _spent(result.cost(), args.output)
    if code is not None:
        return code
    hint = _key_hint(args.provider, chain[0], args.api_key) if answered is chain[0] else None
    _report(result.turns[-1], answered, key_hint=hint, debug=args.debug)  # the failed turn
    return EXIT_ERROR


def _cmd_replay(args: argparse.Namespace) -> int:
    import httpx
    from rillet.transports.replay import ReplayTransport

    from .._core._dialect import Provider

    path: Path = args.file
    if not path.is_file():
        raise CliError(f"no such file: {path}")
    dialect_name = args.dialect or _guess_dialect(path)
    dialect = _dialect_by_name(dialect_name)
    provider = Provider(dialect, "http://replay.invalid", "replay")
    transport = ReplayTransport(path, chunk_size=args.chunk_size, delay=args.delay)
    request = TurnRequest(messages=[user("(replay)")])

    async def go() -> tuple[TurnResult, list[Sink]]:
        async with httpx.AsyncClient(transport=transport) as client:
            return await _run_turn_cli(
                request,
                provider,
                _Output(args.output),
                Policy(transport_retries=0, rescue=False),
                client=client,
            )

    result, sinks = trio.run(go)
    _report(result, provider, key_hint=None, debug=args.debug)
    return _exit_code(result, sinks)


def _dialect_by_name(name: str) -> Any:
    from .._core._errors import ConfigurationError
    from ..providers._registry import dialect_from_name

    try:
        return dialect_from_name(name)
    except ConfigurationError as exc:
        raise CliError(str(exc), "pass --dialect with one of those") from None


def _guess_dialect(path: Path) -> str:
    from ..providers._registry import DIALECT_NAMES

    if path.parent.name in DIALECT_NAMES:
        return path.parent.name
    if path.suffix == ".ndjson":
        return "ollama"
    raise CliError(f"cannot tell which dialect recorded {path.name}", "pass --dialect")


def _cmd_providers(_: argparse.Namespace) -> int:
    from ..providers._registry import describe_providers

    print(f"{'provider':<18} {'default model':<24} {'base URL':<42} {'key':<8} status")
    for entry in describe_providers():
        ready = "ready" if entry.get("ready") else f"needs {entry.get('missing')}"
        key = entry.get("api_key") or "-"
        model = entry.get("model") or "-"
        print(f"{entry['kind']:<18} {model:<24} {entry['base_url']:<42} {key:<8} {ready}")
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    bench_main = _bench_main()
    given = list(args.args)
    bench_main(given[1:] if given[:1] == ["--"] else given, prog="rillet bench")
    return EXIT_OK


def _bench_main() -> Callable[..., None]:
    """The benchmarks' entry point: from the checkout this rillet runs from (an editable
    install's, wherever the command is called), else from `bench` on the path. They are not
    part of the package: an install from the index has none, and says where they are."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "bench" / "__main__.py").is_file() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        from bench.__main__ import main as bench_main
    except ImportError:
        raise CliError(
            "the benchmarks are not part of an installed rillet: they live in its source "
            "repository's bench/",
            "clone it and run `make bench` there (it installs what they need)",
        ) from None
    return bench_main


def _cmd_serve(args: argparse.Namespace) -> int:
    from ._serve import serve_cli

    return serve_cli(args, _provider)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    interrupted: list[bool] = []

    async def go() -> int:
        try:
            return await run_demo(keep_serving=args.keep_serving, port=args.port, fast=args.fast)
        except* KeyboardInterrupt:  # Ctrl-C may arrive through the page server's nursery
            interrupted.append(True)
        return EXIT_CANCELLED

    try:
        code = trio.run(go)
    except KeyboardInterrupt:
        interrupted.append(True)
        code = EXIT_CANCELLED
    if interrupted and args.keep_serving:  # the documented way to end a demo that stays up
        print("\nrillet demo: stopped", file=sys.stderr)
        return EXIT_OK
    return code


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
    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["bench"]:  # its options are the benchmarks' own, `--help` included
        argv = ["bench", "--", *given[1:]]
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
        if args.debug:
            traceback.print_exc()
        print(f"rillet: {exc}" + (f" ({exc.hint})" if exc.hint else ""), file=sys.stderr)
        code = exc.code
    except RilletError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"rillet: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = EXIT_ERROR
    except KeyboardInterrupt:
        code = EXIT_CANCELLED
    except BrokenPipeError:
        code = EXIT_PIPE
    if code == EXIT_PIPE:
        _quiet_stdout()
    raise SystemExit(code)
