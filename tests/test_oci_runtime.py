"""The OCI runtimes (ale/runner/oci.py): their command lines, the sandbox's first process
(ale/runner/oci_launch.py), what they read from their engines, and what only a real podman shows:
the locked digests in the attestation, the harness's /tmp, the local filter's rules, the mounts a
sandbox and an evaluator get, and nothing left behind.

The runtime conformance suite and the isolation tests run against ``podman`` and ``docker`` from
the registry (tests/test_runtime_conformance.py, test_seccomp.py, test_cgroups.py,
test_agent_view.py); docker's own tests are tests/test_docker_runtime.py. The slow tests here
need rootful podman with runc and skopeo (CI installs them: ``ALE_SITE_TOOLS_REQUIRED=1``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from oci_images import prepare
from sandbox_tools import missing

from ale import catalog
from ale.images import attest
from ale.runner import agent_env, oci, oci_launch, seccomp
from ale.runner.conformance import Box, Lines, _evaluator_spec
from ale.runner.oci import (
    DOCKER,
    PODMAN,
    DockerRuntime,
    ImageRef,
    PodmanRuntime,
    SandboxFiles,
    evaluator_argv,
    module_binds,
    sandbox_argv,
    serve_options,
)
from ale.runner.runtime import Limits, RuntimeUnavailable, SandboxSpec

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "ab" * 32
LAUNCH = Path(oci_launch.__file__)


def _spec(tmp_path: Path, *, writable: bool = True) -> SandboxSpec:
    return SandboxSpec(
        command=("/ale/python/bin/python3", "-c", "pass"),
        workspace=tmp_path / "ws",
        workspace_writable=writable,
        task_dir=tmp_path / "task",
        evaluator_socket=tmp_path / "e.sock",
        env={"HOME": "/workspace", "PATH": "/ale/python/bin:/usr/bin:/bin"},
        limits=Limits(
            processes=99,
            sandbox_memory_bytes=1 << 30,
            cpus=0.5,
            open_files=512,
            file_bytes=1 << 20,
            memory_bytes=1 << 29,
        ),
    )


def _files(tmp_path: Path, tmp: Path | None = None) -> SandboxFiles:
    return SandboxFiles(events=tmp_path / "ev", tmp=tmp, seccomp=tmp_path / "f.bpf", empty=tmp_path / "empty")


# --- command lines ---------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", [PODMAN, DOCKER], ids=["podman", "docker"])
def test_sandbox_argv_runs_the_image_by_digest_with_every_restriction(tmp_path: Path, engine: oci.Engine) -> None:
    argv = sandbox_argv(
        engine, _spec(tmp_path), ImageRef("agent-base", DIGEST), name="n", uid=1879048192, files=_files(tmp_path),
        cgroup_parent="/ale-oci/ale-1-ab",
    )  # fmt: skip
    assert argv[:2] == [engine.binary, "run"]
    for flag in (
        "--pull=never", "--network=none", "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
        "--user=1879048192:1879048192", "--pids-limit=99", f"--memory={1 << 30}", f"--memory-swap={1 << 30}",
        "--cpus=0.5", "--ulimit=nofile=512:512", "--ulimit=nproc=99:99", f"--ulimit=fsize={1 << 20}:{1 << 20}",
        "--ulimit=core=0:0", "--cgroup-parent=/ale-oci/ale-1-ab", "--log-driver=none",
        f"--volume={tmp_path / 'ws'}:/workspace:rw", f"--volume={tmp_path / 'task'}:/task:ro",
        f"--volume={tmp_path / 'e.sock'}:/ale/evaluator.sock", f"--volume={tmp_path / 'ev'}:/ale/launch/events",
        f"--volume={tmp_path / 'f.bpf'}:/ale/launch/seccomp.bpf:ro", f"--volume={tmp_path / 'empty'}:/run:ro",
        f"--volume={tmp_path / 'empty'}:/var/tmp:ro", "--workdir=/workspace", "--env=ALE_EVENT_FD=3",
        "--env=HOME=/workspace", f"--tmpfs=/tmp:rw,size={Limits().tmp_bytes},mode=1777,nosuid,nodev",
    ):  # fmt: skip
        assert flag in argv, flag
    assert not any(a.startswith("--security-opt=seccomp") for a in argv)  # the launcher installs the filter
    assert ("--read-only-tmpfs=false" in argv) == (engine is PODMAN)  # podman's own; docker's CLI has none
    i = argv.index(f"localhost/ale-agent-base@{DIGEST}")
    launch = argv[i + 1 :]
    assert launch[:4] == [agent_env.PYTHON, "-I", "-S", "-c"]
    assert launch[4] == oci.launcher_source()
    assert '"""' not in launch[4]
    assert "bubblewrap" not in launch[4]  # the docstring stays in the file
    assert launch[5:] == [
        "--as", str(1 << 29), "--events", "/ale/launch/events", "--keep", "ALE_EVENT_FD,HOME,PATH",
        "--seccomp", "/ale/launch/seccomp.bpf", "--", "/ale/python/bin/python3", "-c", "pass",
    ]  # fmt: skip


