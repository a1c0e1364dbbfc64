"""The LLM gateway of a run (docs/gateway.md): its upstreams, its start, its policy, its end.

:func:`configure` turns ``ale run --llm-upstream`` flags and the usual environment
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``) into
:class:`Upstream` values, checked as the gateway will check them (:func:`ale.gateway.config.parse_config`)
before anything starts. :func:`open_gateway` starts ``python -m ale.gateway serve`` with its
configuration on a descriptor (the real keys are never in its argv or environment), waits for its
ready line and stops it on exit; :meth:`Gateway.set_policy` talks to its control socket.

The real keys live in :class:`Upstream` (never in its repr) and in the configuration bytes only;
whatever the harness prints of the gateway (its stderr) has them replaced (:meth:`Gateway.redact`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Mapping, MutableMapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.lowlevel

from ale.runner import lifeline, supervise
from ale.runner._groups import collapse

READY_TIMEOUT_S = 30.0
CONTROL_TIMEOUT_S = 10.0
API_KINDS = ("openai", "anthropic")
#: The usual environment of each API kind: (base URL variable, key variable, default base URL).
USUAL_ENV: Mapping[str, tuple[str, str, str]] = {
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_KEY", "https://api.openai.com/v1"),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "https://api.anthropic.com"),
}
_OPTION = re.compile(r"(api|key-env|ca-file)=(.*)", re.DOTALL)
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PROXY_NAME = "ale-gateway"


class UpstreamError(ValueError):
    """An upstream that cannot be configured; the message names the flag or variable, never a key."""


class GatewayError(RuntimeError):
    """The gateway did not start, or stopped answering; the message has its (redacted) stderr's tail."""


@attrs.frozen
class Upstream:
    """One LLM API the gateway may forward to."""

    name: str
    api: str
    base_url: str
    api_key: str | None = attrs.field(repr=False)
    ca_file: str | None = None
    source: str = ""  # where it was configured ("--llm-upstream ...", "OPENAI_API_KEY"), for messages
    key_var: str | None = None  # the environment variable its key was read from

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "api": self.api,
            "base_url": self.base_url,
            "api_key": self.api_key,
            "ca_file": self.ca_file,
        }


def _default_key_var(name: str, api: str) -> str:
    if name == api:
        return USUAL_ENV[api][1]
    return f"{name.upper().replace('-', '_')}_API_KEY"


def parse_flag(text: str, environ: Mapping[str, str]) -> Upstream:
    """``NAME=URL[,api=openai|anthropic][,key-env=VAR][,ca-file=PATH]`` (one ``--llm-upstream``).

    ``api`` defaults to NAME when NAME is ``openai`` or ``anthropic``; the key is read from the
    variable ``key-env`` names (default: ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY`` for those two
    names, else ``NAME_API_KEY``, upper-cased, ``-`` as ``_``); a variable that is not set means
    no key (a local server that needs none)."""
    flag = f"--llm-upstream {text.split('=', 1)[0]!r}"
    head, *options = text.split(",")
    name, sep, url = head.partition("=")
    if not sep or not name or not url:
        raise UpstreamError(f"{flag}: expected NAME=URL[,api=...][,key-env=VAR][,ca-file=PATH]")
    found: dict[str, str] = {}
    for option in options:
        match = _OPTION.fullmatch(option)
        if match is None or match[1] in found:
            raise UpstreamError(f"{flag}: {option.split('=')[0]!r} is not one of api=, key-env=, ca-file= (once each)")
        found[match[1]] = match[2]
    api = found.get("api") or (name if name in API_KINDS else "")
    if api not in API_KINDS:
        raise UpstreamError(f"{flag}: say which API it speaks: api=openai or api=anthropic")
    key_var = found.get("key-env") or _default_key_var(name, api)
    if not _VAR.fullmatch(key_var):
        raise UpstreamError(f"{flag}: key-env={key_var!r} is not an environment variable's name")
    return Upstream(
        name=name,
        api=api,
        base_url=url,
        api_key=environ.get(key_var) or None,
        ca_file=found.get("ca-file") or None,
        source=f"{flag} (key from ${key_var})",
        key_var=key_var,
    )


def from_environment(environ: Mapping[str, str], taken: set[str]) -> list[Upstream]:
    """An upstream named ``openai`` (``anthropic``) when ``OPENAI_API_KEY`` or ``OPENAI_BASE_URL``
    (the Anthropic pair) is set and no flag named it already."""
    found = []
    for api, (base_var, key_var, default) in USUAL_ENV.items():
        if api in taken or not (environ.get(base_var) or environ.get(key_var)):
            continue
        found.append(
            Upstream(
                name=api,
                api=api,
                base_url=environ.get(base_var) or default,
                api_key=environ.get(key_var) or None,
                source=f"${base_var} / ${key_var}",
                key_var=key_var,
            )
        )
    return found


