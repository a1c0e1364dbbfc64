"""How a task ends early: its phase and category (a closed set) in the trajectory, task_results.json
and the manifest, which the verifier accepts and checks; infrastructure starts retried, the agent
never; one LLM gateway per task with the task's own budget."""

from __future__ import annotations

import copy
import io
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pyrage
import pytest
import trio
import verifier_helpers as h
from llm_upstream import Turn, Usage, serve_upstream
from sandbox_tools import need_bwrap
from test_harness_faults import (
    CARTPOLE,
    PENDULUM,
    EvaluatorKillingRuntime,
    Run,
    _kept_trajectory,
    _options,
    run_harness,
)

from ale import catalog
from ale.core.reasons import Reason
from ale.core.results import END_CATEGORIES, END_PHASES
from ale.core.verify import VerificationError, check_files, unpack
from ale.runner import bundle_writer
from ale.runner.harness import Harness, RunError
from ale.runner.inspect import installed_releases, offline_check
from ale.runner.local import LocalRuntime
from ale.runner.options import RetryPolicy
from ale.runner.outcome import NO_AGENT
from ale.runner.progress import PlainProgress
from ale.runner.runtime import EvaluatorSpec, LineSink, SandboxError, SandboxResult, SandboxSpec
from ale.schemas import validate_document, validator

FAST = RetryPolicy(attempts=3, base_s=0.01, max_s=0.05)


async def _bundled(options: Any, tmp_path: Path, runtime: LocalRuntime | None = None) -> tuple[Run, dict[str, bytes]]:
    """Run, write the bundle, check it as ``ale inspect`` does; the run and the bundle's files."""
    identity = pyrage.x25519.Identity.generate()
    written: list[Path] = []

    def write(record: Any) -> None:
        written.append(bundle_writer.write_bundle(record, [str(identity.to_public())], tmp_path)[0])

    run = await run_harness(options, runtime, before_cleanup=write)
    (path,) = written
    ciphertext = await trio.Path(path).read_bytes()
    offline_check(ciphertext, str(identity))  # the verifier accepts it
    return run, unpack(ciphertext, str(identity))


def _ended(run: Run, files: dict[str, bytes]) -> list[Any]:
    """The task's ended as the outcome, task_results.json, the manifest and task_finished say it."""
    (outcome,) = run.record.outcomes
    (result,) = h.jdoc(files, "task_results.json")["tasks"]
    (task,) = h.jdoc(files, "manifest.json")["tasks"]
    (finished,) = run.of("task_finished", "trusted_harness")
    return [None if outcome.ended is None else outcome.ended.entry(), result["ended"], task["ended"], finished["ended"]]


ARTIFACT = "import os; open('/workspace/policy.safetensors', 'wb').write(os.urandom(4096))"
NOT_EXECUTABLE = "open('/workspace/policy', 'w').write('#!/bin/sh\\nexit 0\\n')"


@pytest.mark.parametrize(
    ("code", "task", "agent_time", "phase", "category"),
    [
        ("pass", CARTPOLE, 20.0, "agent", "agent/no_policy"),
        ("import sys; sys.exit(3)", CARTPOLE, 20.0, "agent", "agent/exit"),
        ("import time; time.sleep(60)", CARTPOLE, 2.0, "agent", "agent/timeout"),
        (ARTIFACT, CARTPOLE, 20.0, "official", "policy/load"),
        (NOT_EXECUTABLE, PENDULUM, 20.0, "official", "policy/load"),
    ],
    ids=["no-policy", "exit", "timeout", "bad-artifact", "not-executable"],
)
async def test_each_way_an_agent_ends_its_task_early_is_recorded_and_verified(
    tmp_path: Path, code: str, task: str, agent_time: float, phase: str, category: str
) -> None:
    run, files = await _bundled(_options(code, task=task, agent_time=agent_time, episodes=1), tmp_path)
    assert _ended(run, files) == [{"phase": phase, "category": category}] * 4
    assert run.outcome.status == "not_completed"
    assert run.of("infrastructure_retry") == []  # nothing of the agent's is retried
    assert len(run.of("agent_started")) == 1
    events = validator("trajectory_event")
    assert all(not list(events.iter_errors(e)) for e in run.events)


