"""Relay benchmark: what the sandbox's TCP relay to the gateway socket (ale/_relay.py) adds.

Run: .venv/bin/python bench/relay_bench.py [--quick] [--out bench/results/relay.json]

A stand-in gateway (a separate process on a Unix socket) streams chunks stamped with the sending
time (``time.perf_counter_ns``: CLOCK_MONOTONIC, one clock for every process of the machine) and
answers pings. A client reads them over the socket directly and through the relay (TCP to
127.0.0.1:PORT, spliced to the socket), alternating, in two places:

* ``host``: the relay started as ``python -m ale._relay PORT SOCKET -- sleep`` on the host, the
  client in the benchmark process;
* ``sandbox``: the client inside a real sandbox of the local runtime with the gateway attachment
  (bubblewrap, seccomp, the sandbox's cgroup with its 1-CPU quota), where the relay runs as it does
  for an agent; direct is ``/ale/gateway.sock`` from inside the same sandbox.

Figures: per-chunk delivery latency (arrival - stamp) p50/p99 direct and relayed and their
difference (what the relay adds per chunk), ping-pong round trips (64 B each way), and bulk
throughput (one 64 MiB transfer). Goals from issue 12: chunks forwarded within 1 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SERVER = r"""
import os, socket, struct, sys, threading, time
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
os.chmod(path, 0o666)
srv.listen(64)
print("ready", flush=True)
def serve(c):
    try:
        head = b""
        while len(head) < 32:
            d = c.recv(32 - len(head))
            if not d:
                return
            head += d
        mode, a, b, size = head[:4], *struct.unpack("!QQQ", head[8:32])
        if mode == b"STRM":  # a chunks of size bytes, every b microseconds
            pad = b"x" * (size - 8)
            nxt = time.perf_counter()
            for _ in range(a):
                c.sendall(struct.pack("!Q", time.perf_counter_ns()) + pad)
                nxt += b / 1e6
                delay = nxt - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
        elif mode == b"PING":  # a pings of 64 bytes
            for _ in range(a):
                got = b""
                while len(got) < 64:
                    d = c.recv(64 - len(got))
                    if not d:
                        return
                    got += d
                c.sendall(got)
        elif mode == b"BULK":  # a bytes
            block = b"y" * 262144
            left = a
            while left:
                n = c.send(block[: min(left, len(block))])
                left -= n
        c.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

