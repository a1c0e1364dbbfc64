"""The podman backend (ale/runner/oci.py): its argv and seccomp profile, and the runtime
conformance suite run against it with the real images built here and locked.

Slow (the images are built from the download cache shared with test_images_repro.py); needs
rootful podman with runc and skopeo (CI installs them: ``ALE_SITE_TOOLS_REQUIRED=1``).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from sandbox_tools import missing

from ale.images import attest, definition
from ale.images.build import build_image
from ale.images.fetch import FetchError, default_cache
from ale.runner import seccomp
from ale.runner.conformance import Box, Lines, RuntimeConformance
from ale.runner.oci import ImageRef, PodmanRuntime, evaluator_argv, sandbox_argv, seccomp_profile, with_fd
from ale.runner.runtime import EvaluatorSpec, Limits, Runtime, SandboxSpec

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "ab" * 32


def _spec(tmp_path: Path, *, writable: bool = True) -> SandboxSpec:
    return SandboxSpec(
        command=("/ale/python/bin/python3", "-c", "pass"),
        workspace=tmp_path / "ws",
        workspace_writable=writable,
        task_dir=tmp_path / "task",
        evaluator_socket=tmp_path / "e.sock",
        env={"HOME": "/workspace", "PATH": "/ale/python/bin:/usr/bin:/bin"},
        limits=Limits(processes=99, sandbox_memory_bytes=1 << 30, cpus=0.5, open_files=512, file_bytes=1 << 20),
    )


def test_sandbox_argv_runs_the_image_by_digest_with_every_restriction(tmp_path: Path) -> None:
    argv = sandbox_argv(
        "podman", _spec(tmp_path), ImageRef("agent-base", DIGEST), name="n", uid=1879048192,
        seccomp_file=tmp_path / "s.json", tmp_dir=None,
    )  # fmt: skip
    for flag in (
        "--pull=never", "--network=none", "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
        "--user=1879048192:1879048192", f"--security-opt=seccomp={tmp_path / 's.json'}", "--pids-limit=99",
        f"--memory={1 << 30}", f"--memory-swap={1 << 30}", "--cpus=0.5", "--ulimit=nofile=512:512",
        "--ulimit=nproc=99:99", f"--ulimit=fsize={1 << 20}:{1 << 20}", "--unsetenv-all", "--preserve-fds=1",
        f"--volume={tmp_path / 'ws'}:/workspace:rw", f"--volume={tmp_path / 'task'}:/task:ro",
        f"--volume={tmp_path / 'e.sock'}:/ale/evaluator.sock", "--workdir=/workspace", "--env=ALE_EVENT_FD=3",
    ):  # fmt: skip
        assert flag in argv, flag
    i = argv.index(f"localhost/ale-agent-base@{DIGEST}")
    assert argv[i + 1 :] == ["/usr/bin/env", "-u", "HOSTNAME", "/ale/python/bin/python3", "-c", "pass"]
    ro = sandbox_argv("podman", _spec(tmp_path, writable=False), ImageRef("agent-base", DIGEST), name="n",
                      uid=5, seccomp_file=tmp_path / "s.json", tmp_dir=tmp_path / "tmp")  # fmt: skip
    assert f"--volume={tmp_path / 'ws'}:/workspace:ro" in ro
    assert f"--volume={tmp_path / 'tmp'}:/tmp" in ro


def test_evaluator_argv_mounts_only_its_folders(tmp_path: Path) -> None:
    spec = EvaluatorSpec(
        "cartpole-balance", b"{}", tmp_path / "s" / "a.sock", tmp_path / "p" / "h.sock", tmp_path / "p" / "e.jsonl"
    )
    argv = evaluator_argv("podman", spec, ImageRef("evaluator", DIGEST), name="e")
    assert [a for a in argv if a.startswith("--volume=")] == [
        f"--volume={tmp_path / 'p'}:{tmp_path / 'p'}",
        f"--volume={tmp_path / 's'}:{tmp_path / 's'}",
    ]
    assert argv[argv.index(f"localhost/ale-evaluator@{DIGEST}") + 1 :][:3] == ["serve", "--task", "cartpole-balance"]
    assert "--run-config-fd" in argv


def test_with_fd_makes_the_descriptor_number_three() -> None:
    assert with_fd(19, ["podman", "run"], direction="out") == [
        "/bin/bash",
        "-c",
        'exec "$@" 3>&19',
        "bash",
        "podman",
        "run",
    ]
    assert with_fd(9, ["x"], direction="in")[2] == 'exec "$@" 3<&9'


def test_seccomp_profile_has_the_local_filters_rules() -> None:
    profile = seccomp_profile("x86_64", lambda name: name != "cacheflush")
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert profile["defaultErrnoRet"] == errno.EPERM
    allowed = profile["syscalls"][0]["names"]
    assert "read" in allowed
    assert "cacheflush" not in allowed
    assert not {"ptrace", "mount", "unshare", "io_uring_setup", "bpf"} & set(allowed)
    by_name: dict[str, list[dict[str, object]]] = {}
    for rule in profile["syscalls"]:
        for name in rule["names"]:
            by_name.setdefault(name, []).append(rule)
    assert by_name["clone3"][0]["errnoRet"] == errno.ENOSYS
    assert by_name["clone"][0]["args"] == [
        {"index": 0, "value": seccomp.NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]
    assert len(by_name["personality"]) == len(seccomp.PERSONALITIES)
    assert len(by_name["socket"]) == 5  # AF_UNIX any; AF_INET and AF_INET6 with STREAM or DGRAM


# --- the conformance suite on podman -------------------------------------------------------------


@pytest.fixture(scope="module")
def built_images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("podman") is None or shutil.which("skopeo") is None:
        missing("podman and skopeo are not installed (apt-get install podman runc skopeo)")
    if os.geteuid() != 0:
        missing("the podman runtime needs root (rootful podman)")
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / ".ci" / "containers.conf"))
    out = tmp_path_factory.mktemp("layouts")
    cache = Path(os.environ.get("ALE_IMAGES_CACHE") or default_cache())
    defs = [definition.load(ROOT / "images" / f"{n}.toml") for n in ("agent-base", "evaluator")]
    try:
        for d in defs:
            build_image(d, ROOT, out / d.name, cache, log=lambda _line: None)
    except FetchError as exc:
        missing(f"the pinned downloads are neither cached nor reachable: {exc}")
    lock = out / "images.lock.json"
    attest.write_lock(lock, attest.read_lock_entries(out, defs))
    return out, lock


@pytest.fixture(scope="module")
def podman_runtime(built_images: tuple[Path, Path]) -> Iterator[PodmanRuntime]:
    layouts, lock = built_images
    runtime = PodmanRuntime(layouts=layouts, lock=lock)
    runtime.check()
    return runtime


@pytest.mark.slow
class TestPodmanConformance(RuntimeConformance):
    @pytest.fixture
    def runtime(self, podman_runtime: PodmanRuntime) -> Runtime:
        return podman_runtime


@pytest.mark.slow
def test_podman_attestation_names_the_locked_digests(
    podman_runtime: PodmanRuntime, built_images: tuple[Path, Path]
) -> None:
    _layouts, lock = built_images
    att = podman_runtime.attestation()
    entries = attest.read_lock(lock)
    assert att["images"]["images"]["evaluator"]["digest"] == entries["evaluator"]["digest"]
    assert att["code"]["agent_image_sha256"] == entries["agent-base"]["digest"][7:]


@pytest.mark.slow
async def test_podman_sandbox_tmp_is_size_and_inode_limited(podman_runtime: PodmanRuntime, tmp_path: Path) -> None:
    """/tmp is the harness's tmpfs (size= and nr_inodes=), which podman's own --tmpfs cannot limit by inodes."""
    folder = Path(tempfile.mkdtemp(prefix="ale-oci-"))
    box = Box(folder)
    try:
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
    finally:
        box.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
async def test_podman_sandbox_runs_under_the_local_filters_rules(podman_runtime: PodmanRuntime) -> None:
    """Not podman's default profile: netlink and raw sockets are refused (podman's allows them),
    ptrace is EPERM, and the filter is installed (Seccomp: 2)."""
    folder = Path(tempfile.mkdtemp(prefix="ale-oci-"))
    box = Box(folder)
    try:
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
            "print('REPORT ' + json.dumps(r), flush=True)\n"
        )
        lines = Lines()
        result = await podman_runtime.run_sandboxed(box.spec(code), lines)
        assert result.exit_status == 0, lines.lines
        assert lines.report() == {
            "seccomp": "2", "netlink": "EPERM", "packet": "EPERM", "unix": "opened", "ptrace": "EPERM"
        }  # fmt: skip
    finally:
        box.close()
        shutil.rmtree(folder, ignore_errors=True)