def configure(
    flags: Sequence[str], environ: Mapping[str, str], *, use_environment: bool = True
) -> tuple[Upstream, ...]:
    """The run's upstreams: the flags', then the environment's (unless ``use_environment`` is off),
    checked as the gateway checks its configuration; UpstreamError says what is wrong."""
    upstreams = [parse_flag(text, environ) for text in flags]
    names = [u.name for u in upstreams]
    if len(set(names)) != len(names):
        raise UpstreamError("--llm-upstream: two upstreams have the same name")
    if use_environment:
        upstreams += from_environment(environ, set(names))
    if upstreams:
        check(upstreams)
    return tuple(upstreams)


def forget_keys(upstreams: Sequence[Upstream], environ: MutableMapping[str, str]) -> None:
    """Remove the variables the keys were read from (once they are in the upstreams), so that no
    process the harness starts (the evaluator, the sandbox's tools) inherits them."""
    for upstream in upstreams:
        if upstream.key_var is not None:
            environ.pop(upstream.key_var, None)


def check(upstreams: Sequence[Upstream]) -> None:
    """Refuse what the gateway would refuse (its own parser), naming where the upstream came from."""
    from ale.gateway.config import ConfigError, parse_config

    for upstream in upstreams:
        probe = config_bytes("check", "sk-ale-check-" + "0" * 32, [upstream], "closed", {})
        try:
            parse_config(probe)
        except ConfigError as exc:
            raise UpstreamError(f"{upstream.source}: {exc}") from None


def config_bytes(
    run_id: str, placeholder: str, upstreams: Sequence[Upstream], policy: str, budgets: Mapping[str, int | None]
) -> bytes:
    """The configuration the gateway reads from its descriptor (docs/gateway.md)."""
    return json.dumps(
        {
            "run_id": run_id,
            "placeholder_key": placeholder,
            "upstreams": [u.config() for u in upstreams],
            "policy": policy,
            "budgets": {name: budgets.get(name) for name in ("requests", "input_tokens", "output_tokens")},
        }
    ).encode()


def new_placeholder() -> str:
    """A per-run placeholder key (what the sandbox's OPENAI_API_KEY and ANTHROPIC_API_KEY hold)."""
    return f"sk-ale-placeholder-{secrets.token_hex(24)}"


def routes(upstreams: Sequence[Upstream]) -> dict[str, str]:
    """Each API kind's route name for the sandbox's ``*_BASE_URL``: the upstream named like the
    kind, else the first of that kind."""
    chosen: dict[str, str] = {}
    for upstream in sorted(upstreams, key=lambda u: u.name != u.api):
        chosen.setdefault(upstream.api, upstream.name)
    return chosen


@attrs.frozen
class GatewaySpec:
    run_id: str
    upstreams: tuple[Upstream, ...]
    budgets: Mapping[str, int | None]
    agent_socket: Path  # in a folder of the harness's own; the sandbox gets it bound in
    control_socket: Path  # in the run's private folder
    events_path: Path
    placeholder: str = attrs.field(factory=new_placeholder, repr=False)
    policy: str = "closed"  # until the first agent phase opens it


@attrs.define
class Gateway:
    """A running gateway."""

    spec: GatewaySpec
    process: lifeline.Child
    stderr_lines: deque[str] = attrs.Factory(lambda: deque(maxlen=40))
    policy: str = "closed"

    @property
    def agent_socket(self) -> Path:
        return self.spec.agent_socket

    @property
    def events_path(self) -> Path:
        return self.spec.events_path

    def alive(self) -> bool:
        return self.process.returncode is None

    def redact(self, text: str) -> str:
        """``text`` with every real key (and the placeholder) replaced."""
        for secret in (*(u.api_key for u in self.spec.upstreams if u.api_key), self.spec.placeholder):
            text = text.replace(secret, "[redacted]")
        return text

    def stderr_tail(self) -> str:
        status = "" if self.alive() else f"(exit status {self.process.returncode})\n"
        return status + self.redact("\n".join(self.stderr_lines))

    async def set_policy(self, policy: str, phase: str | None = None) -> None:
        """Open or close the gateway (``POST /policy``, naming the phase it is for); GatewayError
        when it does not answer 200. A close answers once every request in flight that it cut is
        recorded in the events file (docs/gateway.md), so nothing needs to wait for the log after."""
        body = json.dumps({"policy": policy, "phase": phase}).encode()
        try:
            with trio.fail_after(CONTROL_TIMEOUT_S):
                status, answer = await _request(self.spec.control_socket, "POST", "/policy", body)
        except (OSError, trio.TooSlowError, ValueError) as exc:
            raise GatewayError(
                f"the LLM gateway's control socket did not answer: {exc}\n{self.stderr_tail()}"
            ) from None
        if status != 200:
            raise GatewayError(f"the LLM gateway refused the policy {policy!r} ({status}): {self.redact(answer[:512])}")
        self.policy = policy