def test_sandbox_argv_read_only_workspace_harness_tmp_and_module_binds(tmp_path: Path) -> None:
    ro = sandbox_argv(
        PODMAN, _spec(tmp_path, writable=False), ImageRef("agent-base", DIGEST), name="n", uid=5,
        files=_files(tmp_path, tmp_path / "tmp"), cgroup_parent="/p", binds=[(tmp_path / "m.py", "/x/m.py")],
    )  # fmt: skip
    assert f"--volume={tmp_path / 'ws'}:/workspace:ro" in ro
    assert f"--volume={tmp_path / 'tmp'}:/tmp" in ro
    assert not any(a.startswith("--tmpfs=/tmp") for a in ro)
    assert f"--volume={tmp_path / 'm.py'}:/x/m.py:ro" in ro


def test_the_sandbox_binds_the_evaluator_socket_a_link_names(tmp_path: Path) -> None:
    """An OCI evaluator's agent socket is a link at the spec's path: the container gets the socket."""
    (tmp_path / "real.sock").write_text("")
    (tmp_path / "e.sock").symlink_to(tmp_path / "real.sock")
    argv = sandbox_argv(
        PODMAN, _spec(tmp_path), ImageRef("agent-base", DIGEST), name="n", uid=5, files=_files(tmp_path),
        cgroup_parent="/p",
    )  # fmt: skip
    assert f"--volume={tmp_path / 'real.sock'}:/ale/evaluator.sock" in argv


def test_evaluator_argv_mounts_only_its_two_folders_and_its_fifo_with_limits(tmp_path: Path) -> None:
    argv = evaluator_argv(PODMAN, ImageRef("evaluator", DIGEST), name="e", folder=tmp_path, pycache=None)
    assert [a for a in argv if a.startswith("--volume=")] == [
        f"--volume={tmp_path / 'agent'}:/ale/agent",
        f"--volume={tmp_path / 'harness'}:/ale/harness",
        f"--volume={tmp_path / 'alive'}:/ale/launch/alive",
    ]
    cached = evaluator_argv(PODMAN, ImageRef("evaluator", DIGEST), name="e", folder=tmp_path, pycache=tmp_path / "c")
    assert f"--volume={tmp_path / 'c'}:/ale/pycache" in cached
    assert "--env=PYTHONPYCACHEPREFIX=/ale/pycache" in cached
    assert "--env=PYTHONDONTWRITEBYTECODE=" in cached  # the image says 1: the cache is written
    for flag in (
        "--interactive", "--user=10001:10001", "--network=none", "--read-only", "--cap-drop=ALL",
        "--security-opt=no-new-privileges", f"--pids-limit={oci.EVALUATOR_PROCESSES}",
        f"--memory={oci.EVALUATOR_MEMORY_BYTES}", f"--cpus={oci.evaluator_cpus():g}",
    ):  # fmt: skip
        assert flag in argv, flag
    # the launcher first (it ends the container with the harness), then the image's entrypoint
    assert "--entrypoint=/usr/bin/python3.11" in argv
    assert argv[argv.index(f"localhost/ale-evaluator@{DIGEST}") + 1 :] == [
        "-I", "-S", "-c", oci.launcher_source(), "--alive", "/ale/launch/alive", "--",
        "/usr/bin/python3.11", "-m", "ale_evaluator", "standby", "--job-fd", "0",
    ]  # fmt: skip
    assert serve_options("cartpole-balance")[:2] == ["--task", "cartpole-balance"]
    assert "--run-config-fd" not in serve_options("x")  # the run configuration goes in the job, on stdin


def test_a_bundled_agents_own_modules_are_bound_and_nothing_of_the_client() -> None:
    assert module_binds(None) == []
    assert module_binds(agent_env.ensure()) == []  # the client library's closure is in the image
    demo = agent_env.ensure(("ale.agents.demo",))
    binds = dict((dest, src) for src, dest in module_binds(demo))
    site = oci.IMAGE_SITE
    assert f"{site}/ale/agents/__init__.py" in binds
    assert f"{site}/ale/agents/demo.py" in binds
    assert not any(dest.startswith(f"{site}/ale/client") for dest in binds)
    assert all(src.is_file() and src.is_relative_to(demo.root) for src in binds.values())


