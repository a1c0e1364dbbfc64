"""The sandbox's system-call filter (ale/runner/seccomp.py, docs/agent-contract.md "System calls").

Two halves. The compiled program is run here, in a small classic-BPF interpreter, on synthetic
``seccomp_data`` (system-call number, architecture, arguments): every refusal the contract lists,
and the tricks around it (a foreign architecture's table, x32 numbers, high bits on a socket
domain), without a kernel in the loop. Then real sandboxes (bubblewrap, the local runtime) show
that the kernel enforces it on the agent's processes and that ordinary tools still run.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_tools import backends, make_runtime, missing, need_bwrap

from ale.runner import agent_env, sandbox, seccomp
from ale.runner.local import LocalRuntime
from ale.runner.runtime import SandboxSpec, sandbox_path

PY = agent_env.PYTHON  # the sandbox's own interpreter (docs/agent-contract.md)
AUDIT_ARCH_I386 = 0x40000003
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW = 0x7FFF0000
RET_EPERM = seccomp.act_errno(errno.EPERM)
RET_ENOSYS = seccomp.act_errno(errno.ENOSYS)
CLONE_THREAD_FLAGS = 0x003D0F00  # what glibc's pthread_create passes
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
X86_64_NUMBERS = {"read": 0, "socket": 41, "clone": 56, "mount": 165, "unshare": 272, "clone3": 435}


# --- a classic BPF interpreter for seccomp programs --------------------------------------------------


def run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's seccomp would return for this system call (the subset libseccomp emits)."""
    args = tuple(args) + (0,) * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(a & (2**64 - 1) for a in args))
    insns = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    a = x = 0
    mem = [0] * 16
    pc = 0
    for _ in range(100_000):
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if cls == 0x00:  # BPF_LD
            mode = code & 0xE0
            if mode == 0x20:  # BPF_ABS, word
                a = struct.unpack_from("<I", data, k)[0]
            elif mode == 0x00:  # BPF_IMM
                a = k
            elif mode == 0x60:  # BPF_MEM
                a = mem[k]
            else:
                raise AssertionError(f"unexpected load {code:#x}")
        elif cls == 0x01:  # BPF_LDX
            x = mem[k] if code & 0xE0 == 0x60 else k
        elif cls == 0x02:  # BPF_ST
            mem[k] = a
        elif cls == 0x03:  # BPF_STX
            mem[k] = x
        elif cls == 0x04:  # BPF_ALU
            op, src = code & 0xF0, (x if code & 0x08 else k)
            if op == 0x50:
                a &= src
            elif op == 0x40:
                a |= src
            elif op == 0x00:
                a = (a + src) & 0xFFFFFFFF
            elif op == 0x10:
                a = (a - src) & 0xFFFFFFFF
            else:
                raise AssertionError(f"unexpected alu {code:#x}")
        elif cls == 0x05:  # BPF_JMP
            op, src = code & 0xF0, (x if code & 0x08 else k)
            if op == 0x00:  # BPF_JA
                pc += k
                continue
            taken = {0x10: a == src, 0x20: a > src, 0x30: a >= src, 0x40: bool(a & src)}[op]
            pc += jt if taken else jf
        elif cls == 0x06:  # BPF_RET
            return k if code & 0x18 == 0 else a
        elif cls == 0x07:  # BPF_MISC
            if code & 0xF8 == 0x00:
                x = a
            else:
                a = x
        else:
            raise AssertionError(f"unexpected class {code:#x}")
    raise AssertionError("the program did not return")


@pytest.fixture(scope="module")
def flt() -> seccomp.Filter:
    try:
        return seccomp.build()
    except seccomp.SeccompUnavailable as exc:
        missing(str(exc))
        raise


