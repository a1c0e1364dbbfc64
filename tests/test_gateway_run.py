"""`ale run` with the LLM gateway, over real HTTP and real sandboxes (issue 12, points 1, 2, 5, 6, 10).

One module-scoped run (:func:`gateway_run`): ``ale run pendulum-lqr`` whose agent
(tests/gateway_agent.py) uses the official ``openai`` and ``anthropic`` SDKs inside the sandbox
(``--agent-package``) against the test upstream (tests/llm_upstream.py) through the gateway, plain
and streaming, tries denied paths, an unknown upstream, a wrong key and direct connections, drops a
stream, and leaves an interactive policy that probes the official phase's network. The upstream
requires a unique real key, which is then searched for everywhere the run left something.
Separate runs: the gateway dying mid-run, and never becoming ready.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
import pytest
import verifier_helpers as h
from gateway_agent import agent_code
from llm_upstream import Turn, Usage, serve_upstream
from sandbox_tools import need_bwrap

from ale import catalog
from ale.core import bundle
from ale.core.reasons import Reason
from ale.core.verify import VerificationError, check_files
from ale.runner.inspect import installed_releases
from ale.schemas import validate_document, validator

RUNNER = (sys.executable, "-m", "ale.runner.cli")
TASK = "pendulum-lqr"
REAL_KEY = f"sk-real-{os.getpid()}-e3b0c44298fc1c149afbf4c8996fb924"  # unique to this test session
GAIN = 12.5


@attrs.frozen
class GatewayRun:
    proc: subprocess.CompletedProcess[str]
    folder: Path
    tmp: Path  # its TMPDIR, where the run folder was
    bundle_path: Path
    files: dict[str, bytes]
    events: list[dict[str, Any]]
    upstream: Any
    keys: h.SiteKeys

    def of(self, producer: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["producer"] == producer and kind in (None, e["kind"])]

    def report(self, prefix: str = "REPORT ") -> dict[str, Any]:
        kind = "stdout" if prefix == "REPORT " else "policy_stdout"
        for e in self.of("untrusted_agent", kind):
            if e["data"]["text"].startswith(prefix):
                return dict(json.loads(e["data"]["text"][len(prefix) :]))
        raise AssertionError(f"no {prefix.strip()} line in the trajectory")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """The harness's environment: no ALE_*, OPENAI_* or ANTHROPIC_* of the caller's, its run folder
    in ``tmp`` (short: Unix socket paths)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALE_", "OPENAI_", "ANTHROPIC_"))}
    return {**env, "TMPDIR": str(tmp), **extra}


