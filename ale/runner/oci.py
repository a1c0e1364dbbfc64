"""An OCI runtime backend: the evaluator and the agent's sandbox as containers of the images
``images/`` defines, run by digest with rootful podman and runc (docs/images.md).

**Not registered yet** (``ale.runner.runtimes`` names ``local`` only): this is the start of the
images issue's point 3. What it does: :class:`PodmanRuntime` implements the runtime interface
(``ale.runner.runtime``) with the images' digests checked against a lock before anything runs
(:func:`ale.images.attest.image_attestation`) and recorded in :meth:`PodmanRuntime.attestation`;
a sandbox is ``podman run IMAGE@DIGEST`` with ``--pull=never``, ``--network=none``, a read-only
root, every capability dropped, ``no-new-privileges``, the run's own non-root uid
(:mod:`ale.runner.uids`), pids, memory and CPU limits, per-process rlimits, the sandbox's
system-call filter as an OCI seccomp profile (:func:`seccomp_profile`, the same rules as
:mod:`ale.runner.seccomp`), and the agent contract's mounts; supervision is the shared one
(:mod:`ale.runner.supervise`). The harness reaches the evaluator's harness endpoint through a
socket in a folder only the harness and the evaluator's container mount.

Not yet: docker, the gateway attachment, ``RLIMIT_AS`` (podman has no ``--ulimit as``), the
bundled agents' own modules inside the agent image, and the registry entry with its CLI tests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.lowlevel

from ale.core.parse import ParseError, parse_json
from ale.runner import seccomp, supervise, uids
from ale.runner._groups import collapse
from ale.runner.runtime import (
    SOCKET_PATH,
    TASK_PATH,
    WORKSPACE_PATH,
    EvaluatorSpec,
    EvaluatorStartError,
    Limits,
    LineSink,
    Network,
    RuntimeUnavailable,
    SandboxError,
    SandboxResult,
    SandboxSpec,
)

EVENT_FD = 3  # the event channel's (and the run configuration's) number inside the container
EVALUATOR_USER = "10001:10001"  # images/evaluator.toml's user
READY_TIMEOUT_S = 60.0
AGENT_IMAGE = "agent-base"
EVALUATOR_IMAGE = "evaluator"
REPOSITORY = "localhost/ale"
#: Root's own folder for what the engine reads from the harness (not /tmp: another user could
#: plant a file there first).
STATE_DIR = Path("/run/ale-oci")


# --- the seccomp profile ------------------------------------------------------------------------

_SCMP_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


def _arg(index: int, op: str, value: int, two: int = 0) -> dict[str, Any]:
    return {"index": index, "value": value, "valueTwo": two, "op": op}


def seccomp_profile(arch: str, known: Callable[[str], bool]) -> dict[str, Any]:
    """The sandbox's system-call filter (:mod:`ale.runner.seccomp`'s rules) as an OCI seccomp
    profile for ``--security-opt seccomp=FILE``. ``known`` says whether this architecture has a
    system call of that name (names it lacks are left out, as the local filter skips them).
    System calls newer than the profile answer ENOSYS by runc's own rule, as the local filter does."""
    if arch not in _SCMP_ARCH:
        raise SandboxError(f"no seccomp profile for the {arch} architecture")
    eq, masked = "SCMP_CMP_EQ", "SCMP_CMP_MASKED_EQ"
    rules: list[dict[str, Any]] = [
        {"names": [n for n in seccomp.ALLOWED if known(n)], "action": "SCMP_ACT_ALLOW"},
        {"names": list(seccomp.ENOSYS_CALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, masked, seccomp.NAMESPACE_FLAGS, 0)]},
    ]
    rules += [
        {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, eq, value)]}
        for value in seccomp.PERSONALITIES
    ]
    for domain, types in seccomp.SOCKETS:
        if types is None:
            rules.append({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, eq, int(domain))]})
            continue
        rules += [
            {
                "names": ["socket"],
                "action": "SCMP_ACT_ALLOW",
                "args": [_arg(0, eq, int(domain)), _arg(1, masked, seccomp.SOCK_TYPE_MASK, int(kind))],
            }
            for kind in types
        ]
    rules.append({"names": ["socketpair"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, eq, 1)]})  # AF_UNIX
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": [_SCMP_ARCH[arch]],
        "syscalls": rules,
    }


