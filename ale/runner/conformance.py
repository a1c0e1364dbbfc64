"""The runtime conformance suite: the interface contract (ale/runner/runtime.py) any backend keeps.

It ships in the package, as dm_env_rpc ships its compliance classes, so that a backend's own
tests run the very same checks: subclass :class:`RuntimeConformance` in a pytest module with
pytest-trio's ``trio_mode`` and provide a ``runtime`` fixture giving a checked backend::

    class TestMyRuntime(RuntimeConformance):
        @pytest.fixture
        def runtime(self) -> Runtime:
            runtime = MyRuntime()
            runtime.check()
            return runtime

The tests speak only the interface (``check``, ``attestation``, ``networks``, ``open_evaluator``,
``run_sandboxed``, the exceptions) and what a command sees inside the sandbox, which is the agent
contract (docs/agent-contract.md): it holds for every runtime. ``tests/test_runtime_conformance.py``
runs the suite against every registered backend (:mod:`ale.runner.runtimes`) this machine has.
Needs pytest and pytest-trio (the ``dev`` extra).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from ale import catalog
from ale.client import AleEnvClient
from ale.runner import agent_env, sandbox
from ale.runner.runtime import (
    GATEWAY_PORT,
    GATEWAY_SOCKET_PATH,
    GATEWAY_URL,
    EvaluatorSpec,
    EvaluatorStartError,
    Limits,
    Network,
    Runtime,
    SandboxError,
    SandboxResult,
    SandboxSpec,
    sandbox_path,
)
from ale.runner.supervise import KILL_GRACE_S, MAX_LINE, MAX_STREAM_BYTES

PY = agent_env.PYTHON  # the sandbox's own interpreter (docs/agent-contract.md)
TASK = "cartpole-balance"
# A command that leaves when asked to (as PID 1 of a namespace, a process ignores SIGTERM without a handler).
ON_SIGTERM_EXIT = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"


class Box:
    """Host folders for one sandbox: a workspace, task files and a stand-in evaluator socket."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.workspace = folder / "workspace"
        self.workspace.mkdir()
        if os.geteuid() == 0:
            os.chown(self.workspace, sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)
        self.task_dir = folder / "task"
        self.task_dir.mkdir()
        (self.task_dir / "task.json").write_text('{"id": "conformance"}\n')
        self.task_dir.chmod(0o755)
        (self.task_dir / "task.json").chmod(0o666)  # writable by anyone: only the read-only mount protects it
        folder.chmod(0o755)
        self.socket_path = folder / "evaluator.sock"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.socket_path))
        self.listener.listen(8)
        self.listener.setblocking(False)
        self.socket_path.chmod(0o666)

    def spec(self, code: str, *, wall_time_s: float = 30.0, writable: bool = True, **kw: Any) -> SandboxSpec:
        return SandboxSpec(
            command=(PY, "-c", code),
            workspace=self.workspace,
            workspace_writable=writable,
            task_dir=self.task_dir,
            evaluator_socket=self.socket_path,
            env=kw.pop("env", {"HOME": "/workspace", "PATH": sandbox_path(), "ALE_TEST": "1"}),
            wall_time_s=wall_time_s,
            **kw,
        )

    def accepted(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1

    def close(self) -> None:
        self.listener.close()


class StandInGateway:
    """A Unix socket server standing in for the gateway (the attachment is tested, not the gateway).

    What a connection's first four bytes say decides what it gets: ``ECHO``: everything it sends,
    upper-cased, and EOF after its EOF; ``FLOW``: a line every 10 ms until the peer is gone (then
    :attr:`gone` is set); anything else: one line ``refused`` and the end. Every connection's bytes
    are recorded (:attr:`received`: their SHA-256 and length, in the order connections ended).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        path.chmod(0o666)
        self.received: list[tuple[bytes, int, str]] = []  # (first bytes, length, sha256)
        self.gone = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        digest, first, total = hashlib.sha256(), b"", 0
        try:
            while len(first) < 4 and (data := conn.recv(4 - len(first))):
                first += data
            digest.update(first)
            total = len(first)
            if first == b"FLOW":
                self._flow(conn)
            elif first == b"ECHO":
                conn.sendall(first)
                while data := conn.recv(65536):
                    digest.update(data)
                    total += len(data)
                    conn.sendall(data.upper())
                conn.shutdown(socket.SHUT_WR)
            else:
                conn.settimeout(0.5)
                with contextlib.suppress(OSError):
                    while data := conn.recv(65536):
                        digest.update(data)
                        total += len(data)
                conn.sendall(b"refused\n")
        except OSError:
            pass
        finally:
            conn.close()
            with self._lock:
                self.received.append((first, total, digest.hexdigest()))

    def _flow(self, conn: socket.socket) -> None:
        try:
            for i in range(100_000):
                conn.sendall(b"chunk %d\n" % i)
                time.sleep(0.01)
        except OSError:
            self.gone.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


class Lines:
    """A sink that keeps every line with its stream name."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, bytes]] = []

    def __call__(self, stream: str, line: bytes) -> None:
        self.lines.append((stream, line))

    def of(self, stream: str) -> list[str]:
        return [line.decode() for s, line in self.lines if s == stream]

    def report(self, prefix: str = "REPORT ") -> dict[str, Any]:
        for line in self.of("stdout"):
            if line.startswith(prefix):
                return dict(json.loads(line[len(prefix) :]))
        raise AssertionError(f"no report line; got {self.lines!r}")


def _evaluator_spec(folder: Path, task_id: str = TASK) -> EvaluatorSpec:
    config = json.dumps({"run_id": "run-conformance", "secret": secrets.token_hex(32)}).encode()
    private = folder / "private"
    private.mkdir(mode=0o700, exist_ok=True)
    sockets = folder / "sockets"
    sockets.mkdir(exist_ok=True)
    return EvaluatorSpec(
        task_id=task_id,
        run_config=config,
        agent_socket=sockets / "evaluator.sock",
        harness_socket=private / "harness.sock",
        events_path=private / "evaluator.jsonl",
    )


def _host_pids_with(needle: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if needle.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _kill_leftovers(marker: str) -> None:
    """SIGKILL what this test started and the runtime left behind (so a failure leaks nothing)."""
    for pid in _host_pids_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class RuntimeConformance:
    """The interface contract every runtime backend keeps (a subclass provides the ``runtime`` fixture)."""

    @pytest.fixture
    def box(self) -> Iterator[Box]:
        """Host folders for one sandbox, removed after the test."""
        folder = Path(tempfile.mkdtemp(prefix="ale-rc-"))  # short: Unix socket paths
        made = None
        try:
            made = Box(folder)
            yield made
        finally:
            if made is not None:
                made.close()
            shutil.rmtree(folder, ignore_errors=True)

    # --- check and attestation -----------------------------------------------------------------

    def test_check_passes(self, runtime: Runtime) -> None:
        runtime.check()
        assert isinstance(runtime.name, str)
        assert runtime.name

    async def test_an_unsupported_network_attachment_is_a_sandbox_error(self, runtime: Runtime, box: Box) -> None:
        """A spec asking for an attachment the backend lacks never runs in a weaker sandbox."""
        assert Network.NONE in runtime.networks  # every backend isolates a sandbox with no network
        unsupported = [n for n in Network if n not in runtime.networks]
        if not unsupported:
            pytest.skip(f"{runtime.name} supports every network attachment")
        gateway = box.folder / "gateway.sock"
        for network in unsupported:
            code = "open('/workspace/ran', 'w').write('yes')"
            spec = attrs.evolve(
                box.spec(code), network=network, gateway_socket=gateway if network is Network.GATEWAY else None
            )
            with pytest.raises(SandboxError, match=network.value):
                await runtime.run_sandboxed(spec, Lines())
        assert not (box.workspace / "ran").exists()

    def test_attestation_names_runtime_sandbox_and_evaluator_digest(self, runtime: Runtime) -> None:
        att = runtime.attestation()
        json.dumps(att)  # it goes into the bundle manifest
        assert att["runtime"] == runtime.name
        assert isinstance(att["sandbox"], str)
        assert att["sandbox"]
        # The evaluator's code digest (the local runtime calls it "evaluator", later "code").
        digests = att.get("evaluator") or att.get("code")
        assert isinstance(digests, dict), att
        hexes = {k: v for k, v in digests.items() if k.endswith("sha256")}
        assert hexes, digests
        assert all(re.fullmatch(r"[0-9a-f]{64}", v) for v in hexes.values()), hexes
        assert runtime.attestation() == att  # stable within a process

    def test_image_digests_are_the_images_the_attestation_names(self, runtime: Runtime) -> None:
        """What the harness holds against a release's images is what the manifest records as run."""
        digests = runtime.image_digests()
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", d) for d in digests.values()), digests
        images = runtime.attestation().get("images")
        if not digests:
            assert images is None
            return
        assert images is not None
        assert {name: entry["digest"] for name, entry in images["images"].items()} == digests

    # --- the evaluator ------------------------------------------------------------------------

    async def test_open_evaluator_serves_both_endpoints(self, runtime: Runtime, box: Box) -> None:
        spec = _evaluator_spec(box.folder)
        task = catalog.get_task(TASK)
        async with runtime.open_evaluator(spec) as handle:
            assert handle.alive()
            assert stat.S_ISSOCK(os.stat(handle.agent_socket).st_mode)
            for target in (handle.harness_target, f"unix:{handle.agent_socket}"):
                client = AleEnvClient(target, timeout=10)
                try:
                    got = await trio.to_thread.run_sync(client.get_spec)
                finally:
                    client.close()
                assert got.task_id == TASK
                assert got.task_digest == task.digest
            assert handle.events_path == spec.events_path
        assert not handle.alive()
        events = [json.loads(line) for line in spec.events_path.read_text().splitlines()]
        assert events[0]["kind"] == "evaluator_ready"
        assert isinstance(handle.stderr_tail(), str)

    async def test_a_prestarted_evaluator_serves_the_next_task_and_close_is_idempotent(
        self, runtime: Runtime, box: Box
    ) -> None:
        assert runtime.sandbox == runtime.attestation()["sandbox"]
        await trio.to_thread.run_sync(runtime.prestart_evaluator)
        await trio.to_thread.run_sync(runtime.prestart_evaluator)  # a second call keeps one, not two
        for name in ("first", "second"):  # the second has no prestarted one left: it starts its own
            folder = box.folder / name
            folder.mkdir()
            spec = _evaluator_spec(folder)
            async with runtime.open_evaluator(spec) as handle:
                client = AleEnvClient(handle.harness_target, timeout=10)
                try:
                    got = await trio.to_thread.run_sync(client.get_spec)
                finally:
                    client.close()
                assert got.task_id == TASK
            assert not handle.alive()
        await trio.to_thread.run_sync(runtime.prestart_evaluator)
        runtime.close()
        runtime.close()

    async def test_evaluator_start_error_for_an_unknown_task(self, runtime: Runtime, box: Box) -> None:
        spec = _evaluator_spec(box.folder, task_id="no-such-task")
        with trio.fail_after(30), pytest.raises(EvaluatorStartError, match="no-such-task"):
            async with runtime.open_evaluator(spec):
                pytest.fail("an evaluator for an unknown task became ready")

    # --- run_sandboxed: exit, time, stop ----------------------------------------------------------

    async def test_exit_status_is_returned(self, runtime: Runtime, box: Box) -> None:
        result = await runtime.run_sandboxed(box.spec("import sys; sys.exit(7)"), Lines())
        assert isinstance(result, SandboxResult)
        assert (result.exit_status, result.stopped_for, result.dropped_output_bytes) == (7, "", 0)
        ok = await runtime.run_sandboxed(box.spec("pass"), Lines())
        assert (ok.exit_status, ok.stopped_for) == (0, "")
        assert 0 <= ok.wall_time_s < 30

    async def test_wall_time_is_honoured(self, runtime: Runtime, box: Box) -> None:
        lines = Lines()
        code = f"{ON_SIGTERM_EXIT}print('started', flush=True)\ntime.sleep(600)\n"
        result = await runtime.run_sandboxed(box.spec(code, wall_time_s=1.5), lines)
        assert result.stopped_for == "wall_time"
        assert result.exit_status is None
        assert 1.5 <= result.wall_time_s < 1.5 + KILL_GRACE_S + 2
        assert lines.of("stdout") == ["started"]

    async def test_long_silent_command_is_not_killed_early(
        self, runtime: Runtime, box: Box, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A quiet command runs to its own end: nothing but the runtime's stop decides it ends.

        Trio starts processes from worker threads and retires idle ones after ten seconds; the
        idle timeout is shortened here so that the test takes two seconds, not fifteen.
        """
        from trio._core import _thread_cache

        monkeypatch.setattr(_thread_cache, "IDLE_TIMEOUT", 0.2)
        code = "import time; time.sleep(2); print('still here', flush=True)"
        lines = Lines()
        result = await runtime.run_sandboxed(box.spec(code, wall_time_s=20), lines)
        assert (result.exit_status, result.stopped_for) == (0, ""), lines.lines
        assert lines.of("stdout") == ["still here"]

    async def test_should_stop_reason_stops_the_command(self, runtime: Runtime, box: Box) -> None:
        calls = 0

        async def should_stop() -> str:
            nonlocal calls
            calls += 1
            return "env_steps" if calls >= 2 else ""

        code = f"{ON_SIGTERM_EXIT}time.sleep(600)\n"
        result = await runtime.run_sandboxed(box.spec(code, wall_time_s=60), Lines(), should_stop=should_stop)
        assert result.stopped_for == "env_steps"
        assert result.exit_status is None
        assert calls == 2
        assert result.wall_time_s < 2 + KILL_GRACE_S + 3  # polled about once a second

    async def test_cancellation_stops_the_sandbox(self, runtime: Runtime, box: Box) -> None:
        """Cancelled once its command is up (not after a fixed time: a loaded machine may take longer
        than that to start a container), the sandbox's processes are gone soon after."""
        marker = f"ale-conformance-{secrets.token_hex(6)}"
        code = f"MARKER = {marker!r}; import time; print('up', flush=True); time.sleep(600)"
        lines, up = Lines(), trio.Event()

        def sink(stream: str, line: bytes) -> None:
            lines(stream, line)
            if line == b"up":
                up.set()

        try:
            with trio.move_on_after(120) as waited:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(runtime.run_sandboxed, box.spec(code), sink)
                    await up.wait()
                    nursery.cancel_scope.cancel()
            assert not waited.cancelled_caught, f"the command never came up: {lines.lines}"
            assert lines.of("stdout") == ["up"]
            with trio.move_on_after(KILL_GRACE_S + 2):
                while _host_pids_with(marker):  # noqa: ASYNC110 - polling /proc
                    await trio.sleep(0.1)
            assert _host_pids_with(marker) == []
        finally:
            _kill_leftovers(marker)

    # --- run_sandboxed: output ------------------------------------------------------------------

    async def test_output_lines_arrive_in_order_per_stream(self, runtime: Runtime, box: Box) -> None:
        code = (
            "import json, os, sys\n"
            "fd = int(os.environ['ALE_EVENT_FD'])\n"
            "for i in range(300):\n"
            "    print(f'out {i}', flush=i % 7 == 0)\n"
            "    print(f'err {i}', file=sys.stderr, flush=i % 5 == 0)\n"
            "    if i % 3 == 0:\n"
            "        os.write(fd, json.dumps({'kind': 'note', 'data': {'i': i}}).encode() + b'\\n')\n"
            "sys.stdout.flush()\n"
            "sys.stdout.write('no newline at the end')\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(box.spec(code), lines)
        assert result.exit_status == 0
        assert {s for s, _ in lines.lines} == {"stdout", "stderr", "event"}
        assert lines.of("stdout") == [f"out {i}" for i in range(300)] + ["no newline at the end"]
        assert lines.of("stderr") == [f"err {i}" for i in range(300)]
        assert [json.loads(e)["data"]["i"] for e in lines.of("event")] == list(range(0, 300, 3))

    async def test_long_lines_are_cut_and_floods_are_capped(self, runtime: Runtime, box: Box) -> None:
        code = (
            "import sys\n"
            "w = sys.stdout.buffer\n"
            f"w.write(b'L' * {3 * MAX_LINE} + b'\\n')\n"
            f"for _ in range({(MAX_STREAM_BYTES + 2 * 1024 * 1024) // 4096}):\n"
            "    w.write(b'f' * 4095 + b'\\n')\n"
            "w.flush()\n"
            "print('stderr is separate', file=sys.stderr)\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(box.spec(code), lines)
        assert result.exit_status == 0
        stdout = [line for s, line in lines.lines if s == "stdout"]
        assert all(len(line) <= MAX_LINE for line in stdout)
        assert sum(len(line) + 1 for line in stdout) <= MAX_STREAM_BYTES + MAX_LINE
        assert result.dropped_output_bytes > 2 * 1024 * 1024 - MAX_LINE
        assert lines.of("stderr") == ["stderr is separate"]

    # --- what the command sees ------------------------------------------------------------------

    async def test_network_is_unreachable(self, runtime: Runtime, box: Box) -> None:
        host = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        host.bind(("127.0.0.1", 0))
        host.listen(8)
        host.setblocking(False)
        port = host.getsockname()[1]
        code = (
            "import json, socket\n"
            "def loopback():\n"
            "    srv = socket.socket()\n"
            "    srv.bind(('127.0.0.1', 0))\n"
            "    srv.listen(1)\n"
            "    socket.create_connection(srv.getsockname(), timeout=3).close()\n"
            "    srv.close()\n"
            "r = {}\n"
            f"for name, addr in [('public', ('1.1.1.1', 53)), ('host_loopback', ('127.0.0.1', {port}))]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=3).close()\n"
            "        r[name] = 'connected'\n"
            "    except OSError as exc:\n"
            "        r[name] = type(exc).__name__\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 443)\n"
            "    r['dns'] = 'resolved'\n"
            "except OSError as exc:\n"
            "    r['dns'] = type(exc).__name__\n"
            "try:\n"
            "    loopback()\n"
            "    r['own_loopback'] = 'connected'\n"
            "except OSError as exc:\n"
            "    r['own_loopback'] = f'{type(exc).__name__}: {exc}'\n"
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        try:
            result = await runtime.run_sandboxed(box.spec(code), lines)
            try:
                conn, _ = host.accept()
                conn.close()
                reached = True
            except BlockingIOError:
                reached = False
        finally:
            host.close()
        assert result.exit_status == 0, lines.lines
        report = lines.report()
        assert report["public"] != "connected"
        assert report["host_loopback"] != "connected"
        assert report["dns"] == "gaierror"
        assert not reached
        # docs/agent-contract.md: "no TCP, UDP or DNS; loopback only": the sandbox's own loopback works.
        assert report["own_loopback"] == "connected"

    async def test_the_agents_python_is_its_own(self, runtime: Runtime, box: Box) -> None:
        """``python3`` on PATH is the agent environment's (docs/agent-contract.md, "The agent's Python
        environment"): the client library imports, the harness and the evaluator do not, and the
        environment is read-only."""
        code = (
            "import errno, json, sys\n"
            "import ale.client, ale.policy, ale.protocol\n"
            "r = {'prefix': sys.prefix, 'executable': sys.executable, 'importable': []}\n"
            "for m in ('ale.runner', 'ale.agents', 'ale.core.release', 'ale_evaluator', 'trio'):\n"
            "    try:\n"
            "        __import__(m)\n"
            "        r['importable'].append(m)\n"
            "    except ImportError:\n"
            "        pass\n"
            "try:\n"
            "    open(sys.prefix + '/probe', 'w')\n"
            "    r['write'] = 'written'\n"
            "except OSError as exc:\n"
            "    r['write'] = errno.errorcode[exc.errno]\n"
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(attrs.evolve(box.spec(code), command=("python3", "-c", code)), lines)
        assert result.exit_status == 0, lines.lines
        report = lines.report()
        assert report["prefix"] == agent_env.MOUNT_POINT
        assert report["executable"] == f"{agent_env.MOUNT_POINT}/bin/python3"
        assert report["importable"] == []
        assert report["write"] == "EROFS", report

    async def test_the_agent_environment_is_the_python_the_sandbox_runs(self, runtime: Runtime, box: Box) -> None:
        """What the manifest says the agent ran with (agent_environment) is what the sandbox's own
        Python sees: the same distributions (and, for an image, the interpreter's version)."""
        import jsonschema
        from packaging.utils import canonicalize_name

        code = (
            "import importlib.metadata as m, json, platform\n"
            "d = [(x.metadata['Name'], x.version) for x in m.distributions()]\n"
            "print('REPORT ' + json.dumps({'version': platform.python_version(), 'distributions': d}), flush=True)\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(box.spec(code), lines)
        assert result.exit_status == 0, lines.lines
        report = lines.report()
        env = runtime.agent_environment(None)
        schema = json.loads((Path(catalog.__file__).parent / "schemas" / "manifest.schema.json").read_text())
        jsonschema.validate(env, schema["properties"]["agent"]["properties"]["environment"])

        def canonical(pairs: list[tuple[str, str]]) -> list[str]:
            return sorted(f"{canonicalize_name(name)}=={version}" for name, version in pairs)

        named = [tuple(d.split("==", 1)) for d in env["distributions"]]
        assert canonical(named) == canonical(report["distributions"])
        if "python" in env:  # an image's own interpreter
            assert env["python"]["version"] == report["version"]

    async def test_agent_contract_paths(self, runtime: Runtime, box: Box) -> None:
        """/workspace (writable), /task (read-only), /ale/evaluator.sock, HOME, cwd: for every runtime."""
        code = (
            "import json, os, socket\n"
            "r = {'cwd': os.getcwd(), 'home': os.environ.get('HOME'), 'env': sorted(os.environ)}\n"
            "try:\n"
            "    open('/workspace/made-inside', 'w').write('hello')\n"
            "    r['workspace'] = 'written'\n"
            "except OSError as exc:\n"
            "    r['workspace'] = type(exc).__name__\n"
            "try:\n"
            "    r['task'] = json.load(open('/task/task.json'))\n"
            "except OSError as exc:\n"
            "    r['task'] = type(exc).__name__\n"
            "try:\n"
            "    open('/task/task.json', 'a').write('x')\n"
            "    r['task_write'] = 'written'\n"
            "except OSError as exc:\n"
            "    r['task_write'] = type(exc).__name__\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            "    s.connect('/ale/evaluator.sock')\n"
            "    r['socket'] = 'connected'\n"
            "except OSError as exc:\n"
            "    r['socket'] = type(exc).__name__\n"
            "s.close()\n"
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        try:
            result = await runtime.run_sandboxed(box.spec(code), lines)
            accepted = box.accepted()
        finally:
            box.close()
        assert result.exit_status == 0, lines.lines
        report = lines.report()
        assert report["cwd"] == "/workspace"
        assert report["home"] == "/workspace"
        assert report["workspace"] == "written"
        assert (box.workspace / "made-inside").read_text() == "hello"
        assert report["task"] == {"id": "conformance"}
        assert report["task_write"] != "written"
        assert report["socket"] == "connected"
        assert accepted == 1
        # Only the spec's variables and ALE_EVENT_FD (plus what the process adds itself).
        extra = set(report["env"]) - {"HOME", "PATH", "ALE_TEST", "ALE_EVENT_FD", "PWD", "LC_CTYPE", "SHLVL", "_"}
        assert extra == set()

    async def test_read_only_workspace(self, runtime: Runtime, box: Box) -> None:
        (box.workspace / "policy").write_text("kept")
        (box.workspace / "policy").chmod(0o666)  # only the read-only mount protects it
        code = (
            "import json\n"
            "r = {'read': open('/workspace/policy').read()}\n"
            "try:\n"
            "    open('/workspace/policy', 'w').write('changed')\n"
            "    r['write'] = 'written'\n"
            "except OSError as exc:\n"
            "    r['write'] = type(exc).__name__\n"
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(box.spec(code, writable=False), lines)
        assert result.exit_status == 0, lines.lines
        assert lines.report() == {"read": "kept", "write": "OSError"}
        assert (box.workspace / "policy").read_text() == "kept"

    async def test_workspace_size_is_watched(self, runtime: Runtime, box: Box) -> None:
        code = (
            "import os, time\n"
            "with open('/workspace/big', 'wb') as fh:\n"
            "    fh.write(os.urandom(3 << 20))\n"
            "print('written', flush=True)\n"
            "time.sleep(600)\n"
        )
        lines = Lines()
        spec = box.spec(code, wall_time_s=30, limits=Limits(workspace_bytes=1 << 20))
        result = await runtime.run_sandboxed(spec, lines)
        assert lines.of("stdout") == ["written"], lines.lines
        assert result.stopped_for == "disk"
        assert result.wall_time_s < 10

    async def test_unprivileged_without_capabilities(self, runtime: Runtime, box: Box) -> None:
        code = (
            "import json, os\n"
            "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)\n"
            "r = {k: status[k].split() for k in ('Uid', 'CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs')}\n"
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(box.spec(code), lines)
        assert result.exit_status == 0, lines.lines
        report = lines.report()
        assert "0" not in report["Uid"]
        if os.geteuid() == 0:  # started as root: dropped to one unprivileged uid (the run's own, or nobody)
            assert len(set(report["Uid"])) == 1
            assert int(report["Uid"][0]) >= 1000, report["Uid"]
        assert int(report["CapEff"][0], 16) == 0
        assert int(report["CapPrm"][0], 16) == 0
        assert int(report["CapBnd"][0], 16) == 0
        assert report["NoNewPrivs"] == ["1"]

    # --- the gateway attachment -----------------------------------------------------------------

    @pytest.fixture
    def gateway(self, runtime: Runtime, box: Box) -> Iterator[StandInGateway]:
        """A stand-in gateway socket in the box's folder (skips a backend without the attachment)."""
        if Network.GATEWAY not in runtime.networks:
            pytest.skip(f"{runtime.name} has no gateway attachment")
        made = StandInGateway(box.folder / "gateway.sock")
        try:
            yield made
        finally:
            made.close()

    @staticmethod
    def _gateway_spec(box: Box, gateway: StandInGateway, code: str, **kw: Any) -> SandboxSpec:
        return attrs.evolve(box.spec(code, **kw), network=Network.GATEWAY, gateway_socket=gateway.path)

    async def test_gateway_relay_splices_tcp_to_the_gateway_socket(
        self, runtime: Runtime, box: Box, gateway: StandInGateway
    ) -> None:
        """The relay on the sandbox's loopback carries every byte both ways, many connections at once;
        the socket itself is at its contract path; the two attachment variables are set."""
        code = (
            "import hashlib, json, os, socket, threading\n"
            f"PORT, SOCK = {GATEWAY_PORT}, {GATEWAY_SOCKET_PATH!r}\n"
            "r = {'env': [os.environ.get('ALE_GATEWAY_SOCKET'), os.environ.get('ALE_GATEWAY_URL')], 'ok': []}\n"
            "def one(i, family, addr):\n"
            "    body = hashlib.sha256(b'%d' % i).digest() * (4096 * (1 + i % 8))\n"
            "    s = socket.socket(family, socket.SOCK_STREAM)\n"
            "    s.settimeout(20)\n"
            "    s.connect(addr)\n"
            "    def send():\n"
            "        s.sendall(b'ECHO' + body)\n"
            "        s.shutdown(socket.SHUT_WR)\n"
            "    threading.Thread(target=send).start()  # both ways at once\n"
            "    got = bytearray()\n"
            "    while data := s.recv(65536):\n"
            "        got += data\n"
            "    s.close()\n"
            "    r['ok'].append(bytes(got) == b'ECHO' + body.upper())\n"
            "tcp = ('127.0.0.1', PORT)\n"
            "threads = [threading.Thread(target=one, args=(i, socket.AF_INET, tcp)) for i in range(24)]\n"
            "threads.append(threading.Thread(target=one, args=(99, socket.AF_UNIX, SOCK)))\n"
            "for t in threads: t.start()\n"
            "for t in threads: t.join()\n"
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(self._gateway_spec(box, gateway, code), lines)
        assert result.exit_status == 0, lines.lines
        report = lines.report()
        assert report["env"] == [GATEWAY_SOCKET_PATH, GATEWAY_URL]
        assert report["ok"] == [True] * 25
        with trio.fail_after(10):
            while len(gateway.received) < 25:  # noqa: ASYNC110 - the stand-in's threads
                await trio.sleep(0.05)
        expected = {
            hashlib.sha256(b"ECHO" + hashlib.sha256(b"%d" % i).digest() * (4096 * (1 + i % 8))).hexdigest()
            for i in [*range(24), 99]
        }
        assert {digest for _first, _n, digest in gateway.received} == expected

    async def test_gateway_attachment_reaches_the_gateway_and_nothing_else(
        self, runtime: Runtime, box: Box, gateway: StandInGateway
    ) -> None:
        """No route out with the gateway either; the relay passes bytes to the socket only, whatever
        they ask for (a CONNECT to a public host arrives at the gateway as those bytes)."""
        host = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        host.bind(("127.0.0.1", 0))
        host.listen(8)
        host.setblocking(False)
        port = host.getsockname()[1]
        request = b"CONNECT 1.1.1.1:443 HTTP/1.1\r\nHost: 1.1.1.1:443\r\n\r\n"
        code = (
            "import json, socket\n"
            "r = {}\n"
            f"for name, addr in [('public', ('1.1.1.1', 53)), ('host_loopback', ('127.0.0.1', {port})),\n"
            "                   ('public_v6', ('2606:4700:4700::1111', 53))]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=3).close()\n"
            "        r[name] = 'connected'\n"
            "    except OSError as exc:\n"
            "        r[name] = type(exc).__name__\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 443)\n"
            "    r['dns'] = 'resolved'\n"
            "except OSError as exc:\n"
            "    r['dns'] = type(exc).__name__\n"
            f"s = socket.create_connection(('127.0.0.1', {GATEWAY_PORT}), timeout=10)\n"
            f"s.sendall({request!r})\n"
            "s.shutdown(socket.SHUT_WR)\n"
            "r['reply'] = b''.join(iter(lambda: s.recv(100), b'')).decode()  # to the end: it may come in pieces\n"
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        try:
            result = await runtime.run_sandboxed(self._gateway_spec(box, gateway, code), lines)
            try:
                host.accept()[0].close()
                reached = True
            except BlockingIOError:
                reached = False
        finally:
            host.close()
        assert result.exit_status == 0, lines.lines
        report = lines.report()
        assert report["public"] != "connected"
        assert report["public_v6"] != "connected"
        assert report["host_loopback"] != "connected"
        assert report["dns"] == "gaierror"
        assert not reached
        assert report["reply"] == "refused\n"
        assert gateway.received == [(request[:4], len(request), hashlib.sha256(request).hexdigest())]

    async def test_gateway_relay_keeps_the_commands_exit_status_and_signals(
        self, runtime: Runtime, box: Box, gateway: StandInGateway
    ) -> None:
        """The command runs as it would without the relay: its exit status, its SIGTERM handler at
        the wall time (the relay still serves it then), no relay among its children."""
        exited = await runtime.run_sandboxed(self._gateway_spec(box, gateway, "import sys; sys.exit(7)"), Lines())
        assert (exited.exit_status, exited.stopped_for) == (7, "")
        code = (
            "import os, signal, socket, sys, time\n"
            "def bye(*_):\n"
            f"    s = socket.create_connection(('127.0.0.1', {GATEWAY_PORT}), timeout=5)\n"
            "    s.sendall(b'ECHO after sigterm')\n"
            "    s.shutdown(socket.SHUT_WR)\n"
            "    print('terminated', b''.join(iter(lambda: s.recv(100), b'')).decode(), flush=True)\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            "try:\n"
            "    os.waitpid(-1, os.WNOHANG)\n"
            "    print('a child', flush=True)\n"
            "except ChildProcessError:\n"
            "    print('no children', flush=True)\n"
            "time.sleep(600)\n"
        )
        lines = Lines()
        result = await runtime.run_sandboxed(self._gateway_spec(box, gateway, code, wall_time_s=2), lines)
        assert result.stopped_for == "wall_time"
        assert lines.of("stdout") == ["no children", "terminated ECHO AFTER SIGTERM"], lines.lines

    async def test_the_agent_dropping_its_connection_reaches_the_gateway(
        self, runtime: Runtime, box: Box, gateway: StandInGateway
    ) -> None:
        """A client that goes away mid-stream is gone for the gateway too (the relay closes its side)."""
        code = (
            f"import socket, time\ns = socket.create_connection(('127.0.0.1', {GATEWAY_PORT}), timeout=10)\n"
            "s.sendall(b'FLOW')\n"
            "data = b''\n"
            "while data.count(b'\\n') < 3:\n"
            "    data += s.recv(100)\n"
            "s.close()\n"
            "print('dropped', flush=True)\n"
            "time.sleep(600)\n"
        )
        lines = Lines()
        done = trio.Event()

        async def run() -> None:
            await runtime.run_sandboxed(self._gateway_spec(box, gateway, code, wall_time_s=30), lines)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            with trio.fail_after(20):
                # Both, in either order: the line travels through the engine, the drop does not.
                while not gateway.gone.is_set() or not lines.of("stdout"):  # noqa: ASYNC110 - the stand-in's thread
                    await trio.sleep(0.05)
            assert not done.is_set()  # the sandbox still runs: the drop alone reached the gateway
            nursery.cancel_scope.cancel()
        assert lines.of("stdout") == ["dropped"]

    async def test_a_missing_gateway_socket_is_a_sandbox_error(
        self, runtime: Runtime, box: Box, gateway: StandInGateway
    ) -> None:
        spec = attrs.evolve(
            box.spec("open('/workspace/ran', 'w')"), network=Network.GATEWAY, gateway_socket=box.folder / "none.sock"
        )
        with pytest.raises(SandboxError, match="gateway socket"):
            await runtime.run_sandboxed(spec, Lines())
        assert not (box.workspace / "ran").exists()