def test_an_agent_environment_with_distributions_the_image_lacks_is_named() -> None:
    """``ale run --agent-package``: the OCI runtimes run the image's Python, which has the client's
    distributions only; the others are named (and the sandbox refused: run_sandboxed)."""
    assert oci.image_lacks(None) == []
    assert oci.image_lacks(agent_env.ensure(("ale.agents.demo",))) == []
    env = attrs.evolve(agent_env.ensure(), distributions=("numpy==2.4.6", "openai==2.0.0", "Some_Thing==1"))
    assert oci.image_lacks(env) == ["Some_Thing==1", "openai==2.0.0"]


def test_the_agent_image_wants_exactly_the_client_librarys_distributions() -> None:
    from packaging.utils import canonicalize_name

    from ale.images import definition

    wheels = {canonicalize_name(w.name) for w in definition.load(ROOT / "images" / "agent-base.toml").python.wheels}
    assert wheels == set(oci._client_distributions())


def test_the_image_site_is_the_agent_definitions() -> None:
    from ale.images import definition

    assert definition.load(ROOT / "images" / "agent-base.toml").python.site == oci.IMAGE_SITE


def test_the_evaluators_entrypoint_is_the_evaluator_definitions() -> None:
    """The evaluator's container starts the launcher instead, and then the image's own entrypoint."""
    from ale.images import definition

    defn = definition.load(ROOT / "images" / "evaluator.toml")
    assert defn.entrypoint == oci.EVALUATOR_ENTRYPOINT
    assert f"{defn.user.uid}:{defn.user.gid}" == oci.EVALUATOR_USER


# --- the sandbox's first process ---------------------------------------------------------------------


def _launch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", oci.launcher_source(), *args],
        capture_output=True, text=True, env=env if env is not None else {"PATH": "/usr/bin:/bin", "DROP": "1"},
        cwd=tmp_path, timeout=60,
    )  # fmt: skip


REPORT = (
    "import json, os, resource\n"
    'os.write(3, b\'{"kind": "note"}\\n\')\n'
    "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
    "env = dict(e.split('=', 1) for e in open('/proc/self/environ').read().split('\\0') if e)\n"
    "print(json.dumps({'env': env, 'as': resource.getrlimit(resource.RLIMIT_AS)[0],"
    " 'seccomp': status['Seccomp'].strip()}))\n"
)


def test_the_launcher_sets_as_opens_the_channel_keeps_the_env_and_filters(tmp_path: Path) -> None:
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    program = tmp_path / "f.bpf"
    program.write_bytes(seccomp.build().program)
    try:
        proc = _launch(
            tmp_path, "--as", str(4 << 30), "--events", str(fifo), "--keep", "PATH,ALE_EVENT_FD,MISSING",
            "--seccomp", str(program), "--", sys.executable, "-c", REPORT,
            env={"PATH": "/usr/bin:/bin", "ALE_EVENT_FD": "3", "HOSTNAME": "engine-added"},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert os.read(reader, 4096) == b'{"kind": "note"}\n'
    finally:
        os.close(reader)
    report = json.loads(proc.stdout)
    assert report["env"] == {"PATH": "/usr/bin:/bin", "ALE_EVENT_FD": "3"}
    assert report["as"] == 4 << 30
    assert report["seccomp"] == "2"


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--as", "1"], 126, "no command"),
        (["--as", "--", "true"], 126, "usage"),
        (["--bogus", "x", "--", "true"], 126, "unknown option --bogus"),
        (["--as", "many", "--", "true"], 126, "cannot set up"),
        (["--events", "/nonexistent/fifo", "--", "true"], 126, "cannot set up"),
        (["--seccomp", "/nonexistent.bpf", "--", "true"], 126, "cannot set up"),
        (["--", "/no/such/command"], 127, "cannot run /no/such/command"),
    ],
)
def test_the_launcher_refuses_with_one_line_and_never_runs_the_command(
    tmp_path: Path, args: list[str], status: int, message: str
) -> None:
    proc = _launch(tmp_path, *args)
    assert proc.returncode == status
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("ale sandbox: ")
    assert message in proc.stderr