@pytest.fixture(scope="module")
def native() -> int:
    return {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(os.uname().machine, 0)


def nr_of(name: str) -> int:
    lib = seccomp._load()
    nr = int(lib.seccomp_syscall_resolve_name(name.encode()))
    assert nr >= 0, name
    return nr


def verdict(flt: seccomp.Filter, native: int, name: str, *args: int) -> int:
    return run_bpf(flt.program, nr_of(name), native, args)


def test_the_resolver_gives_the_kernels_numbers() -> None:
    """The rules are only as right as the numbers; on x86_64 a few are checked against the kernel ABI."""
    if os.uname().machine != "x86_64":
        pytest.skip("x86_64 numbers")
    assert {name: nr_of(name) for name in X86_64_NUMBERS} == X86_64_NUMBERS


@pytest.mark.parametrize(
    "name",
    [
        "mount", "umount2", "pivot_root", "unshare", "setns", "bpf", "perf_event_open", "keyctl", "add_key",
        "request_key", "userfaultfd", "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load",
        "init_module", "finit_module", "delete_module", "reboot", "swapon", "io_uring_setup", "open_tree",
        "move_mount", "fsopen", "chroot", "settimeofday", "syslog", "acct", "iopl",
    ],
)  # fmt: skip
def test_dangerous_calls_are_refused_with_eperm(flt: seccomp.Filter, native: int, name: str) -> None:
    try:
        nr = nr_of(name)
    except AssertionError:
        pytest.skip(f"{name} does not exist on {os.uname().machine}")
    assert run_bpf(flt.program, nr, native) == RET_EPERM


@pytest.mark.parametrize(
    ("domain", "kind"),
    [
        (socket.AF_UNIX, socket.SOCK_STREAM),
        (socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC),
        (socket.AF_UNIX, socket.SOCK_SEQPACKET),
        (socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC),
        (socket.AF_INET, socket.SOCK_DGRAM),
        (socket.AF_INET6, socket.SOCK_STREAM),
        (socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC),
    ],
)
def test_unix_and_ip_sockets_are_allowed(flt: seccomp.Filter, native: int, domain: int, kind: int) -> None:
    assert verdict(flt, native, "socket", domain, kind, 0) == RET_ALLOW


@pytest.mark.parametrize(
    ("domain", "kind"),
    [
        (40, socket.SOCK_STREAM),  # AF_VSOCK: reaches the VM host
        (socket.AF_PACKET, socket.SOCK_RAW),
        (socket.AF_NETLINK, socket.SOCK_RAW),
        (socket.AF_NETLINK, socket.SOCK_DGRAM),
        (socket.AF_INET, socket.SOCK_RAW),
        (socket.AF_INET6, socket.SOCK_RAW | socket.SOCK_CLOEXEC),
        (socket.AF_INET, socket.SOCK_SEQPACKET),  # SCTP
        (31, socket.SOCK_STREAM),  # AF_BLUETOOTH
        ((1 << 32) | socket.AF_UNIX, socket.SOCK_STREAM),  # high bits: the kernel would read AF_UNIX...
        ((1 << 32) | 40, socket.SOCK_STREAM),  # ...or AF_VSOCK; exact matches refuse both
    ],
)
def test_other_socket_families_and_raw_sockets_are_refused(
    flt: seccomp.Filter, native: int, domain: int, kind: int
) -> None:
    assert verdict(flt, native, "socket", domain, kind, 0) == RET_EPERM


def test_socketpair_only_for_unix(flt: seccomp.Filter, native: int) -> None:
    assert verdict(flt, native, "socketpair", socket.AF_UNIX, socket.SOCK_STREAM) == RET_ALLOW
    assert verdict(flt, native, "socketpair", 40, socket.SOCK_STREAM) == RET_EPERM


def test_clone_without_namespace_flags_only(flt: seccomp.Filter, native: int) -> None:
    assert verdict(flt, native, "clone", CLONE_THREAD_FLAGS) == RET_ALLOW
    assert verdict(flt, native, "clone", 0x01200011) == RET_ALLOW  # fork(): CHILD_SETTID|CHILD_CLEARTID|SIGCHLD
    for flag in (CLONE_NEWUSER, CLONE_NEWNET, 0x00020000, 0x20000000, 0x02000000, 0x04000000, 0x08000000):
        assert verdict(flt, native, "clone", 0x11 | flag) == RET_EPERM, hex(flag)


def test_clone3_looks_absent_so_libc_falls_back(flt: seccomp.Filter, native: int) -> None:
    assert verdict(flt, native, "clone3", 0, 88) == RET_ENOSYS


def test_system_calls_newer_than_the_profile_look_absent(flt: seccomp.Filter, native: int) -> None:
    """A newer libc probing a call this filter has never heard of falls back (ENOSYS), as on an
    older kernel; calls the allowlist names stay allowed whatever their number."""
    for nr in (454, 462, 470, 599):  # futex_wake, mseal, and calls not yet made
        assert run_bpf(flt.program, nr, native) == RET_ENOSYS, nr
    assert run_bpf(flt.program, 600, native) == RET_EPERM
    if int(seccomp._load().seccomp_syscall_resolve_name(b"fchmodat2")) == 452:
        assert run_bpf(flt.program, 452, native) == RET_ALLOW  # in the allowlist
    assert verdict(flt, native, "futex_waitv") == RET_ALLOW


def test_personality_only_the_profiles_values(flt: seccomp.Filter, native: int) -> None:
    for value in seccomp.PERSONALITIES:
        assert verdict(flt, native, "personality", value) == RET_ALLOW
    assert verdict(flt, native, "personality", 0x0040000) == RET_EPERM  # READ_IMPLIES_EXEC


def test_ordinary_calls_are_allowed(flt: seccomp.Filter, native: int) -> None:
    for name in ("read", "write", "openat", "execve", "mmap", "futex", "epoll_wait", "exit_group", "wait4"):
        assert verdict(flt, native, name) == RET_ALLOW, name


def test_foreign_architecture_and_x32_tables_are_refused(flt: seccomp.Filter, native: int) -> None:
    assert run_bpf(flt.program, 20, AUDIT_ARCH_I386) == RET_EPERM  # i386 getpid via int 0x80
    assert run_bpf(flt.program, 102, AUDIT_ARCH_I386, (1, 0)) == RET_EPERM  # i386 socketcall
    if os.uname().machine == "x86_64":
        assert run_bpf(flt.program, X32_SYSCALL_BIT | 41, native, (40, 1, 0)) == RET_EPERM  # x32 socket
        assert run_bpf(flt.program, X32_SYSCALL_BIT | 39, native) == RET_EPERM  # x32 getpid


def test_the_manifest_names_the_profile(flt: seccomp.Filter) -> None:
    d = flt.describe()
    assert d["profile"] == "docker-default"
    assert "moby profiles/seccomp/default.json" in d["source"]
    assert len(d["program_sha256"]) == 64
    assert seccomp.build() is flt  # compiled once per process


# --- the kernel enforces it on real sandboxes --------------------------------------------------------

PROBE = r"""
import errno, json, os, shutil, socket, subprocess
R = {}
def attempt(name, fn):
    try:
        R[name] = ["ok", fn()]
    except OSError as exc:
        R[name] = ["error", errno.errorcode.get(exc.errno, str(exc.errno))]
def sock(*a):
    s = socket.socket(*a)
    s.close()
    return "opened"
def run(*argv):
    if shutil.which(argv[0]) is None:  # an OCI runtime's agent image has no util-linux
        return None
    p = subprocess.run(argv, capture_output=True, text=True)
    return [p.returncode, (p.stdout + p.stderr)[-300:]]
R["status"] = {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
               if k in ("Seccomp", "Seccomp_filters", "NoNewPrivs")}
attempt("vsock", lambda: sock(40, socket.SOCK_STREAM))
attempt("packet", lambda: sock(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt("netlink", lambda: sock(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("raw_inet", lambda: sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("unix", lambda: sock(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("inet", lambda: sock(socket.AF_INET, socket.SOCK_STREAM))
attempt("inet6_dgram", lambda: sock(socket.AF_INET6, socket.SOCK_DGRAM))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def unshare(flags):
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    return "unshared"
attempt("unshare_user", lambda: unshare(0x10000000))
attempt("unshare_net", lambda: unshare(0x40000000))
os.makedirs("/tmp/m", exist_ok=True)
def mount():
    if libc.mount(b"none", b"/tmp/m", b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")
    return "mounted"
attempt("mount_call", mount)
R["unshare_tool"] = run("unshare", "-U", "-r", "true")
R["mount_tool"] = run("mount", "-t", "tmpfs", "none", "/tmp/m")
R["sh"] = run("sh", "-c", "echo $((6*7))")
R["ls"] = run("ls", "/task")
THREADS = "import threading; t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()"
R["python_threads"] = run(__PY__, "-c", THREADS)
R["git"] = run("git", "--version") if __HAS_GIT__ else None
def loopback():
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    c = socket.create_connection(srv.getsockname(), timeout=3); c.close(); srv.close()
    return "connected"
attempt("loopback_tcp", loopback)
def evaluator():
    s = socket.socket(socket.AF_UNIX); s.connect("/ale/evaluator.sock"); s.close()
    return "connected"
attempt("evaluator_socket", evaluator)
print("REPORT " + json.dumps(R), flush=True)
"""


@pytest.fixture(scope="module", params=backends(), ids=[b.id for b in backends()])
def report(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """What a probe saw inside a real sandbox of each backend (a runtime conformance check)."""
    import trio

    runtime = make_runtime(request.param, "seccomp")
    folder = Path(tempfile.mkdtemp(prefix="ale-sc-"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        workspace, task = folder / "workspace", folder / "task"
        workspace.mkdir()
        task.mkdir()
        (task / "task.json").write_text("{}\n")
        folder.chmod(0o755)
        task.chmod(0o755)
        if os.geteuid() == 0:
            os.chown(workspace, sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)
        listener.bind(str(folder / "evaluator.sock"))
        listener.listen(4)
        (folder / "evaluator.sock").chmod(0o666)
        code = PROBE.replace("__PY__", repr(PY)).replace("__HAS_GIT__", repr(shutil.which("git") is not None))
        spec = SandboxSpec(
            command=(PY, "-c", code),
            workspace=workspace,
            workspace_writable=True,
            task_dir=task,
            evaluator_socket=folder / "evaluator.sock",
            env={"HOME": "/workspace", "PATH": sandbox_path()},
            wall_time_s=60,
        )
        lines: list[tuple[str, bytes]] = []
        result = trio.run(lambda: runtime.run_sandboxed(spec, lambda s, line: lines.append((s, line))))
        for stream, line in lines:
            if stream == "stdout" and line.startswith(b"REPORT "):
                yield json.loads(line[7:])
                return
        pytest.fail(f"no report ({result}): {lines!r}")
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_filter_is_installed(report: dict[str, Any]) -> None:
    assert report["status"]["Seccomp"] == "2"
    assert report["status"]["NoNewPrivs"] == "1"


def test_vsock_packet_netlink_and_raw_sockets_fail_with_eperm(report: dict[str, Any]) -> None:
    for name in ("vsock", "packet", "netlink", "raw_inet"):
        assert report[name] == ["error", "EPERM"], name


def test_unix_and_ip_sockets_still_work(report: dict[str, Any]) -> None:
    for name in ("unix", "inet", "inet6_dgram"):
        assert report[name] == ["ok", "opened"], name
    assert report["loopback_tcp"] == ["ok", "connected"]
    assert report["evaluator_socket"] == ["ok", "connected"]


def test_no_new_namespaces(report: dict[str, Any]) -> None:
    assert report["unshare_user"] == ["error", "EPERM"]
    assert report["unshare_net"] == ["error", "EPERM"]
    if report["unshare_tool"] is not None:  # the tool is there (the host's, under bubblewrap)
        code, text = report["unshare_tool"]
        assert code != 0
        assert "Operation not permitted" in text


def test_mount_fails(report: dict[str, Any]) -> None:
    assert report["mount_call"] == ["error", "EPERM"]
    if report["mount_tool"] is not None:
        code, _text = report["mount_tool"]
        assert code != 0


def test_ordinary_tools_still_run(report: dict[str, Any]) -> None:
    assert report["sh"] == [0, "42\n"]
    assert report["ls"] == [0, "task.json\n"]
    assert report["python_threads"] == [0, "thread\n"]
    if report["git"] is not None:
        assert report["git"][0] == 0
        assert report["git"][1].startswith("git version")


def test_the_argv_hands_the_filter_to_bwrap(tmp_path: Path) -> None:
    spec = SandboxSpec(
        command=("true",),
        workspace=tmp_path,
        workspace_writable=True,
        task_dir=tmp_path,
        evaluator_socket=tmp_path / "s",
        env={},
        agent_env=agent_env.AgentEnv(
            root=tmp_path / "agent-env",
            digest="0" * 64,
            interpreter=agent_env.Interpreter(executable="/usr/bin/python3", version="3.11", binds=(), hidden=()),
            modules=("ale", "ale.client"),
            distributions=(),
        ),
    )
    argv = sandbox.bwrap_argv(spec, as_root=True, seccomp_fd=9)
    i = argv.index("--seccomp")
    assert argv[i + 1] == "9"
    assert i < len(argv) - 1 - argv[::-1].index("--")  # a bwrap option, before the command
    assert "--seccomp" not in sandbox.bwrap_argv(spec, as_root=True)


# --- what the manifest records ---------------------------------------------------------------------


def test_the_runtime_attests_the_filter_and_the_manifest_schema_accepts_it() -> None:
    need_bwrap()
    from ale.schemas import validator

    runtime = LocalRuntime()
    runtime.check()
    entry = runtime.attestation()["isolation"]["seccomp"]
    if not entry["in_force"]:
        missing(entry["reason"])
    assert entry["details"]["profile"] == "docker-default"
    schema = validator("manifest").schema
    runtime_schema = {**schema["$defs"]["runtime"], "$defs": schema["$defs"]}
    import jsonschema

    jsonschema.validate(runtime.attestation(), runtime_schema)


def test_a_machine_without_libseccomp_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """No filter is no silent downgrade: check() passes, the manifest says in_force false and why."""
    need_bwrap()
    from ale.runner import isolation

    def unavailable() -> seccomp.Filter:
        raise seccomp.SeccompUnavailable("libseccomp is not installed (apt-get install libseccomp2): test")

    monkeypatch.setattr(seccomp, "build", unavailable)
    probed = isolation.probe()
    assert probed.filter is None
    assert probed.describe()["seccomp"] == {
        "in_force": False,
        "reason": "libseccomp is not installed (apt-get install libseccomp2): test",
        "details": None,
    }