# --- argv ---------------------------------------------------------------------------------------


@attrs.frozen
class ImageRef:
    """An image in the engine's storage, named by its manifest digest."""

    name: str  # the definition's name
    digest: str  # sha256:...

    @property
    def ref(self) -> str:
        return f"{REPOSITORY}-{self.name}@{self.digest}"

    @property
    def tag(self) -> str:
        return f"{REPOSITORY}-{self.name}:{self.digest[7:19]}"


def _common(engine: str, name: str) -> list[str]:
    return [
        engine, "run", "--rm", "--pull=never", f"--name={name}", "--network=none", "--read-only",
        "--read-only-tmpfs=false", "--cap-drop=ALL", "--security-opt=no-new-privileges", "--unsetenv-all",
        "--log-driver=none",
    ]  # fmt: skip


def _limits(limits: Limits) -> list[str]:
    # Both nofile and nproc always: naming one --ulimit drops the engine's default for the other,
    # which runc then fails to raise back for a non-root user.
    return [
        f"--pids-limit={limits.processes}",
        f"--memory={limits.sandbox_memory_bytes}",
        f"--memory-swap={limits.sandbox_memory_bytes}",
        f"--cpus={limits.cpus}",
        f"--ulimit=nofile={limits.open_files}:{limits.open_files}",
        f"--ulimit=nproc={limits.processes}:{limits.processes}",
        f"--ulimit=fsize={limits.file_bytes}:{limits.file_bytes}",
        "--ulimit=core=0:0",
    ]


def sandbox_argv(
    engine: str,
    spec: SandboxSpec,
    image: ImageRef,
    *,
    name: str,
    uid: int,
    seccomp_file: Path,
    tmp_dir: Path | None,
) -> list[str]:
    """``podman run`` for one sandbox: the spec's command in the agent image, by digest."""
    workspace_mode = "rw" if spec.workspace_writable else "ro"
    argv = [
        *_common(engine, name),
        f"--user={uid}:{uid}",
        f"--security-opt=seccomp={seccomp_file}",
        *_limits(spec.limits),
        f"--volume={spec.workspace}:{WORKSPACE_PATH}:{workspace_mode}",
        f"--volume={spec.task_dir}:{TASK_PATH}:ro",
        f"--volume={spec.evaluator_socket}:{SOCKET_PATH}",
        f"--workdir={WORKSPACE_PATH}",
        "--preserve-fds=1",
    ]
    if tmp_dir is not None:  # a size- and inode-limited tmpfs the harness mounted
        argv.append(f"--volume={tmp_dir}:/tmp")
    else:
        argv.append(f"--tmpfs=/tmp:rw,size={spec.limits.tmp_bytes},mode=1777,nosuid,nodev")
    for key, value in sorted({**spec.env, "ALE_EVENT_FD": str(EVENT_FD)}.items()):
        argv.append(f"--env={key}={value}")
    # The engine adds HOSTNAME to the environment; the contract promises the spec's variables only.
    return [*argv, image.ref, "/usr/bin/env", "-u", "HOSTNAME", *spec.command]


def evaluator_argv(engine: str, spec: EvaluatorSpec, image: ImageRef, *, name: str) -> list[str]:
    """``podman run`` for the evaluator: its image's entrypoint serving both endpoints, the
    sockets' and the event log's folders mounted at their host paths."""
    folders = sorted({str(p.parent) for p in (spec.agent_socket, spec.harness_socket, spec.events_path)})
    return [
        *_common(engine, name),
        f"--user={EVALUATOR_USER}",
        *(f"--volume={folder}:{folder}" for folder in folders),
        "--preserve-fds=1",
        image.ref,
        "serve", "--task", spec.task_id, "--agent-socket", str(spec.agent_socket),
        "--harness-socket", str(spec.harness_socket), "--run-config-fd", str(EVENT_FD),
        "--events", str(spec.events_path),
    ]  # fmt: skip


def with_fd(fd: int, argv: Sequence[str], *, direction: str) -> list[str]:
    """``argv`` run with descriptor ``fd`` as descriptor 3 (what ``--preserve-fds=1`` passes on)."""
    redirect = f"{EVENT_FD}>&{fd}" if direction == "out" else f"{EVENT_FD}<&{fd}"
    return ["/bin/bash", "-c", f'exec "$@" {redirect}', "bash", *argv]  # dash takes one-digit fds only