def _pids_with(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if needle.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return found


@pytest.mark.parametrize("option", ["--events", "--alive"])
def test_the_launcher_ends_its_command_once_the_harness_no_longer_holds_the_fifo(tmp_path: Path, option: str) -> None:
    """The harness is the FIFO's only reader: once its end is closed (as the kernel closes a killed
    harness's), the launcher kills the command and ends, whatever the command does with signals."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    marker = f"ale-test-{os.getpid()}-{option[2:]}"
    code = (
        f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); MARK = {marker!r}; "
        "print('up', flush=True); time.sleep(600)"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", oci.launcher_source(), option, str(fifo), "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert launcher.stdout is not None
        assert launcher.stdout.readline() == "up\n"
        launcher.send_signal(signal.SIGTERM)  # passed on, and ignored by the command
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=1)
        assert launcher.returncode is None
        os.close(reader)
        reader = -1
        assert launcher.wait(timeout=60) == 137
        for _ in range(600):
            if not _pids_with(marker):
                break
            time.sleep(0.1)
        assert _pids_with(marker) == []
    finally:
        if reader >= 0:
            os.close(reader)
        launcher.kill()
        launcher.communicate()
        for pid in _pids_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("option", ["--events", "--alive"])
def test_the_launcher_never_runs_the_command_when_nobody_holds_the_fifo(tmp_path: Path, option: str) -> None:
    """A harness gone before its container started: nothing waits for it, nothing runs."""
    os.mkfifo(tmp_path / "fifo")
    marker = tmp_path / "ran"
    proc = _launch(tmp_path, option, str(tmp_path / "fifo"), "--", "/usr/bin/touch", str(marker))
    assert proc.returncode == 126, proc.stderr
    assert "cannot set up the sandbox" in proc.stderr
    assert "No such device or address" in proc.stderr
    assert not marker.exists()


def test_the_launcher_without_keep_keeps_the_whole_environment(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "--", sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))",
                   env={"PATH": "/usr/bin:/bin", "PYTHONPYCACHEPREFIX": "/x"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    got.pop("LC_CTYPE", None)  # what the launcher's Python sets in a C locale (PEP 538), for its children too
    assert got == {"PATH": "/usr/bin:/bin", "PYTHONPYCACHEPREFIX": "/x"}


@pytest.mark.parametrize("program", [b"", b"\x00" * 12, b"\x06\x00\x00\x00\x00\x00\xff\x7f" * 5000])
def test_the_launcher_refuses_a_program_that_is_not_a_filter(tmp_path: Path, program: bytes) -> None:
    (tmp_path / "f.bpf").write_bytes(program)
    marker = tmp_path / "ran"
    proc = _launch(tmp_path, "--seccomp", str(tmp_path / "f.bpf"), "--", "/usr/bin/touch", str(marker))
    assert proc.returncode == 126, proc.stderr
    assert "not a BPF program" in proc.stderr
    assert not marker.exists()


# --- what the engines say about themselves -------------------------------------------------------------

PODMAN_INFO = {
    "host": {"ociRuntime": {"name": "runc", "version": "runc version 1.1.5+ds1\ncommit: x"}, "cgroupVersion": "v1"},
    "version": {"Version": "4.3.1"},
}
DOCKER_VERSION = {
    "Client": {"Version": "20.10.24+dfsg1"},
    "Server": {
        "Components": [
            {"Name": "Podman Engine", "Version": "4.3.1"},
            {"Name": "OCI Runtime (runc)", "Version": "runc version 1.1.5+ds1\ncommit: x"},
        ]
    },
}


def test_the_engines_versions_are_read_from_their_json() -> None:
    assert PodmanRuntime()._engine_info(json.dumps(PODMAN_INFO).encode()) == {
        "name": "podman", "version": "4.3.1", "server": "podman 4.3.1", "oci_runtime": "runc version 1.1.5+ds1",
    }  # fmt: skip
    docker = DockerRuntime()
    info = docker._engine_info(json.dumps(DOCKER_VERSION).encode())
    assert info == {
        "name": "docker", "version": "20.10.24+dfsg1", "server": "Podman Engine 4.3.1",
        "oci_runtime": "runc version 1.1.5+ds1",
    }  # fmt: skip
    assert docker._can_load(info) == ""


def test_a_docker_engine_that_cannot_keep_a_manifest_digest_is_refused_with_a_reason() -> None:
    docker = DockerRuntime()
    moby = {"Client": {"Version": "28.2.2"}, "Server": {"Components": [{"Name": "Engine", "Version": "28.2.2"}]}}
    info = docker._engine_info(json.dumps(moby).encode())
    assert info["server"] == "Engine 28.2.2"
    assert "registry" in docker._can_load(info)
    assert "podman system service" in docker._can_load(info)


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'{"version": "4"}', b'{"Server": {"Components": 7}}'])
@pytest.mark.parametrize("runtime", [PodmanRuntime, DockerRuntime])
def test_garbage_from_the_engine_is_runtime_unavailable_or_empty_fields(
    raw: bytes, runtime: type[oci.OciRuntime]
) -> None:
    try:
        info = runtime()._engine_info(raw)
    except RuntimeUnavailable as exc:
        message = str(exc)
    else:
        assert all(isinstance(v, str) for v in info.values())
        return
    assert "\n" not in message


@pytest.mark.fuzz
@fuzz_settings
@given(
    hostile_json | json_values.map(lambda v: json.dumps({"version": v, "host": v, "Client": v, "Server": v}).encode())
)
def test_fuzz_engine_output_gives_strings_or_runtime_unavailable(raw: bytes) -> None:
    for runtime in (PodmanRuntime(), DockerRuntime()):
        try:
            info = runtime._engine_info(raw)
        except RuntimeUnavailable:
            continue
        assert set(info) == {"name", "version", "server", "oci_runtime"}
        assert all(isinstance(v, str) for v in info.values())


def test_the_runtime_reads_its_images_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALE_IMAGES_DIR", str(tmp_path / "layouts"))
    monkeypatch.setenv("ALE_IMAGES_LOCK", str(tmp_path / "lock.json"))
    runtime = PodmanRuntime()
    assert (runtime.layouts, runtime.lock) == (tmp_path / "layouts", tmp_path / "lock.json")
    monkeypatch.delenv("ALE_IMAGES_DIR")
    monkeypatch.delenv("ALE_IMAGES_LOCK")
    default_lock = Path(catalog.release_lock_path() or "")  # the default release's: ale/releases/locks/
    assert default_lock == Path(catalog.__file__).parent / "releases" / "locks" / "2026.11.json"
    assert (PodmanRuntime().layouts, PodmanRuntime().lock) == (Path("out/images"), default_lock)


def test_images_that_do_not_match_their_lock_are_runtime_unavailable(tmp_path: Path) -> None:
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("check() looks at the images only where a rootful engine could run them")
    (tmp_path / "lock.json").write_text('{"format": "ale-images-lock/v1", "images": {}}')
    with pytest.raises(RuntimeUnavailable, match="names no agent-base or evaluator image"):
        PodmanRuntime(layouts=tmp_path, lock=tmp_path / "lock.json").check()
    with pytest.raises(RuntimeUnavailable, match="ale images build"):
        PodmanRuntime(layouts=tmp_path, lock=tmp_path / "missing.json").check()


# --- on a real podman --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podman_runtime() -> Iterator[PodmanRuntime]:
    if (why := prepare("podman")) is not None:
        missing(why)
    runtime = PodmanRuntime()
    runtime.check()
    yield runtime
    runtime.close()


@pytest.fixture
def box() -> Iterator[Box]:
    folder = Path(tempfile.mkdtemp(prefix="ale-oci-"))
    made = Box(folder)
    try:
        yield made
    finally:
        made.close()
        shutil.rmtree(folder, ignore_errors=True)


def _ours() -> dict[str, Any]:
    """What of this process's OCI runs is on the machine: containers, state folders, cgroups."""
    listed = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True)
    pid = f"-{os.getpid()}-"
    state = [p.name for p in oci.STATE_DIR.iterdir() if pid in p.name] if oci.STATE_DIR.is_dir() else []
    groups = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/ale-oci/ale-{os.getpid()}-*")]
    groups += [str(p) for p in Path("/sys/fs/cgroup").glob(f"ale-oci/ale-{os.getpid()}-*")]
    return {"containers": [n for n in listed.stdout.split() if pid in n], "state": state, "cgroups": groups}


