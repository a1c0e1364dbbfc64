"""The harness under misbehaving agents, a dying evaluator, bad input and interruption.

Agents are ``python -c`` programs (the sandbox sees no host folders but the Python installation).
A run that the agent spoils still completes honestly (its task not completed, the reason
recorded, the bundle written); a run that cannot go on raises RunError and writes no bundle.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pyrage
import pytest
import trio

from ale import catalog
from ale.core.canonical import canonical_json
from ale.core.trajectory import verify_chain
from ale.runner import agent_env, bundle_writer
from ale.runner.harness import Harness, RunError, RunRecord
from ale.runner.inspect import offline_check
from ale.runner.local import LocalRuntime
from ale.runner.options import AgentSpec, RunOptions
from ale.runner.progress import PlainProgress
from ale.runner.recorder import BUDGETS
from ale.runner.runtime import EvaluatorSpec, Limits, LineSink, SandboxResult, SandboxSpec
from ale.runner.supervise import KILL_GRACE_S, MAX_STREAM_BYTES

PY = agent_env.PYTHON  # the sandbox's own interpreter
CARTPOLE = "cartpole-balance"
PENDULUM = "pendulum-lqr"


# --- helpers ------------------------------------------------------------------------------------


def _options(code: str, *, task: str = CARTPOLE, agent_time: float = 20.0, episodes: int = 2, **kw: Any) -> RunOptions:
    release, sha = catalog.release()
    return RunOptions(
        tasks=(task,),
        agent=AgentSpec(name="fault-agent", command=(PY, "-c", code)),
        release=release,
        release_sha256=sha,
        release_name=release.release,
        episodes=episodes,
        agent_time_s=agent_time,
        **kw,
    )


class Run:
    """A finished run: its record, its trajectory's events, and the progress it printed."""

    def __init__(self, record: RunRecord, events: list[dict[str, Any]], progress: str) -> None:
        self.record, self.events, self.progress = record, events, progress

    @property
    def outcome(self) -> Any:
        (outcome,) = self.record.outcomes
        return outcome

    def kinds(self, producer: str | None = None) -> list[str]:
        return [e["kind"] for e in self.events if producer is None or e["producer"] == producer]

    def of(self, kind: str, producer: str | None = None) -> list[dict[str, Any]]:
        return [e["data"] for e in self.events if e["kind"] == kind and (producer is None or e["producer"] == producer)]

    def stdout(self) -> list[str]:
        return [d["text"] for d in self.of("stdout", "untrusted_agent")]


async def run_harness(
    options: RunOptions,
    runtime: LocalRuntime | None = None,
    *,
    before_cleanup: Callable[[RunRecord], None] | None = None,
) -> Run:
    """Run, read the trajectory, call ``before_cleanup`` (the run folder still exists), clean up."""
    out = io.StringIO()
    harness = Harness(options, runtime or LocalRuntime(), PlainProgress(out=out))
    record = await harness.run()
    try:
        raw = await trio.Path(record.trajectory).read_bytes()
        if before_cleanup is not None:
            before_cleanup(record)
    finally:
        shutil.rmtree(record.root, ignore_errors=True)
    verify_chain(raw)
    events = [json.loads(line) for line in raw.splitlines()]
    return Run(record, events, out.getvalue())


