"""The verifier and the 95% intervals (docs/intervals.md): a real run's bundle carries them, the
verifier recomputes them and refuses a bundle whose claimed intervals differ (``score_mismatch``),
accepts an older runner's bundle that has none, stores the intervals of the scores it credits, and
``GET /api/v1/leaderboard`` ranks by them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import verifier_helpers as h
from fuzzing import fuzz_settings, json_values
from hypothesis import given

from ale.core.canonical import canonical_json
from ale.core.documents import ScoreBreakdown
from ale.core.parse import ParseError, structure
from ale.core.results import parse_task_results, score_breakdown_document, score_run
from ale.runner.inspect import installed_releases
from ale.schemas import validate_document


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    return h.get_world(tmp_path_factory, request.config)


@pytest.fixture(scope="session")
def plain(world: h.World) -> dict[str, bytes]:
    return world.files("plain")


def _upload(world: h.World, tmp: Path, files: dict[str, bytes]) -> h.Reply:
    async def go() -> h.Reply:
        v = h.Verifier(world, tmp)
        reply = await v.upload(h.encrypt_files(files, world.keys.recipient))
        await v.assert_healthy()
        return reply

    return h.run(go())


def _rejected_for_intervals(reply: h.Reply) -> None:
    assert reply.status == 422, reply.body
    assert reply.json["reason"] == "score_mismatch"
    assert "95% intervals differ" in reply.json["reasons"][0]["message"]


def test_a_real_runs_claimed_intervals_are_what_its_results_give(plain: dict[str, bytes]) -> None:
    claimed = h.jdoc(plain, "score_breakdown.json")
    results = parse_task_results(plain["task_results.json"])
    manifest = h.jdoc(plain, "manifest.json")
    release = installed_releases()[manifest["release"]["manifest_sha256"]]
    verdicts = {ref: v["faithful"] for ref, v in h.jdoc(plain, "faithfulness.json")["tasks"].items()}
    recomputed = json.loads(canonical_json(score_breakdown_document(score_run(results, release, verdicts), release)))
    assert claimed["intervals"] == recomputed["intervals"]
    assert claimed["intervals"]["method"] == "ale-bootstrap/v1"
    assert set(claimed["intervals"]["tasks"]) == {t["task"] for t in claimed["tasks"]}
    for t in claimed["tasks"]:
        b = claimed["intervals"]["tasks"][t["task"]]
        assert 0 <= b["lower"] <= b["upper"] <= claimed["cap"]


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["intervals"]["tasks"][next(iter(d["intervals"]["tasks"]))].update(lower=0.25),
        lambda d: d["intervals"]["categories"].update(overall={"lower": 0.0, "upper": 1.5}),
        lambda d: d["intervals"].update(macro_mean={"lower": 0.0, "upper": 1.5}),
    ],
    ids=["task-lower", "category-widened", "macro-mean-widened"],
)
def test_claimed_intervals_that_differ_are_a_score_mismatch(
    world: h.World, plain: dict[str, bytes], tmp_path: Path, change: Any
) -> None:
    before = h.jdoc(plain, "score_breakdown.json")
    files = h.edit(plain, "score_breakdown.json", change)
    assert h.jdoc(files, "score_breakdown.json") != before
    _rejected_for_intervals(_upload(world, tmp_path, files))


def test_an_interval_without_a_bound_is_schema_invalid(world: h.World, plain: dict[str, bytes], tmp_path: Path) -> None:
    def unbounded(document: dict[str, Any]) -> None:
        del document["intervals"]["macro_mean"]["upper"]

    files = h.edit(plain, "score_breakdown.json", unbounded)
    reply = _upload(world, tmp_path, files)
    assert (reply.status, reply.json["reason"]) == (422, "schema_invalid"), reply.body


def test_an_older_runners_bundle_without_intervals_is_accepted_and_ranked_with_them(
    world: h.World, plain: dict[str, bytes], tmp_path: Path
) -> None:
    def older(document: dict[str, Any]) -> None:
        del document["intervals"]

    files = h.edit(plain, "score_breakdown.json", older)
    assert "intervals" not in h.jdoc(files, "score_breakdown.json")

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        reply = await v.upload(h.encrypt_files(files, world.keys.recipient))
        assert (reply.status, reply.json["status"]) == (201, "accepted"), reply.body
        summary = (await v.get(f"/api/v1/submissions/{reply.json['id']}")).json["summary"]
        stored = summary["intervals"]  # the verifier's own, for the scores it credits
        assert stored["method"] == "ale-bootstrap/v1"
        assert set(stored["tasks"]) == {t["task"] for t in summary["tasks"] if t["status"] == "completed"}
        (row,) = (await v.get("/api/v1/leaderboard")).json["rows"]
        overall = stored["categories"]["overall"]
        assert (row["rank"], row["lower"], row["upper"]) == (1, overall["lower"], overall["upper"])
        assert row["lower"] <= row["score"] <= row["upper"]
        await v.assert_healthy()

    h.run(go())


def test_two_uploads_of_one_run_share_a_rank_on_the_api(world: h.World, tmp_path: Path) -> None:
    """The same results twice (two challenges): equal scores, equal intervals, one rank; before
    intervals the later upload ranked second."""
    official = world.files("site")

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        ids = []
        for user in (h.PARTICIPANT, "another"):
            c = await v.challenge(user)
            reply = await v.upload(h.encrypt_files(h.rebind(official, c["nonce"], c["token"]), world.keys.recipient),
                                   user=user)  # fmt: skip
            assert (reply.status, reply.json["level"]) == (201, "validated"), reply.body
            ids.append(reply.json["id"])
        rows = (await v.get("/api/v1/leaderboard")).json["rows"]
        assert [(r["submission_id"], r["rank"]) for r in rows] == [(ids[0], 1), (ids[1], 1)]
        assert rows[0]["lower"] == rows[1]["lower"] is not None
        await v.assert_healthy()

    h.run(go())


@pytest.mark.fuzz
@fuzz_settings
@given(json_values)
def test_fuzz_score_breakdown_intervals_member(value: Any) -> None:
    """Whatever ``intervals`` holds, the model and the schema only refuse it (ParseError,
    ValueError), and the model accepts what the schema accepts."""
    document = json.loads(_REAL_DOCUMENT)
    document["intervals"] = value
    try:
        validate_document("score_breakdown.json", document)
        schema_ok = True
    except ValueError:
        schema_ok = False
    try:
        structure(document, ScoreBreakdown, what="score_breakdown.json")
        model_ok = True
    except ParseError:
        model_ok = False
    assert model_ok or not schema_ok


_REAL_DOCUMENT = json.dumps(
    {
        "schema": "ale-score-breakdown/v1",
        "release": "2026.11",
        "cap": 1.5,
        "eps": 1e-9,
        "tasks": [],
        "aggregate": {
            "method": "macro_mean",
            "missing_tasks": "exclude",
            "macro_mean": None,
            "categories": {"overall": None, "reproduction": None, "open": None},
            "pass_rate": None,
            "covered": [],
            "missing": ["cartpole-balance@1.0.0"],
            "extra": [],
            "coverage_complete": False,
            "required_task_set_hash": "0" * 64,
        },
    }
)