@pytest.fixture(scope="module")
def run_tmp() -> Iterator[Path]:
    """A short TMPDIR for the runs of this module (a run folder's sockets must fit 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ale-gw-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run_cmd(up: Any, code: str, *extra: str) -> list[str]:
    return [
        *RUNNER, "run", TASK, "--plain", "--out", "out", "--episodes", "1", "--agent-time", "300",
        "--agent-cmd", f"python3 -c {shlex.quote(code)}", "--agent-name", "gateway-test-agent",
        "--agent-package", "openai", "--agent-package", "anthropic",
        "--llm-upstream", f"openai={up.openai_base}", "--llm-upstream", f"anthropic={up.anthropic_base}",
        *extra,
    ]  # fmt: skip


def _script() -> list[Turn]:
    return [
        Turn(text=json.dumps({"gain": GAIN}), usage=Usage(1200, 30, cached_input_tokens=1024)),
        Turn(text="a streamed answer", reasoning="hidden chain of thought XYZZY", chunk_chars=4),
        Turn(text="hello from the messages api"),
        Turn(text="a streamed message", reasoning="more hidden thinking PLUGH", chunk_chars=5),
        Turn(text="x" * 400, chunk_chars=4, chunk_delay=0.05),  # dropped by the agent after two chunks
    ]


@pytest.fixture(scope="module")
def gateway_run(tmp_path_factory: pytest.TempPathFactory, run_tmp: Path) -> Iterator[GatewayRun]:
    need_bwrap()
    folder = tmp_path_factory.mktemp("gateway-run")
    keys = h.keygen(folder / "site")
    with serve_upstream(script=_script(), api_key=REAL_KEY) as up:
        port = int(up.url.rsplit(":", 1)[1])
        env = _env(run_tmp, OPENAI_API_KEY=REAL_KEY, ANTHROPIC_API_KEY=REAL_KEY)
        cmd = _run_cmd(up, agent_code(port), "--recipient", keys.recipient)
        proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr
        (bundle_path,) = (folder / "out").glob("*.ale")
        files = bundle.unpack(bundle_path.read_bytes(), keys.identity)
        yield GatewayRun(proc, folder, run_tmp, bundle_path, files, h.read_events(files), up, keys)


# --- the run and its bundle ----------------------------------------------------------------------------


def test_the_bundle_passes_inspect_and_the_verifier(gateway_run: GatewayRun, tmp_path: Path) -> None:
    run = gateway_run
    inspected = subprocess.run(
        [*RUNNER, "inspect", str(run.bundle_path), "--identity", str(run.keys.key_file), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert inspected.returncode == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    assert "network_summary.json recomputed from the trajectory's network events" in report["checks"]["passed"]
    assert report["network"]["proxy"]["name"] == "ale-gateway"
    settings = _World(run.keys).settings(tmp_path)
    from ale_verify import db, pipeline

    db.migrate(settings.database)
    db.upsert_user(settings.database, h.PARTICIPANT, h.PARTICIPANT, "local")
    upload = tmp_path / "upload.ale"
    upload.write_bytes(run.bundle_path.read_bytes())
    outcome = pipeline.process_upload(upload, settings, run.keys.signing_key, user_id=h.PARTICIPANT)
    assert outcome.status == "accepted", outcome.reasons
    assert outcome.summary["network_proxy"]["upstreams"][0]["name"] == "openai"
    usage = json.loads(run.files["network_summary.json"])["usage"]
    assert outcome.summary["usage"] == usage
    # The board's token and runtime columns come from the summary and the manifest, end to end.
    from ale_verify import export

    export.export_site(settings.database, tmp_path / "site")
    (row,) = json.loads((tmp_path / "site" / "leaderboard.json").read_text())["submissions"]
    assert (row["input_tokens"], row["output_tokens"]) == (usage["input_tokens"], usage["output_tokens"])
    assert row["tokens_source"] == "network_proxy"
    manifest = json.loads(run.files["manifest.json"])
    started, finished = (datetime.fromisoformat(manifest["run"][k]) for k in ("started", "finished"))
    assert row["runtime_s"] == pytest.approx((finished - started).total_seconds(), abs=1e-3)
    # a run never stopped: the same, to the microsecond. The manifest's started and finished are each
    # rounded to the microsecond and active_s is their float difference rounded once, so the board's
    # runtime (min(active_s, finished - started)) may be one microsecond less: exactly 1e-6 apart,
    # which as floats may exceed abs=1e-6 (4.086476 against 4.086477 failed so); half of one more is
    # the float's slack, not a second microsecond.
    assert row["runtime_s"] == pytest.approx(manifest["run"]["active_s"], abs=1.5e-6)


@attrs.frozen
class _World:
    keys: h.SiteKeys

    def settings(self, tmp: Path) -> Any:
        from ale_verify.config import Settings

        return Settings(
            database=tmp / "verifier.sqlite3",
            key_file=self.keys.key_file,
            signing_key_file=self.keys.signing_key_file,
            tmp_dir=tmp / "upload-tmp",
            bundle_dir=tmp / "bundles",
            operators=frozenset({h.OPERATOR}),
        )


def test_the_sdks_in_the_sandbox_reached_the_upstream_plain_and_streaming(gateway_run: GatewayRun) -> None:
    report = gateway_run.report()
    assert json.loads(report["chat"]) == {"gain": GAIN}
    assert report["chat_usage"] == [1200, 30]
    assert report["chat_stream"] == "a streamed answer"
    assert report["messages"] == "hello from the messages api"
    assert report["messages_stream"] == "a streamed message"
    requests = gateway_run.upstream.requests
    assert [(r.method, r.path) for r in requests] == [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/chat/completions"),
    ]
    # The upstream got the real key, the way each API takes it; the sandbox never had it.
    assert requests[0].headers["authorization"] == f"Bearer {REAL_KEY}"
    assert requests[2].headers["x-api-key"] == REAL_KEY
    assert "x-api-key" not in requests[0].headers
    assert "authorization" not in requests[2].headers


def test_the_sandbox_environment_names_the_gateway_and_holds_the_placeholder(gateway_run: GatewayRun) -> None:
    env = gateway_run.report()["env"]
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:27100/openai"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:27100/anthropic"
    assert env["ALE_GATEWAY_URL"] == "http://127.0.0.1:27100"
    assert env["ALE_GATEWAY_SOCKET"] == "/ale/gateway.sock"
    assert env["ALE_GATEWAY_UPSTREAMS"] == "openai:openai,anthropic:anthropic"
    assert re.fullmatch(r"sk-ale-placeholder-[0-9a-f]{48}", env["OPENAI_API_KEY"])
    assert env["ANTHROPIC_API_KEY"] == env["OPENAI_API_KEY"]


def test_the_real_key_is_nowhere_the_run_left_anything(gateway_run: GatewayRun) -> None:
    """Not in the bundle (every file, the trajectory decompressed), the run's stdout and stderr, the
    output folder or anything else under the test's folder (the run folder is gone)."""
    run = gateway_run
    needle = REAL_KEY.encode()
    assert REAL_KEY not in run.proc.stdout + run.proc.stderr
    for name, data in run.files.items():
        assert needle not in data, name
    assert needle not in bundle.decompress(run.files["events.jsonl.zst"], bundle.Limits(max_decompressed=1 << 28))
    left = [p for p in run.folder.rglob("*") if p.is_file() and "site" not in p.parts]
    assert any(p.suffix == ".ale" for p in left)
    for path in left:
        assert needle not in path.read_bytes(), path
    assert list(run.tmp.iterdir()) == []  # the run folder (with the gateway's log) is removed
    placeholder = run.report()["env"]["OPENAI_API_KEY"]
    assert placeholder not in json.dumps(run.of("trusted_network_proxy"))  # the gateway redacts it too


