"""The LLM agent driven by a scripted OpenAI-compatible upstream over real HTTP (tests/llm_upstream.py).

Outside the sandbox: the agent runs as ``python -m ale.agents.llm`` (or its loop in-process) in the
contract's environment against an in-process evaluator, and the upstream plays canned assistant
turns with tool calls. A scripted session writes an LQR policy for cartpole-balance and finishes;
others send hostile tool calls, fail with 429/5xx/garbage/dropped connections, exhaust the gateway's
budget, overflow the context, run past the turn limit and get SIGTERM mid-command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from llm_upstream import ToolCall, Turn, serve_upstream

from ale import catalog
from ale.agents import llm
from ale.env.v1 import env_pb2 as pb
from ale.policy import load_policy

AGENT_TIMEOUT_S = 120
PLACEHOLDER = "ale-placeholder-test-key"

LQR_SCRIPT = """\
import os
import numpy as np
from ale.client import AleEnvClient
from ale.env.v1 import env_pb2 as pb
from ale.policy import linear_policy

g, mc, mp, l, tau = 9.8, 1.0, 0.1, 0.5, 0.02
M = mc + mp
d = l * (4 / 3 - mp / M)
Ac = np.array([[0, 1, 0, 0], [0, 0, -mp * l * g / (M * d), 0], [0, 0, 0, 1], [0, 0, g / d, 0]])
Bc = np.array([[0], [1 / M + mp * l / (M * M * d)], [0], [-1 / (M * d)]])
A, B = np.eye(4) + tau * Ac, tau * Bc
Q, R = np.diag([1.0, 1.0, 10.0, 1.0]), np.array([[1.0]])
P = Q.copy()
for _ in range(5000):
    K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
    nxt = Q + A.T @ P @ A - A.T @ P @ B @ K
    done = np.max(np.abs(nxt - P)) < 1e-10
    P = nxt
    if done:
        break
K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
raw = linear_policy(np.vstack([np.zeros(4), -K[0]]), output="discrete")
open("policy.safetensors", "wb").write(raw)
client = AleEnvClient(os.environ["ALE_EVALUATOR"])
batch = client.submit_batch_eval(raw, official=False, num_episodes=20, seed=7)
while (s := client.get_batch_eval_status(batch.batch_id, wait_ms=10000)).state not in (
    pb.BATCH_STATE_DONE, pb.BATCH_STATE_FAILED):
    pass
print("K =", np.round(K[0], 3).tolist())
print(f"practice: {s.result.headline_metric} = {s.result.headline_value:.1f} over {s.result.num_episodes} episodes")
"""


def lqr_session(task_dir: str) -> list[Turn]:
    """A capable model's session on cartpole-balance: read, write the solver, run it, finish."""
    return [
        Turn(
            text="I will read the paper first.",
            reasoning="HIDDEN-REASONING-MARKER: never to be recorded",
            tool_calls=[ToolCall("read_file", {"path": f"{task_dir}/paper.md"}), ToolCall("list_files", {})],
        ),
        Turn(
            text="The paper's method is LQR on the linearised model; writing the solver.",
            tool_calls=[ToolCall("write_file", {"path": "lqr.py", "content": LQR_SCRIPT})],
        ),
        Turn(tool_calls=[ToolCall("run_shell", {"command": "python3 lqr.py", "timeout_s": 120})]),
        Turn(
            text="The practice evaluation balances every episode.",
            tool_calls=[ToolCall("finish", {"summary": "LQR policy, mean return 500 in practice"})],
        ),
    ]


def make_task_dir(root: Path, task_id: str) -> Path:
    """The task folder the harness mounts at /task: paper.md, task.json, README.md."""
    task = catalog.get_task(task_id)
    folder = root / "task"
    folder.mkdir()
    (folder / "paper.md").write_text(task.paper)
    (folder / "task.json").write_text(json.dumps(_public(task)))
    (folder / "README.md").write_text(f"# {task_id}\nLeave a policy.\n")
    return folder


def _public(task: catalog.Task) -> dict[str, Any]:
    from ale.core.parse import converter

    return {"digest": task.digest, **converter.unstructure(task.spec)}


