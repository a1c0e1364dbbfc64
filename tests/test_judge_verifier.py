"""The verifier never credits a bundle's own verdict (docs/verifier.md, "Faithfulness").

Each bundle here is a real ``ale run`` bundle of a reproduction task, uploaded through the API. A
verdict counts only when the verifier re-judged the judge input it rebuilt from the bundle with its
operator's judge, or when a judge key it registered signed it; otherwise the task is unjudged, its
final score 0, whatever faithfulness.json claims, and with the scores, chain and integrity root
recomputed as a forger would."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import verifier_helpers as h
from judge_helpers import Runs, chat_body, digest_of, get_runs, serve_judge, verdict_for

from ale import catalog
from ale.core.canonical import canonical_json
from ale.core.parse import parse_json
from ale.core.results import parse_task_results, score_breakdown_document, score_run
from ale_verify import db, export, judge_worker

PENDULUM, REACHER = "pendulum-lqr@1.0.0", "reacher-jacobian@1.0.0"
RELEASE, _ = catalog.release()


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    return h.get_world(tmp_path_factory, request.config)


@pytest.fixture(scope="session")
def runs(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return get_runs(tmp_path_factory, world.keys.recipient, world.keys.identity)


def _claim(files: dict[str, bytes]) -> dict[str, bytes]:
    """score_breakdown.json recomputed from the results and faithfulness.json's verdicts (a forger's)."""
    verdicts = {ref: e["faithful"] for ref, e in json.loads(files["faithfulness.json"])["tasks"].items()}
    scores = score_run(parse_task_results(files["task_results.json"]), RELEASE, verdicts)
    document = parse_json(canonical_json(score_breakdown_document(scores, RELEASE)), what="scores")
    return {**files, "score_breakdown.json": h.jbytes(document)}


def _forge(files: dict[str, bytes], ref: str, **entry: Any) -> dict[str, bytes]:
    faithfulness = json.loads(files["faithfulness.json"])
    faithfulness["tasks"][ref].update(entry)
    return _claim({**files, "faithfulness.json": h.jbytes(faithfulness)})


def _findings(ref: str, satisfied: bool = True) -> list[dict[str, Any]]:
    rubric = catalog.get_task(ref.split("@")[0]).rubric
    assert rubric is not None
    return [{"item": i.id, "kind": i.kind, "satisfied": satisfied, "evidence": "trust me"} for i in rubric.items]


async def _submit(v: h.Verifier, files: dict[str, bytes]) -> h.Reply:
    """Bind the files to a fresh challenge of this verifier (so a clean upload is validated) and upload."""
    challenge = v.direct_challenge()
    ciphertext = h.encrypt_files(h.rebind(files, challenge["nonce"], challenge["token"]), v.world.keys.recipient)
    reply = await v.upload(ciphertext)
    await v.assert_healthy()
    return reply


def _upload(world: h.World, tmp: Path, files: dict[str, bytes], **settings: Any) -> tuple[h.Reply, dict[str, Any]]:
    """Upload; with a judge of the verifier's own, run its jobs (as its worker does, off the upload's
    path), then read the stored submission."""

    async def go() -> tuple[h.Reply, dict[str, Any]]:
        v = h.Verifier(world, tmp, **settings)
        reply = await _submit(v, files)
        if reply.status == 201 and v.settings.judge_model:
            await asyncio.to_thread(judge_worker.drain, v.settings)
        stored = await v.submission(reply.json["id"]) if reply.status == 201 else {}
        return reply, stored

    return h.run(go())


def _task(stored: dict[str, Any], ref: str) -> dict[str, Any]:
    return next(t for t in stored["summary"]["tasks"] if t["task"] == ref)


# -- the forgery of the issue -----------------------------------------------------------------------


def test_forged_judge_verdict_in_faithfulness_json_no_longer_lifts_pendulum_lqr(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    """A faithful verdict from "judge@forged.example" written into a no-judge run's faithfulness.json,
    the claimed scores, the chain and the integrity root recomputed: the bundle is self-consistent and
    accepted (validated), but the verifier credits no verdict of its own word: pendulum-lqr stays at 0."""
    honest = runs.plain
    (entry,) = json.loads(honest["faithfulness.json"])["tasks"].values()
    forged = _forge(honest, PENDULUM, outcome="judged", faithful=True, judge_model="judge@forged.example",
                    rationale="faithful", findings=_findings(PENDULUM), input_sha256=entry["input_sha256"])  # fmt: skip
    claimed = {s["task"]: s for s in json.loads(forged["score_breakdown.json"])["tasks"]}
    assert claimed[PENDULUM]["final"] == claimed[PENDULUM]["score"] > 0  # what the forger claims
    reply, stored = _upload(world, tmp_path, forged)
    assert reply.status == 201, reply.body
    assert (reply.json["status"], reply.json["level"]) == ("accepted", "validated")
    task = _task(stored, PENDULUM)
    assert (task["faithful"], task["final"], task["judgement"]["status"]) == (False, 0, "unjudged")
    assert task["judgement"]["claimed"]["judge_model"] == "judge@forged.example"  # kept for the record only
    assert stored["summary"]["categories"]["reproduction"] == 0
    assert stored["summary"]["macro_mean"] == 0
    assert [n["reason"] for n in reply.json["reasons"]] == ["unjudged"]
    assert PENDULUM in reply.json["reasons"][0]["message"]


def test_the_issues_literal_forgery_is_refused_as_schema_invalid(world: h.World, runs: Runs, tmp_path: Path) -> None:
    faithfulness = json.loads(runs.plain["faithfulness.json"])
    faithfulness["tasks"][PENDULUM] = {"judge": "judge@forged.example", "verdict": True, "reason": "forged"}
    files = h.seal({**runs.plain, "faithfulness.json": h.jbytes(faithfulness)})
    reply, _ = _upload(world, tmp_path, files)
    assert (reply.status, reply.json["reason"]) == (422, "schema_invalid")


def test_a_forged_digest_or_findings_are_inconsistent_results(world: h.World, runs: Runs, tmp_path: Path) -> None:
    (entry,) = json.loads(runs.plain["faithfulness.json"])["tasks"].values()
    judged = {"outcome": "judged", "faithful": True, "judge_model": "m", "input_sha256": entry["input_sha256"]}
    forgeries = [
        _forge(runs.plain, PENDULUM, input_sha256="1" * 64),  # a verdict about another input
        _forge(runs.plain, PENDULUM, **judged, findings=_findings(PENDULUM)[:-1]),  # a rubric item missing
        _forge(runs.plain, PENDULUM, **judged, findings=_findings(PENDULUM, satisfied=False)),
        _forge(runs.plain, PENDULUM, outcome="no_judge", faithful=True),  # faithful without a verdict
    ]
    for i, forged in enumerate(forgeries):
        reply, _ = _upload(world, tmp_path / str(i), forged)
        assert (reply.status, reply.json["reason"]) == (422, "inconsistent_results"), (i, reply.json)


# -- the verifier's own judge ---------------------------------------------------------------------


def _judge_settings(base: str) -> dict[str, Any]:
    return {"judge_model": "site-judge", "judge_base_url": base, "judge_attempts": 2, "judge_retry_s": 0.0}


def test_the_verifier_rejudges_the_rebuilt_input_and_credits_its_own_faithful_verdict(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    (entry,) = json.loads(runs.plain["faithfulness.json"])["tasks"].values()
    with serve_judge() as judge:
        reply, stored = _upload(world, tmp_path, runs.plain, **_judge_settings(judge.base))
        (request,) = judge.requests
    assert reply.status == 201, reply.body
    assert [n["reason"] for n in reply.json["reasons"]] == ["judging_pending"]  # the upload did not wait
    assert stored["reasons"] == []  # judged since, off the upload's path
    assert digest_of(request) == entry["input_sha256"]  # the very input the runner's bundle names
    assert request["model"] == "site-judge"
    task = _task(stored, PENDULUM)
    assert (task["faithful"], task["final"]) == (True, task["score"])
    assert (task["judgement"]["status"], task["judgement"]["source"]) == ("judged", "verifier")
    assert task["judgement"]["claimed"]["outcome"] == "no_judge"  # the bundle said it had none
    assert stored["summary"]["categories"]["reproduction"] == task["score"]


def test_the_verifiers_unfaithful_verdict_zeroes_the_task(world: h.World, runs: Runs, tmp_path: Path) -> None:
    def unfaithful(request: dict[str, Any]) -> tuple[int, bytes]:
        verdict = verdict_for(request, faithful=False, unmet=("no-copied-gains",))
        return 200, chat_body(json.dumps(verdict))

    with serve_judge(unfaithful) as judge:
        _reply, stored = _upload(world, tmp_path, runs.plain, **_judge_settings(judge.base))
    task = _task(stored, PENDULUM)
    assert (task["faithful"], task["final"], task["judgement"]["status"]) == (False, 0, "judged")
    unmet = [f["item"] for f in task["judgement"]["findings"] if not f["satisfied"]]
    assert unmet == ["no-copied-gains"]
    assert stored["reasons"] == []  # judged, so no unjudged note


@pytest.mark.parametrize(
    "answer",
    [
        lambda r: (500, b'{"error": {"message": "down"}}'),
        lambda r: (200, chat_body("no verdict today")),
        lambda r: (200, chat_body(json.dumps(verdict_for(r, digest="2" * 64)))),
        lambda r: (200, chat_body(None, refusal="no")),
    ],
)
def test_a_verifier_judge_that_gives_no_verdict_leaves_the_task_unjudged(
    world: h.World, runs: Runs, tmp_path: Path, answer: Any
) -> None:
    with serve_judge(answer) as judge:
        _reply, stored = _upload(world, tmp_path, runs.plain, **_judge_settings(judge.base))
    task = _task(stored, PENDULUM)
    assert (task["faithful"], task["final"], task["judgement"]["status"]) == (False, 0, "unjudged")
    assert "the verifier's judge gave no verdict" in task["judgement"]["rationale"]
    assert [n["reason"] for n in stored["reasons"]] == ["unjudged"]
    (job,) = db.judge_jobs(world.databases.new(tmp_path))  # the same folder's database
    assert (job["state"], bool(job["has_input"])) == ("failed", False)  # the input is dropped once done


# -- registered judge keys ------------------------------------------------------------------------


def test_a_verdict_signed_by_a_registered_judge_key_is_credited_without_rejudging(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    def unfaithful(request: dict[str, Any]) -> tuple[int, bytes]:
        return 200, chat_body(json.dumps(verdict_for(request, faithful=False)))

    keys = ((("team judge", runs.judge_public_key)),)
    with serve_judge(unfaithful) as judge:
        reply, stored = _upload(world, tmp_path, runs.judged, judge_keys=keys, **_judge_settings(judge.base))
        asked = [re.search(r"^Task: (\S+?): ", r["messages"][-1]["content"], re.M).group(1) for r in judge.requests]  # type: ignore[union-attr]
    assert reply.status == 201, reply.body
    pendulum, reacher = _task(stored, PENDULUM), _task(stored, REACHER)
    assert (pendulum["faithful"], pendulum["judgement"]["source"]) == (True, "judge key team judge")
    assert pendulum["final"] == pendulum["score"]
    assert asked == [REACHER]  # the unsigned one only
    assert (reacher["faithful"], reacher["judgement"]["source"]) == (False, "verifier")


def test_a_verdict_signed_by_an_unregistered_key_is_not_credited(world: h.World, runs: Runs, tmp_path: Path) -> None:
    reply, stored = _upload(world, tmp_path, runs.judged)
    assert reply.status == 201, reply.body
    pendulum = _task(stored, PENDULUM)
    assert (pendulum["faithful"], pendulum["final"], pendulum["judgement"]["status"]) == (False, 0, "unjudged")
    assert "not by a judge key this verifier has registered" in pendulum["judgement"]["rationale"]
    assert pendulum["judgement"]["claimed"]["faithful"] is True
    unjudged = [n["message"].split(":")[0] for n in reply.json["reasons"] if n["reason"] == "unjudged"]
    assert unjudged == [PENDULUM, REACHER]


def test_a_tampered_signed_verdict_is_refused_as_bad_signature(world: h.World, runs: Runs, tmp_path: Path) -> None:
    forged = _forge(runs.judged, PENDULUM, rationale="edited after signing")
    reply, _ = _upload(world, tmp_path, forged, judge_keys=(("team judge", runs.judge_public_key),))
    assert (reply.status, reply.json["reason"]) == (422, "bad_signature")


# -- the board ------------------------------------------------------------------------------------


def test_the_submission_page_shows_judged_unjudged_and_the_findings(world: h.World, runs: Runs, tmp_path: Path) -> None:
    async def go() -> h.Verifier:
        v = h.Verifier(world, tmp_path, judge_keys=(("team judge", runs.judge_public_key),))
        reply = await _submit(v, runs.judged)
        assert reply.status == 201, reply.body
        return v

    v = h.run(go())
    report = export.export_site(v.settings.database, tmp_path / "site")
    assert report.submissions == 1
    (page,) = (tmp_path / "site" / "submissions").glob("*.html")
    html = page.read_text()
    assert f"{PENDULUM}: judged faithful" in html
    assert f'{REACHER}: <span class="unjudged">unjudged</span>' in html
    assert "judge key team judge" in html
    rubric = catalog.get_task("pendulum-lqr").rubric
    assert rubric is not None
    for item in rubric.items:
        assert f"<code>{item.id}</code>" in html
    board = (tmp_path / "site" / "reproduction.html").read_text()
    assert "1 unjudged" in board


# -- configuration --------------------------------------------------------------------------------


def test_judge_keys_are_read_from_the_environment_and_bad_ones_refused() -> None:
    from ale_verify.config import Settings

    public = "A" * 43 + "="  # base64 of 32 bytes
    settings = Settings.from_env({"ALE_VERIFY_JUDGE_KEYS": f"team judge={public}, {public}",
                                  "ALE_VERIFY_JUDGE_MODEL": " m "})  # fmt: skip
    assert settings.judge_keys == (("team judge", public), (public[:12], public))
    assert settings.judge_model == "m"
    for bad in ("x=notbase64!", "short=AAAA", "=" * 5):
        with pytest.raises(ValueError, match="ALE_VERIFY_JUDGE_KEYS"):
            Settings.from_env({"ALE_VERIFY_JUDGE_KEYS": bad})
    assert "sk-" not in repr(Settings.from_env({"ALE_VERIFY_JUDGE_API_KEY_FILE": "/x/sk-key"}))


def test_ale_verify_check_says_which_verdicts_a_site_with_these_judge_keys_credits(
    world: h.World, runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ale_verify.cli import main as verify_main

    path = tmp_path / "judged.ale"
    path.write_bytes(h.encrypt_files(runs.judged, world.keys.recipient))
    monkeypatch.setenv("ALE_VERIFY_DATA", str(tmp_path / "site"))
    args = ["check", str(path), "--identity", str(world.keys.key_file), "--json"]
    assert verify_main(args) == 0
    unregistered = json.loads(capsys.readouterr().out)["faithfulness"]
    monkeypatch.setenv("ALE_VERIFY_JUDGE_KEYS", f"team judge={runs.judge_public_key}")
    assert verify_main(args) == 0
    registered = json.loads(capsys.readouterr().out)["faithfulness"]
    assert unregistered[PENDULUM]["credited_without_rejudging"] is False
    assert registered[PENDULUM]["credited_without_rejudging"] is True
    assert registered[REACHER]["credited_without_rejudging"] is False  # unsigned (and unparsable)
    assert registered[PENDULUM]["signed"] is True
    assert (
        registered[PENDULUM]["input_sha256"]
        == json.loads(runs.judged["faithfulness.json"])["tasks"][PENDULUM]["input_sha256"]
    )
