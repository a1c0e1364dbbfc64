"""Official reruns (the images issue's point 5): ``ale rerun SUBMISSION`` reruns a submission's
agent against its release with a fresh challenge, signs the bundle with a registered runner key and
uploads it; the new submission is ``officially_verified``, end to end against a live verifier. And
the example GitHub Actions workflow that runs it on request."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import verifier_helpers as h
from fuzzing import fuzz_settings, json_values
from hypothesis import given
from hypothesis import strategies as st

from ale import catalog
from ale.runner import agent_env
from ale.runner.rerun import RerunError, agent_of, release_of, summary_of, tasks_of

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "official-rerun.yml"


def _summary(**changes: Any) -> dict[str, Any]:
    release, sha = catalog.release()
    summary = {
        "agent": {
            "name": "ale-demo",
            "declared": {"model": None, "effort": None},
            "command": [agent_env.PYTHON, "-m", "ale.agents.demo"],
        },
        "task_info": {"cartpole-balance@1.0.0": {"mode": "batch"}, "pendulum-lqr@1.0.0": {"mode": "interactive"}},
        "release": release.release,
        "release_sha256": sha,
    }
    summary.update(changes)
    return summary


# --- what the rerun takes from the site's record --------------------------------------------------------


def test_the_rerun_runs_the_submissions_agent_tasks_and_release() -> None:
    summary = _summary()
    agent = agent_of(summary)
    assert (agent.name, agent.command, agent.modules) == (
        "ale-demo", (agent_env.PYTHON, "-m", "ale.agents.demo"), ("ale.agents.demo",)
    )  # fmt: skip
    assert agent.declared == {"model": None, "effort": None}
    custom = agent_of(_summary(agent={"name": "mine", "declared": {}, "command": ["codex", "exec"]}), packages=("x",))
    assert (custom.command, custom.modules, custom.packages) == (("codex", "exec"), (), ("x",))
    assert tasks_of(summary) == ["cartpole-balance", "pendulum-lqr"]
    manifest, sha, name = release_of(summary)
    assert (sha, name) == (summary["release_sha256"], manifest.release)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"agent": {"name": "a", "declared": {}}}, "agent command (it was recorded before reruns existed)"),
        ({"agent": {"name": "a", "declared": {}, "command": []}}, "agent command"),
        ({"agent": {"name": "a", "declared": {}, "command": ["x", 3]}}, "agent command"),
        ({"agent": "ale-demo"}, "no agent"),
        ({"task_info": {}}, "ran no task"),
        ({"task_info": {"no-such-task@1.0.0": {}}}, "does not have"),
        ({"task_info": {"cartpole-balance@9.9.9": {}}}, "this installation has cartpole-balance@1.0.0"),
        ({"release": "../../etc/passwd"}, "no release name"),
        ({"release": "1999.01"}, "not installed"),
        ({"release_sha256": "00" * 32}, "not the one the submission was scored against"),
        ({"release_sha256": None}, "release digest"),
    ],
)
def test_a_record_that_cannot_be_rerun_says_why(changes: dict[str, Any], needle: str) -> None:
    summary = _summary(**changes)

    def read_all() -> None:
        agent_of(summary)
        tasks_of(summary)
        release_of(summary)

    with pytest.raises(RerunError) as err:
        read_all()
    assert needle in str(err.value)


@pytest.mark.fuzz
@fuzz_settings
@given(st.dictionaries(st.sampled_from(["agent", "task_info", "release", "release_sha256"]), json_values) | json_values)
def test_fuzz_a_site_record_gives_a_rerun_or_rerun_error(summary: Any) -> None:
    for read in (summary_of, agent_of, tasks_of, release_of):
        try:
            read(summary)
        except RerunError as exc:
            message = str(exc)
        else:
            continue
        assert "\n" not in message


# --- end to end: a live verifier, a registered official_rerun key -----------------------------------------


@attrs.frozen
class Site:
    live: h.LiveServer
    token: str
    runner_pem: Path
    runner_key_id: str

    def get(self, path: str) -> dict[str, Any]:
        reply = httpx.get(f"{self.live.url}{path}", timeout=30)
        assert reply.status_code == 200, reply.text
        return dict(reply.json())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = Path(tmp_path_factory.mktemp("rerun-site"))
    keys = h.keygen(root / "site")
    live = h.start_live_server(keys, root, name="rerun")
    try:
        pem = root / "rerun-runner.pem"
        made = subprocess.run([*h.RUNNER_CLI, "runner-key", str(pem)], capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        lines = dict(line.split(": ", 1) for line in made.stdout.splitlines())
        reply = httpx.post(
            f"{live.url}/api/v1/operator/runner-keys",
            json={"public_key": lines["public key (register it on the site)"], "kind": "official_rerun",
                  "label": "the rerun box"},
            headers={"Authorization": f"Bearer {live.token(h.OPERATOR)}"}, timeout=30,
        )  # fmt: skip
        assert reply.status_code == 201, reply.text
        yield Site(live, live.token(h.PARTICIPANT), pem, lines["key id"])
    finally:
        live.stop()


def _ale(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*h.RUNNER_CLI, *argv], capture_output=True, text=True, cwd=tmp, env=h._env(), timeout=900, check=False
    )


@pytest.mark.slow
def test_a_rerun_of_a_submission_is_officially_verified(site: Site, tmp_path: Path) -> None:
    common = ["--site", site.live.url, "--token", site.token, "--plain"]
    original = _ale(tmp_path, "run", "cartpole-balance", "--agent", "random", "--out", "first", *common)
    assert original.returncode == 0, original.stderr
    submitted = _ale(tmp_path, "submit", original.stdout.strip().splitlines()[-1], *common[:4], "--json")
    verdict = json.loads(submitted.stdout)
    assert (verdict["status"], verdict["level"]) == ("accepted", "validated")
    first = site.get(f"/api/v1/submissions/{verdict['id']}")
    assert first["summary"]["agent"]["command"] == [agent_env.PYTHON, "-m", "ale.agents.random_agent"]

    rerun = _ale(tmp_path, "rerun", verdict["id"], "--runner-key", str(site.runner_pem), "--out", "again", *common)
    assert rerun.returncode == 0, rerun.stderr
    assert f"rerunning {verdict['id']}: ale-random on cartpole-balance" in rerun.stderr
    line = next(line for line in rerun.stdout.splitlines() if line.startswith("accepted: "))
    assert line.startswith("accepted: level officially_verified (")
    assert line.endswith(f"rerun of {verdict['id']}")
    new_id = line.split("/api/v1/submissions/", 1)[1].split(")", 1)[0]
    second = site.get(f"/api/v1/submissions/{new_id}")
    assert second["level"] == "officially_verified"
    assert second["summary"]["runner"] == {"key_id": site.runner_key_id, "kind": "official_rerun",
                                           "label": "the rerun box"}  # fmt: skip
    for key in ("agent", "release", "release_sha256"):
        assert second["summary"][key] == first["summary"][key], key
    assert second["summary"]["official_episode_counts"] is True
    assert second["summary"]["challenge_id"] != first["summary"]["challenge_id"]


@pytest.mark.slow
def test_a_rerun_without_a_runner_key_or_of_an_unknown_submission_is_refused(site: Site, tmp_path: Path) -> None:
    common = ["--site", site.live.url, "--token", site.token]
    no_key = _ale(tmp_path, "rerun", "sub_000000000000000000000000", *common)
    assert no_key.returncode == 2
    assert no_key.stderr.strip() == "ale: error: --runner-key: an official rerun is signed by a registered runner key"
    unknown = _ale(tmp_path, "rerun", "sub_000000000000000000000000", "--runner-key", str(site.runner_pem), *common)
    assert unknown.returncode == 2
    assert "404 (not_found)" in unknown.stderr
    assert unknown.stderr.count("\n") == 1
    hostile = _ale(tmp_path, "rerun", "../../operator/runner-keys", "--runner-key", str(site.runner_pem), *common)
    assert hostile.returncode == 2
    assert "is not a submission id" in hostile.stderr
    assert not (tmp_path / "out").exists()


# --- the example workflow -----------------------------------------------------------------------------------


def test_the_example_workflow_reruns_on_request_with_the_images_and_its_secrets() -> None:
    import yaml

    flow = yaml.safe_load(WORKFLOW.read_text())
    on = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(on) == {"workflow_dispatch"}
    assert set(on["workflow_dispatch"]["inputs"]) == {"submission", "runtime"}
    steps = flow["jobs"]["rerun"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    for needed in ("ale images build", "ale images lock", "podman system service", "ale rerun", "--runner-key"):
        assert needed in script, needed
    assert "${{ secrets.ALE_TOKEN }}" in WORKFLOW.read_text()
    assert "${{ secrets.ALE_RUNNER_KEY }}" in WORKFLOW.read_text()
    assert 'ALE_RUNNER_KEY }}" >' not in WORKFLOW.read_text()  # the key never goes through a shell's argv
