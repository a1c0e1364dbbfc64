"""Shared machinery for the judge's tests (a plain module, imported by tests/test_judge*.py).

* :func:`chat_body`: a Chat Completions answer body around some message content.
* :func:`verdict_for`: the verdict a judge would write for a request's judge input (its digest and
  rubric read from the request itself), faithful or not, or with every item satisfied.
* :func:`serve_judge`: a judge on 127.0.0.1 that answers each ``POST /v1/chat/completions`` with
  ``answer(request_json)`` (default: :func:`verdict_for` with ``faithful=True``), counting requests.
  For scripted answers that need no digest (errors, refusals, garbage), tests use
  ``tests/llm_upstream.py``'s scripted mode instead.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale import catalog
from ale.core import bundle

Answer = Callable[[dict[str, Any]], tuple[int, bytes]]


def chat_body(content: str | None, *, refusal: str | None = None, finish: str = "stop", model: str = "m") -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
        }
    ).encode()


def user_text(request: dict[str, Any]) -> str:
    return str(request["messages"][-1]["content"])


def digest_of(request: dict[str, Any]) -> str:
    found = re.search(r"input_sha256: ([0-9a-f]{64})\n\Z", user_text(request))
    assert found, "the judge's request ends with the input's digest"
    return found.group(1)


def rubric_of(request: dict[str, Any]) -> Any:
    task = re.search(r"^Task: ([a-z][a-z0-9-]+)@", user_text(request), flags=re.M)
    assert task, "the judge input names its task"
    return catalog.get_task(task.group(1)).rubric


def verdict_for(
    request: dict[str, Any], *, faithful: bool = True, unmet: tuple[str, ...] = (), digest: str | None = None
) -> dict[str, Any]:
    rubric = rubric_of(request)
    return {
        "input_sha256": digest or digest_of(request),
        "faithful": faithful,
        "rationale": "the method as the paper describes it" if faithful else "a shortcut",
        "findings": [
            {"item": item.id, "satisfied": item.id not in unmet, "evidence": f"#{i + 3}"}
            for i, item in enumerate(rubric.items)
        ],
    }


def faithful_answer(request: dict[str, Any]) -> tuple[int, bytes]:
    return 200, chat_body(json.dumps(verdict_for(request)))


@dataclass
class Judge:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"{self.url}/v1"


@contextmanager
def serve_judge(answer: Answer = faithful_answer) -> Iterator[Judge]:
    judge = Judge("")
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            with lock:
                judge.requests.append(body)
            status, payload = (
                answer(body) if self.path == "/v1/chat/completions" else (404, b'{"error":{"message":"no route"}}')
            )
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    judge.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield judge
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# -- real runs, made once per session -------------------------------------------------------------

RUNNER_CLI = (sys.executable, "-m", "ale.runner.cli")


def mixed_answer(request: dict[str, Any]) -> tuple[int, bytes]:
    """pendulum-lqr: a faithful verdict; any other task: an answer that is not a verdict."""
    if re.search(r"^Task: pendulum-lqr@", user_text(request), flags=re.M):
        return faithful_answer(request)
    return 200, chat_body("I would rather not say.")


@dataclass
class Runs:
    """Bundles of real ``ale run`` runs (files decrypted), for the judge's tests."""

    plain: dict[str, bytes]  # pendulum-lqr, no judge, official episode counts
    judged: dict[str, bytes]  # pendulum-lqr and reacher-jacobian, judged (mixed_answer), signed, 2 episodes
    judge_requests: list[dict[str, Any]]  # what the judged run's judge was asked
    judge_public_key: str  # base64, as `ale runner-key` prints it
    log: str


_RUNS: Runs | None = None


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ALE_", "OPENAI_", "KEEP_SUBMISSION"))}


def _run(root: Path, name: str, recipient: str, *extra: str) -> tuple[bytes, str]:
    out = root / name
    proc = subprocess.run(
        [*RUNNER_CLI, "run", "--plain", "--agent-time", "120", "--out", str(out), "--recipient", recipient, *extra],
        cwd=root, env=_env(), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    return path.read_bytes(), proc.stderr


def get_runs(tmp_path_factory: Any, recipient: str, identity: str) -> Runs:
    """The session's runs, made once however many test modules ask for them."""
    global _RUNS
    if _RUNS is not None:
        return _RUNS
    root = Path(tmp_path_factory.mktemp("judge-runs"))
    pem = root / "judge.pem"
    made = subprocess.run([*RUNNER_CLI, "runner-key", str(pem)], capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    public = dict(line.split(": ", 1) for line in made.stdout.splitlines())["public key (register it on the site)"]
    plain_raw, log_plain = _run(root, "plain", recipient, "pendulum-lqr")
    with serve_judge(mixed_answer) as judge:
        judged_raw, log_judged = _run(root, "judged", recipient, "pendulum-lqr", "reacher-jacobian", "--episodes", "2",
                                  "--judge-model", "judge-model-1", "--judge-upstream", judge.base,
                                  "--judge-key", str(pem))  # fmt: skip
        requests = list(judge.requests)
    plain, judged = bundle.unpack(plain_raw, identity), bundle.unpack(judged_raw, identity)
    _RUNS = Runs(plain, judged, requests, public, log_plain + log_judged)
    return _RUNS
