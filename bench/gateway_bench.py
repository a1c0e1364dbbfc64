#!/usr/bin/env python
"""LLM gateway benchmark: the same local upstream called directly and through the gateway, side by side.

1. Added latency per request: sequential non-streaming Chat Completions requests on one keep-alive
   connection, direct (TCP to the upstream) and through the gateway (its agent Unix socket), in
   alternating slices; p50 and p99 of each, and the difference.
2. Chunk forwarding: streams whose every text delta carries the upstream's ``perf_counter_ns`` at
   sending (CLOCK_MONOTONIC, one clock for every process on the machine); the time from sending to
   the client's receipt, direct and through the gateway: the gateway adds the difference.
3. 200 concurrent streams through the gateway (and, for reference, directly): every stream's first
   delta must arrive before the upstream sent its last (no stream buffered whole), every stream must
   be complete, and every one must have its usage in the gateway's ``llm_request`` events.

The upstream is tests/llm_upstream.py (a threaded stdlib server) in a process of its own, the gateway
a real ``python -m ale.gateway serve`` process, the client a minimal raw HTTP/1.1 client in this
process (the same code both ways): three processes, no two sharing a GIL. Run
``python bench/gateway_bench.py`` (about a minute) or ``--quick``; the table goes to stdout, every
figure to ``--out`` (default bench/results/gateway.json). Goals: at most 1 ms added at p50, chunks
forwarded within 1 ms.
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


def latency(direct: Client, gateway: Client, requests: int, slices: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    for client in (direct, gateway):  # warm up both connections
        for _ in range(50):
            client.post("/chat/completions", BODY)
    per = max(1, requests // slices)
    for index in range(slices * 2):
        name, client = (("direct", direct), ("gateway", gateway))[(index + index // 2) % 2]
        for _ in range(per):
            start = time.perf_counter_ns()
            status, _, _ = client.post("/chat/completions", BODY)
            times[name].append((time.perf_counter_ns() - start) / 1e6)
            assert status == 200, status
    out = {name: _summary(values) for name, values in times.items()}
    out["added_ms"] = {q: out["gateway"][q] - out["direct"][q] for q in ("p50", "p90", "p99")}
    return out


# -- 2. chunk forwarding ----------------------------------------------------------------------------------


def forwarding(direct: Client, gateway: Client, streams: int, chunks: int) -> dict[str, Any]:
    delays: dict[str, list[float]] = {"direct": [], "gateway": []}
    body = json.dumps({"model": "forward", "messages": [], "stream": True}).encode()
    for index in range(streams * 2):
        name, client = (("direct", direct), ("gateway", gateway))[index % 2]
        status, _, stamps = client.post("/chat/completions", body)
        assert status == 200, status
        assert len(stamps) == chunks, len(stamps)
        delays[name].extend((received - sent) / 1e6 for sent, received in stamps)
    out = {name: _summary(values) for name, values in delays.items()}
    out["added_ms"] = {q: out["gateway"][q] - out["direct"][q] for q in ("p50", "p90", "p99")}
    return out


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
    delays = [(r - s) / 1e6 for result in results for s, r in result["stamps"]]
    complete = sum(1 for r in results if r["done"] and len(r["stamps"]) == chunks)
    incremental = sum(1 for r in results if r["stamps"] and r["stamps"][0][1] < r["stamps"][-1][0])
    return {
        "streams": count, "complete": complete, "incremental": incremental, "seconds": elapsed,
        "chunk_delay_ms": _summary(delays),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000, help="sequential requests per side (latency)")
    parser.add_argument("--slices", type=int, default=10, help="alternating slices per side")
    parser.add_argument("--streams", type=int, default=40, help="streams per side (forwarding)")
    parser.add_argument("--chunks", type=int, default=25, help="stamped deltas per stream")
    parser.add_argument("--concurrent", type=int, default=200, help="concurrent streams")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.slices, args.streams, args.chunks, args.concurrent = 300, 2, 4, 10, 50
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
        with tempfile.TemporaryDirectory(prefix="gwb-") as folder, run_gateway(Path(folder), [config]) as gw:
            direct, gateway = Client.tcp(port, "/v1"), Client.unix(gw.agent_socket, "/up")
            print("latency ...", file=sys.stderr)
            lat = latency(direct, gateway, args.requests, args.slices)
            print("chunk forwarding ...", file=sys.stderr)
            fwd = forwarding(direct, gateway, args.streams, args.chunks)
            direct.close()
            gateway.close()
            marker = len(gw.wait_requests(gateway.sent))
            print(f"{args.concurrent} concurrent streams ...", file=sys.stderr)
            via = concurrent(lambda: asyncio.open_unix_connection(gw.agent_socket, limit=1 << 20), "/up",
                             args.concurrent, args.chunks)  # fmt: skip
            events = gw.wait_requests(marker + args.concurrent, timeout=60)[marker:]
            direct_c = concurrent(lambda: asyncio.open_connection("127.0.0.1", port, limit=1 << 20), "/v1",
                                  args.concurrent, args.chunks)  # fmt: skip
    finally:
        upstream.kill()
        upstream.wait()
    recorded = sum(1 for e in events if e["usage_source"] == "upstream" and e["usage"]["output_tokens"] > 0)
    via["usage_recorded"] = recorded
    results = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "latency_ms": lat, "chunk_forwarding_ms": fwd,
        "concurrent": {"gateway": via, "direct": direct_c},
        "goals": {
            "added_p50_ms<=1": lat["added_ms"]["p50"] <= 1.0,
            "chunk_added_p50_ms<=1": fwd["added_ms"]["p50"] <= 1.0,
            "concurrent_all_complete": via["complete"] == args.concurrent,
            "concurrent_none_buffered_whole": via["incremental"] == args.concurrent,
            "concurrent_usage_recorded": recorded == args.concurrent,
        },
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    _print(results, args)
    return 0


def _print(r: dict[str, Any], args: argparse.Namespace) -> None:
    lat, fwd, via, dc = r["latency_ms"], r["chunk_forwarding_ms"], r["concurrent"]["gateway"], r["concurrent"]["direct"]
    print(f"load average {r['machine']['load'][0]:.2f} on {r['machine']['cpus']} CPUs")
    print(f"{'measure':<38}{'direct':>10}{'gateway':>10}{'added':>10}{'ratio':>8}")
    for title, block in (("request latency", lat), ("chunk send -> receipt", fwd)):
        for q in ("p50", "p99"):
            d, g = block["direct"][q], block["gateway"][q]
            print(f"{title + ' ' + q + ' (ms)':<38}{d:>10.3f}{g:>10.3f}{g - d:>10.3f}{g / d:>8.2f}")
    for q in ("p50", "p99"):
        d, g = dc["chunk_delay_ms"][q], via["chunk_delay_ms"][q]
        title = f"{args.concurrent} streams: chunk delay {q} (ms)"
        print(f"{title:<38}{d:>10.3f}{g:>10.3f}{g - d:>10.3f}{g / d:>8.2f}")
    print(f"{args.concurrent} streams through the gateway: {via['complete']} complete, {via['incremental']} "
          f"delivered incrementally, {via['usage_recorded']} with usage recorded, {via['seconds']:.2f} s "
          f"(direct {dc['seconds']:.2f} s)")  # fmt: skip
    for goal, met in r["goals"].items():
        print(f"goal {goal}: {'met' if met else 'NOT MET'}")


if __name__ == "__main__":
    sys.exit(main())
