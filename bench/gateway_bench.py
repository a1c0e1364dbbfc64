#!/usr/bin/env python
"""LLM gateway benchmark: the same local upstream called directly and through the gateway, side by side.

1. Added latency per request: sequential non-streaming Chat Completions requests on one keep-alive
   connection, direct (TCP to the upstream) and through the gateway (its agent Unix socket), in
   alternating slices; p50 and p99 of each, and the difference.
2. Chunk forwarding: streams whose every text delta carries the upstream's ``perf_counter_ns`` at
   sending (CLOCK_MONOTONIC, one clock for every process on the machine); the time from sending to
   the client's receipt, direct and through the gateway: the gateway adds the difference.
3. 200 concurrent streams through the gateway and directly, ``--rounds`` times in turn: every
   stream's first delta must arrive before the upstream sent its last (no stream buffered whole),
   every stream must be complete, and every one must have its usage in the gateway's ``llm_request``
   events; the chunk delay of each side, its ratio to the direct path's (the machine is shared: the
   ratio is what says something under load), and the gateway's CPU time per chunk (from /proc).

``--baseline DIR`` runs a second gateway from another checkout of the project (``git worktree add
/tmp/gw-base main``) beside this one, in the same rounds, so a change is measured before and after
under the same load. The upstream is tests/llm_upstream.py (a threaded stdlib server) in a process
of its own, each gateway a real ``python -m ale.gateway serve`` process, the client a minimal raw
HTTP/1.1 client in this process (the same code every way): no two share a GIL. Run
``python bench/gateway_bench.py`` (about a minute) or ``--quick``; the table goes to stdout, every
figure to ``--out`` (default bench/results/gateway.json). Goals: at most 1 ms added at p50, chunks
forwarded within 1 ms (also with 200 streams at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from gateway_process import PLACEHOLDER, run_gateway  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "gateway.json"
BODY = json.dumps({"model": "text", "messages": [{"role": "user", "content": "ping " * 40}]}).encode()


# -- a minimal HTTP/1.1 client (blocking; the same code for both paths) ---------------------------------


class Client:
    def __init__(self, sock: socket.socket, prefix: str) -> None:
        self.sock, self.prefix, self.buffer, self.sent = sock, prefix, b"", 0

    @classmethod
    def tcp(cls, port: int, prefix: str) -> Client:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, prefix)

    @classmethod
    def unix(cls, path: str, prefix: str) -> Client:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        return cls(sock, prefix)

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def _read(self, size: int) -> bytes:
        while len(self.buffer) < size:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.buffer += data
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out

    def post(self, path: str, body: bytes) -> tuple[int, bytes, list[tuple[int, int]]]:
        """(status, body, [(stamp sent, ns received)] of the stamped stream deltas)."""
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {PLACEHOLDER}\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)
        self.sent += 1
        lines = self._read_until(b"\r\n\r\n").split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        if b"content-length" in headers:
            return status, self._read(int(headers[b"content-length"])), []
        parts, stamps = [], []
        while True:
            size = int(self._read_until(b"\r\n"), 16)
            chunk = self._read(size + 2)[:-2]
            if not size:
                return status, b"".join(parts), stamps
            now = time.perf_counter_ns()
            parts.append(chunk)
            stamps.extend((int(s), now) for s in _stamps(chunk))

    def close(self) -> None:
        self.sock.close()


def _stamps(chunk: bytes) -> list[bytes]:
    out = []
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {") and b'"content": "' in line:
            value = line.split(b'"content": "', 1)[1].split(b'"', 1)[0]
            if value.isdigit():
                out.append(value)
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": _pct(values, 0.5), "p90": _pct(values, 0.9), "p99": _pct(values, 0.99), "n": len(values)}


# -- 1. added latency per request --------------------------------------------------------------------


def latency(clients: dict[str, Client], pids: dict[str, int], requests: int, slices: int) -> dict[str, Any]:
    """Per side: the request times, and a gateway's CPU time per request over its own slices."""
    times: dict[str, list[float]] = {name: [] for name in clients}
    cpu = dict.fromkeys(pids, 0.0)
    for client in clients.values():  # warm up every connection
        for _ in range(50):
            client.post("/chat/completions", BODY)
    per = max(1, requests // slices)
    names = list(clients)
    for index in range(slices * len(names)):
        name = names[(index + index // len(names)) % len(names)]
        before = cpu_seconds(pids[name]) if name in pids else 0.0
        for _ in range(per):
            start = time.perf_counter_ns()
            status, _, _ = clients[name].post("/chat/completions", BODY)
            times[name].append((time.perf_counter_ns() - start) / 1e6)
            assert status == 200, status
        if name in pids:
            cpu[name] += cpu_seconds(pids[name]) - before
    out = _compared({name: _summary(values) for name, values in times.items()})
    for name, seconds in cpu.items():
        out[name]["cpu_us_per_request"] = seconds / (per * slices) * 1e6
    return out


def _compared(out: dict[str, Any]) -> dict[str, Any]:
    """Each gateway side's figures less the direct path's (``added_ms``; ``baseline_added_ms``)."""
    for name in [n for n in out if n != "direct"]:
        key = "added_ms" if name == "gateway" else f"{name}_added_ms"
        out[key] = {q: out[name][q] - out["direct"][q] for q in ("p50", "p90", "p99")}
    return out


# -- 2. chunk forwarding ----------------------------------------------------------------------------------


def forwarding(clients: dict[str, Client], streams: int, chunks: int) -> dict[str, Any]:
    delays: dict[str, list[float]] = {name: [] for name in clients}
    body = json.dumps({"model": "forward", "messages": [], "stream": True}).encode()
    names = list(clients)
    for index in range(streams * len(names)):
        name = names[index % len(names)]
        status, _, stamps = clients[name].post("/chat/completions", body)
        assert status == 200, status
        assert len(stamps) == chunks, len(stamps)
        delays[name].extend((received - sent) / 1e6 for sent, received in stamps)
    return _compared({name: _summary(values) for name, values in delays.items()})


# -- 3. concurrent streams ----------------------------------------------------------------------------------


async def _one_stream(connect: Any, prefix: str, body: bytes) -> dict[str, Any]:
    reader, writer = await connect()
    head = (
        f"POST {prefix}/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {PLACEHOLDER}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    writer.write(head + body)
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    stamps: list[tuple[int, int]] = []
    done = False
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        chunk = (await reader.readexactly(size + 2))[:-2]
        if not size:
            break
        now = time.perf_counter_ns()
        stamps.extend((int(s), now) for s in _stamps(chunk))
        done = done or b"[DONE]" in chunk
    writer.close()
    return {"stamps": stamps, "done": done}


async def _concurrent(connect: Any, prefix: str, count: int) -> list[dict[str, Any]]:
    body = json.dumps({"model": "concurrent", "messages": [], "stream": True}).encode()
    return await asyncio.gather(*(_one_stream(connect, prefix, body) for _ in range(count)))


def concurrent(connect: Any, prefix: str, count: int, chunks: int) -> dict[str, Any]:
    start = time.perf_counter()
    results = asyncio.run(_concurrent(connect, prefix, count))
    elapsed = time.perf_counter() - start
    return {
        "delays": [(r - s) / 1e6 for result in results for s, r in result["stamps"]],
        "complete": sum(1 for r in results if r["done"] and len(r["stamps"]) == chunks),
        "incremental": sum(1 for r in results if r["stamps"] and r["stamps"][0][1] < r["stamps"][-1][0]),
        "seconds": elapsed,
    }


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rounds_of_streams(sides: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """``args.rounds`` rounds of ``args.concurrent`` streams on each side in turn (the order rotated
    each round); per side the pooled chunk delays, the worst round's completeness, and a gateway's
    CPU time per chunk over its own rounds."""
    names = list(sides)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            side = sides[name]
            before = cpu_seconds(side["pid"]) if side["pid"] else 0.0
            runs[name].append(concurrent(side["connect"], side["prefix"], args.concurrent, args.chunks))
            cpu[name] += cpu_seconds(side["pid"]) - before if side["pid"] else 0.0
    out: dict[str, Any] = {}
    for name in names:
        delays = [d for run in runs[name] for d in run["delays"]]
        out[name] = {
            "streams": args.concurrent, "rounds": args.rounds,
            "complete": min(run["complete"] for run in runs[name]),
            "incremental": min(run["incremental"] for run in runs[name]),
            "seconds": max(run["seconds"] for run in runs[name]),
            "chunk_delay_ms": _summary(delays),
            "round_p50_ms": [_summary(run["delays"])["p50"] for run in runs[name]],
        }  # fmt: skip
        if sides[name]["pid"]:
            out[name]["cpu_us_per_chunk"] = cpu[name] / (args.rounds * args.concurrent * args.chunks) * 1e6
    return out


def _gateway_env(checkout: Path | None) -> dict[str, str] | None:
    """The environment of a gateway run from another checkout (None: this one's). PYTHONSAFEPATH keeps
    the current folder (this checkout, when the bench runs from it) off the front of its path."""
    if checkout is None:
        return None
    return {**os.environ, "PYTHONPATH": str(checkout), "PYTHONSAFEPATH": "1"}


def _usage_recorded(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e["usage_source"] == "upstream" and e["usage"]["output_tokens"] > 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000, help="sequential requests per side (latency)")
    parser.add_argument("--slices", type=int, default=10, help="alternating slices per side")
    parser.add_argument("--streams", type=int, default=40, help="streams per side (forwarding)")
    parser.add_argument("--chunks", type=int, default=25, help="stamped deltas per stream")
    parser.add_argument("--concurrent", type=int, default=200, help="concurrent streams")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of concurrent streams per side")
    parser.add_argument("--baseline", type=Path, help="another checkout whose gateway runs beside this one")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.slices, args.streams, args.chunks, args.concurrent, args.rounds = 300, 2, 4, 10, 50, 1
    if args.baseline is not None and not (args.baseline / "ale" / "gateway" / "__main__.py").is_file():
        parser.error(f"--baseline {args.baseline}: not a checkout of this project (no ale/gateway/__main__.py)")
    load_before = os.getloadavg()
    turns = {
        "text": {"text": "pong " * 20},
        "forward": {"stamp": args.chunks, "chunk_delay": 0.004},
        "concurrent": {"stamp": args.chunks, "chunk_delay": 0.02},
    }
    command = [sys.executable, str(ROOT / "tests" / "llm_upstream.py"), "--by-model", json.dumps(turns)]
    upstream = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert upstream.stdout is not None
        url = upstream.stdout.readline().strip()
        port = int(url.rsplit(":", 1)[1])
        config = {"name": "up", "api": "openai", "base_url": f"{url}/v1", "api_key": None, "ca_file": None}
        with tempfile.TemporaryDirectory(prefix="gwb-") as folder, ExitStack() as stack:
            checkouts = {"gateway": None} if args.baseline is None else {"baseline": args.baseline, "gateway": None}
            gateways = {
                name: stack.enter_context(run_gateway(Path(folder) / name, [config], env=_gateway_env(checkout)))
                for name, checkout in checkouts.items()
            }
            clients = {"direct": Client.tcp(port, "/v1")}
            clients |= {name: Client.unix(gw.agent_socket, "/up") for name, gw in gateways.items()}
            print("latency ...", file=sys.stderr)
            lat = latency(clients, {name: gw.proc.pid for name, gw in gateways.items()}, args.requests, args.slices)
            print("chunk forwarding ...", file=sys.stderr)
            fwd = forwarding(clients, args.streams, args.chunks)
            for client in clients.values():
                client.close()
            markers = {name: len(gw.wait_requests(clients[name].sent)) for name, gw in gateways.items()}
            print(f"{args.rounds} x {args.concurrent} concurrent streams per side ...", file=sys.stderr)
            sides: dict[str, dict[str, Any]] = {
                "direct": {"connect": lambda: asyncio.open_connection("127.0.0.1", port, limit=1 << 20),
                           "prefix": "/v1", "pid": None},
            }  # fmt: skip
            for name, gw in gateways.items():
                sides[name] = {
                    "connect": lambda path=gw.agent_socket: asyncio.open_unix_connection(path, limit=1 << 20),
                    "prefix": "/up",
                    "pid": gw.proc.pid,
                }
            many = rounds_of_streams(sides, args)
            for name, gw in gateways.items():
                expected = markers[name] + args.rounds * args.concurrent
                many[name]["usage_recorded"] = _usage_recorded(gw.wait_requests(expected, timeout=60)[markers[name] :])
    finally:
        upstream.kill()
        upstream.wait()
    via = many["gateway"]
    ratio = via["chunk_delay_ms"]["p50"] / max(many["direct"]["chunk_delay_ms"]["p50"], 1e-9)
    streams_total = args.rounds * args.concurrent
    results = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_before": load_before,
                    "load_after": os.getloadavg()},
        "latency_ms": lat, "chunk_forwarding_ms": fwd, "concurrent": many,
        "concurrent_p50_ratio_to_direct": ratio,
        "goals": {
            "added_p50_ms<=1": lat["added_ms"]["p50"] <= 1.0,
            "chunk_added_p50_ms<=1": fwd["added_ms"]["p50"] <= 1.0,
            "concurrent_chunk_added_p50_ms<=1":
                via["chunk_delay_ms"]["p50"] - many["direct"]["chunk_delay_ms"]["p50"] <= 1.0,
            "concurrent_all_complete": via["complete"] == args.concurrent,
            "concurrent_none_buffered_whole": via["incremental"] == args.concurrent,
            "concurrent_usage_recorded": via["usage_recorded"] == streams_total,
        },
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    _print(results, args)
    return 0


def _print(r: dict[str, Any], args: argparse.Namespace) -> None:
    lat, fwd, many = r["latency_ms"], r["chunk_forwarding_ms"], r["concurrent"]
    sides = [name for name in ("baseline", "gateway") if name in many]
    machine = r["machine"]
    print(f"load average {machine['load_before'][0]:.2f} before, {machine['load_after'][0]:.2f} after, "
          f"on {machine['cpus']} CPUs")  # fmt: skip
    head = "".join(f"{name:>10}{'added':>9}{'ratio':>8}" for name in sides)
    print(f"{'measure':<38}{'direct':>10}{head}")
    rows = [("request latency", lat), ("chunk send -> receipt", fwd)]
    rows += [(f"{args.concurrent} streams: chunk delay", {n: many[n]["chunk_delay_ms"] for n in many})]
    for title, block in rows:
        for q in ("p50", "p99"):
            d = block["direct"][q]
            cells = "".join(f"{block[n][q]:>10.3f}{block[n][q] - d:>9.3f}{block[n][q] / d:>8.2f}" for n in sides)
            print(f"{title + ' ' + q + ' (ms)':<38}{d:>10.3f}{cells}")
    cpu = "".join(f"{lat[n]['cpu_us_per_request']:>27.1f}" for n in sides)
    print(f"{'gateway CPU per request (us)':<38}{'':>10}{cpu}")
    cpu = "".join(f"{many[n]['cpu_us_per_chunk']:>27.1f}" for n in sides)
    print(f"{'gateway CPU per chunk, requests incl. (us)':<38}{'':>10}{cpu}")
    for name in ["direct", *sides]:
        side = many[name]
        rounds = ", ".join(f"{p:.3f}" for p in side["round_p50_ms"])
        recorded = f", {side['usage_recorded']} with usage recorded" if "usage_recorded" in side else ""
        print(f"{args.concurrent} streams x {args.rounds} via {name}: at worst {side['complete']} complete, "
              f"{side['incremental']} delivered incrementally{recorded}; p50 per round {rounds} ms")  # fmt: skip
    for goal, met in r["goals"].items():
        print(f"goal {goal}: {'met' if met else 'NOT MET'}")


if __name__ == "__main__":
    sys.exit(main())