def _host_processes(needle: str, *, exclude: tuple[int, ...] = ()) -> dict[int, list[str]]:
    """Host processes whose command line contains ``needle``: pid -> argv (no psutil: /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (os.getpid(), *exclude):
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmdline:
            found[int(entry)] = [a.decode(errors="replace")[:120] for a in cmdline.split(b"\0") if a]
    return found


def _host_cmdlines(needle: str, *, exclude: tuple[int, ...] = ()) -> list[str]:
    return [f"{pid}: {' '.join(argv)}" for pid, argv in _host_processes(needle, exclude=exclude).items()]


async def _no_process_with(needle: str, wait_s: float = 5.0) -> list[str]:
    """Wait up to ``wait_s`` for every process with ``needle`` to be gone; return those left."""
    with trio.move_on_after(wait_s):
        while _host_cmdlines(needle):  # noqa: ASYNC110 - polling /proc, nothing to wait on
            await trio.sleep(0.1)
    return _host_cmdlines(needle)


def _kill_leftovers(*needles: str) -> None:
    """SIGKILL, by pid, what a test started and the harness left running (a failure leaks nothing)."""
    for needle in needles:
        for pid in _host_processes(needle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _kept_trajectory(folder: Path) -> list[dict[str, Any]]:
    """The one incomplete trajectory the harness left in ``folder``, chain-checked."""
    (kept,) = folder.glob("*.incomplete.jsonl")
    raw = kept.read_bytes()
    verify_chain(raw, incomplete=True)
    return [json.loads(line) for line in raw.splitlines()]


# --- the agent crashes -------------------------------------------------------------------------------


async def test_crashing_agent_leaves_an_honest_not_completed_run(tmp_path: Path) -> None:
    identity = pyrage.x25519.Identity.generate()
    written: list[tuple[Path, Any]] = []

    def bundle(record: RunRecord) -> None:
        written.append(bundle_writer.write_bundle(record, [str(identity.to_public())], tmp_path))

    code = "import sys; print('about to crash', flush=True); sys.exit(1)"
    run = await run_harness(_options(code), before_cleanup=bundle)
    o = run.outcome
    assert o.agent["exit_status"] == 1
    assert o.agent["stopped_for"] == ""
    assert o.status == "not_completed"
    assert o.reason == "the agent left no policy artifact at /workspace/policy.safetensors"
    assert o.result is None
    assert "about to crash" in run.stdout()
    assert run.kinds("trusted_harness")[-1] == "run_finished"
    assert run.of("official_evaluation_skipped")[0]["reason"] == o.reason

    # The bundle is still written, and it says: nothing covered, no macro mean.
    ((path, run_score),) = written
    assert path.is_file()
    assert run_score.aggregate.macro_mean is None
    assert run_score.aggregate.covered == ()
    assert any(line.startswith("macro mean n/a") for line in bundle_writer.summary_lines(run_score))
    report = offline_check(await trio.Path(path).read_bytes(), str(identity))
    (task,) = report.results.tasks
    assert (task.status, task.reason) == ("not_completed", o.reason)
    assert report.claimed.aggregate.macro_mean is None
    assert report.manifest.tasks[0].agent.exit_status == 1


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
async def test_agent_killed_by_a_signal(sig: int) -> None:
    run = await run_harness(_options(f"import os; print('bye', flush=True); os.kill(os.getpid(), {int(sig)})"))
    o = run.outcome
    assert o.agent["stopped_for"] == ""
    status = o.agent["exit_status"]
    # The sandbox reports the signal as 128+N (a shell's convention) or -N (Python's).
    assert status in (128 + sig, -sig), status
    assert o.status == "not_completed"
    assert "no policy artifact" in o.reason
    assert run.kinds("trusted_harness")[-1] == "run_finished"


# --- the agent hangs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["plain", "ignores-SIGTERM"])
async def test_hanging_agent_is_stopped_at_its_wall_time(ignore_sigterm: bool) -> None:
    budget = 2.0
    code = "import signal, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('hanging', flush=True)\ntime.sleep(600)\n"
    started = time.monotonic()
    run = await run_harness(_options(code, agent_time=budget))
    elapsed = time.monotonic() - started
    o = run.outcome
    assert o.agent["stopped_for"] == "wall_time"
    assert o.agent["exit_status"] is None
    assert budget <= o.agent["wall_time_s"] <= budget + KILL_GRACE_S + 2
    assert elapsed < budget + KILL_GRACE_S + 10
    assert o.status == "not_completed"
    assert run.of("agent_finished")[0]["stopped_for"] == "wall_time"


async def test_hanging_agent_gets_sigterm_before_sigkill() -> None:
    """docs/agent-contract.md: "the harness stops it (SIGTERM, then SIGKILL after 5 s)".

    An agent that saves its work on SIGTERM must get the chance to.
    """
    code = (
        "import os, signal, sys, time\n"
        "def on_term(*_):\n"
        "    print('got SIGTERM', flush=True)\n"
        "    open('/workspace/saved', 'w').write('ok')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('waiting', flush=True)\n"
        "time.sleep(600)\n"
    )
    run = await run_harness(_options(code, agent_time=2.0))
    assert run.outcome.agent["stopped_for"] == "wall_time"
    assert "waiting" in run.stdout()
    assert "got SIGTERM" in run.stdout(), run.stdout()


# --- output and disk ---------------------------------------------------------------------------------


async def test_stdout_flood_is_capped_and_counted() -> None:
    """The runtime passes 8 MiB of a stream; the recorder keeps the agent.stdout channel's budget
    of trajectory lines and counts the rest in one events_dropped event."""
    line_bytes, lines = 1024, 50 * 1024  # 50 MiB
    code = (
        "import sys\n"
        f"line = b'x' * {line_bytes - 1} + b'\\n'\n"
        "w = sys.stdout.buffer\n"
        f"for _ in range({lines}):\n"
        "    w.write(line)\n"
        "w.flush()\n"
        "print('done flooding', file=sys.stderr, flush=True)\n"
    )
    run = await run_harness(_options(code, agent_time=60))
    total = line_bytes * lines
    kept = run.stdout()
    assert kept
    assert set(kept) == {"x" * (line_bytes - 1)}
    passed = MAX_STREAM_BYTES // line_bytes  # what the runtime passed on
    (truncated,) = run.of("output_truncated")
    assert truncated["dropped_bytes"] == total - passed * line_bytes
    (dropped,) = run.of("events_dropped")
    assert dropped["channel"] == "agent.stdout"
    assert dropped["budget_bytes"] == BUDGETS["agent.stdout"]
    assert dropped["events"] == passed - len(kept)
    assert dropped["bytes"] == dropped["events"] * line_bytes
    written = sum(len(canonical_json(e)) + 1 for e in run.events if e["kind"] == "stdout")
    assert BUDGETS["agent.stdout"] <= written <= BUDGETS["agent.stdout"] + 2 * line_bytes
    # stderr has its own budget; the run goes on to the end.
    assert [d["text"] for d in run.of("stderr", "untrusted_agent")] == ["done flooding"]
    assert run.outcome.agent["exit_status"] == 0
    assert run.kinds("trusted_harness")[-1] == "run_finished"


async def test_agent_filling_its_workspace_hits_the_limit() -> None:
    """On a size-limited workspace filesystem (root) the write past the limit fails with ENOSPC;
    where the runtime cannot mount one, the watchdog stops the agent for disk."""
    limit = 16 * 1024 * 1024
    code = (
        "import errno, os, sys, time\n"
        "chunk = os.urandom(4 * 1024 * 1024)\n"
        "for i in range(64):  # at most 256 MiB, whatever happens\n"
        "    try:\n"
        "        with open(f'/workspace/fill{i}', 'wb') as fh:\n"
        "            fh.write(chunk)\n"
        "    except OSError as exc:\n"
        "        print('full', errno.errorcode[exc.errno], flush=True)\n"
        "        sys.exit(0)\n"
        "    time.sleep(0.02)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    runtime = LocalRuntime()
    run = await run_harness(_options(code, agent_time=60, limits=Limits(workspace_bytes=limit)), runtime=runtime)
    o = run.outcome
    if runtime.isolation.mounts:
        assert run.stdout() == ["full ENOSPC"]
        assert o.agent["exit_status"] == 0
    else:
        assert o.agent["stopped_for"] == "disk"
        assert o.agent["exit_status"] is None
    assert time.monotonic() - started < 20
    assert o.status == "not_completed"


async def test_file_size_and_tmp_limits_are_enforced() -> None:
    code = (
        "import errno, os\n"
        "def fill(path, total):\n"
        "    written = 0\n"
        "    try:\n"
        "        with open(path, 'wb', buffering=0) as fh:\n"
        "            while written < total:\n"
        "                written += fh.write(b'\\0' * 65536)\n"
        "    except OSError as exc:\n"
        "        return errno.errorcode[exc.errno], os.path.getsize(path)\n"
        "    return 'no error', os.path.getsize(path)\n"
        "print('workspace', *fill('/workspace/big', 8 << 20), flush=True)\n"
        "total, i, result = 0, 0, None\n"
        "while result is None and i < 64:\n"
        "    code, size = fill(f'/tmp/t{i}', 512 << 10)\n"
        "    total += size\n"
        "    i += 1\n"
        "    if code != 'no error':\n"
        "        result = code\n"
        "print('tmp', result, total, flush=True)\n"
    )
    limits = Limits(file_bytes=1 << 20, tmp_bytes=2 << 20)
    run = await run_harness(_options(code, limits=limits))
    out = dict(line.split(" ", 1) for line in run.stdout())
    ws_code, ws_size = out["workspace"].split()
    assert ws_code == "EFBIG"
    assert int(ws_size) <= 1 << 20
    tmp_code, tmp_total = out["tmp"].split()
    assert tmp_code == "ENOSPC"
    assert int(tmp_total) <= 2 << 20


async def test_fork_bomb_is_contained() -> None:
    marker = f"ale-fork-bomb-{secrets.token_hex(6)}"
    code = (
        f"MARKER = {marker!r}\n"
        "import errno, os, time\n"
        "forked, failure = 0, None\n"
        "deadline = time.monotonic() + 1.0\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        failure = failure or errno.errorcode[exc.errno]\n"
        "        time.sleep(0.01)\n"
        "        continue\n"
        "    if pid == 0:\n"
        "        forked, failure = 0, 'child'\n"  # children go on forking, quietly
        "    else:\n"
        "        forked += 1\n"
        "if failure != 'child':\n"
        "    visible = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "    print('forked', forked, failure, len(visible), flush=True)\n"
        "time.sleep(600)\n"
    )
    try:
        run = await run_harness(_options(code, agent_time=3, limits=Limits(processes=64)))
        left = await _no_process_with(marker)
    finally:
        _kill_leftovers(marker)
    assert left == []
    o = run.outcome
    assert o.agent["stopped_for"] == "wall_time"
    (line,) = [t for t in run.stdout() if t.startswith("forked ")]
    _, forked, failure, visible = line.split()
    assert failure == "EAGAIN"
    assert int(forked) < 64
    assert int(visible) <= 64 + 2  # the sandbox's init and setpriv are not the sandbox uid's
    assert run.kinds("trusted_harness")[-1] == "run_finished"


# --- the policy is broken ---------------------------------------------------------------------------


async def test_malformed_policy_artifact_is_refused() -> None:
    code = "import os; open('/workspace/policy.safetensors', 'wb').write(os.urandom(4096))"
    run = await run_harness(_options(code))
    o = run.outcome
    assert o.status == "not_completed"
    assert o.reason.startswith("the evaluator refused the policy artifact: "), o.reason
    assert len(o.reason) > len("the evaluator refused the policy artifact: ")
    assert o.artifact is not None
    assert o.artifact["bytes"] == 4096
    assert o.result is None
    assert run.of("policy_artifact")[0]["sha256"] == o.artifact["sha256"]


async def test_policy_artifact_symlink_is_not_followed() -> None:
    code = "import os; os.symlink('/etc/ld.so.cache', '/workspace/policy.safetensors')"
    run = await run_harness(_options(code))
    o = run.outcome
    assert o.status == "not_completed"
    assert o.reason == "/workspace/policy.safetensors is not a regular file"
    assert o.artifact is None


def _policy(body: str) -> str:
    script = f"#!{PY}\nimport os, sys\nfrom ale.client import RemoteEnv\n{body}"
    return f"import os\nopen('/workspace/policy', 'w').write({script!r})\nos.chmod('/workspace/policy', 0o755)\n"


async def test_interactive_policy_resetting_mid_episode_and_exiting_early() -> None:
    body = (
        "import numpy as np\n"
        "env = RemoteEnv(os.environ['ALE_EVALUATOR'], env_id=os.environ['ALE_ENV_ID'])\n"
        "for _ in range(2):\n"
        "    env.reset()\n"
        "    for _ in range(3):  # no push: the pendulum stays up, the episode runs on\n"
        "        env.step(np.zeros(env.action_space.shape, dtype=np.float32))\n"
        "print('leaving early', flush=True)\n"
        "sys.exit(4)\n"
    )
    run = await run_harness(_options(_policy(body), task=PENDULUM, episodes=3))
    o = run.outcome
    assert o.result is not None
    episodes = o.result["episodes"]
    assert [e["abort_reason"] for e in episodes] == ["reset_mid_episode", "session_closed", "not_started"]
    assert all(e["aborted"] and not e["success"] for e in episodes)
    assert o.result["passed_episodes"] == 0
    assert o.result["headline_value"] == 0
    assert o.reason == "3 of 3 episodes were aborted"
    (finished,) = run.of("policy_finished")
    assert finished["exit_status"] == 4
    assert "leaving early" in [d["text"] for d in run.of("policy_stdout", "untrusted_agent")]


async def test_interactive_policy_that_exits_at_once() -> None:
    run = await run_harness(_options(_policy("sys.exit(0)\n"), task=PENDULUM, episodes=2))
    o = run.outcome
    assert o.result is not None
    assert [e["abort_reason"] for e in o.result["episodes"]] == ["not_started", "not_started"]
    assert o.result["passed_episodes"] == 0
    assert o.reason == "2 of 2 episodes were aborted"


async def test_interactive_task_without_an_executable_policy() -> None:
    code = "open('/workspace/policy', 'w').write('#!/bin/sh\\nexit 0\\n')"  # not executable
    run = await run_harness(_options(code, task=PENDULUM, episodes=2))
    o = run.outcome
    assert o.status == "not_completed"
    assert o.reason == "/workspace/policy is not an executable regular file"
    assert o.result is None


# --- the evaluator dies -------------------------------------------------------------------------------


class EvaluatorKillingRuntime(LocalRuntime):
    """The local runtime, but the evaluator is killed a moment after the agent starts."""

    def __init__(self, after_s: float = 0.5) -> None:
        super().__init__()
        self.after_s = after_s
        self.handle: Any = None

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[Any]:
        async with super().open_evaluator(spec) as handle:
            self.handle = handle
            yield handle

    async def run_sandboxed(
        self,
        spec: SandboxSpec,
        sink: LineSink,
        *,
        should_stop: Callable[[], Awaitable[str]] | None = None,
    ) -> SandboxResult:
        async with trio.open_nursery() as nursery:

            async def kill_later() -> None:
                await trio.sleep(self.after_s)
                self.handle.process.kill()

            nursery.start_soon(kill_later)
            result = await super().run_sandboxed(spec, sink, should_stop=should_stop)
            nursery.cancel_scope.cancel()
        return result


async def test_evaluator_dying_mid_run_is_a_run_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runtime = EvaluatorKillingRuntime()
    workdir = Path(tempfile.mkdtemp(prefix="ale-die-"))  # short: the run folder holds Unix sockets
    options = _options("import time; time.sleep(600)", agent_time=30, workdir=workdir)
    started = time.monotonic()
    try:
        with pytest.raises(RunError, match="evaluator of cartpole-balance died"):
            await Harness(options, runtime, PlainProgress(out=io.StringIO())).run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert time.monotonic() - started < 15
    assert runtime.handle is not None
    assert not runtime.handle.alive()
    # No bundle (there is nothing to write one from); the trajectory so far is kept, marked failed.
    last = _kept_trajectory(tmp_path)[-1]
    assert last["kind"] == "run_failed"
    assert "died" in last["data"]["reason"]


# --- the command line refuses bad input before running anything ---------------------------------------


def _ale(*args: str, cwd: Path, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    kw.setdefault("env", {k: v for k, v in os.environ.items() if k != "ALE_RECIPIENT"})
    return subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def _assert_refused_early(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("ale: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "evaluator" not in proc.stderr  # nothing was started
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_unknown_task_lists_the_installed_tasks(tmp_path: Path) -> None:
    proc = _ale("run", "no-such-task", "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_refused_early(proc, "unknown task 'no-such-task'", *sorted(catalog.tasks()))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\x00garbage{", "release manifest: not valid JSON"),
        (b'{"schema": "ale-release-manifest/v1", "release": "x"}', "required field missing"),
        (None, "cannot read the release manifest"),
    ],
    ids=["garbage", "missing-fields", "nonexistent"],
)
def test_bad_release_manifest(tmp_path: Path, content: bytes | None, needle: str) -> None:
    path = tmp_path / "release.json"
    if content is not None:
        path.write_bytes(content)
    for command in ("run", "tasks"):
        args = ["--release-file", str(path)]
        if command == "run":
            args = [CARTPOLE, "--out", str(tmp_path / "out"), *args]
        proc = _ale(command, *args, cwd=tmp_path)
        _assert_refused_early(proc, needle)


def test_release_manifest_missing_one_field(tmp_path: Path) -> None:
    doc = json.loads(catalog.release_bytes())
    del doc["cap"]
    path = tmp_path / "release.json"
    path.write_text(json.dumps(doc))
    proc = _ale("run", CARTPOLE, "--release-file", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_refused_early(proc, "cap")


def test_unknown_installed_release(tmp_path: Path) -> None:
    proc = _ale("run", CARTPOLE, "--release", "1999.01", "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_refused_early(proc, "1999.01")


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_unwritable_output_folder(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "out" if where == "under-a-file" else Path("/proc/ale-test-out")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = _ale("run", CARTPOLE, "--out", str(out), "--plain", cwd=tmp_path, env=env)
    _assert_refused_early(proc, "is not writable")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no run folder was made


def test_a_run_folder_too_deep_for_the_evaluators_sockets_is_a_clean_run_failure(tmp_path: Path) -> None:
    """A run folder too deep for a Unix socket path: the evaluator could not bind, so the run is
    refused before it starts, saying which socket and what to do."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    env = {**os.environ, "TMPDIR": str(deep)}
    agent = f"{PY} -c pass"
    proc = _ale("run", CARTPOLE, "--plain", "--out", str(tmp_path / "out"), "--agent-cmd", agent, cwd=tmp_path, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stderr
    assert "ale: run failed, no bundle was written:" in proc.stderr
    assert "too deep for Unix sockets" in proc.stderr
    assert "evaluator.sock would be" in proc.stderr
    assert "use a shorter TMPDIR or --workdir" in proc.stderr
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_bad_recipient_is_refused_before_the_run(tmp_path: Path) -> None:
    proc = _ale(
        "run",
        CARTPOLE,
        "--plain",
        "--out",
        str(tmp_path / "out"),
        "--recipient",
        "not-an-age-key",
        "--agent-cmd",
        f"{PY} -c pass",
        "--episodes",
        "1",
        cwd=tmp_path,
    )
    _assert_refused_early(proc, "not-an-age-key")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--episodes", "0"], "--episodes must be positive"),
        (["--agent-cmd", "python -c 'unbalanced"], "--agent-cmd"),
        (["--agent", "no-such-agent"], "unknown bundled agent"),
    ],
    ids=["zero-episodes", "unparsable-agent-cmd", "unknown-agent"],
)
def test_bad_run_arguments(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = _ale("run", CARTPOLE, "--plain", "--out", str(tmp_path / "out"), *args, cwd=tmp_path)
    _assert_refused_early(proc, needle)


def test_no_task_named(tmp_path: Path) -> None:
    proc = _ale("run", "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_refused_early(proc, "name at least one task")


# --- Ctrl-C and SIGTERM ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupt_stops_everything_and_keeps_the_trajectory(sig: int) -> None:
    # A short path: the run folder (under TMPDIR) holds Unix sockets.
    base = Path(tempfile.mkdtemp(prefix="ale-int-"))
    marker = f"ale-interrupt-{secrets.token_hex(6)}"
    try:
        _interrupt(base, sig, marker)
    finally:
        _kill_leftovers(marker, str(base))
        shutil.rmtree(base, ignore_errors=True)


def _interrupt(base: Path, sig: int, marker: str) -> None:
    out, cwd, tmp = base / "out", base / "cwd", base / "tmp"
    for d in (cwd, tmp):
        d.mkdir()
    agent = f"{PY} -c \"print('{marker}', flush=True); import time; time.sleep(600)\""
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("CI", None)
    stderr_path = base / "stderr.txt"
    argv = [sys.executable, "-m", "ale.runner.cli", "run", CARTPOLE, "--plain", "--out", str(out)]
    argv += ["--agent-time", "120", "--agent-cmd", agent]
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 60
            # The agent runs once a host process *is* it (argv[0] the sandbox's Python, not bwrap).
            while not any(argv[0] == PY for argv in _host_processes(marker, exclude=(proc.pid,)).values()):
                assert proc.poll() is None, stderr_path.read_text()
                assert time.monotonic() < deadline, "the agent never started"
                time.sleep(0.05)
            time.sleep(0.5)
            started_interrupt = time.monotonic()
            proc.send_signal(sig)
            stdout, _ = proc.communicate(timeout=30)
            took = time.monotonic() - started_interrupt
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = stderr_path.read_text()

    # Nothing is left running: no agent, no evaluator of this run.
    deadline = time.monotonic() + 5
    while (left := _host_cmdlines(marker) + _host_cmdlines(str(tmp))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []
    assert took < KILL_GRACE_S + 10
    # No bundle, no key: the run's state folder only (to resume it).
    events = _kept_trajectory(cwd)
    run_id = events[0]["data"]["run_id"]
    assert [p.name for p in out.iterdir()] == [f"{run_id}.state"]
    assert stdout == b""
    assert "Traceback" not in err, err
    assert proc.returncode == 130, err
    assert "run interrupted; no bundle was written" in err
    assert f"ale run --resume {run_id} --out {out}" in err
    # The trajectory so far is kept in the working folder, a valid chain ending run_interrupted; the
    # task that was running ended early, cancelled in its agent phase.
    assert [p.name for p in cwd.iterdir()] == [f"{run_id}.incomplete.jsonl"]
    assert [e["kind"] for e in events[-3:]] == ["task_ended_early", "task_finished", "run_interrupted"]
    assert {k: events[-3]["data"][k] for k in ("phase", "category")} == {"phase": "agent", "category": "cancelled"}
    assert events[-2]["data"]["ended"] == {"phase": "agent", "category": "cancelled"}
    assert events[-1]["producer"] == "trusted_harness"
    assert any(e["kind"] == "stdout" and e["data"]["text"] == marker for e in events)
    assert str(next(cwd.glob("*.incomplete.jsonl"))) in err


class PrestartRecordingRuntime(LocalRuntime):
    """Records which evaluator process served each task and what was prestarted."""

    def __init__(self) -> None:
        super().__init__()
        self.prestarted: list[int] = []
        self.served: list[int] = []

    def prestart_evaluator(self, count: int = 1) -> None:
        super().prestart_evaluator(count)
        assert self._standby is not None
        self.prestarted.append(self._standby.process.pid)

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[Any]:
        async with super().open_evaluator(spec) as handle:
            self.served.append(handle.process.pid)
            yield handle


async def test_the_next_tasks_evaluator_is_prestarted_while_a_task_runs_and_nothing_is_left() -> None:
    runtime = PrestartRecordingRuntime()
    options = attrs.evolve(_options("pass", episodes=1), tasks=(CARTPOLE, "pendulum-lqr"))
    run = await run_harness(options, runtime)
    assert [o.task.spec.id for o in run.record.outcomes] == [CARTPOLE, "pendulum-lqr"]
    assert len(runtime.prestarted) == 1  # during the first task, for the second; none after the last
    assert runtime.served[1] == runtime.prestarted[0]
    assert runtime._standby is None
    assert run.kinds("trusted_harness").count("evaluator_started") == 2


async def test_an_agent_killed_at_the_sandbox_memory_limit_is_recorded_as_an_oom_kill() -> None:
    hog = "block = bytearray(400 * 2**20)\nfor j in range(0, len(block), 4096):\n    block[j] = 1\n"
    limits = Limits(sandbox_memory_bytes=128 * 2**20)
    run = await run_harness(_options(hog, limits=limits))
    (finished,) = run.of("agent_finished", "trusted_harness")
    assert finished["oom_kills"] >= 1
    assert finished["exit_status"] != 0
    assert run.outcome.agent["oom_kills"] == finished["oom_kills"]
    assert "memory limit" in run.outcome.reason