def test_denied_requests_and_direct_connections(gateway_run: GatewayRun) -> None:
    report = gateway_run.report()
    assert report["denied"] == {"path": 403, "upstream": 404, "key": 401}
    assert report["direct"]["public"] != "connected"
    assert report["direct"]["upstream_host_port"] != "connected"  # the upstream is on the host's loopback
    requests = gateway_run.of("trusted_network_proxy", "llm_request")
    denied = {e["data"]["reason"]: e["data"] for e in requests if e["data"]["decision"] == "denied"}
    assert set(denied) == {"path_not_allowed", "unknown_upstream", "bad_credentials"}
    assert denied["path_not_allowed"]["path"] == "/v1/files"
    assert all(d["usage"] == {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0} for d in denied.values())
    assert len(gateway_run.upstream.requests) == 5  # none of the denied ones went out


def test_the_dropped_stream_is_recorded_as_the_agent_leaving(gateway_run: GatewayRun) -> None:
    assert gateway_run.report()["dropped_after"] == 2
    (dropped,) = [e for e in gateway_run.of("trusted_network_proxy", "llm_request") if e["data"]["model"] == "m-drop"]
    assert dropped["data"]["reason"] == "client_disconnected"
    assert dropped["data"]["decision"] == "allowed"
    assert gateway_run.upstream.wait_outcome(4) == "client_gone"


def test_hidden_reasoning_is_not_recorded(gateway_run: GatewayRun) -> None:
    text = json.dumps(gateway_run.events)
    assert "XYZZY" not in text
    assert "PLUGH" not in text


def test_the_scored_policy_has_no_way_out(gateway_run: GatewayRun) -> None:
    """The official evaluation's sandbox has no gateway socket, relay or variables, and the gateway
    was closed before it began; the manifest and the summary record each phase's policy."""
    probe = gateway_run.report("POLICY ")
    assert probe == {"socket_exists": False, "env": [], "relay": "ConnectionRefusedError"}
    kinds = [(e["producer"], e["kind"], e["data"].get("policy")) for e in gateway_run.events]
    closed = kinds.index(("trusted_network_proxy", "policy_changed", "closed"))
    opened = kinds.index(("trusted_network_proxy", "policy_changed", "open"))
    official = kinds.index(("trusted_harness", "official_evaluation_started", None))
    agent = kinds.index(("trusted_harness", "agent_started", None))
    assert opened < agent < closed < official
    policy_changes = [e["data"] for e in gateway_run.of("trusted_network_proxy", "policy_changed")]
    assert [(p["policy"], p["phase"]) for p in policy_changes] == [("open", "agent"), ("closed", "official")]
    manifest = json.loads(gateway_run.files["manifest.json"])
    assert manifest["tasks"][0]["network"] == {"agent": "open", "official": "closed"}
    assert json.loads(gateway_run.files["network_summary.json"])["phases"] == {"agent": "open", "official": "closed"}
    assert manifest["tasks"][0]["episodes_run"] == 1
    assert [e["data"]["index"] for e in gateway_run.of("trusted_evaluator", "episode_end")] == [0]


