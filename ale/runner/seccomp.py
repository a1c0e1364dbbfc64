"""The agent sandbox's system-call filter: a seccomp BPF program for ``bwrap --seccomp FD``.

It follows **Docker's default seccomp profile** (moby, ``profiles/seccomp/default.json``) as
it applies to a container without capabilities: an allowlist, everything else refused with
``EPERM`` (its ``defaultErrnoRet: 1``), ``clone`` only without namespace flags (mask
``0x7E020000``), ``clone3`` refused with ``ENOSYS`` (its arguments sit in memory, which seccomp
cannot read, so libc falls back to ``clone``), ``personality`` only with the profile's five
values, and system calls newer than the profile ``ENOSYS`` (as runc applies it), so that a newer
libc falls back as on an older kernel. Where this filter is stricter than that profile (docs/agent-contract.md, "System
calls"):

* ``socket`` only for ``AF_UNIX`` (any type) and ``AF_INET``/``AF_INET6`` with type
  ``SOCK_STREAM`` or ``SOCK_DGRAM`` (no ``SOCK_RAW``, no SCTP); ``socketpair`` only for
  ``AF_UNIX``. The profile refuses only ``AF_VSOCK`` with a not-equal test that a domain with
  high bits set slips past; an allowlist of exact values cannot be fooled that way.
  ``AF_NETLINK`` is refused too: glibc's ``getaddrinfo`` then assumes both address families,
  which is all it uses netlink for; the sandbox's loopback needs no routing queries.
* ``ptrace``, ``process_vm_readv``/``process_vm_writev``: refused. seccomp cannot tell whether
  the target is the caller's own child, and the sandbox holds only the agent's own processes,
  so the only loss is debuggers (strace, gdb), which no task needs.
* ``io_uring_*``: refused (a path around this filter; Docker's profile dropped it later too).

Never in the allowlist, so refused: ``mount``/``umount2``/``pivot_root``/the new mount API,
``unshare``/``setns``, ``bpf``, ``perf_event_open``, ``keyctl``/``add_key``/``request_key``,
``userfaultfd``, ``kexec_*``, ``init_module``/``finit_module``/``delete_module``, ``reboot``,
``swapon``, ``acct``, ``quotactl``, the clock setters, ``iopl``/``ioperm``, ``syslog`` and
the rest. Only the native architecture (x86_64, aarch64) passes the arch check: i386 and x32
system calls on x86_64 and arm32 on aarch64 get ``EPERM``, so no second system-call table
(nor the multiplexed ``socketcall``) can route around the rules.

The program is compiled by libseccomp (Debian's ``libseccomp2``, which ``apt`` itself depends
on) through a small ctypes binding, so no Python package is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import hashlib
import os
import platform
import socket
from typing import Any

import attrs

PROFILE = "docker-default"
PROFILE_SOURCE = "moby profiles/seccomp/default.json (no capabilities), stricter: docs/agent-contract.md"

#: Docker's allowlist for a process without capabilities, grouped; minus ptrace,
#: process_vm_readv/writev and io_uring (see the module docstring). Names the running
#: architecture or libseccomp does not know are skipped.
ALLOWED: tuple[str, ...] = (
    # files and directories
    "access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range", "creat",
    "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate",
    "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64",
    "fdatasync", "flock", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate",
    "ftruncate64", "futimesat", "getcwd", "getdents", "getdents64", "lchown", "lchown32", "link", "linkat",
    "_llseek", "lseek", "lstat", "lstat64", "mkdir", "mkdirat", "mknod", "mknodat", "name_to_handle_at",
    "newfstatat", "open", "openat", "openat2", "pread64", "preadv", "preadv2", "pwrite64", "pwritev",
    "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "rename", "renameat", "renameat2",
    "rmdir", "sendfile", "sendfile64", "splice", "stat", "stat64", "statfs", "statfs64", "statx",
    "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate", "truncate64", "umask",
    "unlink", "unlinkat", "utime", "utimensat", "utimensat_time64", "utimes", "vmsplice", "write", "writev",
    "cachestat",
    # extended attributes, inotify, fanotify marks
    "fgetxattr", "flistxattr", "fremovexattr", "fsetxattr", "getxattr", "lgetxattr", "listxattr",
    "llistxattr", "lremovexattr", "lsetxattr", "removexattr", "setxattr", "fanotify_mark",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
    # memory
    "brk", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mlock", "mlock2",
    "mlockall", "mmap", "mmap2", "mprotect", "mremap", "msync", "munlock", "munlockall", "munmap",
    "pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages", "process_mrelease",
    # processes, threads, signals
    "execve", "execveat", "exit", "exit_group", "fork", "vfork", "wait4", "waitid", "waitpid", "kill",
    "tkill", "tgkill", "pidfd_open", "pidfd_send_signal", "rt_sigaction", "rt_sigpending",
    "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sigaltstack", "signalfd", "signalfd4", "sigprocmask",
    "sigreturn", "restart_syscall", "pause", "futex", "futex_time64", "futex_waitv", "get_robust_list",
    "set_robust_list", "set_tid_address", "rseq", "get_thread_area", "set_thread_area", "arch_prctl",
    "modify_ldt", "prctl", "seccomp", "capget", "capset", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self",
    # identity and limits (the process has no capabilities: these only drop)
    "getegid", "getegid32", "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32",
    "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getresgid", "getresgid32", "getresuid",
    "getresuid32", "getrlimit", "ugetrlimit", "getrusage", "getsid", "gettid", "getuid", "getuid32",
    "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32", "setgroups", "setgroups32",
    "setpgid", "setpriority", "setregid", "setregid32", "setresgid", "setresgid32", "setresuid",
    "setresuid32", "setreuid", "setreuid32", "setrlimit", "prlimit64", "setsid", "setuid", "setuid32",
    "ioprio_get", "ioprio_set",
    # scheduling
    "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "getcpu",
    # time
    "adjtimex", "alarm", "clock_adjtime", "clock_adjtime64", "clock_getres", "clock_getres_time64",
    "clock_gettime", "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "getitimer",
    "gettimeofday", "nanosleep", "setitimer", "time", "times", "timer_create", "timer_delete",
    "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64",
    "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64",
    # waiting and events
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
    "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "poll", "ppoll", "ppoll_time64", "pselect6",
    "pselect6_time64", "select", "_newselect", "pipe", "pipe2",
    # asynchronous I/O (not io_uring)
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "io_setup",
    "io_submit",
    # System V and POSIX IPC (the sandbox has its own IPC namespace)
    "ipc", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64",
    "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "msgctl", "msgget", "msgrcv", "msgsnd", "semctl",
    "semget", "semop", "semtimedop", "semtimedop_time64", "shmat", "shmctl", "shmdt", "shmget",
    # sockets once opened (which ones may be opened: the rules below)
    "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen", "recv",
    "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg", "sendmsg", "sendto",
    "setsockopt", "shutdown",
    # system information
    "getrandom", "sysinfo", "uname", "ioctl",
    # aarch64/arm only
    "sync_file_range2", "arm_fadvise64_64", "arm_sync_file_range", "breakpoint", "cacheflush", "set_tls",
)  # fmt: skip

#: personality(2) values the profile allows: PER_LINUX, UNAME26, ADDR_NO_RANDOMIZE (with and
#: without UNAME26), and the query 0xffffffff.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
#: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
NAMESPACE_FLAGS = 0x7E020000
SOCK_TYPE_MASK = 0xF
#: (domain, socket types or None for any) that socket(2) may open.
SOCKETS: tuple[tuple[int, tuple[int, ...] | None], ...] = (
    (socket.AF_UNIX, None),
    (socket.AF_INET, (socket.SOCK_STREAM, socket.SOCK_DGRAM)),
    (socket.AF_INET6, (socket.SOCK_STREAM, socket.SOCK_DGRAM)),
)
#: Refusals that are not EPERM: clone3 must look absent so that libc falls back to clone.
ENOSYS_CALLS = ("clone3",)
#: System-call numbers newer than any call the profile names (it ends with Linux 5.16's 450;
#: from 424 on, every architecture numbers new calls alike) that the allowlist does not name
#: answer ENOSYS, as runc applies Docker's profile: a newer libc probing one falls back, as it
#: does on an older kernel, instead of failing on EPERM.
NEWER_CALLS = range(451, 600)

# libseccomp's ABI (seccomp.h, stable since libseccomp.so.2).
_ACT_ALLOW = 0x7FFF0000
_FLTATR_ACT_BADARCH = 2
_FLTATR_CTL_OPTIMIZE = 8
_CMP_EQ = 4
_CMP_MASKED_EQ = 7
_ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_*, the seccomp_data.arch values


def act_errno(code: int) -> int:
    """SCMP_ACT_ERRNO(code): the system call returns -code."""
    return 0x00050000 | (code & 0xFFFF)


class SeccompUnavailable(RuntimeError):
    """No filter can be built here (libseccomp missing, an architecture this filter does not cover)."""


class _ArgCmp(ctypes.Structure):
    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


class _Version(ctypes.Structure):
    _fields_ = (("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint))


@attrs.frozen
class Filter:
    """A compiled program and what the manifest says about it."""

    program: bytes  # struct sock_filter[], as bwrap --seccomp reads it
    arch: str
    libseccomp: str

    def describe(self) -> dict[str, Any]:
        return {
            "profile": PROFILE,
            "source": PROFILE_SOURCE,
            "arch": self.arch,
            "libseccomp": self.libseccomp,
            "program_sha256": hashlib.sha256(self.program).hexdigest(),
        }


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp is not installed (apt-get install libseccomp2): {exc}") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = (ctypes.c_uint32,)
    lib.seccomp_release.argtypes = (ctypes.c_void_p,)
    lib.seccomp_release.restype = None
    lib.seccomp_attr_set.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)
    lib.seccomp_rule_add_array.argtypes = (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    )
    lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    lib.seccomp_export_bpf.argtypes = (ctypes.c_void_p, ctypes.c_int)
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    return lib


class _Builder:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.ctx = lib.seccomp_init(act_errno(errno.EPERM))
        self.used: set[int] = set()
        if not self.ctx:
            raise SeccompUnavailable("seccomp_init failed")

    def nr(self, name: str) -> int | None:
        """The native number of a system call, or None where this architecture has no such call."""
        nr = int(self.lib.seccomp_syscall_resolve_name(name.encode()))
        return nr if nr >= 0 else None

    def rule(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        nr = self.nr(name)
        if nr is not None:
            self.rule_nr(action, nr, *cmps, name=name)

    def rule_nr(self, action: int, nr: int, *cmps: tuple[int, int, int, int], name: str = "") -> None:
        array = (_ArgCmp * max(len(cmps), 1))(*(_ArgCmp(*c) for c in cmps))
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(cmps), array)
        if rc != 0:
            raise SeccompUnavailable(f"libseccomp refused the rule for {name or nr}: {os.strerror(-rc)}")
        self.used.add(nr)

    def export(self) -> bytes:
        read_fd, write_fd = os.pipe()
        try:
            rc = self.lib.seccomp_export_bpf(self.ctx, write_fd)
            os.close(write_fd)
            write_fd = -1
            if rc != 0:
                raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            chunks = []
            while chunk := os.read(read_fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)

    def release(self) -> None:
        self.lib.seccomp_release(self.ctx)


def _rules(b: _Builder) -> None:
    for name in ALLOWED:
        b.rule(_ACT_ALLOW, name)
    for name in ENOSYS_CALLS:
        b.rule(act_errno(errno.ENOSYS), name)
    b.rule(_ACT_ALLOW, "clone", (0, _CMP_MASKED_EQ, NAMESPACE_FLAGS, 0))
    for value in PERSONALITIES:
        b.rule(_ACT_ALLOW, "personality", (0, _CMP_EQ, value, 0))
    for domain, types in SOCKETS:
        if types is None:
            b.rule(_ACT_ALLOW, "socket", (0, _CMP_EQ, domain, 0))
            continue
        for kind in types:
            b.rule(_ACT_ALLOW, "socket", (0, _CMP_EQ, domain, 0), (1, _CMP_MASKED_EQ, SOCK_TYPE_MASK, kind))
    b.rule(_ACT_ALLOW, "socketpair", (0, _CMP_EQ, socket.AF_UNIX, 0))
    for nr in NEWER_CALLS:
        if nr not in b.used:
            b.rule_nr(act_errno(errno.ENOSYS), nr)


@functools.cache
def build() -> Filter:
    """The filter for this machine's architecture (compiled once per process)."""
    arch = platform.machine()
    if arch not in _ARCHES:
        raise SeccompUnavailable(f"no system-call filter for the {arch} architecture (only {', '.join(_ARCHES)})")
    lib = _load()
    if lib.seccomp_arch_native() != _ARCHES[arch]:
        raise SeccompUnavailable(f"libseccomp's native architecture is not {arch} (an x32 or compat Python?)")
    version = lib.seccomp_version().contents
    b = _Builder(lib)
    try:
        # Foreign system-call tables (i386 and x32 on x86_64, arm32 on aarch64): refused like the rest.
        if lib.seccomp_attr_set(b.ctx, _FLTATR_ACT_BADARCH, act_errno(errno.EPERM)) != 0:
            raise SeccompUnavailable("libseccomp cannot set the bad-architecture action")
        lib.seccomp_attr_set(b.ctx, _FLTATR_CTL_OPTIMIZE, 2)  # a binary tree, where libseccomp has it
        _rules(b)
        program = b.export()
    finally:
        b.release()
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported a malformed program ({len(program)} bytes)")
    return Filter(program=program, arch=arch, libseccomp=f"{version.major}.{version.minor}.{version.micro}")


def program_fd(flt: Filter) -> int:
    """A descriptor to read the program from, positioned at its start (the caller closes it)."""
    fd = os.memfd_create("ale-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, flt.program)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