async def test_a_completed_task_says_it_did_not_end_early(tmp_path: Path) -> None:
    from ale.runner import agent_env

    demo = attrs.evolve(
        _options("pass", episodes=1),
        agent=attrs.evolve(
            _options("pass").agent, command=(agent_env.PYTHON, "-m", "ale.agents.demo"), modules=("ale.agents.demo",)
        ),
    )
    run, files = await _bundled(demo, tmp_path)
    assert run.outcome.status == "completed"
    assert _ended(run, files) == [None] * 4


# -- the verifier checks the field ----------------------------------------------------------------


@pytest.fixture(scope="module")
def ended_bundle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("ended")
    _, files = trio.run(_bundled, _options("pass", episodes=1), folder)
    return files


def _check(files: dict[str, bytes]) -> None:
    releases = installed_releases()
    check_files(
        files,
        release_for=lambda sha: (releases[sha], sha) if sha in releases else None,
        known_tasks={t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()},
        validate=validate_document,
        contexts=catalog.judge_contexts(),
    )


def _set_ended(document: dict[str, Any], value: Any) -> None:
    (entry,) = document["tasks"]
    entry["ended"] = value


@pytest.mark.parametrize(
    ("file", "value", "reason"),
    [
        ("task_results.json", {"phase": "agent", "category": "agent/exit"}, Reason.INCONSISTENT_RESULTS),
        ("manifest.json", {"phase": "agent", "category": "agent/exit"}, Reason.INCONSISTENT_RESULTS),
        ("task_results.json", None, Reason.INCONSISTENT_RESULTS),
        ("task_results.json", {"phase": "agent", "category": "agent/bored"}, Reason.SCHEMA_INVALID),
        ("task_results.json", {"phase": "lunch", "category": "agent/exit"}, Reason.SCHEMA_INVALID),
        ("task_results.json", {"phase": "setup", "category": "agent/exit"}, Reason.SCHEMA_INVALID),
        ("task_results.json", {"phase": "agent"}, Reason.SCHEMA_INVALID),
        ("task_results.json", "agent/exit", Reason.SCHEMA_INVALID),
        ("manifest.json", {"phase": "agent", "category": "agent/no_policy", "note": 1}, Reason.SCHEMA_INVALID),
    ],
    ids=["other-category", "manifest-differs", "dropped-from-results", "unknown-category", "unknown-phase",
         "category-in-a-phase-it-never-ends", "no-category", "a-string", "extra-member"],
)  # fmt: skip
def test_the_verifier_refuses_an_ended_that_is_not_the_runs(
    ended_bundle: dict[str, bytes], file: str, value: Any, reason: Reason
) -> None:
    forged = h.edit(ended_bundle, file, lambda d: _set_ended(d, value))
    with pytest.raises(VerificationError) as info:
        _check(forged)
    assert info.value.reason == reason, info.value


def test_a_bundle_of_an_older_harness_without_ended_is_accepted(ended_bundle: dict[str, bytes]) -> None:
    """Backwards compatible: no ended in task_results.json, the manifest or task_finished."""
    events = h.read_events(ended_bundle)
    for e in events:
        if e["kind"] == "task_finished":
            del e["data"]["ended"]
    files = h.with_events(ended_bundle, h.rehash(copy.deepcopy(events)))

    def drop(document: dict[str, Any]) -> None:
        del document["tasks"][0]["ended"]

    for name in ("task_results.json", "manifest.json"):
        files = h.edit(files, name, drop, reseal=False)
    _check(h.seal(files))


def test_a_completed_task_with_an_ended_is_refused(tmp_path: Path) -> None:
    from ale.core.parse import ParseError
    from ale.core.results import parse_task_results

    doc = {"schema": "ale-task-results/v1", "run_id": "run-1", "tasks": [{
        "task": "cartpole-balance@1.0.0", "genre": "open", "mode": "batch", "official_episodes": 1,
        "status": "not_completed", "reason": "x", "result": None, "ended": {"phase": "agent", "category": "agent/exit"},
    }]}  # fmt: skip
    parse_task_results(json.dumps(doc).encode())
    doc["tasks"][0]["status"] = "completed"
    with pytest.raises((ParseError, ValueError)):
        parse_task_results(json.dumps(doc).encode())


def test_the_closed_set_is_the_schemas() -> None:
    for name in ("task_results", "manifest", "trajectory_event"):
        schema = _schema(name)
        ended = schema["$defs"]["ended"]["properties"]
        assert ended["phase"]["enum"] == list(END_PHASES)
        assert ended["category"]["enum"] == list(END_CATEGORIES)


