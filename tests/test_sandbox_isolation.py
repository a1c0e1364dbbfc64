"""What an agent can reach from inside its sandbox (docs/agent-contract.md, "Nothing else of the host").

One real run (the Harness, the local runtime, a real evaluator) with a probe agent that tries
everything it should not be able to do and prints what happened as one JSON line. The tests
below each read their part of that report, checked against the host side (servers the test
started itself, the hidden-seed secret it planted, a marker variable in its own environment).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ale import catalog
from ale.runner import agent_env, uids
from ale.runner import task_run as task_run_module  # where a task's run configuration (its secret) is made
from ale.runner.harness import Harness
from ale.runner.local import LocalRuntime
from ale.runner.options import AgentSpec, RunOptions
from ale.runner.progress import PlainProgress
from ale.runner.runtime import sandbox_path
from ale.runner.sandbox import SANDBOX_UID

PY = agent_env.PYTHON  # the sandbox's own interpreter
TASK = "cartpole-balance"
AGENT_TIME_S = 40.0
SECRET = hashlib.sha256(b"ale sandbox isolation test: the planted run-config secret").hexdigest()
MARKER_VAR = "ALE_TEST_HOST_ONLY_MARKER"
MARKER_VALUE = "host-marker-" + secrets.token_hex(8)
REPORT_PREFIX = "ALE-PROBE-REPORT "

# The variables docs/agent-contract.md promises, plus what the harness adds for Python and what
# the process itself introduces (bwrap's PWD, CPython's C-locale coercion LC_CTYPE).
CONTRACT_VARS = {
    "ALE_EVALUATOR",
    "ALE_TASK_ID",
    "ALE_TASK_VERSION",
    "ALE_TASK_DIR",
    "ALE_WORKSPACE",
    "ALE_MODE",
    "ALE_BUDGET_WALL_TIME_S",
    "ALE_BUDGET_ENV_STEPS",
    "ALE_BUDGET_LLM_TOKENS",
    "ALE_EVENT_FD",
    "HOME",
    "PATH",
}
HARMLESS_EXTRA_VARS = {"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PWD", "LC_CTYPE", "SHLVL", "_"}

# The probe. Placeholders are filled in by the test; the secret is embedded reversed, so the
# probe's own command line (which it can read in /proc) never holds it.
PROBE = r"""
import errno, json, os, socket, stat, time

TCP_PORT, UDP_PORT = __TCP_PORT__, __UDP_PORT__
HOST_NAMESERVER = __NAMESERVER__
HOST_WORKDIR = __WORKDIR__
SECRET = __SECRET_REVERSED__[::-1]
NEEDLES = (SECRET.encode(), bytes.fromhex(SECRET))
SKIP_TREES = {"/usr", "/proc", "/sys", *__PYTHON_ROOTS__}
R = {}
# Built at run time so the probe's own command line does not match them.
HARNESS_SOCK, EVALUATOR_LOG, RUN_DIR = ".harness" + ".sock", ".evaluator" + ".jsonl", "ale-" + "run-"
PROC_NEEDLES = [("ale_" + "evaluator").encode(), HARNESS_SOCK.encode(), ("/private" + "/").encode()]


def attempt(name, fn):
    try:
        R[name] = {"ok": True, "value": fn()}
    except BaseException as exc:  # noqa: BLE001 - the probe reports everything
        R[name] = {"ok": False, "error": type(exc).__name__, "errno": getattr(exc, "errno", None), "text": str(exc)}


def tcp(host, port):
    s = socket.create_connection((host, port), timeout=3)
    s.close()
    return "connected"


def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"ale-probe", (host, port))
    finally:
        s.close()
    return "sent"


def loopback_control():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    c = socket.create_connection(("127.0.0.1", port), timeout=3)
    c.close()
    srv.close()
    return "connected"


