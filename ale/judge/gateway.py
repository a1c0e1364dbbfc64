"""The judge's own gateway: ``python -m ale.gateway serve`` (docs/gateway.md) for one task's judging.

The judge's requests go through a gateway of their own, not the agent's: its budget is the
judge's (:func:`budgets`), its policy open, its one upstream (named ``judge``) the judge's endpoint
with the real key, which the harness hands over on a pipe and never puts in argv, the environment
or an event. The judge's client holds only the per-task placeholder. After the exchange the gateway
is stopped (SIGTERM: it records ``gateway_stopped``) and its event log read back, line by line
through the bounded parser, so the harness can relay it into the trajectory
(:func:`relayed`). Blocking: the harness runs a session in a worker thread and calls :meth:`kill`
from the event loop if the run is cancelled.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ale.core.parse import ParseError, parse_json
from ale.core.verdict import MAX_OUTPUT_TOKENS, clip

UPSTREAM = "judge"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
MAX_EVENT_LINE = 1 << 20  # the gateway's lines are at most 256 KiB (docs/gateway.md)
REQUEST_PREFIX = "judge-"  # the judge gateway's request ids, as the trajectory records them


class GatewayError(RuntimeError):
    """The judge's gateway did not start (the message is the gateway's own, which never holds a key)."""


def budgets(input_bytes: int, attempts: int) -> dict[str, int]:
    """The judge's budget for one task: its attempts, no more input tokens than the request has
    bytes (a token is at least a byte) per attempt, and its output limit per attempt."""
    return {
        "requests": attempts,
        "input_tokens": attempts * (input_bytes + 16 * 1024),
        "output_tokens": attempts * MAX_OUTPUT_TOKENS,
    }


class JudgeGateway:
    """One gateway process in ``folder`` (private to the harness)."""

    def __init__(
        self, folder: Path, run_id: str, base_url: str, api_key: str | None, limits: dict[str, int], name: str = "judge"
    ) -> None:
        self.folder = folder
        self.agent_socket = str(folder / "judge-gw.sock")  # short (a socket path has 107 bytes); one at a time
        self.control_socket = str(folder / "judge-gw-control.sock")
        self.events_path = folder / f"{name}-gw.jsonl"  # one log per gateway: each task's is its own
        self.placeholder = "ale-judge-" + secrets.token_urlsafe(24)
        upstream = {"name": UPSTREAM, "api": "openai", "base_url": base_url, "api_key": api_key, "ca_file": None}
        self._config = {
            "run_id": run_id,
            "placeholder_key": self.placeholder,
            "upstreams": [upstream],
            "policy": "open",
            "budgets": limits,
        }
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._killed = False

    def start(self, timeout: float = START_TIMEOUT_S) -> str:
        """Start the gateway and wait for its ready line; the agent socket's path."""
        self.events_path.unlink(missing_ok=True)  # a log of an earlier gateway here is not this one's
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, json.dumps(self._config).encode())
        finally:
            os.close(write_end)
        argv = [sys.executable, "-m", "ale.gateway", "serve", "--agent-socket", self.agent_socket,
                "--control-socket", self.control_socket, "--config-fd", str(read_end), "--events",
                str(self.events_path)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
        try:
            with self._lock:
                if self._killed:
                    raise GatewayError("the run was stopped")
                self._proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=(read_end,), env=env, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            raise GatewayError(f"cannot start the gateway: {exc.strerror}") from None
        finally:
            os.close(read_end)
        self._wait_ready(timeout)
        return self.agent_socket

    def _wait_ready(self, timeout: float) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.kill()
                    raise GatewayError(f"the gateway was not ready within {timeout:g} s")
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    proc.wait(STOP_TIMEOUT_S)
                    stderr = proc.stderr.read(4096).decode("utf-8", "replace") if proc.stderr else ""
                    raise GatewayError(clip(stderr.strip() or f"the gateway exited with {proc.returncode}", 500))
                line += chunk
        try:
            ready = parse_json(line.strip(), what="the gateway's ready line")
        except ParseError as exc:
            self.kill()
            raise GatewayError(str(exc)) from None
        if not isinstance(ready, dict) or ready.get("event") != "ready":
            self.kill()
            raise GatewayError("the gateway's first line is not its ready line")

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL after STOP_TIMEOUT_S)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """Stop at once (safe from another thread, and more than once)."""
        with self._lock:
            self._killed = True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        proc = self._proc
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def events(self) -> list[dict[str, Any] | str]:
        """The event log's lines: each a parsed object, or why it could not be read."""
        try:
            raw = self.events_path.read_bytes()
        except FileNotFoundError:
            return []
        out: list[dict[str, Any] | str] = []
        for line in raw.splitlines():
            try:
                value = parse_json(line, what="a judge gateway event", max_bytes=MAX_EVENT_LINE)
            except ParseError as exc:
                out.append(clip(str(exc), 512))
                continue
            out.append(value if isinstance(value, dict) else "not a JSON object")
        return out


def relayed(line: dict[str, Any], task: str) -> tuple[str, dict[str, Any], float, float] | str:
    """(kind, data, wall time, monotonic) of a gateway line as the trajectory records it: the line
    without kind and times, its ``seq`` as ``gateway_seq``, the request id prefixed
    :data:`REQUEST_PREFIX`, ``"gateway": "judge"`` and the task added; or why it cannot be."""
    event = dict(line)
    kind, wall, mono = event.pop("kind", None), event.pop("wall_time", None), event.pop("monotonic", None)
    if type(kind) is not str:
        return "no kind"
    if type(wall) not in (int, float) or type(mono) not in (int, float) or not math.isfinite(mono):
        return "wall_time and monotonic must be numbers (seconds)"
    if not 0 <= wall < 253_402_300_800:
        return "wall_time out of range"
    event["gateway_seq"] = event.pop("seq", None)
    if type(event.get("request_id")) is str:
        event["request_id"] = REQUEST_PREFIX + event["request_id"]
    return kind, {"task": task, "gateway": UPSTREAM, **event}, float(wall), float(mono)