def _schema(name: str) -> dict[str, Any]:
    from ale import schemas

    return dict(json.loads((Path(schemas.__file__).parent / f"{name}.schema.json").read_text()))


# -- retries of the infrastructure, never of the agent -----------------------------------------------


class FlakyEvaluators(LocalRuntime):
    """The local runtime, but the first ``fails`` evaluators of the tasks named fail to start (for
    real: asked to serve a task the evaluator does not know)."""

    def __init__(self, fails: int, tasks: tuple[str, ...] = (CARTPOLE,)) -> None:
        super().__init__()
        self.fails, self.tasks = fails, tasks
        self.opened: list[str] = []

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[Any]:
        self.opened.append(spec.task_id)
        if spec.task_id in self.tasks and self.opened.count(spec.task_id) <= self.fails:
            spec = attrs.evolve(spec, task_id="no-such-task")
        async with super().open_evaluator(spec) as handle:
            yield handle


class FlakySandboxes(LocalRuntime):
    """The local runtime, but the first ``fails`` sandboxes do not start."""

    def __init__(self, fails: int) -> None:
        super().__init__()
        self.fails, self.calls = fails, 0

    async def run_sandboxed(
        self, spec: SandboxSpec, sink: LineSink, *, should_stop: Callable[[], Awaitable[str]] | None = None
    ) -> SandboxResult:
        self.calls += 1
        if self.calls <= self.fails:
            raise SandboxError(f"no sandbox this time ({self.calls})")
        return await super().run_sandboxed(spec, sink, should_stop=should_stop)


async def test_an_evaluator_that_fails_to_start_twice_is_retried_and_the_task_runs(tmp_path: Path) -> None:
    runtime = FlakyEvaluators(fails=2)
    run, files = await _bundled(_options("pass", episodes=1, retry=FAST), tmp_path, runtime)
    retries = run.of("infrastructure_retry", "trusted_harness")
    assert [(r["what"], r["attempt"], r["attempts"]) for r in retries] == [("evaluator_start", 1, 3),
                                                                          ("evaluator_start", 2, 3)]  # fmt: skip
    assert "no-such-task" in retries[0]["error"]
    assert [r["backoff_s"] for r in retries] == [0.01, 0.02]
    kinds = run.kinds("trusted_harness")
    assert kinds.index("evaluator_started") > kinds.index("infrastructure_retry")
    assert len(run.of("evaluator_ready")) == 1
    assert runtime.opened == [CARTPOLE] * 3
    assert _ended(run, files) == [{"phase": "agent", "category": "agent/no_policy"}] * 4  # the agent's own end
    _schema_valid(run.events)


def _schema_valid(events: list[dict[str, Any]]) -> None:
    schema = validator("trajectory_event")
    for e in events:
        assert not [err.message for err in schema.iter_errors(e)], e


async def test_a_sandbox_that_fails_to_start_is_retried_but_the_agent_that_failed_is_not(tmp_path: Path) -> None:
    runtime = FlakySandboxes(fails=1)
    run, files = await _bundled(_options("import sys; sys.exit(3)", episodes=1, retry=FAST), tmp_path, runtime)
    (retry,) = run.of("infrastructure_retry")
    assert (retry["what"], retry["error"]) == ("sandbox_start", "no sandbox this time (1)")
    assert runtime.calls == 2  # the failed start, then the agent: once
    assert len(run.of("agent_started")) == 1
    assert run.of("agent_finished")[0]["exit_status"] == 3
    assert _ended(run, files) == [{"phase": "agent", "category": "agent/exit"}] * 4


def _workdir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ale-end-"))  # short: the run folder holds Unix sockets
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


workdir = pytest.fixture(_workdir)


