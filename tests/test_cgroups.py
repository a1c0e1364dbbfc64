"""Resources per sandbox (docs/agent-contract.md "Resources"): a cgroup per sandbox for memory (all
processes together), processes and CPU; the workspace and /tmp on size- and inode-limited
filesystems; a uid per run. Real sandboxes: the tests that speak only the runtime interface run
against every backend of the conformance suite (``backend``), the rest look inside the local
runtime. Skipped with the reason on a machine without the facility, required in CI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
from sandbox_box import Box, Lines
from sandbox_tools import backends, make_runtime, missing, need_bwrap

from ale.runner import cgroups, isolation, sandbox_fs, uids
from ale.runner.local import LocalRuntime
from ale.runner.runtime import Limits

MiB = 1024 * 1024


@pytest.fixture(params=backends(), ids=[b.id for b in backends()])
def backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def _runtime(*facilities: str) -> LocalRuntime:
    runtime = LocalRuntime()
    runtime.check()
    for name in facilities:
        if name in runtime.isolation.missing:
            missing(f"{name}: {runtime.isolation.missing[name]}")
    return runtime


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What each sandbox's cgroup counted, read just before it is removed."""
    records: list[dict[str, Any]] = []
    real = cgroups.Cgroup.destroy

    def destroy(self: cgroups.Cgroup, timeout_s: float = 5.0) -> None:
        pids_dir = self.dirs["" if self.hierarchy.version == 2 else "pids"]
        events = dict(line.split() for line in (pids_dir / "pids.events").read_text().splitlines())
        records.append({"oom_kills": self.oom_kills(), "pids_max_hits": int(events.get("max", 0)), "dirs": self.dirs})
        real(self, timeout_s)

    monkeypatch.setattr(cgroups.Cgroup, "destroy", destroy)
    return records


def _report(lines: Lines) -> dict[str, Any]:
    for line in lines.of("stdout"):
        if line.startswith("REPORT "):
            return dict(json.loads(line[7:]))
    raise AssertionError(f"no report: {lines.lines!r}")


# --- memory: all processes together ----------------------------------------------------------------

THREE_CHILDREN = r"""
import json, os, signal, time
statuses = []
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(__EACH__)  # zero-filled: every page touched
        for j in range(0, len(block), 4096):
            block[j] = 1
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    _, status = os.waitpid(pid, 0)
    statuses.append(os.waitstatus_to_exitcode(status))
print("REPORT " + json.dumps({"children": statuses}), flush=True)
"""


async def test_three_children_over_the_sandbox_memory_limit_are_oom_killed(
    backend: Any, box: Box, seen: list[dict[str, Any]]
) -> None:
    """Each child stays far under the per-process limit (RLIMIT_AS); together they pass the sandbox's."""
    runtime = make_runtime(backend, "cgroup")
    limits = Limits(sandbox_memory_bytes=256 * MiB, memory_bytes=8 * 1024 * MiB)
    code = THREE_CHILDREN.replace("__EACH__", str(120 * MiB))
    lines = Lines()
    with trio.fail_after(60):
        result = await runtime.run_sandboxed(box.spec(code, limits=limits, wall_time_s=45), lines)
    report = _report(lines)  # the parent lived to report: the harness got a normal result
    assert result.stopped_for == ""
    assert result.exit_status == 0
    assert -9 in report["children"], report  # SIGKILL from the OOM killer
    assert result.oom_kills >= 1  # and the runtime says why
    if isinstance(runtime, LocalRuntime):
        assert seen[0]["oom_kills"] >= 1


# --- processes ---------------------------------------------------------------------------------------

FORK_BOMB = r"""
import errno, json, os, time
made, error = 0, None
while made < 10000:
    try:
        pid = os.fork()
    except OSError as exc:
        error = errno.errorcode[exc.errno]
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print("REPORT " + json.dumps({"made": made, "error": error}), flush=True)
os.killpg(0, 9)
"""

MANY = r"""
import json, os, subprocess, time
time.sleep(1.0)  # while the other sandbox's fork bomb holds its limit
procs = [subprocess.Popen(["sleep", "0.5"]) for _ in range(40)]
print("REPORT " + json.dumps({"started": len(procs), "codes": sorted({p.wait() for p in procs})}), flush=True)
"""