def test_network_summary_totals_equal_the_events(gateway_run: GatewayRun) -> None:
    """Summed here from the llm_request events, independently of ale.core.network; and the gateway's
    own totals (gateway_stopped) agree."""
    summary = json.loads(gateway_run.files["network_summary.json"])
    requests = [e["data"] for e in gateway_run.of("trusted_network_proxy", "llm_request")]
    assert summary["requests"] == {
        "total": len(requests),
        "allowed": sum(r["decision"] == "allowed" for r in requests),
        "denied": sum(r["decision"] == "denied" for r in requests),
    }
    assert summary["requests"] == {"total": 8, "allowed": 5, "denied": 3}
    for name in ("input_tokens", "output_tokens", "cached_input_tokens"):
        assert summary["usage"][name] == sum(r["usage"][name] for r in requests), name
    assert summary["usage"]["cached_input_tokens"] == 1024
    (stopped,) = gateway_run.of("trusted_network_proxy", "gateway_stopped")
    assert stopped["data"]["requests"] == summary["requests"]
    assert stopped["data"]["usage"] == summary["usage"]
    (started,) = gateway_run.of("trusted_network_proxy", "gateway_started")
    assert summary["proxy"]["upstreams"] == started["data"]["upstreams"]


def test_the_tasks_budgets_are_the_gateways(gateway_run: GatewayRun) -> None:
    (started,) = gateway_run.of("trusted_network_proxy", "gateway_started")
    tokens = catalog.get_task(TASK).spec.budgets.llm_tokens
    assert started["data"]["budgets"] == {"requests": None, "input_tokens": tokens, "output_tokens": tokens}


def test_every_event_matches_the_event_schema(gateway_run: GatewayRun) -> None:
    events = validator("trajectory_event")
    for event in gateway_run.events:
        errors = [f"{e.json_path}: {e.message[:200]}" for e in events.iter_errors(event)]
        assert errors == [], (event["producer"], event["kind"], errors)
    for name in ("manifest.json", "network_summary.json"):
        validate_document(name, json.loads(gateway_run.files[name]))
    gateway_kinds = {e["kind"] for e in gateway_run.of("trusted_network_proxy")}
    assert gateway_kinds == {"gateway_started", "policy_changed", "llm_request", "gateway_stopped"}
    in_phase = [e for e in gateway_run.of("trusted_network_proxy", "llm_request")]
    assert all(e["data"]["task"] == f"{TASK}@1.0.0" for e in in_phase)


# --- a forged summary ----------------------------------------------------------------------------------


def _offline(files: dict[str, bytes]) -> None:
    releases = installed_releases()
    check_files(
        files,
        release_for=lambda sha: (releases[sha], sha) if sha in releases else None,
        known_tasks={t.spec.ref: (t.spec, t.digest) for t in catalog.tasks().values()},
        validate=validate_document,
    )


def _drop_one_request(files: dict[str, bytes]) -> dict[str, bytes]:
    events = h.read_events(files)
    index = next(i for i, e in enumerate(events) if e["kind"] == "llm_request" and e["data"]["decision"] == "allowed")
    kept = events[:index] + events[index + 1 :]
    for seq, e in enumerate(kept):
        e["seq"] = seq
    per: dict[str, int] = {}
    for e in kept:
        e["producer_sequence"] = per.get(e["producer"], 0)
        per[e["producer"]] = e["producer_sequence"] + 1
    return h.seal(h.with_events(files, h.rehash(kept)))


def _usage_as_text(files: dict[str, bytes]) -> dict[str, bytes]:
    events = h.read_events(files)
    e = next(e for e in events if e["kind"] == "llm_request")
    e["data"]["usage"]["output_tokens"] = "30"
    return h.seal(h.with_events(files, h.rehash(events)))