async def test_a_sandbox_that_never_starts_ends_the_task_and_the_run_fails(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    runtime = FlakySandboxes(fails=99)
    options = _options("pass", retry=FAST, workdir=workdir, state_parent=workdir)
    with pytest.raises(RunError, match=r"infrastructure/sandbox_start: the sandbox did not start: 3 attempts"):
        await Harness(options, runtime, PlainProgress(out=io.StringIO())).run()
    (record,) = await trio.to_thread.run_sync(lambda: list(workdir.glob(f"*.state/tasks/{CARTPOLE}/record.json")))
    outcome = json.loads(await trio.Path(record).read_text())["outcome"]
    assert outcome["agent"] == NO_AGENT  # the manifest's entry of an agent that never ran
    assert outcome["ended"] == {"phase": "agent", "category": "infrastructure/sandbox_start"}
    events = _kept_trajectory(workdir)
    kinds = [e["kind"] for e in events]
    assert kinds.count("infrastructure_retry") == 2
    assert kinds[-3:] == ["task_ended_early", "task_finished", "run_failed"]
    ended = next(e for e in events if e["kind"] == "task_ended_early")["data"]
    assert (ended["phase"], ended["category"]) == ("agent", "infrastructure/sandbox_start")
    assert "agent_finished" not in kinds  # the agent never ran
    assert runtime.calls == 3
    _schema_valid(events)
    broken = dict(ended, category="infrastructure/bored")
    assert list(validator("trajectory_event").iter_errors({**events[-3], "data": broken}))


async def test_an_evaluator_that_dies_under_the_agent_ends_the_task_for_the_infrastructure(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    options = _options("import time; time.sleep(600)", agent_time=30, workdir=workdir)
    with pytest.raises(RunError, match="infrastructure/evaluator_died"):
        await Harness(options, EvaluatorKillingRuntime(), PlainProgress(out=io.StringIO())).run()
    events = _kept_trajectory(workdir)
    ended = next(e for e in events if e["kind"] == "task_ended_early")["data"]
    assert (ended["phase"], ended["category"]) == ("agent", "infrastructure/evaluator_died")
    assert next(e for e in events if e["kind"] == "agent_finished")["data"]["stopped_for"] == "evaluator_died"


# -- one gateway per task, with the task's own budget --------------------------------------------------

#: the agent: requests until one is refused (at most 8); prints how many were answered
SPENDER = """
import http.client, json, os, urllib.parse
url = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
answered = 0
for i in range(8):
    c = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "q%d" % i}]})
    c.request("POST", url.path + "/chat/completions", body,
              {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    r = c.getresponse(); r.read(); c.close()
    if r.status != 200:
        break
    answered += 1
print("answered", answered, flush=True)
"""


async def test_one_gateway_per_run_no_longer_shares_the_runs_llm_budget_across_its_tasks(tmp_path: Path) -> None:
    """The defect: one gateway per run had the sum of its tasks' budgets (up to twice a task's
    figure and more), so the first task could spend what the next one had. Now each task has a
    gateway of its own with its own llm_tokens: each request reports 600k input tokens; cartpole
    (1M) is answered twice (the request that crosses the budget completes), pendulum (2M) four
    times, though it runs after cartpole spent its own."""
    from ale.runner.gateway_proc import Upstream

    need_bwrap()
    budgets = {t: catalog.get_task(t).spec.budgets.llm_tokens for t in (CARTPOLE, PENDULUM)}
    assert budgets == {CARTPOLE: 1_000_000, PENDULUM: 2_000_000}
    turn = Turn(text="ok", usage=Usage(input_tokens=600_000, output_tokens=1))
    with serve_upstream(by_model={"m": turn}) as up:
        upstream = Upstream(name="openai", api="openai", base_url=up.openai_base, api_key=None)
        options = attrs.evolve(_options(SPENDER, episodes=1), tasks=(CARTPOLE, PENDULUM), upstreams=(upstream,))
        run, files = await _bundled(options, tmp_path)
    assert [t for t in run.stdout() if t.startswith("answered")] == ["answered 2", "answered 4"]
    started = run.of("gateway_started", "trusted_network_proxy")
    assert [s["budgets"]["input_tokens"] for s in started] == [budgets[CARTPOLE], budgets[PENDULUM]]
    kinds = run.kinds()
    windows = [i for i, k in enumerate(kinds) if k in ("task_started", "task_finished")]
    starts = [i for i, k in enumerate(kinds) if k == "gateway_started"]
    stops = [i for i, k in enumerate(kinds) if k == "gateway_stopped"]
    assert windows[0] < starts[0] < stops[0] < windows[1] < windows[2] < starts[1] < stops[1] < windows[3]
    allowed = [r for r in run.of("llm_request", "trusted_network_proxy") if r["decision"] == "allowed"]
    assert len(allowed) == 6
    summary = h.jdoc(files, "network_summary.json")
    assert summary["requests"]["allowed"] == 6
    assert summary["usage"]["input_tokens"] == 6 * 600_000