def contract_env(ev: Any, task_id: str, workspace: Path, task_dir: Path, base_url: str) -> dict[str, str]:
    spec = catalog.get_task(task_id).spec
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALE_", "OPENAI_"))}
    env.update(
        ALE_EVALUATOR=ev.agent_address if ev is not None else "unix:/nonexistent.sock",
        ALE_TASK_ID=task_id,
        ALE_TASK_VERSION=spec.version,
        ALE_TASK_DIR=str(task_dir),
        ALE_WORKSPACE=str(workspace),
        ALE_MODE=spec.mode,
        ALE_BUDGET_WALL_TIME_S=str(spec.budgets.wall_time_s),
        ALE_BUDGET_ENV_STEPS=str(spec.budgets.env_steps),
        ALE_BUDGET_LLM_TOKENS=str(spec.budgets.llm_tokens),
        HOME=str(workspace),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3 is the agent's, as in the sandbox
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY=PLACEHOLDER,
    )
    return env


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return workspace, make_task_dir(tmp_path, "cartpole-balance")


def run_agent_process(env: dict[str, str], tmp_path: Path, *argv: str) -> tuple[int, str, list[dict[str, Any]]]:
    """``python -m ale.agents.llm --model scripted-model ARGV``; (exit status, stderr, event lines)."""
    events_path = tmp_path / "events.jsonl"
    with open(events_path, "wb") as events_file:
        env = {**env, "ALE_EVENT_FD": str(events_file.fileno())}
        proc = subprocess.run(
            [sys.executable, "-m", "ale.agents.llm", "--model", "scripted-model", *argv],
            env=env,
            pass_fds=(events_file.fileno(),),
            capture_output=True,
            text=True,
            timeout=AGENT_TIMEOUT_S,
            check=False,
        )
    raw_lines = events_path.read_bytes().splitlines()
    assert all(len(line) < 64 * 1024 for line in raw_lines), "an event line the harness would refuse"
    return proc.returncode, proc.stdout + proc.stderr, [json.loads(line) for line in raw_lines]


def official_batch(ev: Any, workspace: Path, num_episodes: int) -> pb.EvalResult:
    raw = (workspace / "policy.safetensors").read_bytes()
    batch = ev.harness.submit_batch_eval(raw, official=True, num_episodes=num_episodes)
    deadline = time.monotonic() + 60
    while ev.harness.get_batch_eval_status(batch.batch_id).state != pb.BATCH_STATE_DONE:
        assert time.monotonic() < deadline, "the official batch evaluation did not finish"
        time.sleep(0.02)
    return ev.harness.get_eval_result(batch.batch_id, finalize=True)


def in_process(
    folders: tuple[Path, Path], base_url: str, *, ev: Any = None, **settings: Any
) -> tuple[llm.Agent, list[str]]:
    """The agent's loop in this process, fast retries, its log lines collected."""
    workspace, task_dir = folders
    env = contract_env(ev, "cartpole-balance", workspace, task_dir, base_url)
    agent = llm.build_agent(
        llm.Settings(model="scripted-model", base_url=base_url, api_key=PLACEHOLDER, **settings), env
    )
    lines: list[str] = []
    agent.log = lines.append
    agent.client.log = lines.append
    agent.client.backoff = 0.01
    agent.client.max_backoff = 0.05
    return agent, lines


def tool_messages(request: Any) -> list[str]:
    return [m["content"] for m in request.json["messages"] if m["role"] == "tool"]


# -- a whole session ------------------------------------------------------------------------------