attempt("tcp_public", lambda: tcp("1.1.1.1", 53))
attempt("tcp_host_loopback", lambda: tcp("127.0.0.1", TCP_PORT))
attempt("tcp_sandbox_loopback_control", loopback_control)
attempt("udp_public", lambda: udp("8.8.8.8", 53))
attempt("udp_host_loopback", lambda: udp("127.0.0.1", UDP_PORT))
if HOST_NAMESERVER:
    attempt("udp_host_nameserver", lambda: udp(HOST_NAMESERVER, 53))
attempt("dns", lambda: [a[4][0] for a in socket.getaddrinfo("example.com", 80)])
attempt("interfaces", lambda: sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]))
attempt("hostname", socket.gethostname)

def evaluator_socket():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/ale/evaluator.sock")
    finally:
        s.close()
    return "connected"

attempt("evaluator_socket_control", evaluator_socket)
attempt("proc1_root", lambda: os.listdir("/proc/1/root"))
attempt("host_workdir_visible", lambda: os.path.exists(HOST_WORKDIR))

# Processes visible to the agent, and what their command lines and environments hold.
procs, secret_hits, evaluator_visible = [], [], []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for part in ("cmdline", "environ"):
        try:
            data = open(f"/proc/{pid}/{part}", "rb").read()
        except OSError:
            continue
        if part == "cmdline":
            procs.append(pid)
            if any(n in data for n in PROC_NEEDLES):
                evaluator_visible.append(pid)
        if any(n in data for n in NEEDLES):
            secret_hits.append(f"/proc/{pid}/{part}")
R["pids"] = procs
R["evaluator_in_proc"] = evaluator_visible

# The filesystem: every name and every regular file's contents, except in the read-only system
# and Python installation mounts (their mount options are checked below) and /proc, /sys.
suspicious, sockets, files_read = [], [], []
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP_TREES]
    for name in dirs + files:
        path = os.path.join(root, name)
        if name.endswith((HARNESS_SOCK, EVALUATOR_LOG)) or RUN_DIR in path:
            suspicious.append(path)
    for name in files:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            sockets.append(path)
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > 8 * 1024 * 1024:
            continue
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        files_read.append(path)
        if any(n in data for n in NEEDLES):
            secret_hits.append(path)
R["suspicious_names"] = suspicious
R["sockets"] = sorted(sockets)
R["secret_hits"] = secret_hits
R["files_read"] = files_read

# Writes.
writes = {}
for path in ("/workspace/probe", "/tmp/probe", "/usr/probe", "/task/probe", "/task/paper.md", "/etc/probe",
             "/probe", "/ale/probe", "/root/probe", __PY_PROBE_PATH__):
    try:
        with open(path, "a") as fh:
            fh.write("x")
        writes[path] = "written"
    except OSError as exc:
        writes[path] = errno.errorcode.get(exc.errno, str(exc.errno))
R["writes"] = writes
R["task_files"] = sorted(os.listdir("/task"))

mounts = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    mounts[fields[4]] = fields[5].split(",")
R["mounts"] = mounts