CLIENT = r"""
import json, socket, struct, sys, time
PORT, SOCK, CHUNKS, INTERVAL_US, SIZE, PINGS, BULK, ROUNDS, OUT = json.loads(sys.argv[1])
def connect(via):
    if via == "direct":
        s = socket.socket(socket.AF_UNIX)
        s.connect(SOCK)
    else:
        s = socket.create_connection(("127.0.0.1", PORT))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
def head(mode, a, b=0, size=0):
    return mode + b"\0" * 4 + struct.pack("!QQQ", a, b, size)
def exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            raise EOFError
        buf += d
    return bytes(buf)
def stream(via):
    s = connect(via)
    s.sendall(head(b"STRM", CHUNKS, INTERVAL_US, SIZE))
    lat = []
    for _ in range(CHUNKS):
        chunk = exact(s, SIZE)
        lat.append((time.perf_counter_ns() - struct.unpack("!Q", chunk[:8])[0]) / 1000)
    s.close()
    return lat
def ping(via):
    s = connect(via)
    s.sendall(head(b"PING", PINGS))
    rtt, msg = [], b"p" * 64
    for _ in range(PINGS):
        t = time.perf_counter_ns()
        s.sendall(msg)
        exact(s, 64)
        rtt.append((time.perf_counter_ns() - t) / 1000)
    s.close()
    return rtt
def bulk(via):
    s = connect(via)
    s.sendall(head(b"BULK", BULK))
    t, n = time.perf_counter(), 0
    while d := s.recv(1 << 20):
        n += len(d)
    s.close()
    return n / (time.perf_counter() - t) / 1e6
out = {v: {"chunk_us": [], "rtt_us": [], "bulk_mb_s": []} for v in ("direct", "relay")}
for r in range(ROUNDS):
    order = ("direct", "relay") if r % 2 == 0 else ("relay", "direct")
    for via in order:
        out[via]["chunk_us"] += stream(via)
        out[via]["rtt_us"] += ping(via)
        out[via]["bulk_mb_s"].append(bulk(via))
if OUT:
    with open(OUT, "w") as fh:
        json.dump(out, fh)
else:
    print("RESULT " + json.dumps(out), flush=True)
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(raw: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for via, figures in raw.items():
        out[via] = {
            "chunk_p50_us": round(_pct(figures["chunk_us"], 0.5), 1),
            "chunk_p99_us": round(_pct(figures["chunk_us"], 0.99), 1),
            "rtt_p50_us": round(_pct(figures["rtt_us"], 0.5), 1),
            "rtt_p99_us": round(_pct(figures["rtt_us"], 0.99), 1),
            "bulk_mb_s": round(statistics.median(figures["bulk_mb_s"]), 1),
            "chunks": len(figures["chunk_us"]),
        }
    d, r = out["direct"], out["relay"]
    out["added"] = {
        "chunk_p50_us": round(r["chunk_p50_us"] - d["chunk_p50_us"], 1),
        "chunk_p99_us": round(r["chunk_p99_us"] - d["chunk_p99_us"], 1),
        "rtt_p50_us": round(r["rtt_p50_us"] - d["rtt_p50_us"], 1),
        "rtt_p99_us": round(r["rtt_p99_us"] - d["rtt_p99_us"], 1),
        "bulk_ratio": round(r["bulk_mb_s"] / d["bulk_mb_s"], 3) if d["bulk_mb_s"] else None,
    }
    return out


def _params(args: argparse.Namespace, port: int, sock: str, out: str = "") -> str:
    return json.dumps([port, sock, args.chunks, args.interval_us, args.size, args.pings, args.bulk, args.rounds, out])


def host_mode(args: argparse.Namespace, sock: Path) -> dict[str, Any]:
    port = _free_port()
    relay = subprocess.Popen(
        [sys.executable, "-m", "ale._relay", str(port), str(sock), "--", "sleep", "3600"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, _params(args, port, str(sock))], capture_output=True, text=True, check=True
        )
    finally:
        os.killpg(relay.pid, signal.SIGKILL)
        relay.wait()
    return _summary(_result(done.stdout))


def sandbox_mode(args: argparse.Namespace, sock: Path, folder: Path) -> dict[str, Any]:
    import attrs
    import trio

    from ale.runner import conformance
    from ale.runner.local import LocalRuntime
    from ale.runner.runtime import GATEWAY_PORT, GATEWAY_SOCKET_PATH, Network

    runtime = LocalRuntime()
    runtime.check()
    (folder / "box").mkdir()
    box = conformance.Box(folder / "box")
    lines = conformance.Lines()
    spec = attrs.evolve(
        box.spec(CLIENT, wall_time_s=600),
        command=(conformance.PY, "-c", CLIENT, _params(args, GATEWAY_PORT, GATEWAY_SOCKET_PATH, "/workspace/out.json")),
        network=Network.GATEWAY,
        gateway_socket=sock,
    )
    try:
        result = trio.run(runtime.run_sandboxed, spec, lines)
        if result.exit_status != 0:
            raise SystemExit(f"the sandboxed client failed: {result}\n{lines.of('stderr')}")
        raw = json.loads((box.workspace / "out.json").read_text())
    finally:
        box.close()
    return _summary(raw)


def _result(stdout: str) -> dict[str, dict[str, list[float]]]:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]
    raise SystemExit(f"no result from the client:\n{stdout}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few chunks, one round")
    parser.add_argument("--chunks", type=int, default=2000, help="chunks per stream and round")
    parser.add_argument("--interval-us", type=int, default=500, help="between two chunks of a stream")
    parser.add_argument("--size", type=int, default=256, help="bytes per chunk (an SSE delta is about this)")
    parser.add_argument("--pings", type=int, default=2000, help="64-byte ping-pongs per round")
    parser.add_argument("--bulk", type=int, default=64 << 20, help="bytes of the bulk transfer")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, direct and relay alternating")
    parser.add_argument("--where", choices=("host", "sandbox", "both"), default="both")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "relay.json"))
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.pings, args.bulk, args.rounds = 200, 200, 8 << 20, 1
    folder = Path(tempfile.mkdtemp(prefix="ale-rb-"))
    folder.chmod(0o755)
    sock = folder / "gw.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(sock)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "params": {k: getattr(args, k) for k in ("chunks", "interval_us", "size", "pings", "bulk", "rounds")},
    }
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the stand-in gateway did not start")
        if args.where in ("host", "both"):
            results["host"] = host_mode(args, sock)
        if args.where in ("sandbox", "both"):
            results["sandbox"] = sandbox_mode(args, sock, folder)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)
    for where in ("host", "sandbox"):
        if where in results:
            r = results[where]
            d, relayed = r["direct"], r["relay"]
            print(
                f"{where:8} chunk latency p50 direct {d['chunk_p50_us']} us, relay {relayed['chunk_p50_us']}"
                f" us (added {r['added']['chunk_p50_us']} us; p99 added {r['added']['chunk_p99_us']} us); "
                f"ping rtt added p50 {r['added']['rtt_p50_us']} us, p99 {r['added']['rtt_p99_us']} us; "
                f"bulk {relayed['bulk_mb_s']} MB/s relayed vs {d['bulk_mb_s']} direct"
            )
    if max(os.getloadavg()[0], 0) > (os.cpu_count() or 1) * 0.7:
        print("warning: the machine was busy (load average); the figures are noisy")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