@pytest.mark.slow
def test_podman_attestation_names_the_locked_digests(podman_runtime: PodmanRuntime) -> None:
    att = podman_runtime.attestation()
    entries = attest.read_lock(podman_runtime.lock)
    assert att["images"]["images"]["evaluator"]["digest"] == entries["evaluator"]["digest"]
    assert att["code"]["agent_image_sha256"] == entries["agent-base"]["digest"][7:]
    assert att["engine"]["name"] == "podman"
    assert att["engine"]["version"]
    assert att["isolation"]["seccomp"]["details"] == seccomp.build().describe()  # the local runtime's filter
    assert podman_runtime.image_digests() == {n: e["digest"] for n, e in entries.items()}


@pytest.mark.slow
async def test_podman_sandbox_tmp_is_size_and_inode_limited(podman_runtime: PodmanRuntime, box: Box) -> None:
    """/tmp is the harness's tmpfs (size= and nr_inodes=), which the engines' --tmpfs cannot limit by inodes."""
    code = (
        "import errno, json, os\n"
        "n = 0\n"
        "try:\n"
        "    while n < 5000:\n"
        "        open(f'/tmp/f{n}', 'w').close()\n"
        "        n += 1\n"
        "    r = 'no limit'\n"
        "except OSError as exc:\n"
        "    r = errno.errorcode[exc.errno]\n"
        "print('REPORT ' + json.dumps({'files': n, 'stopped': r}), flush=True)\n"
    )
    lines = Lines()
    spec = attrs.evolve(box.spec(code), limits=Limits(tmp_bytes=16 << 20))
    result = await podman_runtime.run_sandboxed(spec, lines)
    assert result.exit_status == 0, lines.lines
    report = lines.report()
    assert report["stopped"] == "ENOSPC", report
    assert report["files"] < 1100