def test_scripted_model_writes_a_cartpole_lqr_policy_that_balances_every_official_episode(
    make_evaluator: Any, tmp_path: Path, folders: tuple[Path, Path]
) -> None:
    ev = make_evaluator("cartpole-balance")
    workspace, task_dir = folders
    with serve_upstream(script=lqr_session(str(task_dir))) as up:
        env = contract_env(ev, "cartpole-balance", workspace, task_dir, up.openai_base)
        status, output, events = run_agent_process(env, tmp_path)
    assert status == 0, output
    assert "ended (finished) after 4 turns" in output
    assert "the policy is in place" in output
    load_policy((workspace / "policy.safetensors").read_bytes())
    result = official_batch(ev, workspace, num_episodes=20)
    assert result.headline_metric == "mean_return"
    assert result.headline_value == 500.0
    assert result.passed_episodes == 20

    assert len(up.requests) == 4
    first = up.requests[0]
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == f"Bearer {PLACEHOLDER}"
    assert first.json["model"] == "scripted-model"
    assert {t["function"]["name"] for t in first.json["tools"]} == {
        "list_files",
        "read_file",
        "write_file",
        "run_shell",
        "finish",
    }
    system = first.json["messages"][0]
    assert system["role"] == "system"
    assert "Balancing a cart-pole with LQR state feedback" in system["content"]  # the paper
    assert "policy.safetensors" in system["content"]
    assert "ALE_EVALUATOR" in system["content"]
    # Each tool result went back with its call's id, and the model saw what its command printed.
    second = up.requests[1].json["messages"]
    calls = [c["id"] for c in second[2]["tool_calls"]]
    assert [m["tool_call_id"] for m in second[3:5]] == calls
    assert second[3]["content"].startswith("# Balancing a cart-pole")
    assert "practice: mean_return = 500.0 over 20 episodes" in tool_messages(up.requests[3])[-1]
    # What the agent recorded: its steps, never the hidden reasoning.
    kinds = [e["kind"] for e in events]
    for kind in ("api_usage", "message", "tool_call", "tool_result", "shell_command", "note"):
        assert kind in kinds, kind
    shell = next(e for e in events if e["kind"] == "shell_command")
    assert shell["data"] == {"command": "python3 lqr.py", "exit_status": 0}
    usage = [e["data"] for e in events if e["kind"] == "api_usage"]
    assert len(usage) == 4
    assert all(u["model"] == "scripted-model" and u["input_tokens"] > 0 for u in usage)
    everything = output + json.dumps(events) + json.dumps([r.json for r in up.requests[1:]])
    assert "HIDDEN-REASONING-MARKER" not in everything


def test_the_session_leaves_no_policy_and_exit_1_when_the_model_never_writes_one(
    tmp_path: Path, folders: tuple[Path, Path]
) -> None:
    workspace, task_dir = folders
    script = [Turn(tool_calls=[ToolCall("finish", {})]), Turn(tool_calls=[ToolCall("finish", {"summary": "gave up"})])]
    with serve_upstream(script=script) as up:
        env = contract_env(None, "cartpole-balance", workspace, task_dir, up.openai_base)
        status, output, _ = run_agent_process(env, tmp_path)
    assert status == 1
    assert "policy not in place: there is no" in output
    assert "error: there is no" in tool_messages(up.requests[1])[0]  # the first finish was refused


# -- hostile tool calls ---------------------------------------------------------------------------


