"""The gateway as a real process for tests: start it, talk to its sockets, read what it recorded.

with run_gateway(tmp_path, upstreams=[openai_upstream(up)]) as gw:
    gw.client()              # an httpx.Client on the agent socket (base http://gateway)
    gw.control("POST", "/policy", {"policy": "closed"})
    gw.events()              # the events file, parsed
    with gw.relay() as port: # a TCP relay on 127.0.0.1 to the agent socket (for the SDKs)
        ...
gw.stdout, gw.stderr, gw.returncode   # after the block (the gateway got SIGTERM)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PLACEHOLDER = "ale-placeholder-7f3c2a9e"
OPENAI_AUTH_HEADER = f"authorization: Bearer {PLACEHOLDER}\r\n".encode()


def openai_upstream(up: Any, name: str = "openai", key: str | None = None) -> dict[str, Any]:
    return {"name": name, "api": "openai", "base_url": up.openai_base, "api_key": key, "ca_file": up.ca_file}


def anthropic_upstream(up: Any, name: str = "anthropic", key: str | None = None) -> dict[str, Any]:
    return {"name": name, "api": "anthropic", "base_url": up.anthropic_base, "api_key": key, "ca_file": up.ca_file}


def config(upstreams: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    base = {
        "run_id": "run-test",
        "placeholder_key": PLACEHOLDER,
        "upstreams": upstreams,
        "policy": "open",
        "budgets": {"requests": None, "input_tokens": None, "output_tokens": None},
    }
    return {**base, **overrides}


@dataclass
class Gateway:
    folder: Path
    proc: subprocess.Popen[bytes]
    agent_socket: str
    control_socket: str
    events_path: Path
    ready: dict[str, Any]
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    _clients: list[httpx.Client] = field(default_factory=list)

    def client(self, **kwargs: Any) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=self.agent_socket)
        client = httpx.Client(transport=transport, base_url="http://gateway", timeout=30, **kwargs)
        self._clients.append(client)
        return client

    def control(self, method: str, path: str, body: Any = None) -> httpx.Response:
        transport = httpx.HTTPTransport(uds=self.control_socket)
        with httpx.Client(transport=transport, base_url="http://control", timeout=30) as client:
            return client.request(method, path, json=body)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The log's complete lines (the gateway may be writing the last one as it is read)."""
        text = self.events_path.read_text() if self.events_path.exists() else ""
        events = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]
        return [e for e in events if kind is None or e["kind"] == kind]

    def requests(self) -> list[dict[str, Any]]:
        return self.events("llm_request")

    def settled(self, quiet: float = 0.15) -> int:
        """The number of llm_request events once no new one has come for ``quiet`` seconds (a
        request of an earlier test is recorded just after its client saw the end of its answer)."""
        import time

        count, since = len(self.requests()), time.monotonic()
        while time.monotonic() - since < quiet:
            time.sleep(0.02)
            now = len(self.requests())
            if now != count:
                count, since = now, time.monotonic()
        return count

    def wait_requests(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The llm_request events once there are at least ``count``."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.requests()
            if len(found) >= count:
                return found
            time.sleep(0.01)
        raise AssertionError(f"expected {count} llm_request events, got {len(self.requests())}")

    @contextmanager
    def relay(self) -> Iterator[int]:
        """A TCP relay on 127.0.0.1 (a free port) to the agent socket, as the sandbox has."""
        with tcp_relay(self.agent_socket) as port:
            yield port

    def stop(self, timeout: float = 20) -> None:
        for client in self._clients:
            client.close()
        if self.returncode is None:
            self.proc.terminate()
            out, err = self.proc.communicate(timeout=timeout)
            self.stdout += out.decode()
            self.stderr += err.decode()
            self.returncode = self.proc.returncode


@contextmanager
def run_gateway(
    folder: Path, upstreams: list[dict[str, Any]] | None = None, *, raw_config: bytes | None = None,
    extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None, **overrides: Any,
) -> Iterator[Gateway]:  # fmt: skip
    """The gateway as a process (``env``: its environment, default this one's)."""
    folder.mkdir(parents=True, exist_ok=True)
    agent, control, events = folder / "gw.sock", folder / "control.sock", folder / "events.jsonl"
    raw = raw_config if raw_config is not None else json.dumps(config(upstreams or [], **overrides)).encode()
    read_end, write_end = os.pipe()
    os.write(write_end, raw)
    os.close(write_end)
    command = [
        sys.executable, "-m", "ale.gateway", "serve", "--agent-socket", str(agent), "--control-socket", str(control),
        "--config-fd", str(read_end), "--events", str(events), *extra_args,
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read_end,), env=env)
    os.close(read_end)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _out, err = proc.communicate(timeout=10)
        raise GatewayFailed(proc.returncode, err.decode())
    gateway = Gateway(folder, proc, str(agent), str(control), events, json.loads(line), stdout=line.decode())
    try:
        yield gateway
    finally:
        gateway.stop()


class GatewayFailed(Exception):
    def __init__(self, returncode: int | None, stderr: str) -> None:
        super().__init__(f"the gateway exited ({returncode}): {stderr}")
        self.returncode, self.stderr = returncode, stderr


@contextmanager
def tcp_relay(unix_path: str) -> Iterator[int]:
    """Splice each TCP connection on 127.0.0.1 to a new connection to ``unix_path``."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    stop = threading.Event()

    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (sink, source):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            source.close()  # each socket is the source of one pump

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(unix_path)
            except OSError:
                client.close()
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
        listener.close()
        thread.join(2)
