"""``ale run --judge-model``: real runs judged through the judge's own gateway, recorded, fail-closed,
and a judge input anyone holding the bundle rebuilds byte for byte."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import verifier_helpers as h
from judge_helpers import Runs, get_runs, user_text

from ale import catalog
from ale.core import bundle
from ale.core.judge_input import build_input, task_windows
from ale.core.verdict import verify_verdict
from ale.runner.cli import main as ale_main

PENDULUM, REACHER = "pendulum-lqr@1.0.0", "reacher-jacobian@1.0.0"


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    return h.get_world(tmp_path_factory, request.config)


@pytest.fixture(scope="session")
def runs(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return get_runs(tmp_path_factory, world.keys.recipient, world.keys.identity)


def _events(files: dict[str, bytes]) -> list[dict[str, Any]]:
    raw = bundle.decompress(files["events.jsonl.zst"], bundle.Limits(max_decompressed=64 << 20))
    return [json.loads(line) for line in raw.splitlines()]


def _doc(files: dict[str, bytes], name: str) -> Any:
    return json.loads(files[name])


def test_a_run_without_a_judge_is_unfaithful_and_names_its_judge_input(runs: Runs) -> None:
    (entry,) = _doc(runs.plain, "faithfulness.json")["tasks"].values()
    assert (entry["outcome"], entry["faithful"], entry["judge_model"]) == ("no_judge", False, None)
    assert _doc(runs.plain, "manifest.json")["judge"] is None
    (score,) = _doc(runs.plain, "score_breakdown.json")["tasks"]
    assert (score["faithful"], score["final"]) == (False, 0)
    raw = bundle.decompress(runs.plain["events.jsonl.zst"], bundle.Limits(max_decompressed=64 << 20))
    window = task_windows(raw, [PENDULUM])[PENDULUM]
    context = catalog.judge_context(catalog.get_task("pendulum-lqr"))
    assert entry["input_sha256"] == build_input(window, context, _doc(runs.plain, "manifest.json")["run_id"]).sha256
    kinds = [e["kind"] for e in _events(runs.plain)]
    assert "artifact_snapshot" in kinds
    assert "artifact_file" in kinds
    assert "judge_started" not in kinds


def test_a_judged_run_records_the_verdict_the_judge_gave_and_signs_it(runs: Runs) -> None:
    tasks = _doc(runs.judged, "faithfulness.json")["tasks"]
    pendulum, reacher = tasks[PENDULUM], tasks[REACHER]
    assert (pendulum["outcome"], pendulum["faithful"], pendulum["judge_model"]) == ("judged", True, "judge-model-1")
    rubric = catalog.get_task("pendulum-lqr").rubric
    assert rubric is not None
    assert [f["item"] for f in pendulum["findings"]] == list(rubric.ids)
    assert verify_verdict(PENDULUM, pendulum)  # signed with --judge-key
    assert (reacher["outcome"], reacher["faithful"], reacher["signature"]) == ("unparsable", False, None)
    finals = {s["task"]: s for s in _doc(runs.judged, "score_breakdown.json")["tasks"]}
    assert finals[PENDULUM]["final"] == finals[PENDULUM]["score"] > 0
    assert finals[REACHER]["final"] == 0
    judge = _doc(runs.judged, "manifest.json")["judge"]
    assert (judge["model"], judge["prompt"]) == ("judge-model-1", "ale-judge-prompt/v1")
    assert judge["endpoint"].startswith("http://127.0.0.1:")
    assert judge["key_id"] == pendulum["signature"]["key_id"]


def test_the_judge_was_asked_about_exactly_the_input_the_bundle_rebuilds(runs: Runs) -> None:
    raw = bundle.decompress(runs.judged["events.jsonl.zst"], bundle.Limits(max_decompressed=64 << 20))
    run_id = _doc(runs.judged, "manifest.json")["run_id"]
    windows = task_windows(raw, [PENDULUM, REACHER])
    asked = {}
    for request in runs.judge_requests:
        text = user_text(request)
        found = re.search(r"^Task: (\S+?): ", text, flags=re.M)
        assert found
        asked[found.group(1)] = text
    for ref in (PENDULUM, REACHER):
        ji = build_input(windows[ref], catalog.judge_context(catalog.get_task(ref.split("@")[0])), run_id)
        assert asked[ref] == ji.text.decode() + f"\ninput_sha256: {ji.sha256}\n"
        assert _doc(runs.judged, "faithfulness.json")["tasks"][ref]["input_sha256"] == ji.sha256
    assert len(runs.judge_requests) == 2  # one each: an unparsable answer is final, not retried


def test_the_demo_agents_judge_input_holds_its_derivation_code_not_only_the_policy(runs: Runs) -> None:
    """What the judge was asked about, in a real run of the bundled demo agent: the source of the
    modules that derived the policy (from the workspace's snapshot), whole, beside the policy."""
    from ale.agents import _lqr, _pendulum, _reacher

    asked = {re.search(r"^Task: (\S+?): ", user_text(r), flags=re.M).group(1): user_text(r)  # type: ignore[union-attr]
             for r in runs.judge_requests}  # fmt: skip
    for ref, modules in ((PENDULUM, (_pendulum, _lqr)), (REACHER, (_reacher,))):
        for module in modules:
            assert f"derivation/{Path(module.__file__).name}" in asked[ref]
            source = Path(module.__file__).read_text()
            assert source.strip() in asked[ref], f"{module.__name__}'s source is not in {ref}'s judge input whole"


def test_the_judges_exchange_is_in_the_trajectory_through_its_gateway(runs: Runs) -> None:
    events = _events(runs.judged)
    judge_events = [e for e in events if e["producer"] == "trusted_network_proxy"]
    assert {e["data"]["gateway"] for e in judge_events} == {"judge"}
    requests = [e for e in judge_events if e["kind"] == "llm_request"]
    assert [e["data"]["request_id"] for e in requests] == ["judge-gw-1", "judge-gw-1"]  # one gateway per task
    for ref in (PENDULUM, REACHER):
        own = [e for e in judge_events if e["data"]["task"] == ref]
        assert [e["kind"] for e in own] == ["gateway_started", "llm_request", "gateway_stopped"], ref
        assert [e["data"]["gateway_seq"] for e in own] == [1, 2, 3]
    assert not [e for e in events if e["kind"] in ("refused_event", "rejected_agent_event")]
    assert all(e["data"]["decision"] == "allowed" and e["data"]["status"] == 200 for e in requests)
    started = [e for e in events if e["kind"] == "judge_started"]
    finished = [e for e in events if e["kind"] == "judge_finished"]
    assert [e["data"]["task"] for e in started] == [e["data"]["task"] for e in finished] == [PENDULUM, REACHER]
    assert all(e["data"]["budgets"]["requests"] == 2 for e in started)
    assert [e["data"]["outcome"] for e in finished] == ["judged", "unparsable"]
    order = [e["kind"] for e in events if e["data"].get("task") == PENDULUM]
    assert order.index("official_evaluation_finished") < order.index("judge_started") < order.index("task_finished")


def test_the_bundle_passes_the_offline_checks_and_ale_judge_input_rebuilds_the_digests(
    runs: Runs, world: h.World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    identity = tmp_path / "identity.txt"
    identity.write_text(world.keys.identity + "\n")
    path = tmp_path / "judged.ale"
    path.write_bytes(h.encrypt_files(runs.judged, world.keys.recipient))
    assert ale_main(["inspect", str(path), "--identity", str(identity)]) == 0
    capsys.readouterr()
    assert ale_main(["judge", "input", str(path), "--identity", str(identity)]) == 0
    lines = capsys.readouterr().out.splitlines()
    tasks = _doc(runs.judged, "faithfulness.json")["tasks"]
    assert {line.split()[0]: line.split()[1] for line in lines} == {r: t["input_sha256"] for r, t in tasks.items()}
    proc = subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "judge", "input", str(path), "--identity", str(identity),
         "--task", PENDULUM], capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert hashlib.sha256(proc.stdout).hexdigest() == tasks[PENDULUM]["input_sha256"]


def test_an_unreachable_judge_leaves_the_run_complete_and_the_task_unfaithful(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "run", "pendulum-lqr", "--plain", "--episodes", "1",
         "--agent-time", "120", "--out", str(out), "--judge-model", "m", "--judge-upstream",
         f"http://127.0.0.1:{port}/v1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "UNFAITHFUL" in proc.stderr
    assert "judge m: UNFAITHFUL (error)" in proc.stderr
    key = next(out.glob("*.key"))
    identity = next(line for line in key.read_text().splitlines() if line.startswith("AGE-SECRET-KEY-1"))
    files = bundle.unpack(next(out.glob("*.ale")).read_bytes(), identity)
    (entry,) = json.loads(files["faithfulness.json"])["tasks"].values()
    assert (entry["outcome"], entry["faithful"]) == ("error", False)
    assert "HTTP 502" in entry["rationale"]  # the gateway could not reach it (and the retry neither)
    assert "upstream_failed" in entry["rationale"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--judge-upstream", "http://127.0.0.1:9/v1"], "need --judge-model"),
        (["--judge-model", "m", "--judge-upstream", "http://example.com/v1"], "loopback"),
        (["--judge-model", "m", "--judge-upstream", "ftp://x/v1"], "http:// or https://"),
        (["--judge-model", "m", "--judge-upstream", "https://u:p@x/v1"], "credentials"),
        (["--judge-model", "m", "--judge-key", "/nonexistent.pem"], "--judge-key"),
    ],
)
def test_judge_options_that_cannot_work_are_refused_before_the_run(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert ale_main(["run", "pendulum-lqr", "--plain", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
