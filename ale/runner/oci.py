"""The OCI runtimes: the evaluator and the agent's sandbox as containers of the images ``images/``
defines, run by digest on rootful podman with runc (``--runtime podman``) or through the docker
CLI (``--runtime docker``, against any engine that speaks the Docker API and keeps an image's OCI
manifest digest: ``podman system service`` as ``DOCKER_HOST``). docs/runtime.md, "The OCI
runtimes", says what each does and why; in short:

* ``check()`` reads each image's manifest digest from its OCI layout and checks it against the
  images lock (:func:`ale.images.attest.image_attestation`), copies an image missing from the
  engine's storage in with skopeo, and claims the run's own uid; every container then runs
  ``IMAGE@DIGEST`` with ``--pull=never``, so the attested digest is the one that ran;
* a sandbox is ``ENGINE run --network=none --read-only --cap-drop=ALL
  --security-opt=no-new-privileges --user UID`` with pids, memory and CPU limits and rlimits, the
  agent contract's mounts, and a first process (:mod:`ale.runner.oci_launch`) that sets
  ``RLIMIT_AS``, opens the event channel, keeps the spec's environment only and installs the local
  runtime's system-call filter before it execs the command; supervision is the shared one;
* its container is nested in a cgroup of the harness's (:mod:`ale.runner.oci_cgroups`), which is
  how its out-of-memory kills are counted;
* the evaluator runs ahead of its task (``prestart_evaluator``: ``ale-evaluator standby`` in its
  container, its job read from the container's stdin), with limits of its own; the harness
  reaches its harness endpoint through a socket in a folder only the evaluator's container and the
  harness mount (the agent's container gets the agent socket alone).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.lowlevel

from ale.core.parse import ParseError, parse_json
from ale.runner import agent_env, lifeline, oci_cgroups, oci_launch, sandbox_fs, seccomp, supervise, uids
from ale.runner._groups import collapse
from ale.runner.runtime import (
    GATEWAY_PORT,
    GATEWAY_SOCKET_PATH,
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
    gateway_attachment_env,
)

AGENT_IMAGE = "agent-base"
EVALUATOR_IMAGE = "evaluator"
REPOSITORY = "localhost/ale"
EVALUATOR_USER = "10001:10001"  # images/evaluator.toml's user
#: images/evaluator.toml's entrypoint: the evaluator, run by the launcher (its container's first process)
EVALUATOR_ENTRYPOINT = ("/usr/bin/python3.11", "-m", "ale_evaluator")
READY_TIMEOUT_S = 60.0
#: Root's own folder for what the engine reads from the harness (not /tmp: another user could plant
#: a file there first): the filter program, each sandbox's event channel and /tmp mount point, each
#: evaluator's socket folders.
STATE_DIR = Path("/run/ale-oci")
#: Where the agent image keeps its Python packages (images/agent-base.toml's [python] site).
IMAGE_SITE = "/ale/python/lib/python3.11/site-packages"
LAUNCH_DIR = "/ale/launch"  # inside the sandbox: the event channel and the filter program
#: The evaluator's container: its limits (it is trusted, but not to take the machine) and its paths.
EVALUATOR_MEMORY_BYTES = 4 * 1024**3
EVALUATOR_PROCESSES = 512
EVALUATOR_TMP_BYTES = 64 * 1024**2
EVALUATOR_AGENT_DIR = "/ale/agent"  # the agent endpoint's socket (its host folder the sandbox never sees)
EVALUATOR_HARNESS_DIR = "/ale/harness"  # the harness endpoint's socket and the event log
EVALUATOR_PYCACHE = "/ale/pycache"  # the evaluator's byte code, kept per image (PYTHONPYCACHEPREFIX)


def evaluator_cpus() -> float:
    """The evaluator container's CPU quota: the machine's CPUs, at most four."""
    return float(min(os.cpu_count() or 1, 4))


# --- what is run --------------------------------------------------------------------------------


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


@attrs.frozen
class Engine:
    """What differs between the engines' command lines."""

    name: str  # podman | docker
    binary: str
    run_flags: tuple[str, ...]  # added to every `run`
    rm: tuple[str, ...]  # `rm` and its flags, the container's name follows


PODMAN = Engine("podman", "podman", ("--read-only-tmpfs=false",), ("rm", "--force", "--time=0"))
DOCKER = Engine("docker", "docker", (), ("rm", "--force"))


@attrs.frozen
class SandboxFiles:
    """One sandbox's host files: its event channel (a FIFO), /tmp (a tmpfs or None: the engine's)."""

    events: Path
    tmp: Path | None
    seccomp: Path  # the filter program (shared, named by its contents)
    empty: Path  # an empty folder, mounted read-only over the engines' own scratch tmpfs


# --- argv ---------------------------------------------------------------------------------------


def _common(engine: Engine, name: str) -> list[str]:
    return [
        engine.binary, "run", "--pull=never", f"--name={name}", "--network=none", "--read-only",
        "--cap-drop=ALL", "--security-opt=no-new-privileges", "--log-driver=none", *engine.run_flags,
    ]  # fmt: skip


def _limits(*, memory: int, processes: int, cpus: float, open_files: int, file_bytes: int | None) -> list[str]:
    # Both nofile and nproc always: naming one --ulimit drops the engine's default for the other,
    # which runc then fails to raise back for a non-root user.
    flags = [
        f"--pids-limit={processes}", f"--memory={memory}", f"--memory-swap={memory}", f"--cpus={cpus:g}",
        f"--ulimit=nofile={open_files}:{open_files}", f"--ulimit=nproc={processes}:{processes}", "--ulimit=core=0:0",
    ]  # fmt: skip
    if file_bytes is not None:
        flags.append(f"--ulimit=fsize={file_bytes}:{file_bytes}")
    return flags


