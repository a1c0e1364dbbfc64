"""The first process of an OCI runtime's sandbox: what bubblewrap and the kernel do for the local
runtime, done inside the container before the agent's command runs.

The OCI runtimes (:mod:`ale.runner.oci`) run this file's source with the agent image's own
Python (``/ale/python/bin/python3 -I -S -c SOURCE ARGS -- COMMAND``): standard library only, and
nothing of it is in the image, which holds nothing of the harness. In this order it

1. sets ``RLIMIT_AS`` (``--as BYTES``): no engine has a flag for it (``--ulimit`` knows no ``as``);
2. opens the event channel, a FIFO the harness reads, and makes it descriptor 3 (``--events
   PATH``): neither engine can hand a container a descriptor of the caller's (docker's CLI talks to
   a daemon), so the channel goes through a file only this container mounts; or, for a container
   with no channel (the evaluator's), ``--alive PATH``, a FIFO the harness holds open and never
   reads. Either is opened without waiting: a FIFO nobody reads means the harness is gone;
3. keeps exactly the environment variables named by ``--keep`` (the engines add their own:
   ``HOSTNAME``, ``container``, ``TERM`` and the image's ``ENV``); without ``--keep``, all of them
   (with ``LC_CTYPE`` where Python's locale coercion set it: PEP 538);
4. installs the local runtime's system-call filter (``--seccomp PATH``: the very BPF program
   :func:`ale.runner.seccomp.build` compiles for bubblewrap), on top of the engine's default
   profile; the filter is in force before the command's first instruction;
5. starts the command (``PATH`` looked up in the kept environment) and stays as the container's
   first process, as bubblewrap's own stays for the local runtime: it passes SIGTERM, SIGINT,
   SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to every other process of the container (``kill(-1)``),
   reaps what is orphaned, and ends when the command does, with its exit status (128 + N for a
   command killed by signal N); the engine then ends the rest. So the command is not the
   namespace's PID 1 (which ignores SIGTERM without a handler), and a process it leaves behind
   (the gateway relay, which forks itself away from the command) is no child of the command;
6. **ends with its harness**: once the FIFO of step 2 has no reader left (the harness closed it
   after the sandbox, or died: the kernel closes a killed process's descriptors, and only the
   harness reads it: the agent may only write it), it kills every other process of the container
   and ends (status 137). An attached CLI outlives a container's harness, and the container the
   CLI, so without this a killed harness's containers would run on until something removed them.

Any failure before the command starts ends it with status 126 (127: no such command) and one
line on stderr; the command never runs without its filter.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys

EVENT_FD = 3
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def _fail(message: str, status: int = 126) -> None:
    sys.stderr.write(f"ale sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(status)


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """``--name value`` pairs up to ``--``, and the command after it."""
    if "--" not in argv:
        _fail("no command (expected -- COMMAND...)")
    cut = argv.index("--")
    head, command = argv[:cut], argv[cut + 1 :]
    if len(head) % 2 or not command:
        _fail("usage: [--as BYTES] [--events PATH | --alive PATH] [--keep NAMES] [--seccomp PATH] -- COMMAND...")
    opts = dict(zip(head[::2], head[1::2], strict=True))
    unknown = set(opts) - {"--as", "--events", "--alive", "--keep", "--seccomp"}
    if unknown:
        _fail(f"unknown option {sorted(unknown)[0]}")
    return opts, command


def _install_filter(path: str) -> None:
    import ctypes

    with open(path, "rb") as fh:
        program = fh.read()
    if not program or len(program) % 8 or len(program) // 8 > 4096:
        _fail(f"{path} is not a BPF program")

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        _fail(f"cannot set no_new_privs: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        _fail(f"cannot install the system-call filter: {os.strerror(ctypes.get_errno())}")


def _open_fifo(path: str) -> int:
    """``path`` opened for writing without waiting for a reader (ENXIO: nobody reads it), blocking after."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _setup(opts: dict[str, str]) -> tuple[dict[str, str], int | None]:
    """Steps 1 to 4: the kept environment, and the descriptor whose reader is the harness."""
    if "--as" in opts:
        import resource

        limit = int(opts["--as"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    watched = None
    if "--events" in opts:
        fd = _open_fifo(opts["--events"])
        if fd != EVENT_FD:
            os.dup2(fd, EVENT_FD, inheritable=True)
            os.close(fd)
        else:
            os.set_inheritable(fd, True)
        watched = EVENT_FD
    elif "--alive" in opts:
        watched = _open_fifo(opts["--alive"])  # close-on-exec: the command never holds it
    if "--keep" in opts:
        names = [n for n in opts["--keep"].split(",") if n]
        env = {name: os.environ[name] for name in names if name in os.environ}
    else:
        env = dict(os.environ)
    if "--seccomp" in opts:
        _install_filter(opts["--seccomp"])
    return env, watched


def main(argv: list[str]) -> None:
    opts, command = _options(argv)
    try:
        env, watched = _setup(opts)
    except (OSError, ValueError) as exc:
        _fail(f"cannot set up the sandbox: {exc}")
    os._exit(_supervise(command, env, watched))


_child = 0


def _forward(signum: int, _frame: object) -> None:
    # From the namespace's first process, -1 is every other process in it; anywhere else (a test
    # on the host) only the command.
    with contextlib.suppress(OSError):
        os.kill(-1 if os.getpid() == 1 else _child, signum)


def _start(command: list[str], env: dict[str, str]) -> int:
    """Fork and exec the command with default dispositions; its pid (a failed exec ends the launcher)."""
    global _child
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the child has its own dispositions
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    child = _child = os.fork()
    if child == 0:
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        try:
            os.execvpe(command[0], command, env)
        except OSError as exc:
            os.write(write_end, f"{exc.errno} {exc.strerror}".encode())
        os._exit(127)
    os.close(write_end)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    failed = os.read(read_end, 512).decode(errors="replace")  # empty once the exec succeeded
    os.close(read_end)
    if failed:
        number, _, reason = failed.partition(" ")
        os.waitpid(child, 0)
        _fail(f"cannot run {command[0]}: {reason}", 127 if number == "2" else 126)
    return child


def _reaped(child: int) -> int | None:
    """Reap every ended process; the command's exit status once it has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def _supervise(command: list[str], env: dict[str, str], watched: int | None) -> int:
    """Run the command as a child; pass signals on, reap orphans; its exit status once it ends, or
    137 once ``watched`` (a FIFO's write end) has no reader left: then every other process is killed."""
    for signum in FORWARDED:
        signal.signal(signum, _forward)
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)  # a signal (SIGCHLD among them) wakes the poll below
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    child = _start(command, env)
    poller = select.poll()
    poller.register(wake_read, select.POLLIN)
    if watched is not None:
        poller.register(watched, 0)  # POLLERR (always reported): no reader left
    while (status := _reaped(child)) is None:
        for fd, events in poller.poll():
            if fd == watched and events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                with contextlib.suppress(OSError):
                    os.kill(-1 if os.getpid() == 1 else child, signal.SIGKILL)
                return 137
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
    return status


if __name__ == "__main__":
    main(sys.argv[1:])
