"""``ale-evaluator``: the serve, tasks and demo commands, run as real processes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fuzzing import fuzz_settings, hostile_json
from hypothesis import given

import ale_evaluator
from ale import catalog
from ale.client import AleEnvClient, AleEnvError
from ale.env.v1 import env_pb2 as pb
from ale.policy import linear_policy
from ale_evaluator.seeds import RunConfig, hidden_seed

EVALUATOR = [sys.executable, "-m", "ale_evaluator"]
SECRET = hashlib.sha256(b"ale cli test").digest()
CONFIG = RunConfig(run_id="cli-run-1", secret=SECRET)
CONFIG_JSON = json.dumps({"run_id": CONFIG.run_id, "secret": SECRET.hex()}).encode()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short folder: Unix socket paths must stay under about 100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ale-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVALUATOR, *args], capture_output=True, text=True, timeout=timeout, check=False)


def serve_args(folder: Path, task: str = "cartpole-balance") -> list[str]:
    return [
        "serve",
        "--task",
        task,
        "--agent-socket",
        str(folder / "a.sock"),
        "--harness-socket",
        str(folder / "h.sock"),
    ]


def run_with_config_fd(args: list[str], config: bytes) -> subprocess.Popen[bytes]:
    read_end, write_end = os.pipe()
    os.write(write_end, config)
    os.close(write_end)
    try:
        return subprocess.Popen(
            [*EVALUATOR, *args, "--run-config-fd", str(read_end)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)


def read_line(proc: subprocess.Popen[bytes], timeout: float = 30) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no line on stdout in time"
    return proc.stdout.readline()


def leaks(text: str, n: int) -> list[str]:
    found = []
    for i in range(n + 2):
        seed = hidden_seed(CONFIG, "cartpole-balance", i)
        for form in (str(seed), f"{seed:x}", seed.to_bytes(8, "big").hex(), seed.to_bytes(8, "little").hex()):
            if form in text.lower():
                found.append(f"seed {i} as {form}")
    if SECRET.hex() in text.lower():
        found.append("the secret")
    return found


# -- serve -------------------------------------------------------------------------------------------


def test_serve_runs_an_official_evaluation_and_stops_cleanly_on_sigterm(sock_dir):
    events_path = sock_dir / "events.jsonl"
    proc = run_with_config_fd([*serve_args(sock_dir), "--events", str(events_path)], CONFIG_JSON)
    try:
        line = read_line(proc)
        ready = json.loads(line)
        assert ready["event"] == "ready"
        assert ready["run_id"] == CONFIG.run_id
        assert ready["task"] == catalog.get_task("cartpole-balance").spec.ref
        assert ready["agent"] == f"unix:{sock_dir / 'a.sock'}"
        assert ready["harness"] == f"unix:{sock_dir / 'h.sock'}"
        assert ready["evaluator_version"] == ale_evaluator.__version__

        agent_mode = (sock_dir / "a.sock").stat().st_mode
        harness_mode = (sock_dir / "h.sock").stat().st_mode
        assert stat.S_ISSOCK(agent_mode)
        assert stat.S_ISSOCK(harness_mode)
        assert stat.S_IMODE(agent_mode) == 0o666
        assert stat.S_IMODE(harness_mode) == 0o600

        n = 2
        harness, agent = AleEnvClient(ready["harness"], timeout=30), AleEnvClient(ready["agent"], timeout=30)
        # CartPole is a batch task: its official evaluation is an official batch on hidden seeds.
        falling = linear_policy(np.array([[0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]), output="discrete")
        batch = harness.submit_batch_eval(falling, official=True, num_episodes=n)
        status = harness.get_batch_eval_status(batch.batch_id, wait_ms=10_000)
        assert status.state == pb.BATCH_STATE_DONE, status.error
        result = harness.get_eval_result(batch.batch_id, finalize=True)
        assert result.complete
        assert result.run_id == CONFIG.run_id
        harness.close()
        agent.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err

    events = [json.loads(x) for x in events_path.read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "evaluator_ready"
    assert "batch_submitted" in kinds
    assert "eval_result" in kinds
    ends = [e for e in events if e["kind"] == "episode_end"]
    assert [e["index"] for e in ends] == list(range(n))
    for e, rec in zip(ends, result.episodes, strict=True):
        seed = hidden_seed(CONFIG, "cartpole-balance", e["index"])
        expected = hashlib.sha256(seed.to_bytes(8, "big") + CONFIG.run_id.encode() + SECRET).hexdigest()
        assert e["seed_commitment"] == expected == rec.seed_commitment.hex()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))

    everything = "\n".join([line.decode(), out.decode(), err.decode(), events_path.read_text()])
    assert leaks(everything, n) == []


def test_sigint_also_stops_serve_cleanly(sock_dir):
    proc = run_with_config_fd(serve_args(sock_dir), CONFIG_JSON)
    try:
        ready = json.loads(read_line(proc))
        client = AleEnvClient(ready["agent"], timeout=30)
        assert client.get_spec().task_id == "cartpole-balance"
        client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param(b"not json {", "not valid JSON", id="not-json"),
        pytest.param(
            json.dumps({"run_id": "r", "secret": SECRET.hex()[:62]}).encode(),
            "64 hexadecimal digits",
            id="secret-too-short",
        ),
        pytest.param(json.dumps({"run_id": "bad id!", "secret": SECRET.hex()}).encode(), "run_id", id="bad-run-id"),
        pytest.param(json.dumps({"run_id": "r", "secret": SECRET.hex(), "x": 1}).encode(), "exactly", id="extra-key"),
        pytest.param(b'{"run_id":' * 50 + b"1" + b"}" * 50, "depth limit", id="deep"),
        pytest.param(
            b'{"run_id": "r", "secret": "' + SECRET.hex().encode() + b'", "secret": "' + SECRET.hex().encode() + b'"}',
            "not valid JSON",
            id="duplicate-secret-key-not-echoed",
        ),
    ],
)
def test_a_bad_run_config_exits_2_without_echoing_the_secret(sock_dir, config, message):
    proc = run_with_config_fd(serve_args(sock_dir), config)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    text = err.decode()
    assert text.startswith("ale-evaluator: error: run configuration:"), text
    assert message in text
    assert "Traceback" not in text
    for secretish in (SECRET.hex(), SECRET.hex()[:62], SECRET.hex()[:-1]):
        assert secretish not in text
        assert secretish not in out.decode()
    assert b"ready" not in out
    assert not (sock_dir / "a.sock").exists()
    assert not (sock_dir / "h.sock").exists()


def test_a_run_config_file_is_read_too(sock_dir):
    bad = sock_dir / "config.json"
    bad.write_text(json.dumps({"run_id": "r", "secret": SECRET.hex()[:40]}))
    result = run(*serve_args(sock_dir), "--run-config-file", str(bad))
    assert result.returncode == 2
    assert "64 hexadecimal digits" in result.stderr
    assert SECRET.hex()[:40] not in result.stderr


def test_an_unreadable_run_config_fd_exits_2(sock_dir):
    result = run(*serve_args(sock_dir), "--run-config-fd", "250")
    assert result.returncode == 2
    assert "cannot read the run configuration from fd 250" in result.stderr


def test_serve_with_an_unknown_task_exits_2(sock_dir):
    result = run(*serve_args(sock_dir, task="no-such-task"))
    assert result.returncode == 2
    assert "unknown task 'no-such-task'" in result.stderr
    assert "cartpole-balance" in result.stderr, "the message lists the installed tasks"
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "endpoints",
    [
        pytest.param(["--harness-socket", "h.sock"], id="no-agent-endpoint"),
        pytest.param(
            ["--agent-socket", "a.sock", "--agent-address", "127.0.0.1:0", "--harness-socket", "h.sock"],
            id="two-agent-endpoints",
        ),
    ],
)
def test_serve_needs_exactly_one_address_per_endpoint(sock_dir, endpoints):
    config = sock_dir / "config.json"
    config.write_bytes(CONFIG_JSON)
    args = [a if not a.endswith(".sock") else str(sock_dir / a) for a in endpoints]
    result = run("serve", "--task", "cartpole-balance", *args, "--run-config-file", str(config))
    assert result.returncode == 2
    assert "ale-evaluator: error: give exactly one of --agent-socket and --agent-address" in result.stderr
    assert "Traceback" not in result.stderr
    assert "ready" not in result.stdout


# -- tasks, demo, help -------------------------------------------------------------------------------


def test_tasks_lists_every_installed_task():
    result = run("tasks")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    listed = {line.split()[0] for line in lines}
    assert {"cartpole-balance@1.0.0", "hopper-hop@1.0.0", "pendulum-lqr@1.0.0", "reacher-jacobian@1.0.0"} <= listed
    assert listed == {t.spec.ref for t in catalog.tasks().values()}
    cartpole = next(line for line in lines if line.startswith("cartpole-balance@"))
    assert "CartPole-v1" in cartpole
    assert "mean_return" in cartpole


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        pytest.param([], ["serve", "tasks", "demo", "--version"], id="top-level"),
        pytest.param(
            ["serve"], ["--task", "--agent-socket", "--harness-socket", "--run-config-fd", "--events"], id="serve"
        ),
        pytest.param(["tasks"], ["usage: ale-evaluator tasks"], id="tasks"),
        pytest.param(["demo"], ["--task", "--episodes"], id="demo"),
    ],
)
def test_help_works_for_each_subcommand(command, expected):
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ale-evaluator")
    for word in expected:
        assert word in result.stdout


def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"ale-evaluator {ale_evaluator.__version__}"


def test_an_unknown_subcommand_is_a_usage_error():
    result = run("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_demo_runs_end_to_end():
    started = time.monotonic()
    result = run("demo", "--task", "cartpole-balance", "--episodes", "2")
    assert result.returncode == 0, result.stderr
    assert "official result: mean_return" in result.stdout
    assert "2/2 episodes passed, complete=True" in result.stdout
    assert time.monotonic() - started < 60


# -- the RPC path keeps to one CPU -------------------------------------------------------------------


def _allowed(pid: int, tid: int | None = None) -> set[int]:
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    line = next(x for x in Path(path).read_text().splitlines() if x.startswith("Cpus_allowed_list:"))
    out: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _comm(pid: int, tid: int) -> str:
    return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()


def test_serve_keeps_its_threads_to_one_cpu_but_not_its_batches(sock_dir):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to keep to")
    proc = run_with_config_fd(serve_args(sock_dir), CONFIG_JSON)
    try:
        ready = json.loads(read_line(proc))
        assert ready["rpc_cpu"] == cpus[-1]
        agent = AleEnvClient(ready["agent"], timeout=30)
        assert agent.get_spec().task_id == "cartpole-balance"
        threads = {int(t) for t in os.listdir(f"/proc/{proc.pid}/task")}
        grpc_threads = [t for t in threads if _comm(proc.pid, t).startswith(("grpc", "event_engine", "lifeguard"))]
        assert grpc_threads
        # The main thread and every thread started after it: gRPC's own and the handlers (threads a
        # library started while being imported, before, such as a BLAS pool, keep theirs).
        assert _allowed(proc.pid, proc.pid) == {cpus[-1]}
        assert all(_allowed(proc.pid, t) == {cpus[-1]} for t in grpc_threads)

        batch = agent.submit_batch_eval(linear_policy(np.zeros((2, 4)), output="discrete"), num_episodes=2, seed=1)
        agent.get_batch_eval_status(batch.batch_id, wait_ms=10_000)
        new = {int(t) for t in os.listdir(f"/proc/{proc.pid}/task")} - threads
        batch_threads = [t for t in new if _comm(proc.pid, t) == "ale-batch-agent"]  # the agent endpoint's worker
        assert len(batch_threads) == 1
        assert _allowed(proc.pid, batch_threads[0]) == set(cpus), "the batch thread may use every CPU"
        agent.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.mark.parametrize(("value", "message"), [("abc", "expected a CPU number"), ("99999", "expected a CPU"),
                                                ("4096", "not one this process may use")])  # fmt: skip
def test_a_bad_rpc_cpu_is_refused(sock_dir, value, message):
    config = sock_dir / "config.json"
    config.write_bytes(CONFIG_JSON)
    result = run(*serve_args(sock_dir), "--run-config-file", str(config), "--rpc-cpu", value)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_rpc_cpu_none_leaves_affinity_alone(sock_dir):
    proc = run_with_config_fd([*serve_args(sock_dir), "--rpc-cpu", "none"], CONFIG_JSON)
    try:
        ready = json.loads(read_line(proc))
        assert ready["rpc_cpu"] is None
        assert _allowed(proc.pid) == set(os.sched_getaffinity(0))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_step_helpers_use_every_cpu_while_the_serving_threads_keep_to_one(sock_dir):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: no step helpers")
    proc = run_with_config_fd(serve_args(sock_dir, "pendulum-lqr"), CONFIG_JSON)
    try:
        ready = json.loads(read_line(proc))
        assert ready["rpc_cpu"] == cpus[-1]
        assert ready["step_threads"] == min(len(cpus), 8)
        agent = AleEnvClient(ready["agent"], timeout=30)
        created = agent.create_env(task_id="pendulum-lqr", num_envs=16)
        agent.reset(created.env_id, 0)
        reply = agent.step(created.env_id, np.zeros((16, 1), dtype=np.float32))
        assert len(reply.reward.data) == 16 * 8
        helpers = [
            t for t in map(int, os.listdir(f"/proc/{proc.pid}/task")) if _comm(proc.pid, t).startswith("ale-step")
        ]
        assert helpers, "a 16-copy InvertedPendulum group steps on helper threads"
        assert all(_allowed(proc.pid, t) == set(cpus) for t in helpers)
        agent.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.mark.parametrize("value", ["0", "9", "-1", "two", "", "1" * 5000, "auto "])
def test_a_bad_step_threads_is_refused(sock_dir, value):
    result = run(*serve_args(sock_dir), "--step-threads", value)
    assert result.returncode == 2
    assert "expected 'auto' or a number of threads from 1 to 8" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr) < 2000


def test_one_step_thread_means_no_helpers(sock_dir):
    proc = run_with_config_fd([*serve_args(sock_dir, "pendulum-lqr"), "--step-threads", "1"], CONFIG_JSON)
    try:
        ready = json.loads(read_line(proc))
        assert ready["step_threads"] == 1
        agent = AleEnvClient(ready["agent"], timeout=30)
        created = agent.create_env(task_id="pendulum-lqr", num_envs=16)
        agent.reset(created.env_id, 0)
        agent.step(created.env_id, np.zeros((16, 1), dtype=np.float32))
        names = [_comm(proc.pid, int(t)) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert not any(n.startswith("ale-step") for n in names)
        agent.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_serve_refuses_the_agents_steps_past_its_env_step_budget(sock_dir):
    proc = run_with_config_fd([*serve_args(sock_dir), "--env-step-budget", "3"], CONFIG_JSON)
    try:
        ready = json.loads(read_line(proc))
        agent = AleEnvClient(ready["agent"], timeout=30)
        env_id = agent.create_env().env_id
        agent.reset(env_id, seed=0)
        for _ in range(4):  # the step that crosses the budget is taken: the total is then past it
            agent.step(env_id, np.array([1]))
        with pytest.raises(AleEnvError) as info:
            agent.step(env_id, np.array([1]))
        assert info.value.code.name == "RESOURCE_EXHAUSTED"
        assert info.value.details == "the agent's env-step budget of 3 steps is used up (4 steps taken)"
        agent.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_env_step_budget_none_is_accepted_and_serves(sock_dir):
    proc = run_with_config_fd([*serve_args(sock_dir), "--env-step-budget", "none"], CONFIG_JSON)
    try:
        agent = AleEnvClient(json.loads(read_line(proc))["agent"], timeout=30)
        env_id = agent.create_env(num_envs=64, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP).env_id
        agent.reset(env_id, seed=0)
        for _ in range(10):
            agent.step(env_id, np.ones(64, dtype=np.int64))
        agent.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()


@pytest.mark.parametrize("value", ["0", "-1", "lots", "", "9" * 16])
def test_a_bad_env_step_budget_is_refused(sock_dir, value):
    result = run(*serve_args(sock_dir), "--env-step-budget", value)
    assert result.returncode == 2
    assert "expected a positive number of steps, 'task' or 'none'" in result.stderr
    assert "Traceback" not in result.stderr


# -- standby -----------------------------------------------------------------------------------------


def start_standby(job: bytes | None) -> subprocess.Popen[bytes]:
    """``ale-evaluator standby``; ``job`` is written to its job descriptor once it runs (None: the
    descriptor is closed without one)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [*EVALUATOR, "standby", "--job-fd", str(read_end)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)
    try:
        if job:
            os.write(write_end, job)
    finally:
        os.close(write_end)
    return proc