@functools.cache
def launcher_source() -> str:
    """:mod:`ale.runner.oci_launch`'s code without its docstrings and comments (it goes into argv)."""
    tree = ast.parse(Path(oci_launch.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body:
            continue
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            body[:1] = [] if len(body) > 1 else [ast.Pass()]
    return ast.unparse(tree)


def launcher_argv(spec: SandboxSpec, env: Mapping[str, str], *, events: str, seccomp_file: str) -> list[str]:
    """The sandbox's first process (:mod:`ale.runner.oci_launch`) and the spec's command after it;
    with the gateway attachment the command starts through the relay to the gateway socket
    (:mod:`ale._relay`, in the agent image), under the filter, as the local runtime starts it."""
    command = list(spec.command)
    if spec.network is Network.GATEWAY:
        relay = [agent_env.PYTHON, "-I", "-m", "ale._relay", str(GATEWAY_PORT), GATEWAY_SOCKET_PATH, "--"]
        command = [*relay, *command]
    return [
        agent_env.PYTHON, "-I", "-S", "-c", launcher_source(),
        "--as", str(spec.limits.memory_bytes), "--events", events, "--keep", ",".join(sorted(env)),
        "--seccomp", seccomp_file, "--", *command,
    ]  # fmt: skip


def sandbox_argv(
    engine: Engine,
    spec: SandboxSpec,
    image: ImageRef,
    *,
    name: str,
    uid: int,
    files: SandboxFiles,
    cgroup_parent: str,
    binds: Sequence[tuple[Path, str]] = (),
) -> list[str]:
    """``ENGINE run`` for one sandbox: the spec's command in the agent image, by digest."""
    lim = spec.limits
    argv = [
        *_common(engine, name),
        f"--user={uid}:{uid}",
        f"--cgroup-parent={cgroup_parent}",
        *_limits(
            memory=lim.sandbox_memory_bytes,
            processes=lim.processes,
            cpus=lim.cpus,
            open_files=lim.open_files,
            file_bytes=lim.file_bytes,
        ),
        f"--volume={spec.workspace}:{WORKSPACE_PATH}:{'rw' if spec.workspace_writable else 'ro'}",
        f"--volume={spec.task_dir}:{TASK_PATH}:ro",
        f"--volume={os.path.realpath(spec.evaluator_socket)}:{SOCKET_PATH}",
        f"--volume={files.events}:{LAUNCH_DIR}/events",
        f"--volume={files.seccomp}:{LAUNCH_DIR}/seccomp.bpf:ro",
        f"--volume={files.empty}:/run:ro",
        f"--volume={files.empty}:/var/tmp:ro",
        f"--workdir={WORKSPACE_PATH}",
    ]
    if files.tmp is not None:  # a size- and inode-limited tmpfs the harness mounted
        argv.append(f"--volume={files.tmp}:/tmp")
    else:
        argv.append(f"--tmpfs=/tmp:rw,size={lim.tmp_bytes},mode=1777,nosuid,nodev")
    argv += [f"--volume={src}:{dest}:ro" for src, dest in binds]
    env = {**spec.env, "ALE_EVENT_FD": str(oci_launch.EVENT_FD)}
    if spec.network is Network.GATEWAY:
        assert spec.gateway_socket is not None  # SandboxSpec says so
        argv.append(f"--volume={os.path.realpath(spec.gateway_socket)}:{GATEWAY_SOCKET_PATH}")
        env |= gateway_attachment_env()
    argv += [f"--env={key}={value}" for key, value in sorted(env.items())]
    launch = launcher_argv(spec, env, events=f"{LAUNCH_DIR}/events", seccomp_file=f"{LAUNCH_DIR}/seccomp.bpf")
    return [*argv, image.ref, *launch]


def evaluator_argv(engine: Engine, image: ImageRef, *, name: str, folder: Path, pycache: Path | None) -> list[str]:
    """``ENGINE run`` for an evaluator in standby: its code loaded, its job read from stdin; with
    ``pycache``, its byte code kept there between runs of the same image (the images hold none).
    Its first process is the launcher, which ends the container when the harness is gone (the FIFO
    ``folder/alive`` has no reader left: :mod:`ale.runner.oci_launch`)."""
    cache = [] if pycache is None else [
        f"--volume={pycache}:{EVALUATOR_PYCACHE}", f"--env=PYTHONPYCACHEPREFIX={EVALUATOR_PYCACHE}",
        "--env=PYTHONDONTWRITEBYTECODE=",
    ]  # fmt: skip
    return [
        *_common(engine, name),
        "--interactive",
        f"--user={EVALUATOR_USER}",
        *cache,
        *_limits(
            memory=EVALUATOR_MEMORY_BYTES,
            processes=EVALUATOR_PROCESSES,
            cpus=evaluator_cpus(),
            open_files=4096,
            file_bytes=None,
        ),
        f"--tmpfs=/tmp:rw,size={EVALUATOR_TMP_BYTES},mode=1777,nosuid,nodev",
        f"--volume={folder / 'agent'}:{EVALUATOR_AGENT_DIR}",
        f"--volume={folder / 'harness'}:{EVALUATOR_HARNESS_DIR}",
        f"--volume={folder / 'alive'}:{LAUNCH_DIR}/alive",
        f"--entrypoint={EVALUATOR_ENTRYPOINT[0]}",
        image.ref,
        "-I", "-S", "-c", launcher_source(), "--alive", f"{LAUNCH_DIR}/alive", "--",
        *EVALUATOR_ENTRYPOINT, "standby", "--job-fd", "0",
    ]  # fmt: skip


def serve_options(task_id: str) -> list[str]:
    """The standby evaluator's ``serve`` options: its sockets and event log at container paths."""
    return [
        "--task", task_id,
        "--agent-socket", f"{EVALUATOR_AGENT_DIR}/evaluator.sock",
        "--harness-socket", f"{EVALUATOR_HARNESS_DIR}/harness.sock",
        "--events", f"{EVALUATOR_HARNESS_DIR}/evaluator.jsonl",
    ]  # fmt: skip


# --- the agent's own modules --------------------------------------------------------------------


def module_binds(env: agent_env.AgentEnv | None) -> list[tuple[Path, str]]:
    """A bundled agent's own modules (those of its environment the image does not hold: the
    client library's closure is in the image), each bound read-only into the image's site-packages."""
    if env is None:
        return []
    in_image = set(agent_env.ale_closure(agent_env.CLIENT_MODULES)[0])
    site = env.root / f"lib/python{env.interpreter.version}/site-packages"
    binds = []
    for module in sorted(set(env.modules) - in_image):
        rel = module.replace(".", "/")
        path = f"{rel}/__init__.py" if (site / rel).is_dir() else f"{rel}.py"
        binds.append((site / path, f"{IMAGE_SITE}/{path}"))
    return binds


@functools.cache
def _client_distributions() -> frozenset[str]:
    """The distributions of the client library's closure (canonical names): what the agent image's
    wheels are (images/agent-base.toml's ``want`` is that closure)."""
    from packaging.utils import canonicalize_name

    _modules, external = agent_env.ale_closure(agent_env.CLIENT_MODULES)
    return frozenset(canonicalize_name(d.name) for d in agent_env.distribution_closure(external))


def image_lacks(env: agent_env.AgentEnv | None) -> list[str]:
    """The distributions of an agent's environment the agent image does not hold (``ale run
    --agent-package``): the OCI runtimes run the image's Python, so such an agent is refused."""
    if env is None:
        return []
    from packaging.utils import canonicalize_name

    names = {canonicalize_name(d.partition("==")[0]): d for d in env.distributions}
    return sorted(names[n] for n in set(names) - _client_distributions())


# --- the containers -----------------------------------------------------------------------------


def _engine_kill(engine: Engine, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [engine.binary, "kill", "--signal=KILL", name],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _remove(engine: Engine, name: str, kills: list[subprocess.Popen[bytes]]) -> None:
    """Remove a container whatever state it is in (blocking): after the kills sent to it ended
    (a removal racing a kill can fail), and again while the engine says it failed."""
    for kill in kills:
        with contextlib.suppress(subprocess.TimeoutExpired):
            kill.wait(timeout=60)
    for attempt in range(5):
        try:
            done = subprocess.run([engine.binary, *engine.rm, name], capture_output=True, text=True, timeout=120)
        except (subprocess.TimeoutExpired, OSError):
            continue
        if done.returncode == 0 or "no such container" in done.stderr.lower():
            return
        time.sleep(0.2 * (attempt + 1))


@attrs.define
class _Sandbox:
    """A sandbox's attached ``ENGINE run`` as supervision's Sandboxed."""

    process: trio.Process
    engine: Engine
    name: str
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    events: trio.abc.ReceiveStream  # the FIFO's read end
    keep_open: int  # a write end of the FIFO held until the container ended (a FIFO with no writer reads as ended)
    kills: list[subprocess.Popen[bytes]] = attrs.Factory(list)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        status = await self.process.wait()
        self._release()
        return status

    def _release(self) -> None:
        if self.keep_open >= 0:
            os.close(self.keep_open)
            self.keep_open = -1

    def send_term(self) -> None:
        # The attached CLI passes the signal on to the container's first process (the command).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.process.send_signal(signal.SIGTERM)

    def send_kill(self) -> None:
        # Not waited for here (send_kill must not block): remove() reaps it. The CLI goes too,
        # so that a container still being made cannot keep the wait alive.
        self.kills.append(_engine_kill(self.engine, self.name))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.process.send_signal(signal.SIGKILL)
        self._release()

    async def aclose(self) -> None:
        self._release()
        await self.events.aclose()

    def remove(self) -> None:
        _remove(self.engine, self.name, self.kills)


@attrs.define
class _Standby:
    """An evaluator container in standby (``ale-evaluator standby --job-fd 0``), attached."""

    process: subprocess.Popen[bytes]
    engine: Engine
    name: str
    folder: Path  # STATE_DIR/<name>: agent/, harness/ and the FIFO alive, mounted into the container
    alive: int  # the read end of folder/alive, held (never read) while the container may run
    kills: list[subprocess.Popen[bytes]] = attrs.Factory(list)

    @classmethod
    def spawn(cls, engine: Engine, image: ImageRef) -> _Standby:
        name = _name("evaluator")
        folder = _state_folder(name)
        uid, gid = (int(x) for x in EVALUATOR_USER.split(":"))
        for sub in ("agent", "harness"):
            (folder / sub).mkdir(mode=0o700 if sub == "harness" else 0o755)
            os.chown(folder / sub, uid, gid)
        alive = _liveness_fifo(folder / "alive")
        try:
            process = subprocess.Popen(
                evaluator_argv(engine, image, name=name, folder=folder, pycache=_pycache(image, uid)),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=folder,
            )  # fmt: skip
        except OSError:
            os.close(alive)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(process, engine, name, folder, alive)

    @property
    def agent_socket(self) -> Path:
        return self.folder / "agent" / "evaluator.sock"

    @property
    def harness_socket(self) -> Path:
        return self.folder / "harness" / "harness.sock"

    @property
    def events(self) -> Path:
        return self.folder / "harness" / "evaluator.jsonl"

    def hand_over(self, task_id: str, run_config: bytes) -> tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]:
        """Write the job to its stdin (the run configuration goes only there) and take its output."""
        job = b'{"serve":' + json.dumps(serve_options(task_id)).encode() + b',"run_config":' + run_config + b"}"
        stdin, out, err = self.process.stdin, self.process.stdout, self.process.stderr
        assert stdin is not None
        assert out is not None
        assert err is not None
        try:
            stdin.write(job)
            stdin.flush()
        finally:
            with contextlib.suppress(OSError):
                stdin.close()
        streams = (trio.lowlevel.FdStream(os.dup(out.fileno())), trio.lowlevel.FdStream(os.dup(err.fileno())))
        out.close()
        err.close()
        return streams

    # supervision's Killable ------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    async def wait(self) -> int:
        return await lifeline.wait_popen(self.process)

    def send_term(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.process.send_signal(signal.SIGTERM)

    def send_kill(self) -> None:
        self.kills.append(_engine_kill(self.engine, self.name))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.process.send_signal(signal.SIGKILL)

    def discard(self) -> None:
        """End it (an empty job ends a standby evaluator), remove its container and folder (blocking)."""
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.send_kill()
            self.process.wait()
        _remove(self.engine, self.name, self.kills)
        if self.alive >= 0:
            os.close(self.alive)
            self.alive = -1
        shutil.rmtree(self.folder, ignore_errors=True)


@attrs.define
class OciEvaluator:
    standby: _Standby
    harness_target: str
    agent_socket: Path
    events_path: Path
    stderr_lines: deque[str] = attrs.Factory(lambda: deque(maxlen=40))

    def alive(self) -> bool:
        return self.standby.process.poll() is None

    def stderr_tail(self) -> str:
        return "\n".join(self.stderr_lines)


def _liveness_fifo(path: Path) -> int:
    """A FIFO at ``path`` that the container's user may only write (root's, 0602: no process of the
    container can hold it open for reading), and the harness's read end of it: while the harness
    lives it has a reader; once it is gone, the container's launcher ends the container."""
    os.mkfifo(path, 0o600)
    os.chmod(path, 0o602)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def _name(kind: str) -> str:
    return f"ale-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _state_dir() -> Path:
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    info = STATE_DIR.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise RuntimeUnavailable(f"{STATE_DIR} is not this user's own private folder")
    return STATE_DIR


def _state_folder(name: str) -> Path:
    folder = _state_dir() / name
    folder.mkdir(mode=0o755)
    return folder


def _state_file(name: str, data: bytes) -> Path:
    """``data`` in :data:`STATE_DIR` as ``NAME`` (0644), written once, atomically."""
    path = _state_dir() / name
    if not path.is_file() or path.read_bytes() != data:
        fd, tmp = tempfile.mkstemp(dir=STATE_DIR)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return path


def _agent_python(root: Path, image: ImageRef) -> dict[str, Any]:
    """The agent image's Python environment read from its layout (ale.images.contents), kept in the
    state folder under the image's digest (reading the layers takes a moment; a digest's never changes)."""
    from ale.images import contents

    cached = _state_dir() / f"agent-python-{image.digest[7:]}.json"
    with contextlib.suppress(OSError, ParseError):
        doc = parse_json(cached.read_bytes(), what="the agent image's cached environment")
        if isinstance(doc, dict) and doc.get("digest") == image.digest:
            return doc
    try:
        found = contents.python_environment(root, site=IMAGE_SITE, executable=agent_env.PYTHON)
    except contents.ContentsError as exc:
        raise RuntimeUnavailable(f"the agent image's Python environment: {exc}") from None
    doc = {"digest": image.digest, **dataclasses.asdict(found)}
    doc["modules"], doc["distributions"] = list(found.modules), list(found.distributions)
    _state_file(cached.name, json.dumps(doc, sort_keys=True).encode())
    return doc


def _pycache(image: ImageRef, uid: int) -> Path | None:
    """The evaluator image's byte-code folder (one an image digest, the evaluator's user's own, in
    root's private state folder: no agent's container mounts it); None where it cannot be made."""
    folder = _state_dir() / "pycache" / image.digest.replace(":", "-")
    try:
        folder.parent.mkdir(mode=0o711, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chown(folder, uid, uid)
    except OSError:
        return None
    return folder


def _link(path: Path, target: Path) -> None:
    """``path`` as a symbolic link to ``target`` (what was there before replaced)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    path.symlink_to(target)


class _Reaper:
    """Removes what ended (containers, their cgroups and folders) on a thread of its own, off the
    run's path; :meth:`join` (``close()``, and the process's exit) waits until all of it is gone."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], object]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="ale-oci-reaper", daemon=True)
                self._thread.start()
                atexit.register(self.join)
        self._jobs.put(job)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # best effort: the next check() sweeps what a failure left
                pass
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def join(self) -> None:
        self._jobs.join()


# --- the backend --------------------------------------------------------------------------------


@attrs.frozen
class _Checked:
    """What check() found: the images, the engine, the isolation in force."""

    images: dict[str, ImageRef]
    images_doc: dict[str, Any]
    filter: seccomp.Filter
    seccomp_file: Path
    empty: Path
    cgroups: oci_cgroups.Layout
    mounts: str  # "" when size- and inode-limited tmpfs can be mounted, else why not
    uid: uids.Claim
    agent_python: dict[str, Any]  # the agent image's Python environment (ale.images.contents)
    task_uids: uids.TaskUids  # each task's uid (the run's own claim for the first), by workspace


def _default_lock() -> str:
    """The default release's images lock (the installed file its ``images_lock`` names)."""
    from ale import catalog

    try:
        found = catalog.release_lock_path()
    except (OSError, ValueError):  # a release that does not parse: check() says what is missing
        found = None
    return found or "images.lock.json"


class OciRuntime:
    """The evaluator and the sandbox as containers of the locked images (a subclass names the engine)."""

    name = "oci"
    engine = PODMAN
    networks = frozenset({Network.NONE, Network.GATEWAY})

    def __init__(self, *, layouts: Path | None = None, lock: Path | None = None) -> None:
        self.layouts = Path(layouts or os.environ.get("ALE_IMAGES_DIR") or "out/images")
        self.lock = Path(lock or os.environ.get("ALE_IMAGES_LOCK") or _default_lock())
        self._checked: _Checked | None = None
        self._standby: _Standby | None = None
        self._standby_lock = threading.Lock()
        self._engine: dict[str, str] | None = None  # what the engine says of itself (attestation)
        self._reaper = _Reaper()

    # --- check and attestation ----------------------------------------------------------------

    def _engine_info(self, raw: bytes) -> dict[str, str]:
        """The engine's version and its OCI runtime, from the version command's JSON output."""
        raise NotImplementedError

    def _info_argv(self) -> list[str]:
        raise NotImplementedError

    def _can_load(self, info: Mapping[str, str]) -> str:
        """ "" when images can be copied into the engine's storage with skopeo, else why not."""
        return ""

    def _image_digests(self) -> dict[str, Any]:
        from ale.images.attest import AttestError, image_attestation

        try:
            return image_attestation(self.lock, self.layouts)
        except AttestError as exc:
            raise RuntimeUnavailable(
                f"the images do not match their lock: {exc} (build and lock them: ale images build; ale images lock; "
                "or point ALE_IMAGES_DIR and ALE_IMAGES_LOCK at them)"
            ) from None

    def check(self) -> None:
        if self._checked is not None:
            return
        if shutil.which(self.engine.binary) is None:
            raise RuntimeUnavailable(f"{self.engine.binary} is not installed ({self._install_hint()})")
        if os.geteuid() != 0:
            raise RuntimeUnavailable(f"the {self.name} runtime runs a rootful engine: run the harness as root")
        doc = self._image_digests()
        images = {n: ImageRef(n, e["digest"]) for n, e in doc["images"].items()}
        missing = {AGENT_IMAGE, EVALUATOR_IMAGE} - set(images)
        if missing:
            raise RuntimeUnavailable(f"the lock {self.lock} names no {' or '.join(sorted(missing))} image")
        python = _agent_python(self.layouts / AGENT_IMAGE, images[AGENT_IMAGE])
        refs = [images[AGENT_IMAGE].ref, images[EVALUATOR_IMAGE].ref]
        with _started(self._inspect_argv(refs)) as inspect_run:
            _out, _err, inspect_rc = _finish(inspect_run)
        if inspect_rc != 0:  # missing images, or an engine that does not work: engine_info() says which
            self._load(images, self.engine_info())
        try:
            flt = seccomp.build()
        except seccomp.SeccompUnavailable as exc:
            raise RuntimeUnavailable(str(exc)) from None
        program_file = _state_file(f"seccomp-{hashlib.sha256(flt.program).hexdigest()}.bpf", flt.program)
        empty = _state_dir() / "empty"
        empty.mkdir(mode=0o755, exist_ok=True)
        try:
            layout = oci_cgroups.layout()
        except OSError as exc:
            raise RuntimeUnavailable(f"{exc}: the containers' limits and out-of-memory kills need one") from None
        sandbox_fs.sweep()
        self._reaper.submit(functools.partial(sweep, self.engine))  # and the rest off the run's path
        oci_cgroups.sweep(layout)
        try:
            claim = uids.claim()
        except (uids.NoFreeUid, OSError) as exc:
            raise RuntimeUnavailable(f"no uid of the run's own: {exc}") from None
        self._checked = _Checked(
            images=images, images_doc=doc, filter=flt, seccomp_file=program_file, empty=empty,
            cgroups=layout, mounts=sandbox_fs.can_mount(), uid=claim, agent_python=python,
            task_uids=uids.TaskUids(claim),
        )  # fmt: skip

    def _install_hint(self) -> str:
        return "apt-get install podman runc skopeo"

    def _inspect_argv(self, refs: Sequence[str]) -> list[str]:
        return [self.engine.binary, "image", "inspect", "--format", "{{.Id}}", *refs]

    def _load(self, images: Mapping[str, ImageRef], info: Mapping[str, str]) -> None:
        """Copy the images from their OCI layouts into the engine's storage (by digest, unchanged)."""
        why = self._can_load(info)
        if why:
            raise RuntimeUnavailable(why)
        if shutil.which("skopeo") is None:
            raise RuntimeUnavailable("skopeo is not installed (apt-get install skopeo): it loads the images")
        for image in images.values():
            exists = subprocess.run(self._inspect_argv([image.ref]), capture_output=True, timeout=60)
            if exists.returncode == 0:
                continue
            copy = subprocess.run(
                ["skopeo", "copy", "--quiet", f"oci:{self.layouts / image.name}", f"containers-storage:{image.tag}"],
                capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            if copy.returncode != 0:
                raise RuntimeUnavailable(f"cannot load {image.name} into the engine: {copy.stderr.strip()[-300:]}")

    def engine_info(self) -> dict[str, str]:
        """The engine's name, version, server and OCI runtime (asked once: it takes the engine a
        moment, so check() leaves it to the attestation, which the harness computes meanwhile)."""
        if self._engine is None:
            with _started(self._info_argv()) as info_run:
                out, err, rc = _finish(info_run)
            if rc != 0:
                raise RuntimeUnavailable(f"{self.engine.binary} does not work here: {err.strip()[-300:]}")
            self._engine = self._engine_info(out.encode())
        return self._engine

    def _ready(self) -> _Checked:
        self.check()
        assert self._checked is not None
        return self._checked

    @property
    def sandbox(self) -> str:
        return self.name

    def image_digests(self) -> dict[str, str]:
        """Each image this runtime runs, by name: its manifest digest (read from its layout and
        checked against the lock by check())."""
        return {name: ref.digest for name, ref in sorted(self._ready().images.items())}

    def agent_environment(self, env: agent_env.AgentEnv | None) -> dict[str, Any]:
        """The agent container's Python environment, as the manifest's ``agent.environment`` holds
        it: the agent image (by digest), its interpreter, the distributions it holds and the ale
        modules, the image's and those of ``env`` bound into it (:func:`module_binds`)."""
        c = self._ready()
        python = c.agent_python
        bound = set(env.modules) - set(agent_env.ale_closure(agent_env.CLIENT_MODULES)[0]) if env else set()
        return {
            "image": {"name": AGENT_IMAGE, "digest": c.images[AGENT_IMAGE].digest},
            "python": {"executable": python["executable"], "version": python["version"], "package": python["package"]},
            "modules": sorted(set(python["modules"]) | bound),
            "distributions": list(python["distributions"]),
        }

    def attestation(self) -> dict[str, Any]:
        c = self._ready()

        def in_force(details: dict[str, Any]) -> dict[str, Any]:
            return {"in_force": True, "reason": None, "details": details}

        filesystems: dict[str, Any] = (
            in_force({"kind": "tmpfs", "bytes_per_inode": sandbox_fs.BYTES_PER_INODE})
            if not c.mounts
            else {"in_force": False, "reason": c.mounts, "details": None}
        )
        return {
            "runtime": self.name,
            "sandbox": self.sandbox,
            "engine": dict(self.engine_info()),
            "images": c.images_doc,
            "code": {
                "kind": "oci-images",
                "note": "the OCI manifest digests of the images that ran (read from their layouts, checked "
                "against the images lock)",
                "evaluator_image_sha256": c.images[EVALUATOR_IMAGE].digest[7:],
                "agent_image_sha256": c.images[AGENT_IMAGE].digest[7:],
                "images_lock_sha256": c.images_doc["lock_sha256"],
            },
            "isolation": {
                "seccomp": in_force(c.filter.describe()),
                "cgroup": in_force(c.cgroups.describe()),
                "uid": in_force({"range": [uids.FIRST_UID, uids.FIRST_UID + uids.COUNT - 1]}),
                "filesystems": filesystems,
            },
        }

    # --- the evaluator ------------------------------------------------------------------------

    def _spawn_standby(self, image: ImageRef) -> _Standby:
        try:
            return _Standby.spawn(self.engine, image)
        except OSError as exc:
            raise EvaluatorStartError(f"cannot start the evaluator's container: {exc}") from None

    def prestart_evaluator(self, count: int = 1) -> None:
        """Start an evaluator container in standby so that the next open_evaluator does not wait
        for the container to start and the evaluator's code to load (one, whatever ``count``).
        Best effort, and without waiting for check(): the evaluator's digest is read from its
        layout and the lock (a container that cannot start is replaced by open_evaluator, after check())."""
        with self._standby_lock:
            self._prestart()

    def _prestart(self) -> None:
        if self._standby is not None and self._standby.process.poll() is None:
            return
        try:
            if self._checked is not None:
                image = self._checked.images[EVALUATOR_IMAGE]
            elif os.geteuid() == 0 and shutil.which(self.engine.binary) is not None:
                image = ImageRef(EVALUATOR_IMAGE, self._image_digests()["images"][EVALUATOR_IMAGE]["digest"])
            else:
                return
            self._standby = self._spawn_standby(image)
        except (RuntimeUnavailable, EvaluatorStartError, OSError, KeyError):
            self._standby = None

    def close(self) -> None:
        """Discard a prestarted evaluator nobody took, and wait until every container this runtime
        ran is removed."""
        with self._standby_lock:
            standby, self._standby = self._standby, None
        if standby is not None:
            standby.discard()
        self._reaper.join()

    def _take_standby(self) -> _Standby:
        with self._standby_lock:  # tasks side by side take it from worker threads
            standby, self._standby = self._standby, None
        if standby is not None and standby.process.poll() is None:
            return standby
        if standby is not None:
            standby.discard()
        return self._spawn_standby(self._ready().images[EVALUATOR_IMAGE])

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[OciEvaluator]:
        standby = await trio.to_thread.run_sync(self._take_standby)
        try:
            # The spec's paths name the container's files (the harness reads and connects there).
            _link(spec.agent_socket, standby.agent_socket)
            _link(spec.harness_socket, standby.harness_socket)
            _link(spec.events_path, standby.events)
            stdout, stderr = standby.hand_over(spec.task_id, spec.run_config)
        except OSError as exc:
            await supervise.stop(standby)
            await trio.to_thread.run_sync(_keep_events, standby, spec)
            self._reaper.submit(standby.discard)
            raise EvaluatorStartError(f"cannot start the evaluator: {exc}") from None
        handle = OciEvaluator(standby, f"unix:{spec.harness_socket}", spec.agent_socket, spec.events_path)
        try:
            async with _evaluator_running(handle, stdout, stderr, spec):
                yield handle
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_keep_events, standby, spec)
            self._reaper.submit(standby.discard)

    # --- the workspace and the sandbox --------------------------------------------------------

    def open_workspace(self, workspace: Path, limits: Limits) -> AbstractAsyncContextManager[None]:
        c = self._ready()
        return _workspace(workspace, limits, c.task_uids, mount=not c.mounts)

    async def run_sandboxed(
        self,
        spec: SandboxSpec,
        sink: LineSink,
        *,
        should_stop: Callable[[], Awaitable[str]] | None = None,
    ) -> SandboxResult:
        if spec.network not in self.networks:
            raise SandboxError(f"the {self.name} runtime has no {spec.network.value!r} network attachment")
        if spec.gateway_socket is not None and not await trio.Path(spec.gateway_socket).is_socket():
            raise SandboxError(f"the gateway socket {spec.gateway_socket} is not there")
        c = await trio.to_thread.run_sync(self._ready)
        if lacking := image_lacks(spec.agent_env):
            raise SandboxError(
                f"the agent image holds no {', '.join(lacking)}: the {self.name} runtime runs the image's Python "
                "(add them to images/agent-base.toml, or use the local runtime)"
            )
        uid = c.task_uids.uid_for(spec.workspace)  # the task's own: tasks side by side never share one
        binds = module_binds(spec.agent_env)
        if spec.workspace_writable and not await trio.Path(spec.workspace).is_mount():
            _own(spec.workspace, uid)
        cgroup = oci_cgroups.SandboxCgroup(c.cgroups)
        name = _name("sandbox")
        with _sandbox_files(name, spec.limits, uid, c) as files:
            argv = sandbox_argv(
                self.engine, spec, c.images[AGENT_IMAGE], name=name, uid=uid, files=files,
                cgroup_parent=cgroup.parent, binds=binds,
            )  # fmt: skip
            box = await _start(argv, self.engine, name, files.events)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cgroup.watch)
                    result = await supervise.supervise(spec, box, sink, should_stop, started=time.monotonic())
                    cgroup.finish()
                    nursery.cancel_scope.cancel()
                result = attrs.evolve(result, oom_kills=cgroup.oom_kills())  # before its cgroup goes
            finally:
                # Stopped by force, or a CLI that died of a signal (a SIGTERM before it passes signals
                # on ends it, and says nothing of its container): gone before the harness looks at
                # its workspace again.
                if box.kills or box.returncode is None or box.returncode < 0:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(box.remove)
                self._reaper.submit(functools.partial(_remove_sandbox, box, cgroup))
        return result


class PodmanRuntime(OciRuntime):
    """Rootful podman with runc (``podman run``)."""

    name = "podman"
    engine = PODMAN

    def _info_argv(self) -> list[str]:
        return [self.engine.binary, "info", "--format", "json"]

    def _engine_info(self, raw: bytes) -> dict[str, str]:
        doc = _engine_json(raw, self.engine.binary)
        version, oci = _member(doc, "version"), _member(_member(doc, "host"), "ociRuntime")
        return {
            "name": "podman",
            "version": str(version.get("Version", "")),
            "server": f"podman {version.get('Version', '')}",
            "oci_runtime": _first_line(str(oci.get("version", ""))),
        }


class DockerRuntime(OciRuntime):
    """The docker CLI against the engine ``DOCKER_HOST`` names (tested against ``podman system service``)."""

    name = "docker"
    engine = DOCKER

    def _install_hint(self) -> str:
        return "apt-get install docker.io (the CLI; the engine may be podman system service as DOCKER_HOST)"

    def _info_argv(self) -> list[str]:
        return [self.engine.binary, "version", "--format", "{{json .}}"]

    def _engine_info(self, raw: bytes) -> dict[str, str]:
        doc = _engine_json(raw, self.engine.binary)
        client, server = _member(doc, "Client"), _member(doc, "Server")
        listed = server.get("Components")
        components = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
        engine = next((c for c in components if c.get("Name") in ("Podman Engine", "Engine")), {})
        oci = next((c for c in components if str(c.get("Name", "")).startswith("OCI Runtime")), {})
        return {
            "name": "docker",
            "version": str(client.get("Version", "")),
            "server": f"{engine.get('Name', 'unknown engine')} {engine.get('Version', '')}".strip(),
            "oci_runtime": _first_line(str(oci.get("Version", ""))),
        }

    def _can_load(self, info: Mapping[str, str]) -> str:
        if info["server"].startswith("Podman Engine"):
            return ""  # its storage is containers-storage, where skopeo copies to
        return (
            f"the images are not in {info['server']}'s storage, and a Docker engine keeps no OCI manifest "
            "digest for an image it did not pull from a registry: use podman system service as DOCKER_HOST"
        )


def _member(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``doc[key]`` when it is an object, else an empty one (engines' output varies by version)."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _engine_json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = parse_json(raw, what=f"{what}'s version output", max_bytes=4 * 1024 * 1024)
    except ParseError as exc:
        raise RuntimeUnavailable(str(exc)) from None
    if not isinstance(doc, dict):
        raise RuntimeUnavailable(f"{what} printed no version document")
    return doc


@contextlib.contextmanager
def _started(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError as exc:
        raise RuntimeUnavailable(f"cannot run {argv[0]}: {exc}") from None
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _finish(process: subprocess.Popen[str]) -> tuple[str, str, int]:
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return out, err, process.returncode


async def _start(argv: list[str], engine: Engine, name: str, fifo: Path) -> _Sandbox:
    """Start the attached ``ENGINE run``; the event channel is the FIFO, read here."""
    read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    keep_open = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            cwd=fifo.parent,  # conmon writes an "oom" file into its working folder on cgroup v1
        )  # fmt: skip
    except OSError as exc:
        os.close(read_fd)
        os.close(keep_open)
        raise SandboxError(f"cannot start the sandbox's container: {exc}") from None
    assert process.stdout is not None
    assert process.stderr is not None
    return _Sandbox(process, engine, name, process.stdout, process.stderr, trio.lowlevel.FdStream(read_fd), keep_open)


LEFT_BEHIND = re.compile(r"ale-(?:sandbox|evaluator)-([0-9]+)-[0-9a-f]+")


def sweep(engine: Engine) -> list[str]:
    """Remove what a harness that died (SIGKILL, a crash) left: its containers, which outlive the
    CLI that ran them attached, and its state folders, all named with its pid (``ale-sandbox-PID-*``,
    ``ale-evaluator-PID-*``); the names of what was removed."""
    from ale.runner.sandbox_fs import pid_alive

    listed = subprocess.run(
        [engine.binary, "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True, timeout=120
    )
    names = set(listed.stdout.split()) if listed.returncode == 0 else set()
    with contextlib.suppress(OSError):
        names |= {p.name for p in STATE_DIR.iterdir()}
    swept = []
    for name in sorted(names):
        match = LEFT_BEHIND.fullmatch(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        _remove(engine, name, [])
        folder = STATE_DIR / name
        if (folder / "tmp").is_mount():
            with contextlib.suppress(OSError):
                sandbox_fs.unmount(folder / "tmp")
        shutil.rmtree(folder, ignore_errors=True)
        swept.append(name)
    return swept


def _remove_sandbox(box: _Sandbox, cgroup: oci_cgroups.SandboxCgroup) -> None:
    box.remove()
    cgroup.destroy()


@contextlib.contextmanager
def _sandbox_files(name: str, limits: Limits, uid: int, c: _Checked) -> Iterator[SandboxFiles]:
    """The sandbox's FIFO and /tmp (a size- and inode-limited tmpfs, where mounts work), removed after."""
    folder = _state_folder(name)
    tmp: Path | None = None
    try:
        events = folder / "events"  # the channel; its reader, the harness, opens it in _start
        os.mkfifo(events, 0o600)
        os.chmod(events, 0o602)  # root's: the agent may write it (by fd 3 or by path), never read it
        if not c.mounts:
            tmp = folder / "tmp"
            tmp.mkdir(mode=0o700)
            try:
                sandbox_fs.mount_tmpfs(
                    tmp, size_bytes=limits.tmp_bytes, inodes=sandbox_fs.inodes_for(limits.tmp_bytes), uid=uid,
                    mode=0o1777,
                )  # fmt: skip
            except OSError as exc:
                tmp = None
                raise SandboxError(f"cannot mount the sandbox's /tmp: {exc}") from None
        yield SandboxFiles(events=events, tmp=tmp, seccomp=c.seccomp_file, empty=c.empty)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                sandbox_fs.unmount(tmp)
        shutil.rmtree(folder, ignore_errors=True)


@asynccontextmanager
async def _workspace(workspace: Path, limits: Limits, pool: uids.TaskUids, *, mount: bool) -> AsyncIterator[None]:
    """The task's workspace, its uid's alone (mode 0700: no other task's uid may read it), with a
    uid claimed for the task while it lasts; on a size- and inode-limited tmpfs where mounts work."""
    uid = await trio.to_thread.run_sync(pool.open, workspace)
    try:
        if not mount:
            _own(workspace, uid)
            yield
            return
        sandbox_fs.mount_tmpfs(
            workspace, size_bytes=limits.workspace_bytes, inodes=sandbox_fs.inodes_for(limits.workspace_bytes),
            uid=uid, mode=0o700,
        )  # fmt: skip
        try:
            yield
        finally:
            sandbox_fs.unmount(workspace)
    finally:
        pool.close(workspace)


def _own(folder: Path, uid: int) -> None:
    """``folder`` (a host folder the harness made) as ``uid``'s own, mode 0700."""
    os.chown(folder, uid, uid)
    os.chmod(folder, 0o700)


def _keep_events(standby: _Standby, spec: EvaluatorSpec) -> None:
    """Once the evaluator ended: its event log becomes the spec's file (replacing the link), and its
    sockets' links go (its container and folder go after, on the reaper's thread)."""
    if spec.events_path.is_symlink():
        kept = spec.events_path.with_name(spec.events_path.name + ".part")
        try:
            shutil.copyfile(standby.events, kept)
            os.replace(kept, spec.events_path)
        except FileNotFoundError:
            spec.events_path.unlink(missing_ok=True)
    for link in (spec.agent_socket, spec.harness_socket):
        with contextlib.suppress(OSError):
            if link.is_symlink():
                link.unlink()


@asynccontextmanager
async def _evaluator_running(
    handle: OciEvaluator, stdout: trio.abc.ReceiveStream, stderr: trio.abc.ReceiveStream, spec: EvaluatorSpec
) -> AsyncIterator[None]:
    """Enter once the evaluator said it is ready; stop its container on exit (an error if it never was)."""
    container = handle.standby
    ready = trio.Event()

    on_stdout = supervise.ready_sink(ready, "the evaluator's stdout")

    def on_stderr(_s: str, line: bytes) -> None:
        handle.stderr_lines.append(line.decode(errors="replace"))

    try:
        with collapse():
            async with stdout, stderr, trio.open_nursery() as nursery:
                nursery.start_soon(supervise.pump, stderr, supervise.LineSplitter("stderr", on_stderr))
                nursery.start_soon(
                    supervise.pump,
                    stdout,
                    supervise.LineSplitter("stdout", on_stdout),
                )
                if not await supervise.until_ready(container, ready, READY_TIMEOUT_S):
                    await supervise.stop(container)
                    await trio.sleep(0.1)
                    raise EvaluatorStartError(
                        f"the evaluator for {spec.task_id} did not become ready "
                        f"(exit status {container.returncode}):\n{handle.stderr_tail()}"
                    )
                try:
                    yield
                finally:
                    await supervise.stop(container)
                    nursery.cancel_scope.cancel()
    finally:
        if container.returncode is None:
            await supervise.stop(container)