# --- the backend --------------------------------------------------------------------------------


@attrs.define
class _Container:
    """A container started by the engine's CLI (attached), as supervision's Killable."""

    process: trio.Process
    engine: str
    name: str
    kills: list[subprocess.Popen[bytes]] = attrs.field(factory=list, kw_only=True)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    def send_term(self) -> None:
        # The attached CLI proxies the signal to the container's first process.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.process.send_signal(signal.SIGTERM)

    def send_kill(self) -> None:
        # Not waited for here (send_kill must not block): :meth:`remove` reaps it.
        kill = subprocess.Popen(
            [self.engine, "kill", "--signal=KILL", self.name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.kills.append(kill)

    def remove(self) -> None:
        """Remove the container whatever state it is in, and reap the kills sent to it (blocking)."""
        subprocess.run([self.engine, "rm", "--force", "--time=0", self.name], capture_output=True, timeout=120)
        for kill in self.kills:
            with contextlib.suppress(subprocess.TimeoutExpired):
                kill.wait(timeout=60)


@attrs.define
class _SandboxContainer(_Container):
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    events: trio.abc.ReceiveStream

    async def aclose(self) -> None:
        await self.events.aclose()


@attrs.define
class OciEvaluator:
    process: trio.Process
    harness_target: str
    agent_socket: Path
    events_path: Path
    stderr_lines: deque[str] = attrs.Factory(lambda: deque(maxlen=40))

    def alive(self) -> bool:
        return self.process.returncode is None

    def stderr_tail(self) -> str:
        return "\n".join(self.stderr_lines)


def _name(kind: str) -> str:
    return f"ale-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


class PodmanRuntime:
    """The evaluator and the sandbox as containers of the pinned images, on rootful podman with runc."""

    name = "podman"
    networks = frozenset({Network.NONE})

    def __init__(self, *, layouts: Path, lock: Path, engine: str = "podman") -> None:
        self.layouts, self.lock, self.engine = layouts, lock, engine
        self._images: dict[str, ImageRef] | None = None
        self._images_doc: dict[str, Any] = {}
        self._version = ""
        self._uid: uids.Claim | None = None
        self._seccomp = STATE_DIR / "seccomp.json"  # named by its contents in check()

    # --- check and attestation ----------------------------------------------------------------

    def check(self) -> None:
        if self._images is not None:
            return
        for tool in (self.engine, "skopeo"):
            if shutil.which(tool) is None:
                raise RuntimeUnavailable(f"{tool} is not installed (apt-get install podman runc skopeo)")
        if os.geteuid() != 0:
            raise RuntimeUnavailable("the podman runtime runs rootful podman: run the harness as root")
        version = subprocess.run(
            [self.engine, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, timeout=60
        )
        if version.returncode != 0:
            raise RuntimeUnavailable(f"{self.engine} does not work here: {version.stderr.strip()[-300:]}")
        self._version = version.stdout.strip()
        from ale.images.attest import AttestError, image_attestation

        try:
            self._images_doc = image_attestation(self.lock, self.layouts)
        except AttestError as exc:
            raise RuntimeUnavailable(f"the images do not match their lock: {exc}") from None
        images = {n: ImageRef(n, e["digest"]) for n, e in self._images_doc["images"].items()}
        missing = {AGENT_IMAGE, EVALUATOR_IMAGE} - set(images)
        if missing:
            raise RuntimeUnavailable(f"the lock {self.lock} names no {' or '.join(sorted(missing))} image")
        for image in images.values():
            self._load(image)
        self._seccomp = _write_profile(seccomp_profile(os.uname().machine, _known_syscalls()))
        try:
            self._uid = uids.claim()
        except (uids.NoFreeUid, OSError) as exc:
            raise RuntimeUnavailable(f"no uid of the run's own: {exc}") from None
        self._images = images

    def _load(self, image: ImageRef) -> None:
        """Copy the image from its OCI layout into the engine's storage unless it is there."""
        exists = subprocess.run([self.engine, "image", "exists", image.ref], capture_output=True, timeout=60)
        if exists.returncode == 0:
            return
        copy = subprocess.run(
            ["skopeo", "copy", "--quiet", f"oci:{self.layouts / image.name}", f"containers-storage:{image.tag}"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if copy.returncode != 0:
            raise RuntimeUnavailable(f"cannot load {image.name} into {self.engine}: {copy.stderr.strip()[-300:]}")

    def attestation(self) -> dict[str, Any]:
        self.check()
        assert self._images is not None
        profile_sha = _sha256(self._seccomp.read_bytes())
        return {
            "runtime": self.name,
            "sandbox": f"{self.engine} {self._version} (runc)",
            "images": self._images_doc,
            "code": {
                "kind": "oci-images",
                "evaluator_image_sha256": self._images[EVALUATOR_IMAGE].digest[7:],
                "agent_image_sha256": self._images[AGENT_IMAGE].digest[7:],
                "images_lock_sha256": self._images_doc["lock_sha256"],
            },
            "isolation": {
                "seccomp": {"in_force": True, "reason": None, "details": {"profile_sha256": profile_sha}},
                "cgroup": {"in_force": True, "reason": None, "details": {"by": self.engine}},
                "uid": {
                    "in_force": True,
                    "reason": None,
                    "details": {"range": [uids.FIRST_UID, uids.FIRST_UID + uids.COUNT - 1]},
                },
                "filesystems": {"in_force": True, "reason": None, "details": {"kind": "tmpfs"}},
            },
        }

    # --- workspace and evaluator --------------------------------------------------------------

    def open_workspace(self, workspace: Path, limits: Limits) -> AbstractAsyncContextManager[None]:
        return _workspace(workspace, limits, self._uid.uid if self._uid is not None else None)

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[OciEvaluator]:
        self.check()
        assert self._images is not None
        for folder in {spec.agent_socket.parent, spec.harness_socket.parent, spec.events_path.parent}:
            uid, gid = (int(x) for x in EVALUATOR_USER.split(":"))
            os.chown(folder, uid, gid)  # the evaluator's user creates its sockets and log there
        name = _name("evaluator")
        read_fd, write_fd = os.pipe()
        try:
            os.write(write_fd, spec.run_config)
        finally:
            os.close(write_fd)
        argv = with_fd(
            read_fd, evaluator_argv(self.engine, spec, self._images[EVALUATOR_IMAGE], name=name), direction="in"
        )
        try:
            process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read_fd,)
            )
        except OSError as exc:
            raise EvaluatorStartError(f"cannot start the evaluator's container: {exc}") from None
        finally:
            os.close(read_fd)
        handle = OciEvaluator(process, f"unix:{spec.harness_socket}", spec.agent_socket, spec.events_path)
        container = _Container(process, self.engine, name)
        async with _evaluator_running(handle, container, spec):
            yield handle

    # --- the sandbox --------------------------------------------------------------------------

    async def run_sandboxed(
        self,
        spec: SandboxSpec,
        sink: LineSink,
        *,
        should_stop: Callable[[], Awaitable[str]] | None = None,
    ) -> SandboxResult:
        if spec.network not in self.networks:
            raise SandboxError(f"the podman runtime has no {spec.network.value!r} network attachment (only 'none')")
        self.check()
        assert self._images is not None
        assert self._uid is not None
        uid = self._uid.uid
        if spec.workspace_writable:
            os.chown(spec.workspace, uid, uid)
        with _private_tmp(spec.limits, uid) as tmp_dir:
            box = await self._start(spec, uid, tmp_dir)
            try:
                return await supervise.supervise(spec, box, sink, should_stop, started=time.monotonic())
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(box.remove)

    async def _start(self, spec: SandboxSpec, uid: int, tmp_dir: Path | None) -> _SandboxContainer:
        """Start ``podman run`` for the sandbox, its event channel's write end as descriptor 3."""
        assert self._images is not None
        name = _name("sandbox")
        argv = sandbox_argv(
            self.engine, spec, self._images[AGENT_IMAGE], name=name, uid=uid, seccomp_file=self._seccomp,
            tmp_dir=tmp_dir,
        )  # fmt: skip
        read_fd, write_fd = os.pipe()
        try:
            process = await trio.lowlevel.open_process(
                with_fd(write_fd, argv, direction="out"),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(write_fd,), start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            os.close(read_fd)
            raise SandboxError(f"cannot start the sandbox's container: {exc}") from None
        finally:
            os.close(write_fd)
        assert process.stdout is not None
        assert process.stderr is not None
        return _SandboxContainer(
            process, self.engine, name, process.stdout, process.stderr, trio.lowlevel.FdStream(read_fd)
        )


def _write_profile(profile: dict[str, Any]) -> Path:
    """The profile in :data:`STATE_DIR`, named by its SHA-256 (written once, atomically)."""
    raw = json.dumps(profile, sort_keys=True, separators=(",", ":")).encode()
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    if STATE_DIR.stat().st_uid != os.geteuid() or STATE_DIR.stat().st_mode & 0o077:
        raise RuntimeUnavailable(f"{STATE_DIR} is not this user's own private folder")
    path = STATE_DIR / f"seccomp-{_sha256(raw)}.json"
    if not path.is_file() or path.read_bytes() != raw:
        fd, tmp = tempfile.mkstemp(dir=STATE_DIR)
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.replace(tmp, path)
    return path


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _known_syscalls() -> Callable[[str], bool]:
    """Whether libseccomp knows a system call of that name on this architecture."""
    lib = seccomp._load()  # the same library and names the local filter uses
    return lambda name: int(lib.seccomp_syscall_resolve_name(name.encode())) >= 0


@contextlib.contextmanager
def _private_tmp(limits: Limits, uid: int) -> Iterator[Path | None]:
    """The sandbox's /tmp: a size- and inode-limited tmpfs mounted here (as root) and bind-mounted
    into the container, removed after; None (the engine's --tmpfs, size-limited only) without mounts."""
    from ale.runner import sandbox_fs

    if sandbox_fs.can_mount():
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="ale-tmp-"))
    try:
        sandbox_fs.mount_tmpfs(
            folder, size_bytes=limits.tmp_bytes, inodes=sandbox_fs.inodes_for(limits.tmp_bytes), uid=uid, mode=0o1777
        )
    except OSError as exc:
        folder.rmdir()
        raise SandboxError(f"cannot mount the sandbox's /tmp: {exc}") from None
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            sandbox_fs.unmount(folder)
        with contextlib.suppress(OSError):
            folder.rmdir()


@asynccontextmanager
async def _workspace(workspace: Path, limits: Limits, uid: int | None) -> AsyncIterator[None]:
    """The task's workspace on a size- and inode-limited tmpfs (as root), bind-mounted into sandboxes."""
    from ale.runner import sandbox_fs

    if uid is None or sandbox_fs.can_mount():
        yield
        return
    sandbox_fs.mount_tmpfs(
        workspace, size_bytes=limits.workspace_bytes, inodes=sandbox_fs.inodes_for(limits.workspace_bytes),
        uid=uid, mode=0o755,
    )  # fmt: skip
    try:
        yield
    finally:
        sandbox_fs.unmount(workspace)


@asynccontextmanager
async def _evaluator_running(handle: OciEvaluator, container: _Container, spec: EvaluatorSpec) -> AsyncIterator[None]:
    """Enter once the evaluator said it is ready; stop its container on exit (an error if it never was)."""
    process = handle.process
    assert process.stdout is not None
    assert process.stderr is not None
    ready = trio.Event()

    def on_stdout(_s: str, line: bytes) -> None:
        try:
            msg = parse_json(line, what="the evaluator's stdout", max_bytes=supervise.MAX_LINE)
        except ParseError:
            return
        if isinstance(msg, dict) and msg.get("event") == "ready":
            ready.set()

    def on_stderr(_s: str, line: bytes) -> None:
        handle.stderr_lines.append(line.decode(errors="replace"))

    try:
        with collapse():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(supervise.pump, process.stderr, supervise.LineSplitter("stderr", on_stderr))
                nursery.start_soon(supervise.pump, process.stdout, supervise.LineSplitter("stdout", on_stdout))
                if not await supervise.until_ready(container, ready, READY_TIMEOUT_S):
                    await supervise.stop(container)
                    await trio.sleep(0.1)
                    raise EvaluatorStartError(
                        f"the evaluator for {spec.task_id} did not become ready "
                        f"(exit status {process.returncode}):\n{handle.stderr_tail()}"
                    )
                try:
                    yield
                finally:
                    await supervise.stop(container)
                    nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            await supervise.stop(container)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(container.remove)
