"""``python -m ale.gateway serve --agent-socket P --control-socket P --config-fd FD --events P``.

Reads the configuration from FD (then closes it), binds the agent socket (mode 0666) and the
control socket (0600), records ``gateway_started``, prints one ``{"event": "ready", ...}`` line
once both accept connections, and serves until SIGTERM or SIGINT: then in-flight requests are cut
(each recorded), ``gateway_stopped`` is recorded and the process exits 0. A configuration it
refuses: one line on stderr naming the field (never a key), exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import stat
import sys
from typing import Any

import trio

from ale.gateway.config import MAX_CONFIG_BYTES, Config, ConfigError, parse_config
from ale.gateway.events import EventLog
from ale.gateway.server import UPSTREAM_SECONDS, Gateway
from ale.gateway.transport import serve_raw


class CliError(Exception):
    """Printed on stderr without a traceback; exit status 2."""


def read_config(fd: int) -> Config:
    try:
        with os.fdopen(fd, "rb", closefd=True) as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise CliError(f"cannot read the configuration from fd {fd}: {error.strerror}") from None
    try:
        return parse_config(raw)
    except ConfigError as error:
        raise CliError(str(error)) from None


def bind_unix(path: str, mode: int) -> socket.socket:
    """A listening Unix socket at ``path`` with ``mode`` (a stale socket there is replaced)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise CliError(f"cannot use socket path {path}: {error.strerror}") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # nobody else may connect before the chmod below
    try:
        sock.bind(path)
        os.chmod(path, mode)
        sock.listen(1024)
    except OSError as error:
        sock.close()
        raise CliError(f"cannot listen on {path}: {error.strerror}") from None
    finally:
        os.umask(old)
    return sock


async def serve(gateway: Gateway, agent: socket.socket, control: socket.socket, ready: dict[str, Any]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_raw, agent, gateway.serve_connection, nursery)
            nursery.start_soon(serve_raw, control, gateway.serve_control, nursery)
            nursery.start_soon(gateway.hangups.run)
            gateway.started()
            print(json.dumps(ready), flush=True)
            async for _ in signals:
                gateway.stopping = True
                nursery.cancel_scope.cancel()
                break
    with trio.CancelScope(shield=True), trio.move_on_after(2):
        await gateway.close()


def cmd_serve(args: argparse.Namespace) -> int:
    config = read_config(args.config_fd)
    agent_sock = bind_unix(args.agent_socket, 0o666)
    control_sock = bind_unix(args.control_socket, 0o600)
    try:
        log = EventLog(args.events, [config.placeholder_key, *(u.api_key for u in config.upstreams if u.api_key)])
    except OSError as error:
        raise CliError(f"cannot open the events file {args.events}: {error.strerror}") from None
    gateway = Gateway(config, log, upstream_seconds=args.upstream_timeout)
    ready = {"event": "ready", "agent_socket": args.agent_socket, "control_socket": args.control_socket}
    try:
        trio.run(serve, gateway, agent_sock, control_sock, ready)
    finally:
        gateway.stopped()
        log.close()
        for path in (args.agent_socket, args.control_socket):
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value[:40]!r}") from None
    if not 0 < seconds <= 86400:
        raise argparse.ArgumentTypeError("expected a number of seconds in (0, 86400]")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ale.gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="serve the agent and control sockets for one run")
    serve_cmd.add_argument("--agent-socket", required=True, help="Unix socket path for the agent (mode 0666)")
    serve_cmd.add_argument("--control-socket", required=True, help="Unix socket path for the harness (mode 0600)")
    serve_cmd.add_argument("--config-fd", required=True, type=int, help="read the JSON configuration from this fd")
    serve_cmd.add_argument("--events", required=True, help="append the JSONL event log to this file")
    serve_cmd.add_argument(
        "--upstream-timeout",
        type=_seconds,
        default=UPSTREAM_SECONDS,
        help=f"seconds to wait for an upstream's answer and between its stream's chunks (default {UPSTREAM_SECONDS:g})",
    )
    serve_cmd.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except CliError as error:
        print(f"ale.gateway: {error}", file=sys.stderr)
        return 2
    return code
