"""`rillet serve`, the command (`_cli` parses the line): the server's settings from the
arguments, the workers' supervisor, and every way serving can fail said in one line (an
address that cannot be bound, Redis that does not answer, a worker that keeps dying)."""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._core._errors import RilletError
from ._args import configure_from, costs_from
from ._exits import EXIT_CANCELLED, EXIT_OK, EXIT_USAGE, CliError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from rillet.transports.server import Limits

    from .._core._dialect import Provider

__all__ = ["KEY_VARIABLE", "route_kinds", "serve_cli", "server_key"]

KEY_VARIABLE = "RILLET_SERVER_KEY"
"""The environment variable `serve` reads the server key from."""


def route_kinds(text: str) -> tuple[str, ...]:
    """`--route`'s provider kinds (comma-separated), each one checked."""
    from ..providers import PROVIDER_KINDS

    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in PROVIDER_KINDS]
    if unknown:
        raise CliError(
            f"--route: unknown provider kind {unknown[0]!r}",
            f"use some of {', '.join(PROVIDER_KINDS)}",
        )
    return kinds


def serve_limits(args: argparse.Namespace) -> Limits:
    """The server's limits with the command line's `--max-streams`, `--max-queued` and
    `--max-per-client`: what is not given keeps its default, and the cap on runs started and
    not finished grows to hold every stream and every queued run the options allow."""
    from rillet.transports.server import Limits

    limits = Limits()
    changes: dict[str, int] = {}
    if args.max_streams is not None:
        changes["max_streams"] = args.max_streams
    if args.max_queued is not None:
        changes["max_queued"] = args.max_queued
    if args.max_per_client is not None:
        changes["max_runs_per_client"] = args.max_per_client
    limits = attrs.evolve(limits, **changes)
    room = limits.max_streams + limits.max_queued
    if room > limits.max_active_runs:
        limits = attrs.evolve(limits, max_active_runs=room)
    return limits