status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
FIELDS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")
R["status"] = {k: status[k].split() for k in FIELDS}
R["ids"] = [os.getuid(), os.geteuid(), os.getgid(), os.getegid()]
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue  # the descriptor listdir itself used, closed by now
R["fds"] = {fd: target for fd, target in fds.items() if not target.endswith("/fd")}
R["cwd"] = os.getcwd()
R["environ"] = dict(os.environ)
event = {"kind": "note", "data": {"text": "probe event"}}
os.write(int(os.environ["ALE_EVENT_FD"]), json.dumps(event).encode() + b"\n")
print(__REPORT_PREFIX__ + json.dumps(R), flush=True)
"""


def _python_roots() -> list[str]:
    """The agent's environment and the interpreter's trees, where the sandbox shows them."""
    env = agent_env.ensure()
    return [agent_env.MOUNT_POINT, *env.interpreter.binds, *env.interpreter.hidden]


def _host_nameserver() -> str:
    try:
        text = Path("/etc/resolv.conf").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and re.fullmatch(r"[0-9.]+", parts[1]):
            return parts[1]
    return ""


def _probe_code(tcp_port: int, udp_port: int, workdir: Path) -> str:
    roots = _python_roots()
    subs = {
        "__TCP_PORT__": str(tcp_port),
        "__UDP_PORT__": str(udp_port),
        "__NAMESERVER__": repr(_host_nameserver()),
        "__WORKDIR__": repr(str(workdir)),
        "__SECRET_REVERSED__": repr(SECRET[::-1]),
        "__PYTHON_ROOTS__": repr(roots),
        "__PY_PROBE_PATH__": repr(os.path.join(roots[0], "probe")),
        "__REPORT_PREFIX__": repr(REPORT_PREFIX),
    }
    code = PROBE
    for key, value in subs.items():
        code = code.replace(key, value)
    # a placeholder is __UPPER_CASE__ (the values, a temporary folder's name for one, may hold "__")
    assert not re.search(r"__[A-Z][A-Z0-9_]*__", code), "an unfilled placeholder"
    return code


class _Probe:
    """What the probe reported, the run's trajectory and what the host side saw."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []
        self.trajectory_text = ""
        self.tcp_connections = 0
        self.udp_datagrams = 0
        self.token_hex_sizes: list[int] = []
        self.outcome_status = ""
        self.outcome_agent: dict[str, Any] = {}


@pytest.fixture(scope="module")
def probe() -> Iterator[_Probe]:
    result = _Probe()
    workdir = Path(tempfile.mkdtemp(prefix="ale-iso-"))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    real_token_hex = secrets.token_hex

    def planted_token_hex(nbytes: int | None = None) -> str:
        result.token_hex_sizes.append(int(nbytes or 0))
        return SECRET if nbytes == 32 else real_token_hex(nbytes)

    try:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(16)
        tcp.setblocking(False)
        udp.bind(("127.0.0.1", 0))
        udp.setblocking(False)
        release, sha = catalog.release()
        options = RunOptions(
            tasks=(TASK,),
            agent=AgentSpec(
                name="isolation-probe",
                command=(PY, "-c", _probe_code(tcp.getsockname()[1], udp.getsockname()[1], workdir)),
            ),
            release=release,
            release_sha256=sha,
            release_name=release.release,
            episodes=2,
            agent_time_s=AGENT_TIME_S,
            workdir=workdir,
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(MARKER_VAR, MARKER_VALUE)
            mp.setattr(task_run_module, "secrets", types.SimpleNamespace(token_hex=planted_token_hex))
            harness = Harness(options, LocalRuntime(), PlainProgress(out=io.StringIO()))
            record = trio.run(harness.run)
        try:
            result.trajectory_text = record.trajectory.read_text(encoding="utf-8")
        finally:
            shutil.rmtree(record.root, ignore_errors=True)
        result.outcome_status = record.outcomes[0].status
        result.outcome_agent = record.outcomes[0].agent
        result.events = [json.loads(line) for line in result.trajectory_text.splitlines()]
        for event in result.events:
            text = event["data"].get("text", "") if event["kind"] == "stdout" else ""
            if text.startswith(REPORT_PREFIX):
                result.report = json.loads(text[len(REPORT_PREFIX) :])
        while True:
            try:
                conn, _ = tcp.accept()
            except BlockingIOError:
                break
            conn.close()
            result.tcp_connections += 1
        while True:
            try:
                udp.recvfrom(65536)
            except BlockingIOError:
                break
            result.udp_datagrams += 1
        yield result
    finally:
        tcp.close()
        udp.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def report(probe: _Probe) -> dict[str, Any]:
    if not probe.report:
        output = [(e["kind"], e["data"]) for e in probe.events if e["producer"] == "untrusted_agent"]
        pytest.fail(f"the probe agent printed no report ({probe.outcome_agent}); its output was {output!r}"[:20000])
    return probe.report


def _failed(entry: dict[str, Any]) -> bool:
    return not entry["ok"]


# --- network ---------------------------------------------------------------------------------


def test_loopback_inside_the_sandbox_works(report: dict[str, Any]) -> None:
    # The control: the probe's socket code works, so the failures below are the sandbox's doing.
    assert report["tcp_sandbox_loopback_control"] == {"ok": True, "value": "connected"}
    assert report["interfaces"] == {"ok": True, "value": ["lo"]}


def test_no_tcp_to_the_internet(report: dict[str, Any]) -> None:
    entry = report["tcp_public"]
    assert _failed(entry), entry
    assert entry["errno"] in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNREFUSED, None), entry