async def _request(path: Path, method: str, target: str, body: bytes) -> tuple[int, str]:
    """One HTTP/1.1 request on a Unix socket (the gateway's control socket), the connection closed after."""
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)
        raw = bytearray()
        while len(raw) < 1 << 20 and (chunk := await stream.receive_some(65536)):
            raw += chunk
    status_line, _, rest = bytes(raw).partition(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {bytes(status_line[:80])!r}")
    return int(parts[1]), rest.partition(b"\r\n\r\n")[2].decode("utf-8", "replace")


def _environment(upstreams: Sequence[Upstream]) -> dict[str, str]:
    """The harness's environment without any variable that holds a key (the gateway gets its keys
    from its configuration only)."""
    keys = {u.api_key for u in upstreams if u.api_key}
    named = {var for _base, var, _url in USUAL_ENV.values()}
    return {k: v for k, v in os.environ.items() if k not in named and v not in keys and not k.endswith("_API_KEY")}


def gateway_argv(spec: GatewaySpec, config_fd: int) -> list[str]:
    """The gateway's command line (docs/gateway.md, "The process"): paths and a descriptor, no secret."""
    return [
        sys.executable, "-m", "ale.gateway", "serve", "--agent-socket", str(spec.agent_socket),
        "--control-socket", str(spec.control_socket), "--config-fd", str(config_fd), "--events", str(spec.events_path),
    ]  # fmt: skip


@asynccontextmanager
async def open_gateway(spec: GatewaySpec) -> AsyncIterator[Gateway]:
    """Start the gateway; enter once it is ready; stop it (SIGTERM, then SIGKILL) on exit."""
    config = config_bytes(spec.run_id, spec.placeholder, spec.upstreams, spec.policy, spec.budgets)
    read_fd, write_fd = os.pipe()
    try:
        if len(config) > 60_000:  # a pipe holds 64 KiB: the gateway reads it after it starts
            raise GatewayError(f"the gateway's configuration is {len(config)} bytes; at most 60000 fit")
        os.write(write_fd, config)
    finally:
        os.close(write_fd)
    argv = gateway_argv(spec, read_fd)
    try:
        process = await lifeline.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(read_fd,),
            env=_environment(spec.upstreams),
        )
    except OSError as exc:
        raise GatewayError(f"cannot start the LLM gateway: {exc}") from None
    finally:
        os.close(read_fd)
    gateway = Gateway(spec, process, policy=spec.policy)
    async with _supervised(gateway) as ready:
        if not await supervise.until_ready(supervise.ChildProcess(process), ready, READY_TIMEOUT_S):
            await supervise.stop(supervise.ChildProcess(process))
            await trio.sleep(0.1)  # the last stderr lines
            raise GatewayError(f"the LLM gateway did not become ready:\n{gateway.stderr_tail()}")
        yield gateway


@asynccontextmanager
async def _supervised(gateway: Gateway) -> AsyncIterator[trio.Event]:
    """Read the gateway's output while it runs (its ready line sets the event); stop it after."""
    process = gateway.process
    assert process.stdout is not None
    assert process.stderr is not None
    ready = trio.Event()

    on_stdout = supervise.ready_sink(ready, "the gateway's stdout")

    def on_stderr(_s: str, line: bytes) -> None:
        gateway.stderr_lines.append(gateway.redact(line.decode(errors="replace")))

    try:
        with collapse():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(supervise.pump, process.stderr, supervise.LineSplitter("stderr", on_stderr))
                nursery.start_soon(
                    supervise.pump,
                    process.stdout,
                    supervise.LineSplitter("stdout", on_stdout),
                )
                try:
                    yield ready
                finally:
                    await supervise.stop(supervise.ChildProcess(process))
                    nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            await supervise.stop(supervise.ChildProcess(process))