def test_hostile_tool_calls_get_clear_errors_and_the_session_goes_on(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    (tmp_path / "outside.txt").write_text("OUTSIDE-MARKER")
    (folders[0] / "escape").symlink_to(tmp_path)
    hostile = [
        ToolCall("read_file", '{"path": "a.txt"'),  # cut JSON
        ToolCall("read_file", "[" * 100_000 + "]" * 100_000),
        ToolCall("write_file", {"path": "/etc/ale-owned", "content": "x"}),
        ToolCall("write_file", {"path": "escape/outside.txt", "content": "overwritten"}),
        ToolCall("read_file", {"path": "../outside.txt"}),
        ToolCall("write_file", {"path": "big", "content": "x" * (5 << 20)}),
        ToolCall("no_such_tool", {}),
        ToolCall("", {}),
        ToolCall("run_shell", {"command": 42}),
        ToolCall("run_shell", {"command": "head -c 30000000 /dev/urandom | base64", "timeout_s": 60}),
        ToolCall("run_shell", {"command": "sleep 60", "timeout_s": 0.5}),
    ]
    script = [
        Turn(tool_calls=hostile),
        Turn(tool_calls=[ToolCall("finish", {})]),
        Turn(tool_calls=[ToolCall("finish", {})]),
    ]
    with serve_upstream(script=script) as up:
        agent, _ = in_process(folders, up.openai_base)
        outcome = agent.run()
    assert outcome.reason == "finished"
    results = tool_messages(up.requests[1])
    assert len(results) == len(hostile)
    expected = [
        "not valid JSON",
        "nested deeper than 8 levels",
        "is outside",
        "is outside",
        "is outside",
        "more than 4194304",
        "there is no tool 'no_such_tool'",
        "there is no tool ''",
        "'command' must be a string",
        "bytes of output cut",
        "killed after 0.5 s (timeout)",
    ]
    for text, needle in zip(results, expected, strict=True):
        assert needle in text, (needle, text[:300])
        assert len(text) <= agent.tools.output_limit + 100
    assert all(r.startswith("error: ") for r in results[:9])
    assert (tmp_path / "outside.txt").read_text() == "OUTSIDE-MARKER"
    assert "OUTSIDE-MARKER" not in json.dumps([r.json for r in up.requests])
    assert not (folders[0] / "big").exists()


def test_a_reply_with_hundreds_of_tool_calls_runs_the_first_32_and_answers_every_one(
    folders: tuple[Path, Path],
) -> None:
    many = [ToolCall("write_file", {"path": f"f{i:03d}.txt", "content": str(i)}) for i in range(200)]
    script = [
        Turn(tool_calls=many),
        Turn(tool_calls=[ToolCall("finish", {})]),
        Turn(tool_calls=[ToolCall("finish", {})]),
    ]
    with serve_upstream(script=script) as up:
        agent, _ = in_process(folders, up.openai_base)
        assert agent.run().reason == "finished"
    results = tool_messages(up.requests[1])
    assert len(results) == 200
    assert sum(r.startswith("wrote ") for r in results) == llm.MAX_CALLS_PER_TURN
    assert all("at most 32 tool calls" in r for r in results[llm.MAX_CALLS_PER_TURN :])
    assert len(list(folders[0].glob("f*.txt"))) == llm.MAX_CALLS_PER_TURN


# -- a failing endpoint ---------------------------------------------------------------------------


def test_429_5xx_and_garbage_are_retried_with_backoff(folders: tuple[Path, Path]) -> None:
    script = [
        Turn(status=429, error="Rate limit reached for requests"),
        Turn(status=500),
        Turn(status=503, error="overloaded"),
        Turn(raw=b"<html>bad gateway</html>"),
        Turn(raw=b'{"choices": []}'),
        Turn(tool_calls=[ToolCall("run_shell", {"command": "echo still here"})]),
        Turn(status=502),
        Turn(tool_calls=[ToolCall("finish", {})]),
        Turn(tool_calls=[ToolCall("finish", {})]),
    ]
    with serve_upstream(script=script) as up:
        agent, lines = in_process(folders, up.openai_base)
        outcome = agent.run()
    assert outcome.reason == "finished"
    assert outcome.turns == 3
    assert len(up.requests) == len(script)
    retries = [line for line in lines if "retrying in" in line]
    assert len(retries) == 6
    assert "HTTP 429: Rate limit reached" in retries[0]
    assert "unreadable completion" in retries[3]
    assert "still here" in tool_messages(up.requests[-2])[0]


def test_retries_run_out_and_the_session_ends_cleanly(folders: tuple[Path, Path]) -> None:
    with serve_upstream(default=Turn(status=500, error="down")) as up:
        agent, _ = in_process(folders, up.openai_base)
        agent.client.max_attempts = 3
        outcome = agent.run()
    assert outcome.reason == "upstream failed"
    assert "gave up after 3 attempts: HTTP 500: down" in outcome.detail
    assert len(up.requests) == 3


def test_a_refusal_no_retry_can_fix_ends_at_once(folders: tuple[Path, Path]) -> None:
    with serve_upstream(api_key="the-real-key") as up:  # the placeholder is not it: 401
        agent, _ = in_process(folders, up.openai_base)
        outcome = agent.run()
    assert outcome.reason == "upstream failed"
    assert "HTTP 401: invalid api key" in outcome.detail
    assert len(up.requests) == 1


@pytest.mark.parametrize(
    "message",
    [
        "budget exhausted: output_tokens 1000 of 1000 used",
        "You exceeded your current quota, please check your plan and billing details.",
    ],
)
def test_a_budget_429_ends_the_loop_cleanly_without_retrying(folders: tuple[Path, Path], message: str) -> None:
    script = [Turn(tool_calls=[ToolCall("run_shell", {"command": "true"})]), Turn(status=429, error=message)]
    with serve_upstream(script=script, default=Turn(tool_calls=[ToolCall("finish", {})])) as up:
        agent, lines = in_process(folders, up.openai_base)
        outcome = agent.run()
    assert outcome.reason == "llm budget"
    assert message[:40] in outcome.detail
    assert len(up.requests) == 2
    assert not [line for line in lines if "retrying" in line]


def test_the_gateways_budget_refusal_ends_the_loop(folders: tuple[Path, Path]) -> None:
    body = {
        "error": {
            "message": "the run's output_tokens budget is exhausted (1000 used of 1000): "
            "no more LLM requests in this run",
            "type": "rate_limit_error",
            "param": "output_tokens",
            "code": "budget_exhausted:output_tokens",
        }
    }
    with serve_upstream(script=[Turn(status=429, raw=json.dumps(body).encode())]) as up:
        agent, _ = in_process(folders, up.openai_base)
        outcome = agent.run()
    assert outcome.reason == "llm budget"
    assert "output_tokens budget is exhausted" in outcome.detail
    assert len(up.requests) == 1


def test_a_budget_429_in_a_process_exits_with_the_reason(tmp_path: Path, folders: tuple[Path, Path]) -> None:
    workspace, task_dir = folders
    with serve_upstream(script=[Turn(status=429, error="budget exhausted: requests 0 of 0")]) as up:
        env = contract_env(None, "cartpole-balance", workspace, task_dir, up.openai_base)
        status, output, events = run_agent_process(env, tmp_path)
    assert status == 1
    assert "ended (llm budget: HTTP 429: budget exhausted: requests 0 of 0) after 0 turns" in output
    assert events[-1]["kind"] == "note"
    assert "llm agent ended: llm budget" in events[-1]["data"]["text"]


@contextmanager
def dropping_proxy(target: str, drops: dict[int, str]) -> Iterator[str]:
    """An HTTP front for ``target`` that drops request number i (from 0) as ``drops[i]`` says:
    "close" (no answer at all) or "midway" (headers and part of the body, then close)."""
    host, port = target.removeprefix("http://").split("/", 1)[0].split(":")
    server = socket.create_server(("127.0.0.1", 0))
    count = 0
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        nonlocal count
        with conn:
            while not stop.is_set():
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, body = data.split(b"\r\n\r\n", 1)
                length = int(
                    next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                )
                while len(body) < length:
                    body += conn.recv(65536)
                index, count = count, count + 1
                how = drops.get(index)
                if how == "close":
                    return
                if how == "midway":
                    conn.sendall(
                        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{"ch'
                    )
                    return
                with socket.create_connection((host, int(port))) as upstream:
                    upstream.sendall(head.replace(b"keep-alive", b"close") + b"\r\nConnection: close\r\n\r\n" + body)
                    reply = b""
                    while chunk := upstream.recv(65536):
                        reply += chunk
                conn.sendall(reply.replace(b"\r\n", b"\r\nConnection: close\r\n", 1))
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    finally:
        stop.set()
        server.close()


def test_dropped_connections_and_a_cut_body_are_retried(folders: tuple[Path, Path]) -> None:
    script = [Turn(tool_calls=[ToolCall("finish", {})]), Turn(tool_calls=[ToolCall("finish", {})])]
    with serve_upstream(script=script) as up, dropping_proxy(up.url, {0: "close", 1: "midway", 3: "close"}) as url:
        agent, lines = in_process(folders, url)
        outcome = agent.run()
    assert outcome.reason == "finished"
    assert len(up.requests) == 2  # four attempts reached the proxy, two the upstream
    retries = [line for line in lines if "retrying in" in line]
    assert len(retries) == 3
    assert all("connection failed" in line for line in retries), "\n".join(retries)


def test_a_response_slower_than_the_timeout_is_retried(folders: tuple[Path, Path]) -> None:
    script = [
        Turn(delay=3.0, text="too late"),
        Turn(tool_calls=[ToolCall("finish", {})]),
        Turn(tool_calls=[ToolCall("finish", {})]),
    ]
    with serve_upstream(script=script) as up:
        agent, lines = in_process(folders, up.openai_base)
        agent.client.timeout = 0.5
        outcome = agent.run()
    assert outcome.reason == "finished"
    assert any("no response within 0.5 s" in line for line in lines), lines


def test_a_context_length_refusal_compacts_and_tries_again(folders: tuple[Path, Path]) -> None:
    overflow = Turn(status=400, error="This model's maximum context length is 8192 tokens. However, you requested 9000")
    script = [
        Turn(tool_calls=[ToolCall("run_shell", {"command": "head -c 8000 /dev/zero | tr '\\0' q"})]),
        overflow,
        Turn(tool_calls=[ToolCall("finish", {})]),
        Turn(tool_calls=[ToolCall("finish", {})]),
    ]
    with serve_upstream(script=script) as up:
        agent, lines = in_process(folders, up.openai_base)
        before = agent.conversation.budget()
        outcome = agent.run()
    assert outcome.reason == "finished"
    assert agent.conversation.budget() < before
    assert any("context is too long" in line for line in lines)


def test_context_refusals_in_a_row_end_the_session(folders: tuple[Path, Path]) -> None:
    with serve_upstream(default=Turn(status=400, error="prompt is too long: 300000 tokens > 200000 maximum")) as up:
        agent, _ = in_process(folders, up.openai_base)
        outcome = agent.run()
    assert outcome.reason == "context"
    assert len(up.requests) == llm.MAX_OVERFLOWS


# -- limits ---------------------------------------------------------------------------------------


def test_the_turn_limit_ends_the_session(folders: tuple[Path, Path]) -> None:
    with serve_upstream(default=Turn(tool_calls=[ToolCall("run_shell", {"command": "echo again"})])) as up:
        agent, _ = in_process(folders, up.openai_base, max_turns=3)
        outcome = agent.run()
    assert outcome == llm.Outcome("turn limit", 3, "3 turns")
    assert len(up.requests) == 3
    assert "[turn 2 of 3;" in tool_messages(up.requests[2])[-1]


def test_a_model_that_stops_calling_tools_is_nudged_then_the_session_ends(folders: tuple[Path, Path]) -> None:
    with serve_upstream(default=Turn(text="I am thinking about it.")) as up:
        agent, _ = in_process(folders, up.openai_base)
        outcome = agent.run()
    assert outcome.reason == "no tool calls"
    assert len(up.requests) == llm.MAX_NUDGES + 1
    last = up.requests[-1].json["messages"]
    assert [m["content"] for m in last if m["role"] == "user"][-1] == llm.NUDGE


def test_a_long_session_keeps_its_requests_under_the_context_budget(folders: tuple[Path, Path]) -> None:
    noisy = Turn(
        tool_calls=[
            ToolCall("run_shell", {"command": "head -c 20000 /dev/zero | tr '\\0' y; echo"}),
            ToolCall("write_file", {"path": "notes.txt", "content": "n" * 6000}),
        ]
    )
    with serve_upstream(default=noisy) as up:
        agent, _ = in_process(folders, up.openai_base, max_turns=40, context_tokens=16_000)
        outcome = agent.run()
    assert outcome.reason == "turn limit"
    sizes = [sum(llm._size(m) for m in r.json["messages"]) for r in up.requests]
    limit = 16_000 * 4 * 0.75  # the test upstream counts 4 characters a token
    assert max(sizes) <= limit
    assert sizes[-1] > sizes[0]
    last = up.requests[-1].json["messages"]
    assert "earlier turns were removed" in last[2]["content"]
    assert "Balancing a cart-pole" in last[0]["content"]  # the system prompt is never dropped
    assert agent.conversation.elided > 0


def test_the_wall_time_budget_cuts_commands_and_ends_the_session(tmp_path: Path, folders: tuple[Path, Path]) -> None:
    workspace, task_dir = folders
    with serve_upstream(
        default=Turn(tool_calls=[ToolCall("run_shell", {"command": "sleep 60", "timeout_s": 600})])
    ) as up:
        env = contract_env(None, "cartpole-balance", workspace, task_dir, up.openai_base)
        env["ALE_BUDGET_WALL_TIME_S"] = str(llm.STOP_MARGIN_S * 2 + 3)
        started = time.monotonic()
        status, output, _ = run_agent_process(env, tmp_path)
    assert time.monotonic() - started < llm.STOP_MARGIN_S * 2 + 10
    assert status == 1
    assert "ended (wall time" in output
    assert "(timeout_s cut to the" in output  # the command's timeout was the wall time left
    assert len(up.requests) == 1


def test_sigterm_mid_command_stops_the_agent_and_kills_the_command(tmp_path: Path, folders: tuple[Path, Path]) -> None:
    workspace, task_dir = folders
    command = "echo $$ > shell.pid; sleep 300"
    with serve_upstream(
        script=[Turn(tool_calls=[ToolCall("run_shell", {"command": command, "timeout_s": 600})])]
    ) as up:
        env = contract_env(None, "cartpole-balance", workspace, task_dir, up.openai_base)
        proc = subprocess.Popen(
            [sys.executable, "-m", "ale.agents.llm", "--model", "m"], env=env, stderr=subprocess.PIPE, text=True
        )
        pid_file = workspace / "shell.pid"
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the command never started"
            assert proc.poll() is None, "the agent ended before its command started"
            time.sleep(0.05)
        shell = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "ended (stopped: SIGTERM" in err
    assert not Path(f"/proc/{shell}").exists() or Path(f"/proc/{shell}/stat").read_text().split()[2] == "Z"