@pytest.mark.slow
async def test_podman_sandbox_runs_under_the_local_filters_rules(podman_runtime: PodmanRuntime, box: Box) -> None:
    """The local filter on top of podman's default profile: netlink and raw sockets are refused (podman's
    default allows them), ptrace is EPERM, the filter is installed, and io_uring looks absent."""
    code = (
        "import ctypes, errno, json, socket\n"
        "r = {'seccomp': [l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')][0]}\n"
        "for name, fam, kind in [('netlink', 16, socket.SOCK_RAW), ('packet', 17, socket.SOCK_RAW),\n"
        "                        ('unix', socket.AF_UNIX, socket.SOCK_STREAM)]:\n"
        "    try:\n"
        "        socket.socket(fam, kind).close()\n"
        "        r[name] = 'opened'\n"
        "    except OSError as exc:\n"
        "        r[name] = errno.errorcode[exc.errno]\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "r['ptrace'] = errno.errorcode.get(ctypes.get_errno(), 'ok') if libc.ptrace(0, 0, 0, 0) != 0 else 'ok'\n"
        "r['clone3'] = errno.errorcode.get(ctypes.get_errno()) if libc.syscall(435, 0, 0) != 0 else 'ok'\n"
        "print('REPORT ' + json.dumps(r), flush=True)\n"
    )
    lines = Lines()
    result = await podman_runtime.run_sandboxed(box.spec(code), lines)
    assert result.exit_status == 0, lines.lines
    assert lines.report() == {
        "seccomp": "2", "netlink": "EPERM", "packet": "EPERM", "unix": "opened", "ptrace": "EPERM",
        "clone3": "ENOSYS",
    }  # fmt: skip


MOUNTS = (
    "import json\n"
    "points = sorted({l.split()[4] for l in open('/proc/self/mountinfo')})\n"
    "print('REPORT ' + json.dumps({'points': points}), flush=True)\n"
)


@pytest.mark.slow
async def test_podman_sandbox_mounts_only_the_contracts_paths(podman_runtime: PodmanRuntime, box: Box) -> None:
    """The agent's container mounts the contract's paths and its launcher's two files; no evaluator
    folder (the harness endpoint's socket is in a folder only the evaluator's container mounts)."""
    lines = Lines()
    result = await podman_runtime.run_sandboxed(box.spec(MOUNTS), lines)
    assert result.exit_status == 0, lines.lines
    points = set(lines.report()["points"])
    host = {p for p in points if p.startswith(("/proc", "/sys", "/dev", "/etc"))}
    assert points - host == {
        "/", "/workspace", "/task", "/ale/evaluator.sock", "/ale/launch/events", "/ale/launch/seccomp.bpf",
        "/run", "/var/tmp", "/tmp",
    }  # fmt: skip


@pytest.mark.slow
async def test_podman_evaluator_event_log_and_sockets_at_the_specs_paths(podman_runtime: PodmanRuntime) -> None:
    """The sockets and the event log are the container's, linked at the spec's paths while it runs; after,
    the log is a plain file there, the links are gone, and so are the container and its folder."""
    folder = Path(tempfile.mkdtemp(prefix="ale-oci-"))
    try:
        spec = _evaluator_spec(folder)
        async with podman_runtime.open_evaluator(spec) as handle:
            assert spec.harness_socket.is_symlink()
            target = spec.harness_socket.resolve()
            assert target.parent.stat().st_mode & 0o777 == 0o700  # only the evaluator's user (and root)
            assert not spec.agent_socket.resolve().is_relative_to(target.parent)
            assert handle.harness_target == f"unix:{spec.harness_socket}"
        assert spec.events_path.is_file()
        assert not spec.events_path.is_symlink()
        assert json.loads(spec.events_path.read_text().splitlines()[0])["kind"] == "evaluator_ready"
        assert not spec.agent_socket.exists()
        assert not spec.agent_socket.is_symlink()
        podman_runtime.close()  # waits for the removals, which happen off the run's path
        assert not target.parent.exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
