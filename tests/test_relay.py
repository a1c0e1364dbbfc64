"""The sandbox's relay to the gateway socket (ale/_relay.py), on the host: what it does to the command
it starts and to the connections it carries. In a real sandbox: the conformance suite's gateway cases."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale import _relay

PY = sys.executable


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def echo(short_tmp: Path) -> Iterator[Path]:
    """A Unix socket that answers each connection with what it sent, reversed, after its EOF."""
    path = short_tmp / "gw.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(16)

    def serve(conn: socket.socket) -> None:
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        conn.sendall(data[::-1])
        conn.close()

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    yield path
    server.close()


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "ale._relay", *args], capture_output=True, text=True, timeout=timeout)


def test_relay_usage_errors_run_nothing(tmp_path: Path) -> None:
    for args in ([], ["80"], ["x", "s", "--", "true"], ["80", "s", "true"]):
        done = _run(*args)
        assert done.returncode == 2, args
        assert "usage: python3 -m ale._relay" in done.stderr


def test_relay_on_a_busy_port_runs_nothing_and_says_why(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        done = _run(str(port), str(tmp_path / "gw.sock"), "--", PY, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')")
    assert done.returncode == 125
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_relay_execs_the_command_with_its_exit_status_pid_and_default_signals(tmp_path: Path) -> None:
    """The command replaces the relay's process (same pid, no relay child), exits with its own
    status, and gets SIGPIPE and SIGXFSZ at their defaults again (Python ignores both at start-up)."""
    code = (
        "import os, sys\n"
        "try:\n"
        "    os.waitpid(-1, os.WNOHANG)\n"
        "    children = 'a child'\n"
        "except ChildProcessError:\n"
        "    children = 'no children'\n"
        "print(os.getpid(), children, flush=True)\n"
        "sys.exit(42)\n"
    )
    port, sock = str(_port()), str(tmp_path / "gw.sock")
    process = subprocess.Popen([PY, "-m", "ale._relay", port, sock, "--", PY, "-c", code], stdout=subprocess.PIPE)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 42
    assert out.decode().split(maxsplit=1) == [str(process.pid), "no children\n"]
    status = subprocess.run(
        [PY, "-m", "ale._relay", str(_port()), sock, "--", "grep", "^SigIgn", "/proc/self/status"],
        capture_output=True,
        text=True,
        check=True,
    )
    ignored = int(status.stdout.split()[1], 16)
    assert ignored & (1 << (13 - 1)) == 0  # SIGPIPE
    assert ignored & (1 << (25 - 1)) == 0  # SIGXFSZ


def test_relay_of_a_missing_command_exits_127(tmp_path: Path) -> None:
    done = _run(str(_port()), str(tmp_path / "gw.sock"), "--", str(tmp_path / "no-such-program"))
    assert done.returncode == 127
    assert "cannot run" in done.stderr


def test_relay_carries_bytes_both_ways_and_leaves_with_the_command(echo: Path) -> None:
    port = _port()
    marker = f"relay-test-{os.getpid()}-{port}"
    code = (
        "import socket, sys\n"
        f"MARKER = {marker!r}\n"
        "body = bytes(range(256)) * 8192\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=20)\n"
        "s.sendall(body)\n"
        "s.shutdown(socket.SHUT_WR)\n"
        "got = b''\n"
        "while chunk := s.recv(1 << 20):\n"
        "    got += chunk\n"
        "sys.exit(0 if got == body[::-1] else 1)\n"
    )
    done = _run(str(port), str(echo), "--", PY, "-c", code)
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _relays_with(str(port)):
        time.sleep(0.1)
    assert _relays_with(str(port)) == []  # the relay ends within a second of its command


def test_relay_to_a_missing_socket_closes_the_connection_and_goes_on(tmp_path: Path) -> None:
    port = _port()
    code = (
        "import socket\n"
        "for _ in range(3):\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n"
        "    try:\n"
        "        print(repr(s.recv(10)), flush=True)\n"
        "    except ConnectionResetError:\n"
        "        print('reset', flush=True)\n"
        "    s.close()\n"
    )
    done = _run(str(port), str(tmp_path / "none.sock"), "--", PY, "-c", code)
    assert done.returncode == 0, done.stderr
    assert all(line in ("b''", "reset") for line in done.stdout.split()), done.stdout
    assert done.stderr.count("cannot reach the gateway") == 3


def test_relay_closes_the_gateway_side_when_the_client_drops(short_tmp: Path) -> None:
    """A client that goes away mid-response: the relay closes its connection to the socket too."""
    path = short_tmp / "flow.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    gone = threading.Event()

    def flow() -> None:
        conn, _ = server.accept()
        try:
            for _ in range(10_000):
                conn.sendall(b"x" * 1024)
                time.sleep(0.002)
        except OSError:
            gone.set()
        conn.close()

    threading.Thread(target=flow, daemon=True).start()
    port = _port()
    code = (
        f"import socket, time\ns = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n"
        "s.sendall(b'go')\ns.recv(1024)\ns.close()\ntime.sleep(3)\n"
    )
    process = subprocess.Popen([PY, "-m", "ale._relay", str(port), str(path), "--", PY, "-c", code])
    try:
        assert gone.wait(5)
        assert process.poll() is None  # the drop reached the gateway while the command still ran
    finally:
        process.wait(timeout=30)
        server.close()


def _relays_with(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"ale._relay" in cmdline and needle.encode() in cmdline:
                found.append(int(entry))
    return found


def test_relay_module_uses_the_standard_library_only() -> None:
    """It runs in the agent's environment before anything else: nothing but the standard library."""
    import ast

    tree = ast.parse(Path(_relay.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