def test_no_tcp_to_the_hosts_loopback(probe: _Probe, report: dict[str, Any]) -> None:
    entry = report["tcp_host_loopback"]
    assert _failed(entry), entry
    assert entry["errno"] == errno.ECONNREFUSED, entry  # the sandbox's own, empty loopback
    assert probe.tcp_connections == 0


def test_no_udp_leaves_the_sandbox(probe: _Probe, report: dict[str, Any]) -> None:
    assert _failed(report["udp_public"]), report["udp_public"]
    if "udp_host_nameserver" in report:
        assert _failed(report["udp_host_nameserver"]), report["udp_host_nameserver"]
    # A datagram to 127.0.0.1 may be "sent" on the sandbox's loopback; the host must not get it.
    assert probe.udp_datagrams == 0


def test_dns_does_not_resolve(report: dict[str, Any]) -> None:
    entry = report["dns"]
    assert _failed(entry), entry
    assert entry["error"] == "gaierror"


def test_own_uts_namespace(report: dict[str, Any]) -> None:
    assert report["hostname"] == {"ok": True, "value": "sandbox"}


# --- the harness endpoint, the host, other processes -------------------------------------------


def test_the_agent_endpoint_is_reachable(report: dict[str, Any]) -> None:
    assert report["evaluator_socket_control"] == {"ok": True, "value": "connected"}


def test_harness_endpoint_and_private_folder_are_invisible(report: dict[str, Any]) -> None:
    assert "/task/paper.md" in report["files_read"], report["files_read"]  # the walk did read files
    assert report["suspicious_names"] == []
    assert report["sockets"] == ["/ale/evaluator.sock"]
    assert report["host_workdir_visible"] == {"ok": True, "value": False}


def test_no_host_processes_visible(report: dict[str, Any]) -> None:
    assert _failed(report["proc1_root"]), report["proc1_root"]
    assert report["evaluator_in_proc"] == []
    assert len(report["pids"]) <= 3, report["pids"]  # bwrap's init, perhaps setpriv, the probe


def test_run_config_secret_is_nowhere_the_agent_can_read(probe: _Probe, report: dict[str, Any]) -> None:
    assert 32 in probe.token_hex_sizes, "the planted secret was not used: the test checks nothing"
    assert probe.outcome_status == "not_completed"
    assert report["secret_hits"] == []
    assert SECRET not in json.dumps(report)


def test_run_config_secret_is_not_in_the_trajectory(probe: _Probe) -> None:
    assert probe.trajectory_text
    assert SECRET not in probe.trajectory_text


# --- identity and privileges ---------------------------------------------------------------------


def test_runs_as_the_runs_own_uid(report: dict[str, Any]) -> None:
    """As root, a uid from the documented per-run range (ale/runner/uids.py), never nobody: nobody
    owns this machine's reserved blocks, and every run would share its process count."""
    uid = report["ids"][0]
    if os.geteuid() == 0:
        assert uids.FIRST_UID <= uid < uids.FIRST_UID + uids.COUNT
    else:
        assert uid == SANDBOX_UID
    assert report["ids"] == [uid] * 4
    assert report["status"]["Uid"] == [str(uid)] * 4
    assert report["status"]["Groups"] == []