async def test_podman_leaves_no_container_cgroup_or_folder_behind(podman_runtime: PodmanRuntime, box: Box) -> None:
    podman_runtime.close()  # other runtimes of this process may still be removing theirs: only what is new counts
    before = _ours()
    with trio.move_on_after(2):
        await podman_runtime.run_sandboxed(box.spec("import time; time.sleep(60)"), Lines())
    await podman_runtime.run_sandboxed(box.spec("import os; os.kill(os.getpid(), 9)"), Lines())
    podman_runtime.prestart_evaluator()
    podman_runtime.close()
    after = _ours()
    assert {k: set(v) - set(before[k]) for k, v in after.items()} == {
        "containers": set(),
        "state": set(),
        "cgroups": set(),
    }


def _dead_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


#: A harness of its own: a prestarted evaluator and a sandbox that sleeps, "UP" once the sandbox is up.
KILLED_HARNESS = """
import sys
from pathlib import Path

import trio

from ale.runner import runtimes
from ale.runner.conformance import Box

engine, folder, marker = sys.argv[1:4]
runtime = runtimes.make(engine)
runtime.check()
runtime.prestart_evaluator()
box = Box(Path(folder))
code = f"MARK = {marker!r}; import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
code += "print('up', flush=True); time.sleep(600)"

def sink(stream, line):
    if line == b"up":
        print("UP", flush=True)

trio.run(runtime.run_sandboxed, box.spec(code, wall_time_s=600), sink)
"""


def _running_of(pid: int) -> list[str]:
    """The running containers of the harness ``pid`` (podman's storage: both engines' here)."""
    listed = subprocess.run(["podman", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, timeout=120)
    return sorted(name for name in listed.stdout.split() if f"-{pid}-" in name)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["podman", "docker"])
def test_a_killed_harness_takes_its_containers_with_it(engine: str, tmp_path: Path) -> None:
    """SIGKILL the harness while its agent's container runs (a command that ignores SIGTERM) and its
    evaluator's waits in standby: both end at once, with no check() or sweep: their launchers see
    that nobody holds their FIFOs any more (the agent cannot: it may only write its channel)."""
    if (why := prepare(engine)) is not None:
        missing(why)
    marker = f"ale-killed-{os.getpid()}-{engine}"
    folder = Path(tempfile.mkdtemp(prefix="ale-kh-"))
    harness = subprocess.Popen(
        [sys.executable, "-c", KILLED_HARNESS, engine, str(folder), marker],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder,
    )  # fmt: skip
    try:
        assert harness.stdout is not None
        assert harness.stdout.readline() == "UP\n", harness.stderr.read() if harness.stderr else ""
        for _ in range(600):  # the standby evaluator is started alongside
            if len(_running_of(harness.pid)) == 2:
                break
            time.sleep(0.1)
        running = _running_of(harness.pid)
        assert [n.split("-")[1] for n in running] == ["evaluator", "sandbox"], running
        assert _pids_with(marker)
        harness.kill()
        harness.wait()
        for _ in range(600):
            if not _pids_with(marker) and not _running_of(harness.pid):
                break
            time.sleep(0.1)
        assert _pids_with(marker) == []
        assert _running_of(harness.pid) == []
    finally:
        harness.kill()
        harness.communicate()
        for pid in _pids_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        oci.sweep(oci.DOCKER if engine == "docker" else oci.PODMAN)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
async def test_podman_the_agent_cannot_read_its_event_channel(podman_runtime: PodmanRuntime, box: Box) -> None:
    """A reader the agent held would keep its container alive after its harness: the FIFO is root's
    and the agent may only write it, by its descriptor or by path."""
    code = (
        "import errno, json, os\n"
        "r = {}\n"
        "for name, path in (('path', '/ale/launch/events'), ('proc', '/proc/1/fd/3'), ('own', '/proc/self/fd/3')):\n"
        "    try:\n"
        "        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))\n"
        "        r[name] = 'opened'\n"
        "    except OSError as exc:\n"
        "        r[name] = errno.errorcode[exc.errno]\n"
        'os.write(3, b\'{"kind": "note"}\\n\')\n'
        "print('REPORT ' + json.dumps(r), flush=True)\n"
    )
    lines = Lines()
    result = await podman_runtime.run_sandboxed(box.spec(code), lines)
    assert result.exit_status == 0, lines.lines
    assert lines.report() == {"path": "EACCES", "proc": "EACCES", "own": "EACCES"}
    assert lines.of("event") == ['{"kind": "note"}']