def server_key(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The key clients must send, from `--server-key-file`, `--server-key` or
    `RILLET_SERVER_KEY` (in that order), or None. A key on the command line is used with one
    line on stderr saying why not to: every local user reads it in `/proc/PID/cmdline`. An
    empty or unreadable file (or an empty variable) is a one-line error: the server must not
    start open when a key was meant.

    Args:
        args: the parsed command line (`server_key_file`, `server_key`).
        environ: the environment to read `RILLET_SERVER_KEY` from.
    """
    path: Path | None = args.server_key_file
    if path is not None:
        try:
            key = path.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8"
            raise CliError(f"--server-key-file {path}: cannot read it ({reason})") from None
        if not key:
            raise CliError(f"--server-key-file {path}: the file holds no key")
        return key
    if args.server_key is not None:
        print(
            "rillet: warning: a key given with --server-key is visible to every local user "
            f"(/proc/PID/cmdline): use --server-key-file PATH or {KEY_VARIABLE}",
            file=sys.stderr,
            flush=True,
        )
        if not args.server_key:
            raise CliError("--server-key: the key is empty")
        return str(args.server_key)
    from_env = environ.get(KEY_VARIABLE)
    if from_env is not None and not from_env:
        raise CliError(f"{KEY_VARIABLE} is set but empty", "set the key, or unset it")
    return from_env


def serve_cli(
    args: argparse.Namespace, provider_of: Callable[[argparse.Namespace], Provider]
) -> int:
    """`rillet serve`: the server's settings from the command line, served until Ctrl-C or
    SIGTERM; the exit code. `provider_of` makes the upstream provider from the arguments."""
    from .._core._dialect import Secret
    from .._core._errors import HubUnavailable

    if args.workers > 1 and args.redis is None:
        raise CliError(
            f"--workers {args.workers} needs --redis URL: the workers share their runs "
            "through Redis",
            "add --redis redis://127.0.0.1:6379/0, or leave --workers out",
            code=EXIT_USAGE,
        )
    if args.workers < 1:
        raise CliError("--workers must be at least 1", code=EXIT_USAGE)
    configure_from(args)
    try:
        from rillet.transports.server import ServerConfig, WorkerFailed, serve
    except ImportError:  # pragma: no cover - the server ships with the package
        raise CliError("the server is not available in this installation") from None
    costs = costs_from(args)  # a usage error before the provider's
    given = server_key(args, os.environ)
    provider = provider_of(args)
    key = Secret(given) if given is not None else None
    config = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=key,
        provider=provider,
        models=[provider.model],
        reasoning=args.show_reasoning,
        tool_arguments=args.show_tool_arguments,
        redis_url=args.redis,
        tools=args.tools,
        ui_resume=args.ui_resume,
        takeover=args.takeover,
        route_kinds=route_kinds(args.route),
        workers=args.workers,
        limits=serve_limits(args),
        **costs,
    )
    try:
        config.check()  # before the nursery: its refusal is one line, not an exception group
    except RilletError as exc:
        raise CliError(str(exc)) from None
    if args.redis is not None:
        try:
            import coredis  # noqa: F401
        except ImportError:
            raise CliError(
                "--redis needs the coredis package", "pip install 'rillet[redis]'"
            ) from None

    refused: list[str] = []
    failed: list[str] = []
    unbound: list[OSError] = []
    interrupted: list[bool] = []
    # each worker configures its logging as this process did
    setup = functools.partial(configure_from, args) if args.workers > 1 else None

    async def go() -> None:
        try:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(
                    lambda task_status: serve(config, worker_setup=setup, task_status=task_status)
                )
                workers = f" with {args.workers} workers" if args.workers > 1 else ""
                print(
                    f"rillet serving {url}/{workers} (Ctrl-C stops it)", file=sys.stderr, flush=True
                )
                if args.workers > 1:  # SIGTERM stops the workers too, then this process
                    nursery.start_soon(_stop_on_sigterm, nursery.cancel_scope)
        except* WorkerFailed as group:  # a worker did not start, or kept dying
            failed.extend(str(exc) for exc in group.exceptions)
        except* HubUnavailable as group:  # Redis did not answer: no fallback to memory
            refused.extend(str(exc) for exc in group.exceptions)
        except* OSError as group:  # the address cannot be bound
            unbound.extend(_leaves(group, OSError))
        except* KeyboardInterrupt:  # Ctrl-C arrives through the server's nursery
            interrupted.append(True)

    try:
        trio.run(go)
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    if interrupted:
        return EXIT_CANCELLED
    if failed:
        raise CliError(f"not serving: {failed[0]}")
    if unbound:
        raise _unbound(unbound[0], args.host, args.port)
    if refused:
        raise CliError(
            f"not serving: {refused[0]}", "start Redis, fix --redis, or leave it out for memory"
        )
    return EXIT_OK


async def _stop_on_sigterm(scope: trio.CancelScope) -> None:
    """Cancel `scope` at SIGTERM (the server's supervisor then stops its workers)."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            print("rillet: SIGTERM, stopping the workers", file=sys.stderr, flush=True)
            scope.cancel()
            return


def _leaves(group: BaseExceptionGroup[Any], kind: type[OSError]) -> list[OSError]:
    """The exceptions of `kind` in a (nested) group, in order."""
    found: list[OSError] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(_leaves(exc, kind))
        elif isinstance(exc, kind):
            found.append(exc)
    return found


def _unbound(exc: OSError, host: str, port: int) -> CliError:
    """The one line for an address `serve` cannot listen on."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return CliError(
            f"cannot listen on {where}: the port is already in use",
            "stop what is using it, or pass --port 0 for a free one",
        )
    if exc.errno == errno.EACCES:
        return CliError(f"cannot listen on {where}: permission denied", "use a port above 1023")
    if exc.errno == errno.EADDRNOTAVAIL:
        return CliError(
            f"cannot listen on {where}: no such address on this machine", "check --host"
        )
    return CliError(f"cannot listen on {where}: {exc.strerror or exc}")