FORGERIES = {
    "more-output-tokens": lambda f: h.edit(f, "network_summary.json", lambda d: d["usage"].update(output_tokens=1)),
    "fewer-input-tokens": lambda f: h.edit(
        f, "network_summary.json", lambda d: d["usage"].update(input_tokens=d["usage"]["input_tokens"] - 1)
    ),
    "no-cached-tokens": lambda f: h.edit(f, "network_summary.json", lambda d: d["usage"].update(cached_input_tokens=0)),
    "fewer-denied": lambda f: h.edit(
        f, "network_summary.json", lambda d: d["requests"].update(denied=0, total=d["requests"]["allowed"])
    ),
    "no-proxy": lambda f: h.edit(f, "network_summary.json", lambda d: d.update(proxy=None)),
    "other-upstream-host": lambda f: h.edit(
        f, "network_summary.json", lambda d: d["proxy"]["upstreams"][0].update(host="api.openai.com")
    ),
    "phases-none": lambda f: h.edit(
        f, "network_summary.json", lambda d: d.update(phases={"agent": "none", "official": "none"})
    ),
    "manifest-phases-none": lambda f: h.edit(
        f, "manifest.json", lambda d: d["tasks"][0].update(network={"agent": "none", "official": "none"})
    ),
    "a-request-left-out-of-the-trajectory": _drop_one_request,
    "usage-as-text-in-the-trajectory": _usage_as_text,
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_network_summary_is_refused(gateway_run: GatewayRun, forgery: str) -> None:
    _offline(gateway_run.files)  # the real one passes
    forged = FORGERIES[forgery](dict(gateway_run.files))
    with pytest.raises(VerificationError) as info:
        _offline(forged)
    assert info.value.reason == Reason.NETWORK_MISMATCH, str(info.value)


def test_the_official_phase_cannot_claim_an_open_gateway(gateway_run: GatewayRun) -> None:
    """``official: open`` is not a value the documents have: refused before any recomputation."""
    forged = h.edit(
        dict(gateway_run.files), "manifest.json", lambda d: d["tasks"][0]["network"].update(official="open")
    )
    with pytest.raises(VerificationError) as info:
        _offline(forged)
    assert info.value.reason == Reason.SCHEMA_INVALID


# --- the gateway's own failure -----------------------------------------------------------------------------


def _pids(*needles: str, parent: int | None = None) -> list[int]:
    """Processes whose command line holds every needle (and whose parent is ``parent``, if given)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if all(n.encode() in cmdline for n in needles) and parent in (None, ppid):
                found.append(int(entry))
    return found


def test_the_gateway_dying_mid_run_fails_the_run_clearly(tmp_path: Path, run_tmp: Path) -> None:
    """SIGKILL to the gateway while the agent works: the agent is stopped, the run fails with the
    reason (run_failed in the kept trajectory, with what the gateway recorded), no bundle. Before
    that: the real key is in neither the gateway's nor the evaluator's argv or environment."""
    need_bwrap()
    code = (
        "import openai, time\n"
        "oa = openai.OpenAI(max_retries=0)\n"
        "print(oa.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'one'}])"
        ".choices[0].message.content, flush=True)\n"
        "time.sleep(600)\n"
    )
    with serve_upstream(script=[Turn(text="first answer")], api_key=REAL_KEY) as up:
        env = _env(run_tmp, OPENAI_API_KEY=REAL_KEY, ANTHROPIC_API_KEY=REAL_KEY)
        proc = subprocess.Popen(
            _run_cmd(up, code), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 300
            while not up.requests and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert up.requests, f"the agent never reached the upstream: {proc.communicate(timeout=60)}"
            up.wait_outcome(0)
            time.sleep(0.5)  # recorded
            (gateway,) = _pids("ale.gateway", "serve", str(run_tmp))
            (evaluator,) = _pids("ale_evaluator", parent=proc.pid)  # prestarted: its task came by pipe
            for pid in (gateway, evaluator):
                for what in ("cmdline", "environ"):
                    assert REAL_KEY.encode() not in Path(f"/proc/{pid}/{what}").read_bytes(), (pid, what)
            os.kill(gateway, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 1, stderr
    assert "run failed, no bundle was written" in stderr
    assert "the LLM gateway died mid-run" in stderr
    assert "exit status -9" in stderr
    assert REAL_KEY not in stdout + stderr
    assert not list((tmp_path / "out").glob("*.ale"))
    (kept,) = tmp_path.glob("*.incomplete.jsonl")
    events = [json.loads(line) for line in kept.read_text().splitlines()]
    assert REAL_KEY not in kept.read_text()
    finished = next(e for e in events if e["kind"] == "agent_finished")
    assert finished["data"]["stopped_for"] == "gateway_died"
    assert events[-1]["kind"] == "run_failed"
    assert "the LLM gateway died mid-run" in events[-1]["data"]["reason"]
    (request,) = [e for e in events if e["kind"] == "llm_request"]
    assert request["data"]["decision"] == "allowed"


async def test_a_gateway_that_never_becomes_ready_fails_the_run(
    tmp_path: Path, run_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that refuses its configuration (here an upstream the harness's own check would have
    refused: plain http to a public host), and one that never says it is ready: its start is tried
    three times, then the task ends early for the infrastructure and the run fails with the
    gateway's own words, before the task's evaluator or agent starts."""
    from ale.runner import gateway_proc
    from ale.runner.gateway_proc import Upstream
    from ale.runner.harness import Harness, RunError
    from ale.runner.local import LocalRuntime
    from ale.runner.options import AgentSpec, RunOptions
    from ale.runner.progress import PlainProgress

    need_bwrap()
    manifest, digest = _release()
    monkeypatch.chdir(tmp_path)

    def options(upstream: Upstream) -> RunOptions:
        return RunOptions(
            tasks=("cartpole-balance",),
            agent=AgentSpec(name="never", command=("true",)),
            release=manifest,
            release_sha256=digest,
            release_name=manifest.release,
            upstreams=(upstream,),
            workdir=run_tmp,
        )

    refused = Upstream(name="openai", api="openai", base_url="http://example.com/v1", api_key=REAL_KEY)
    with pytest.raises(RunError) as info:
        await Harness(options(refused), LocalRuntime(), PlainProgress()).run()
    message = str(info.value)
    assert "the LLM gateway did not become ready" in message
    assert "plain http only to a loopback host" in message
    assert REAL_KEY not in message
    _assert_failed_before_any_task(tmp_path, "did not become ready")

    monkeypatch.setattr(gateway_proc, "READY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(
        gateway_proc, "gateway_argv", lambda spec, fd: [sys.executable, "-c", "import time; time.sleep(60)"]
    )
    silent = Upstream(name="openai", api="openai", base_url="http://127.0.0.1:9/v1", api_key=REAL_KEY)
    started = time.monotonic()
    with pytest.raises(RunError, match="did not become ready"):
        await Harness(options(silent), LocalRuntime(), PlainProgress()).run()
    assert time.monotonic() - started < 30


def _assert_failed_before_any_task(folder: Path, reason: str) -> None:
    """The task's gateway was started three times (two retries recorded), then the task ended early
    for it, before its evaluator or agent; the run failed for the infrastructure."""
    kept = sorted(folder.glob("*.incomplete.jsonl"), key=lambda p: p.stat().st_mtime)[-1]
    events = [json.loads(line) for line in kept.read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds == ["run_started", "task_started", "infrastructure_retry", "infrastructure_retry",
                     "task_ended_early", "task_finished", "run_failed"]  # fmt: skip
    assert [e["data"]["what"] for e in events if e["kind"] == "infrastructure_retry"] == ["gateway_start"] * 2
    ended = {"phase": "setup", "category": "infrastructure/gateway_start"}
    assert {k: events[4]["data"][k] for k in ended} == ended
    assert events[5]["data"]["ended"] == ended
    assert reason in events[4]["data"]["reason"]
    assert reason in events[-1]["data"]["reason"]
    assert REAL_KEY not in kept.read_text()
    kept.unlink()


def _release() -> tuple[Any, str]:

    return catalog.release(catalog.DEFAULT_RELEASE)


async def test_a_run_folder_too_deep_for_its_sockets_is_refused_up_front(tmp_path: Path) -> None:
    """A long --workdir (or TMPDIR): one clear line before anything starts, not a gateway or an
    evaluator that cannot bind its socket."""
    from ale.runner.harness import Harness, RunError
    from ale.runner.local import LocalRuntime
    from ale.runner.options import AgentSpec, RunOptions
    from ale.runner.progress import PlainProgress

    need_bwrap()
    manifest, digest = _release()
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    options = RunOptions(
        tasks=("cartpole-balance",),
        agent=AgentSpec(name="never", command=("true",)),
        release=manifest,
        release_sha256=digest,
        release_name=manifest.release,
        workdir=deep,
    )
    with pytest.raises(RunError, match=r"too deep for Unix sockets: .* bytes, at most 107; use a shorter TMPDIR"):
        await Harness(options, LocalRuntime(), PlainProgress()).run()
    assert list(deep.iterdir()) == []