@pytest.mark.slow
def test_what_a_killed_harness_left_is_removed_by_the_next_check(podman_runtime: PodmanRuntime) -> None:
    """A harness killed mid-run leaves its containers running (they outlive the attached CLI) and its
    state folders: the next runtime's check() removes those of a pid that is gone, and no other."""
    dead, image = _dead_pid(), podman_runtime._ready().images["agent-base"].ref
    left = f"ale-sandbox-{dead}-0123abcd"
    mine = f"ale-sandbox-{os.getpid()}-0123abcd"
    for name in (left, mine):
        made = subprocess.run(
            ["podman", "create", "--pull=never", f"--name={name}", image, "/ale/python/bin/python3", "-c", "pass"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        (oci.STATE_DIR / name).mkdir()
    try:
        assert oci.sweep(oci.PODMAN) == [left]
        listed = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True)
        assert left not in listed.stdout.split()
        assert mine in listed.stdout.split()
        assert not (oci.STATE_DIR / left).exists()
        assert (oci.STATE_DIR / mine).exists()
    finally:
        for name in (left, mine):  # one at a time: podman rm stops at a name that is already gone
            subprocess.run(["podman", "rm", "--force", name], capture_output=True)
        shutil.rmtree(oci.STATE_DIR / left, ignore_errors=True)
        shutil.rmtree(oci.STATE_DIR / mine, ignore_errors=True)


@pytest.mark.slow
async def test_podman_the_event_channels_file_is_the_channel_itself(podman_runtime: PodmanRuntime, box: Box) -> None:
    """The event channel's file is the agent's own channel: writing to it by path is writing events."""
    code = "open('/ale/launch/events', 'w').write('{\"kind\": \"by-path\"}\\n')"
    lines = Lines()
    result = await podman_runtime.run_sandboxed(box.spec(code), lines)
    assert result.exit_status == 0, lines.lines
    assert lines.of("event") == ['{"kind": "by-path"}']


@pytest.mark.slow
async def test_podman_tasks_side_by_side_run_as_uids_of_their_own_and_cannot_read_each_others_workspace(
    podman_runtime: PodmanRuntime,
) -> None:
    """Two tasks whose workspaces are open at once (``--jobs 2``): their containers run as two uids
    (and gids), each workspace is its uid's alone (mode 0700), and one task's uid can read its own
    workspace's files but not the other's."""
    code = (
        "import json, os\n"
        "open('/workspace/secret', 'w').write('mine')\n"
        "print('REPORT ' + json.dumps({'uid': os.getuid(), 'gid': os.getgid()}), flush=True)\n"
    )
    folders = [Path(tempfile.mkdtemp(prefix="ale-oci-")) for _ in range(2)]
    boxes = [Box(folder) for folder in folders]
    seen: dict[int, Lines] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            for b in boxes:
                await stack.enter_async_context(podman_runtime.open_workspace(b.workspace, Limits()))

            async def task(i: int) -> None:
                seen[i] = Lines()
                result = await podman_runtime.run_sandboxed(boxes[i].spec(code), seen[i])
                assert result.exit_status == 0, seen[i].lines

            async with trio.open_nursery() as nursery:
                for i in range(2):
                    nursery.start_soon(task, i)
            ids = [seen[i].report() for i in range(2)]
            assert ids[0]["uid"] != ids[1]["uid"]
            assert ids[0]["gid"] != ids[1]["gid"]
            for b, got in zip(boxes, ids, strict=True):
                info = b.workspace.stat()
                assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (got["uid"], got["gid"], 0o700)

            def cat_as(uid: int, path: Path) -> subprocess.CompletedProcess[str]:
                argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "cat", str(path)]
                return subprocess.run(argv, capture_output=True, text=True, timeout=30)

            own = cat_as(ids[0]["uid"], boxes[0].workspace / "secret")
            assert (own.returncode, own.stdout) == (0, "mine"), own.stderr
            other = cat_as(ids[0]["uid"], boxes[1].workspace / "secret")
            assert other.returncode != 0
            assert "Permission denied" in other.stderr
    finally:
        for b, folder in zip(boxes, folders, strict=True):
            b.close()
            shutil.rmtree(folder, ignore_errors=True)