async def test_a_fork_bomb_is_held_by_pids_max_and_does_not_starve_another_run(
    backend: Any, seen: list[dict[str, Any]]
) -> None:
    bomb_runtime, other_runtime = make_runtime(backend, "cgroup", "uid"), make_runtime(backend, "cgroup", "uid")
    limits = Limits(processes=32)
    bomb_box, other_box = Box(), Box()
    bomb_lines, other_lines = Lines(), Lines()
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    bomb_runtime.run_sandboxed, bomb_box.spec(FORK_BOMB, limits=limits, wall_time_s=30), bomb_lines
                )
                nursery.start_soon(other_runtime.run_sandboxed, other_box.spec(MANY), other_lines)
    finally:
        bomb_box.close()
        other_box.close()
    bomb = _report(bomb_lines)
    assert bomb["error"] == "EAGAIN", bomb
    assert bomb["made"] < 32
    if isinstance(bomb_runtime, LocalRuntime):  # the cgroup held it, not the uid's RLIMIT_NPROC
        assert any(r["pids_max_hits"] >= 1 for r in seen), seen
    assert _report(other_lines) == {"started": 40, "codes": [0]}


def test_concurrent_runs_get_their_own_uids() -> None:
    if os.geteuid() != 0:
        missing("per-run uids need root")
    a, b = uids.claim(), uids.claim()
    try:
        assert a.uid != b.uid
        assert uids.FIRST_UID <= min(a.uid, b.uid) < max(a.uid, b.uid) < uids.FIRST_UID + uids.COUNT
    finally:
        a.release()
        b.release()
    again = uids.claim()
    assert again.uid == min(a.uid, b.uid)  # released uids are reused
    again.release()


# --- CPU ---------------------------------------------------------------------------------------------

BUSY = r"""
import json, os, threading, time
def spin():
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        pass
ts = [threading.Thread(target=spin) for _ in range(2)]
t0 = time.monotonic()
[t.start() for t in ts]
[t.join() for t in ts]
wall = time.monotonic() - t0
cpu = sum(os.times()[:2])
print("REPORT " + json.dumps({"wall": wall, "cpu": cpu}), flush=True)
"""


async def test_the_cpu_quota_bounds_cpu_time(backend: Any, box: Box) -> None:
    """An upper bound only (the machine may be busy): two spinning threads get at most the quota."""
    runtime = make_runtime(backend, "cgroup")
    lines = Lines()
    await runtime.run_sandboxed(box.spec(BUSY, limits=Limits(cpus=0.25)), lines)
    report = _report(lines)
    assert report["cpu"] <= 0.25 * report["wall"] * 1.3 + 0.15, report


# --- filesystems -------------------------------------------------------------------------------------

FILL = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
R = {}
for where in ("/workspace", "/tmp"):
    fd = os.open(where + "/prealloc", os.O_CREAT | os.O_WRONLY)
    rc = libc.fallocate(fd, 1, 0, __BIG__)  # FALLOC_FL_KEEP_SIZE: st_size stays 0
    R[where + " fallocate"] = "ok" if rc == 0 else errno.errorcode[ctypes.get_errno()]
    os.close(fd)
    os.unlink(where + "/prealloc")
    made = 0
    try:
        while made < 100000:
            open(f"{where}/f{made}", "w").close()
            made += 1
        R[where + " files"] = ["no error", made]
    except OSError as exc:
        R[where + " files"] = [errno.errorcode[exc.errno], made]