def test_no_descriptors_leak_in(report: dict[str, Any]) -> None:
    """Only stdin, stdout, stderr and the event channel: no pipe to the evaluator's run config, no socket."""
    fds = {int(fd) for fd in report["fds"]}
    assert fds == {0, 1, 2, int(report["environ"]["ALE_EVENT_FD"])}, report["fds"]


def test_no_capabilities(report: dict[str, Any]) -> None:
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(report["status"][cap][0], 16) == 0, cap
    assert report["status"]["NoNewPrivs"] == ["1"]


# --- filesystem ------------------------------------------------------------------------------------


def test_writes_only_to_workspace_and_tmp(report: dict[str, Any]) -> None:
    writes = report["writes"]
    written = {p for p, r in writes.items() if r == "written"}
    assert written == {"/workspace/probe", "/tmp/probe"}, writes
    for path, r in writes.items():
        if path not in written:
            assert r in ("EROFS", "EACCES", "EPERM", "ENOENT"), (path, r)


def test_task_folder_is_a_read_only_mount(report: dict[str, Any]) -> None:
    assert report["task_files"] == ["README.md", "paper.md", "task.json"]
    assert "ro" in report["mounts"]["/task"]
    assert "rw" in report["mounts"]["/workspace"]
    assert report["cwd"] == "/workspace"


def test_nothing_else_of_the_host_is_mounted(report: dict[str, Any]) -> None:
    """Every mount is one the contract names; host folders come in read-only."""
    roots = set(_python_roots())
    writable = {"/", "/tmp", "/workspace", "/ale/evaluator.sock", "/proc"}
    host_read_only = {"/usr", "/task", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives"}
    for point, options in report["mounts"].items():
        if point == "/dev" or point.startswith(("/dev/", "/proc/")):
            continue
        assert point in writable | host_read_only | roots, f"unexpected mount {point}"
        if point in host_read_only | roots:
            assert "ro" in options, (point, options)
    assert {"/", "/usr", "/tmp", "/workspace", "/task", "/ale/evaluator.sock", "/proc"} <= report["mounts"].keys()


# --- environment -----------------------------------------------------------------------------------


def test_contract_environment(report: dict[str, Any]) -> None:
    env = report["environ"]
    spec = catalog.get_task(TASK).spec
    assert env.keys() >= CONTRACT_VARS, CONTRACT_VARS - env.keys()
    expected = {
        "ALE_EVALUATOR": "unix:/ale/evaluator.sock",
        "ALE_TASK_ID": spec.id,
        "ALE_TASK_VERSION": spec.version,
        "ALE_TASK_DIR": "/task",
        "ALE_WORKSPACE": "/workspace",
        "ALE_MODE": spec.mode,
        "ALE_BUDGET_WALL_TIME_S": str(int(AGENT_TIME_S)),
        "ALE_BUDGET_ENV_STEPS": str(spec.budgets.env_steps),
        "ALE_BUDGET_LLM_TOKENS": str(spec.budgets.llm_tokens),
        "HOME": "/workspace",
        "PATH": sandbox_path(),
    }
    assert {k: env[k] for k in expected} == expected
    assert env["PATH"].startswith(f"{agent_env.MOUNT_POINT}/bin:")
    assert env["ALE_EVENT_FD"].isdigit()


def test_the_event_channel_works(probe: _Probe) -> None:
    notes = [e for e in probe.events if e["producer"] == "untrusted_agent" and e["kind"] == "note"]
    assert [e["data"] for e in notes] == [{"text": "probe event"}]


def test_no_host_environment_leaks(report: dict[str, Any]) -> None:
    env = report["environ"]
    assert MARKER_VAR not in env
    assert MARKER_VALUE not in json.dumps(env)
    assert set(env) - CONTRACT_VARS - HARMLESS_EXTRA_VARS == set()
