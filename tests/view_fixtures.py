"""Bundles for the viewer's tests and bench (tests/test_view*.py, bench/view_bench.py).

One real run (``ale run cartpole-balance --episodes 5``, with a new local key) is the base; a
:class:`Grower` re-chains its trajectory with more events inserted in the agent's phase (after the
agent's last own event, before ``agent_finished``): the agent's output and event-channel kinds,
the evaluator's RPCs, hostile payloads. Each producer's clock stays monotonic, the manifest's
trajectory summary and ``integrity.json`` are recomputed and the files are re-packed to the run's
own key, so the result passes every offline check, as a bundle the harness wrote would.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from ale.core import bundle
from ale.core.canonical import canonical_json
from ale.core.merkle import files_root
from ale.core.trajectory import ChainBuilder, iter_events, verify_chain
from ale.runner.inspect import read_identity

#: (producer, kind, data) of an event to insert.
Extra = tuple[str, str, dict[str, Any]]


@attrs.frozen
class RealRun:
    bundle: Path
    key: Path

    @property
    def identity(self) -> str:
        return read_identity(self.key)

    @property
    def recipient(self) -> str:
        for line in self.key.read_text().splitlines():
            if line.startswith("# public key: "):
                return line.removeprefix("# public key: ").strip()
        raise AssertionError(f"{self.key} names no public key")

    def files(self) -> dict[str, bytes]:
        return bundle.unpack(self.bundle.read_bytes(), self.identity)


def real_run(folder: Path, *extra_args: str) -> RealRun:
    """``ale run cartpole-balance`` with the demo agent (5 official episodes) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")}
    cmd = [sys.executable, "-m", "ale.runner.cli", "run", "cartpole-balance", "--plain", "--episodes", "5",
           "--agent-time", "60", "--out", str(folder), *extra_args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    path = path if path.is_absolute() else folder / path
    return RealRun(path, path.with_suffix(".key"))


def _epoch(wall_time: str) -> float:
    moment = dt.datetime.strptime(wall_time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    micros = (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return micros / 1_000_000


def _file(document: Any) -> bytes:
    return canonical_json(document) + b"\n"


class Grower:
    """A real run's files, re-chained with extra events in its agent phase."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        raw = bundle.decompress(files["events.jsonl.zst"], bundle.Limits(max_decompressed=256 << 20))
        self.events = [event for _, event in iter_events(raw)]
        finished = next(i for i, e in enumerate(self.events) if e["kind"] == "agent_finished")
        agent = [i for i, e in enumerate(self.events[:finished]) if e["producer"] == "untrusted_agent"]
        self.insert_at = agent[-1] + 1 if agent else finished
        self.from_wall = _epoch(self.events[self.insert_at - 1]["wall_time"])
        self.to_wall = _epoch(self.events[finished]["wall_time"])
        self.clock: dict[str, float] = {}
        for e in self.events[: self.insert_at]:
            self.clock[e["producer"]] = float(e["monotonic"])

    def stream(self, extra: Sequence[Extra]) -> tuple[bytes, str, int]:
        """The trajectory with ``extra`` inserted; its bytes, chain head and event count."""
        chain = ChainBuilder()
        out = bytearray()
        for e in self.events[: self.insert_at]:
            out += chain.append(e["producer"], e["kind"], e["data"], wall_time=_epoch(e["wall_time"]),
                                monotonic=e["monotonic"])[1]  # fmt: skip
        clock = dict(self.clock)
        step = (self.to_wall - self.from_wall) / (len(extra) + 1)
        for n, (producer, kind, data) in enumerate(extra, start=1):
            # The agent's own clock runs on (no agent event follows); another producer's stays put,
            # so that its next real event still comes later.
            mono = clock.get(producer, 0.0) + (1e-6 if producer == "untrusted_agent" else 0.0)
            clock[producer] = mono
            out += chain.append(producer, kind, data, wall_time=self.from_wall + n * step, monotonic=mono)[1]
        for e in self.events[self.insert_at :]:
            out += chain.append(e["producer"], e["kind"], e["data"], wall_time=_epoch(e["wall_time"]),
                                monotonic=e["monotonic"])[1]  # fmt: skip
        return bytes(out), chain.head, chain.seq

    def build(self, extra: Sequence[Extra], *, level: int = 3) -> dict[str, bytes]:
        """The bundle's files with ``extra`` inserted, every digest recomputed."""
        import zstandard

        stream, head, count = self.stream(extra)
        files = dict(self.files)
        files["events.jsonl.zst"] = zstandard.ZstdCompressor(level=level, write_checksum=True).compress(stream)
        manifest = json.loads(files["manifest.json"])
        manifest["trajectory"]["events"] = count
        manifest["trajectory"]["chain_head"] = head
        chain = verify_chain(stream)
        if chain.gateways:  # the extra events hold a gateway: the summary and phases say so, as a run's would
            from ale.core.network import REQUEST_FIELDS, USAGE_FIELDS
            from ale.runner.network import GATEWAY_PHASES, proxy_description

            summary = json.loads(files["network_summary.json"])
            summary.update(
                proxy=proxy_description(chain.gateways[0] or []),
                phases=dict(GATEWAY_PHASES),
                requests={name: chain.network[name] for name in REQUEST_FIELDS},
                usage={name: chain.network[name] for name in USAGE_FIELDS},
            )
            files["network_summary.json"] = _file(summary)
            for task in manifest["tasks"]:
                task["network"] = dict(GATEWAY_PHASES)
        files["manifest.json"] = _file(manifest)
        integrity = json.loads(files["integrity.json"])
        digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items() if name != "integrity.json"}
        integrity.update(files=digests, merkle_root=files_root(digests), chain_head=head)
        files["integrity.json"] = _file(integrity)
        return files


def write_bundle(run: RealRun, files: dict[str, bytes], path: Path) -> Path:
    path.write_bytes(bundle.pack(files, [run.recipient]))
    return path


# -- what to insert -----------------------------------------------------------------------------

TASK = "cartpole-balance@1.0.0"


def ordinary(n: int, *, seed_text: str = "step") -> list[Extra]:
    """``n`` events in turn: stdout, stderr, a shell command, a message, a tool call and its result,
    a note, an evaluator RPC (each tenth a stdout line of 40 lines' worth, for collapsing)."""
    out: list[Extra] = []
    kinds = ("stdout", "stdout", "stderr", "shell_command", "message", "tool_call", "tool_result", "note", "rpc")
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "stdout":
            out.append(("untrusted_agent", "stdout", {"text": f"{seed_text} {i}: loss {1 / (i + 1):.5f}"}))
        elif kind == "stderr":
            out.append(("untrusted_agent", "stderr", {"text": f"warning {i}: slow step"}))
        elif kind == "shell_command":
            out.append(
                ("untrusted_agent", "shell_command", {"command": f"python train.py --seed {i}", "exit_status": 0})
            )
        elif kind == "message":
            out.append(
                ("untrusted_agent", "message", {"role": "assistant", "text": f"plan {i}:\n" + "try again\n" * 30})
            )
        elif kind == "tool_call":
            out.append(("untrusted_agent", "tool_call", {"tool": "shell", "input": f"ls -la /workspace/{i}"}))
        elif kind == "tool_result":
            out.append(("untrusted_agent", "tool_result", {"tool": "shell", "output": f"total {i}\n" + "x\n" * 20}))
        elif kind == "note":
            out.append(("untrusted_agent", "note", {"text": f"note {i}"}))
        else:
            data = {"task": TASK, "evaluator_seq": 10_000 + i, "endpoint": "agent", "method": "Step", "code": "OK",
                    "duration_ms": 0.25, "env_id": f"env-{i % 4}"}  # fmt: skip
            out.append(("trusted_evaluator", "rpc", data))
    return out


#: Declared by the base run of the tests (``ale run --model --effort``): shown by the page's template.
HOSTILE_MODEL = "<script>window.__ale_pwned = 11</script>"
HOSTILE_EFFORT = "</title><img src=x onerror=alert(12)>\u202e\x1b"

#: Each sets ``window.__ale_pwned`` (or opens a dialog) if it ever runs as code.
HOSTILE_STRINGS: tuple[str, ...] = (
    "<script>window.__ale_pwned = 1; alert(1)</script>",
    "</script><script>window.__ale_pwned = 2; alert(2)</script>",
    '"><img src=x onerror="window.__ale_pwned = 3; alert(3)">',
    "javascript:window.__ale_pwned = 4; alert(4)",
    "<!-- <script>window.__ale_pwned = 5</script> -->",
    "<svg onload=\"window.__ale_pwned = 6\"></svg><iframe srcdoc='<script>parent.__ale_pwned=7</script>'></iframe>",
    "]]></script><style>body{display:none}</style>{{7*7}}${7*7}",
    "\u2028\u2029 \x00\x01\x07\x08\x0b\x0c\x1b[31mred\x1b[0m\x7f\x85 \u202egnp.exe\u202c \ufeff",
    '<a href="javascript:window.__ale_pwned=8">click me</a>',
)


def _nested(depth: int) -> Any:
    value: Any = "<script>window.__ale_pwned = 9</script>"
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


def hostile() -> list[Extra]:
    """Every hostile string as agent output, in every event-channel kind, plus a line of 64 KiB and
    data nested as deep as a line allows (62 levels below ``data``)."""
    out: list[Extra] = []
    for s in HOSTILE_STRINGS:
        out.append(("untrusted_agent", "stdout", {"text": s}))
        out.append(("untrusted_agent", "stderr", {"text": s}))
        out.append(("untrusted_agent", "message", {"role": s, "text": s}))
        out.append(("untrusted_agent", "tool_call", {"tool": s, "input": s}))
        out.append(("untrusted_agent", "tool_result", {"tool": s, "output": s}))
        out.append(("untrusted_agent", "shell_command", {"command": s, "exit_status": s}))
        out.append(("untrusted_agent", "note", {"text": s, s: s}))
        out.append(("untrusted_agent", "api_usage", {"model": s, "input_tokens": s, "output_tokens": 1}))
    out.append(("untrusted_agent", "stdout", {"text": "A" * (64 * 1024 - 64) + "<script>window.__ale_pwned=10"}))
    out.append(("untrusted_agent", "note", {"deep": _nested(61)}))
    return out


def gateway_events(n: int, *, model: str = "gpt-test") -> list[Extra]:
    """``n`` synthetic ``llm_request`` events as docs/gateway.md records them (each fifth denied)."""
    out: list[Extra] = []
    for i in range(n):
        denied = i % 5 == 4
        data = {
            "request_id": f"gw-{i + 1}", "method": "POST", "upstream": "openai", "host": "api.openai.com",
            "path": "/v1/chat/completions", "status": 403 if denied else 200,
            "decision": "denied" if denied else "allowed", "reason": "policy_closed" if denied else None,
            "model": model if i % 3 else "claude-test", "stream": bool(i % 2), "bytes_in": 100 + i,
            "bytes_out": 0 if denied else 2000 + i, "duration_ms": 12.5 + i, "ttfb_ms": None if denied else 3.25,
            "usage": {"input_tokens": 0 if denied else 100 + i, "output_tokens": 0 if denied else 10 + i,
                      "cached_input_tokens": 0 if denied else i},
            "usage_source": "upstream", "messages": [{"role": "user", "content": f"question {i}"}],
            "messages_from": 0, "continues": None,
            "response": None if denied else {"text": f"answer {i}", "tool_calls": [], "stop": "stop"},
        }  # fmt: skip
        out.append(("trusted_network_proxy", "llm_request", data))
    return out


def chained(events: Iterable[Extra]) -> list[dict[str, Any]]:
    """``events`` as a trajectory's parsed events (a chain of their own, one producer clock each)."""
    chain = ChainBuilder()
    clock: dict[str, float] = {}
    out = []
    for n, (producer, kind, data) in enumerate(events):
        clock[producer] = clock.get(producer, 0.0) + 0.5
        out.append(
            chain.append(producer, kind, data, wall_time=1_764_476_918.0 + n * 0.25, monotonic=clock[producer])[0]
        )
    return out


# -- ale view --serve ---------------------------------------------------------------------------


class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc, self.url = proc, url

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").rsplit(":", 1)[1])


def start_serving(*args: str) -> Served:
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ale.runner.cli", "view", *args, "--serve"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line.startswith("http://"):
            return Served(proc, line)
    proc.kill()
    raise AssertionError(f"ale view --serve printed no URL: {proc.communicate()[1]}")