def standby_job(folder: Path, run_config: object, task: str = "cartpole-balance") -> bytes:
    serve = [*serve_args(folder, task)[1:], "--events", str(folder / "events.jsonl")]
    return json.dumps({"serve": serve, "run_config": run_config}).encode()


def test_standby_serves_the_task_its_job_names_with_the_jobs_seeds(sock_dir):
    proc = start_standby(standby_job(sock_dir, {"run_id": CONFIG.run_id, "secret": SECRET.hex()}))
    try:
        ready = json.loads(read_line(proc))
        assert ready["event"] == "ready"
        assert ready["run_id"] == CONFIG.run_id
        assert ready["task"] == catalog.get_task("cartpole-balance").spec.ref
        harness = AleEnvClient(ready["harness"], timeout=30)
        falling = linear_policy(np.array([[0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]), output="discrete")
        batch = harness.submit_batch_eval(falling, official=True, num_episodes=1)
        assert harness.get_batch_eval_status(batch.batch_id, wait_ms=10_000).state == pb.BATCH_STATE_DONE
        result = harness.get_eval_result(batch.batch_id, finalize=True)
        seed = hidden_seed(CONFIG, "cartpole-balance", 0)
        expected = hashlib.sha256(seed.to_bytes(8, "big") + CONFIG.run_id.encode() + SECRET).hexdigest()
        assert result.episodes[0].seed_commitment.hex() == expected  # the job's secret, not one of its own
        harness.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()


def test_standby_whose_descriptor_closes_without_a_job_ends_quietly():
    proc = start_standby(None)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out == b""
    assert err == b""


@pytest.mark.parametrize(
    ("job", "message"),
    [
        pytest.param(b"not json at all", "not valid JSON", id="garbage"),
        pytest.param(b"[" * 100_000, "limit", id="deeply-nested"),
        pytest.param(b'{"serve": [], "run_config": {}, "x": 1}', 'exactly "serve" and "run_config"', id="extra-key"),
        pytest.param(b'{"serve": "--task x", "run_config": {}}', "list of at most 64 strings", id="serve-not-a-list"),
        pytest.param(b'{"serve": [1], "run_config": {}}', "list of at most 64 strings", id="serve-not-strings"),
        pytest.param(b'{"serve": [], "run_config": []}', '"run_config" must be an object', id="config-not-object"),
        pytest.param(b'{"serve": [], "run_config": {"run_id": "r"}}', "run configuration", id="config-incomplete"),
    ],
)
def test_a_bad_standby_job_exits_2_with_a_clear_error(job, message):
    proc = start_standby(job)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert message in err.decode()
    assert "Traceback" not in err.decode()


def test_an_oversized_standby_job_is_refused_without_reading_it_all():
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [*EVALUATOR, "standby", "--job-fd", str(read_end)], stderr=subprocess.PIPE, pass_fds=(read_end,)
    )
    os.close(read_end)
    job = memoryview(b'{"serve": ["' + b"a" * (128 * 1024) + b'"], "run_config": {}}')
    try:
        while job:
            job = job[os.write(write_end, job) :]
    except BrokenPipeError:
        pass  # it stopped reading at its limit
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "size limit" in err.decode()


def test_a_standby_job_that_names_a_run_config_of_its_own_is_refused(sock_dir):
    serve = [*serve_args(sock_dir)[1:], "--run-config-file", "/dev/null"]
    proc = start_standby(json.dumps({"serve": serve, "run_config": {"run_id": "r", "secret": SECRET.hex()}}).encode())
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "carries its run configuration itself" in err.decode()


def test_a_bad_standby_job_never_echoes_its_secret(sock_dir):
    secret = SECRET.hex()
    bad = b'{"serve": [], "run_config": {"run_id": "r", "secret": "' + secret.encode() + b'"}'  # unterminated
    proc = start_standby(bad)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert secret not in err.decode()


@pytest.mark.fuzz
@fuzz_settings
@given(raw=hostile_json)
def test_fuzz_the_standby_job_parser_raises_only_cli_errors(raw):
    from ale_evaluator.cli import CliError, read_standby_job

    with contextlib.suppress(CliError):  # its only error; nothing else may escape
        read_standby_job(raw if isinstance(raw, bytes) else raw.encode())