print("REPORT " + json.dumps(R), flush=True)
"""


async def test_preallocation_and_file_floods_hit_the_filesystem_limits(backend: Any, box: Box) -> None:
    runtime = make_runtime(backend, "filesystems")
    limits = Limits(workspace_bytes=32 * MiB, tmp_bytes=32 * MiB)
    lines = Lines()
    local = isinstance(runtime, LocalRuntime)
    async with runtime.open_workspace(box.workspace, limits):
        await runtime.run_sandboxed(box.spec(FILL.replace("__BIG__", str(64 * MiB)), limits=limits), lines)
        if local:
            assert os.statvfs(box.workspace).f_blocks * os.statvfs(box.workspace).f_frsize == 32 * MiB
    report = _report(lines)
    for where in ("/workspace", "/tmp"):
        assert report[f"{where} fallocate"] == "ENOSPC", report
        error, made = report[f"{where} files"]
        assert error == "ENOSPC", report
        if local:
            assert made < 32 * MiB // sandbox_fs.BYTES_PER_INODE, report
    assert not any(box.workspace.iterdir())  # the workspace filesystem is gone with its context


def _tmp_mounts() -> int:
    return Path("/proc/self/mountinfo").read_text().count("/ale-tmp-")


async def test_nothing_is_left_behind(box: Box, seen: list[dict[str, Any]]) -> None:
    runtime = _runtime("cgroup", "filesystems")
    mounts_before = _tmp_mounts()
    await runtime.run_sandboxed(box.spec("import os; os.fork(); import time; time.sleep(0.2)"), Lines())
    assert seen
    assert not any(d.exists() for d in seen[0]["dirs"].values())
    assert _tmp_mounts() == mounts_before


# --- the manifest says what is in force ----------------------------------------------------------------


def test_check_reports_each_facility() -> None:
    need_bwrap()
    runtime = LocalRuntime()
    runtime.check()
    described = runtime.attestation()["isolation"]
    assert set(described) == {"seccomp", "cgroup", "uid", "filesystems"}
    for name, entry in described.items():
        assert entry["in_force"] is (name not in runtime.isolation.missing)
        if entry["in_force"]:
            assert entry["reason"] is None
            assert entry["details"]
        else:
            assert entry["reason"]
            assert entry["details"] is None
    if described["cgroup"]["in_force"]:
        assert described["cgroup"]["details"]["version"] in (1, 2)


def test_a_machine_without_cgroups_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    need_bwrap()

    def unavailable() -> cgroups.Hierarchy:
        raise cgroups.CgroupUnavailable("no cgroup2 hierarchy; no cgroup v1 memory hierarchy")

    monkeypatch.setattr(cgroups, "probe", unavailable)
    probed = isolation.probe()
    assert probed.hierarchy is None
    entry = probed.describe()["cgroup"]
    assert entry["in_force"] is False
    assert entry["reason"].startswith("no cgroup2 hierarchy; no cgroup v1 memory hierarchy")
    if probed.uid_claim is not None:
        probed.uid_claim.release()


def test_cgroup_v1_is_used_when_v2_lacks_the_controllers(tmp_path: Path) -> None:
    """The machines this runs on: v1 memory/pids/cpu beside a cgroup2 hierarchy with none of them."""
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("hugetlb\n")
    mounts = [(str(unified), "cgroup2", {"rw"})] + [
        (str(tmp_path / c), "cgroup", {"rw", c}) for c in ("memory", "pids", "cpu", "cpuacct")
    ]
    own = {"": "/", "memory": "/x/y", "pids": "/", "cpu": "/"}
    assert cgroups._v2(mounts, own) == f"cgroup2 at {unified} offers no memory, pids, cpu controller"
    v1 = cgroups._v1(mounts, own)
    assert isinstance(v1, cgroups.Hierarchy)
    assert v1.version == 1
    assert v1.parents == {"memory": tmp_path / "memory/x/y", "pids": tmp_path / "pids", "cpu": tmp_path / "cpu"}
    (unified / "cgroup.controllers").write_text("cpu memory pids hugetlb\n")
    v2 = cgroups._v2(mounts, own)
    assert isinstance(v2, cgroups.Hierarchy)
    assert v2.parents == {"": unified}


CRASHING_HARNESS = r"""
import os, signal, sys
from pathlib import Path
from ale.runner import cgroups, sandbox_fs
h = cgroups.probe()
cg = cgroups.create(h, f"ale-{os.getpid()}-0badc0de", cgroups.CgroupLimits(64 << 20, 16, 0.5))
sandbox_fs.mount_tmpfs(Path(sys.argv[1]), size_bytes=1 << 20, inodes=64, uid=0, mode=0o700)
print(" ".join(str(d) for d in cg.dirs.values()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # dies mid-run: no cleanup
"""


def test_what_a_killed_harness_left_is_removed_by_the_next_check(tmp_path: Path) -> None:
    """A harness killed with SIGKILL cannot remove its cgroups and tmpfs mounts; the next runtime
    on the machine does (they name the dead process), so they cannot pile up."""
    import subprocess
    import sys

    need_bwrap()
    runtime = _runtime("cgroup", "filesystems")
    del runtime
    target = tmp_path / "workspace"
    target.mkdir()
    child = subprocess.run(
        [sys.executable, "-c", CRASHING_HARNESS, str(target)], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == -9, child.stderr
    dirs = [Path(d) for d in child.stdout.split()]
    assert dirs
    assert all(d.is_dir() for d in dirs)
    assert str(target) in Path("/proc/self/mountinfo").read_text()
    probed = isolation.probe()
    if probed.uid_claim is not None:
        probed.uid_claim.release()
    assert not any(d.exists() for d in dirs)
    assert str(target) not in Path("/proc/self/mountinfo").read_text()
