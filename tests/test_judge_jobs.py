"""The verifier's judge, off the upload's path (docs/verifier.md, "Faithfulness"; verify/judge_worker.py).

An upload with a task for the verifier's own judge is accepted and verified at once, the task
*judging pending* (final 0); a durable job in the database is claimed by one worker at a time
(a lease renewed while the judge is asked), retried a bounded number of times when the judge does
not answer, and finished by re-scoring the submission. Two ``ale-verify serve`` processes on one
database judge each task once; a process killed mid-judgement leaves its job to the lease, and a
restarted one resumes it. The judge is the scripted upstream of tests/judge_helpers.py. Every test
runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import verifier_helpers as h
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st
from judge_helpers import Judge, Runs, faithful_answer, get_runs, serve_judge

from ale_verify import db, export, judge_worker, judging

PENDULUM = "pendulum-lqr@1.0.0"


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


@pytest.fixture(scope="session")
def runs(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return get_runs(tmp_path_factory, world.keys.recipient, world.keys.identity)


def _judge(base: str, **more: Any) -> dict[str, Any]:
    return {"judge_model": "site-judge", "judge_base_url": base, "judge_retry_s": 0.0, **more}


async def _submit(v: h.Verifier, files: dict[str, bytes]) -> h.Reply:
    challenge = v.direct_challenge()
    return await v.upload(h.encrypt_files(h.rebind(files, challenge["nonce"], challenge["token"]),
                                          v.world.keys.recipient))  # fmt: skip


def _task(stored: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in stored["summary"]["tasks"] if t["task"] == PENDULUM)


class Gate:
    """A judge answer that waits until the test opens the gate (the judge is slow, or down)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.asked = threading.Event()

    def __call__(self, request: dict[str, Any]) -> tuple[int, bytes]:
        self.asked.set()
        self.open.wait(120)
        return faithful_answer(request)


# -- in one process --------------------------------------------------------------------------------


def test_an_upload_does_not_wait_for_the_judge_the_task_is_judging_pending_until_the_job_ran(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    gate = Gate()
    with serve_judge(gate) as judge:

        async def go() -> None:
            v = h.Verifier(world, tmp_path, **_judge(judge.base))
            reply = await _submit(v, runs.plain)
            assert reply.status == 201, reply.body
            assert judge.requests == []  # accepted, verified, answered: nobody asked the judge yet
            assert [n["reason"] for n in reply.json["reasons"]] == ["judging_pending"]
            stored = await v.submission(reply.json["id"])
            task = _task(stored)
            assert (task["faithful"], task["final"], task["judgement"]["status"]) == (False, 0, "pending")
            assert stored["judgements"][PENDULUM] == {
                "state": "judging_pending", "judged_by": None, "judge_key_id": None, "judge_model": None,
                "reason": task["judgement"]["rationale"],
            }  # fmt: skip
            assert stored["summary"]["categories"]["reproduction"] == 0
            (job,) = db.judge_jobs(v.settings.database)
            assert (job["state"], job["attempts"], bool(job["has_input"])) == ("pending", 0, True)

            data = _export(v, tmp_path / "site")[reply.json["id"]]
            assert (data["judging_pending"], data["unjudged"], data["judged_by"]) == ([PENDULUM], [], [])
            board = (tmp_path / "site" / "reproduction.html").read_text()
            assert "1 judging pending" in board

            ran = asyncio.create_task(asyncio.to_thread(judge_worker.drain, v.settings))
            await asyncio.to_thread(gate.asked.wait, 60)
            (job,) = db.judge_jobs(v.settings.database)
            assert (job["state"], job["attempts"]) == ("running", 1)
            gate.open.set()
            assert await ran == 1

            stored = await v.submission(reply.json["id"])
            task = _task(stored)
            assert (task["faithful"], task["final"], task["judgement"]["source"]) == (True, task["score"], "verifier")
            assert stored["summary"]["categories"]["reproduction"] == task["score"] > 0
            assert stored["reasons"] == []
            assert stored["judgements"][PENDULUM]["state"] == "judged_faithful"
            last = stored["history"][-1]
            assert (last["action"], last["actor"], last["from_level"], last["to_level"]) == (
                "judged", "verifier", stored["level"], stored["level"],
            )  # fmt: skip
            (job,) = db.judge_jobs(v.settings.database)
            assert (job["state"], job["attempts"], job["outcome"], bool(job["has_input"])) == (
                "done", 1, "judged", False,
            )  # fmt: skip
            data = _export(v, tmp_path / "site")[reply.json["id"]]
            assert (data["judged_faithful"], data["judging_pending"]) == ([PENDULUM], [])
            assert data["judged_by"] == [f"{PENDULUM}=verifier:site-judge"]
            await v.assert_healthy()

        h.run(go())
    assert len(judge.requests) == 1


def _export(v: h.Verifier, out: Path) -> dict[str, dict[str, Any]]:
    export.export_site(v.settings.database, out, docs_dir=None)
    rows = json.loads((out / "leaderboard.json").read_text())["submissions"]
    return {r["submission_id"]: r for r in rows}


def test_a_judge_that_is_down_leaves_the_task_unjudged_with_the_reason_after_bounded_retries(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    down = f"http://127.0.0.1:{h.free_port()}/v1"  # nothing listens there

    async def go() -> None:
        v = h.Verifier(world, tmp_path, **_judge(down, judge_attempts=2, judge_retry_s=3600.0))
        reply = await _submit(v, runs.plain)
        assert reply.status == 201, reply.body
        assert await asyncio.to_thread(judge_worker.drain, v.settings) == 1  # then it waits an hour
        (job,) = db.judge_jobs(v.settings.database)
        assert (job["state"], job["attempts"], job["outcome"]) == ("pending", 1, "error")
        assert "could not be reached" in job["last_error"]
        assert job["not_before"] > time.time() + 3000
        stored = await v.submission(reply.json["id"])
        assert stored["judgements"][PENDULUM]["state"] == "judging_pending"  # still: one more attempt

        retry_now = h.Verifier(world, tmp_path, **_judge(down, judge_attempts=2, judge_retry_s=0.0))
        with h.raw_connect(v.settings.database) as conn:
            conn.execute("UPDATE judge_jobs SET not_before = 0")
        assert await asyncio.to_thread(judge_worker.drain, retry_now.settings) == 1
        assert await asyncio.to_thread(judge_worker.drain, retry_now.settings) == 0  # bounded: no third attempt
        (job,) = db.judge_jobs(v.settings.database)
        assert (job["state"], job["attempts"], job["outcome"], bool(job["has_input"])) == (
            "failed", 2, "error", False,
        )  # fmt: skip
        stored = await v.submission(reply.json["id"])
        task = _task(stored)
        assert (task["faithful"], task["final"], task["judgement"]["status"]) == (False, 0, "unjudged")
        reason = stored["judgements"][PENDULUM]["reason"]
        assert "the verifier's judge gave no verdict after 2 attempts" in reason
        assert "could not be reached" in reason
        assert [n["reason"] for n in stored["reasons"]] == ["unjudged"]
        assert stored["history"][-1]["action"] == "judged"

    h.run(go())


def test_judge_job_claims_are_exclusive_under_concurrency(world: h.World, runs: Runs, tmp_path: Path) -> None:
    """Six jobs, eight threads claiming as fast as they can: each job is claimed exactly once."""

    async def go() -> h.Verifier:
        v = h.Verifier(world, tmp_path, **_judge("http://127.0.0.1:9/v1"))
        for _ in range(6):
            assert (await _submit(v, runs.plain)).status == 201
        return v

    v = h.run(go())
    claimed: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def claimer(n: int) -> None:
        barrier.wait(30)
        while (
            job := db.claim_judge_job(v.settings.database, worker=f"w{n}", now=time.time(), lease_s=600)
        ) is not None:
            with lock:
                claimed.append((job["submission_id"], job["task"]))

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(claimed) == 6
    assert set(Counter(claimed).values()) == {1}
    assert {(j["state"], j["attempts"]) for j in db.judge_jobs(v.settings.database)} == {("running", 1)}


def test_a_worker_whose_lease_ran_out_cannot_finish_the_job_another_took_over(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    async def go() -> h.Verifier:
        v = h.Verifier(world, tmp_path, **_judge("http://127.0.0.1:9/v1"))
        assert (await _submit(v, runs.plain)).status == 201
        return v

    v = h.run(go())
    where = v.settings.database
    a = db.claim_judge_job(where, worker="a", now=time.time(), lease_s=0.01)
    assert a is not None
    time.sleep(0.05)
    b = db.claim_judge_job(where, worker="b", now=time.time(), lease_s=600)
    assert b is not None
    assert (b["submission_id"], b["task"], b["attempts"]) == (a["submission_id"], a["task"], 2)
    sub, task = a["submission_id"], a["task"]
    assert not db.renew_judge_job(where, sub, task, worker="a", until=time.time() + 60)
    before = db.get_submission(where, sub)
    with pytest.raises(db.Conflict):
        db.retry_judge_job(where, sub, task, worker="a", not_before=0, outcome="error", error="x")
    with pytest.raises(db.Conflict):
        db.finish_judge_job(where, sub, task, worker="a", state="done", outcome="judged", error=None, change={},
                            apply=lambda *args: pytest.fail("a worker without the job re-scored it"))  # fmt: skip
    assert db.get_submission(where, sub) == before
    assert db.renew_judge_job(where, sub, task, worker="b", until=time.time() + 60)


def test_a_stored_judge_input_that_is_not_its_jobs_is_never_sent_and_never_credited(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    with serve_judge() as judge:

        async def go() -> None:
            v = h.Verifier(world, tmp_path, **_judge(judge.base, judge_attempts=1))
            reply = await _submit(v, runs.plain)
            assert reply.status == 201, reply.body
            with h.raw_connect(v.settings.database) as conn:
                (stored,) = conn.execute("SELECT judge_input FROM judge_jobs").fetchone()
                changed = json.loads(stored)
                changed["text"] += " and one more sentence"
                conn.execute(f"UPDATE judge_jobs SET judge_input = {_mark(conn)}", [json.dumps(changed)])
            assert await asyncio.to_thread(judge_worker.drain, v.settings) == 1
            after = await v.submission(reply.json["id"])
            assert after["judgements"][PENDULUM]["state"] == "unjudged"
            assert "not the one its job names" in after["judgements"][PENDULUM]["reason"]

        h.run(go())
    assert judge.requests == []


def _mark(conn: Any) -> str:
    """The driver's parameter mark (sqlite3: ?, psycopg: %s)."""
    import sqlite3

    return "?" if isinstance(conn, sqlite3.Connection) else "%s"


# -- serve processes -------------------------------------------------------------------------------


def _servers(world: h.World, tmp: Path, database: Path | str, judge: Judge, names: list[str], **env: str) -> list[
        h.LiveServer]:  # fmt: skip
    url = f"sqlite:///{database}" if isinstance(database, Path) else database
    common = {"DATABASE_URL": url, "ALE_VERIFY_CHECK_PROCESSES": "0", "ALE_VERIFY_JUDGE_MODEL": "site-judge",
              "ALE_VERIFY_JUDGE_BASE_URL": judge.base, "ALE_VERIFY_JUDGE_POLL_S": "0.05",
              "ALE_VERIFY_JUDGE_RETRY_S": "0", "ALE_VERIFY_UPLOADS_PER_HOUR": "1000", **env}  # fmt: skip
    servers = [h.start_live_server(world.keys, tmp, name=name, wait=False, **common) for name in names]
    try:
        for server in servers:
            server.wait_healthy()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def _upload_live(server: h.LiveServer, files: dict[str, bytes], recipient: str) -> str:
    auth = {"Authorization": f"Bearer {server.token(h.PARTICIPANT)}"}
    c = httpx.post(f"{server.url}/api/v1/challenges", headers=auth, timeout=60).json()
    data = h.encrypt_files(h.rebind(files, c["nonce"], c["token"]), recipient)
    reply = httpx.post(f"{server.url}/api/v1/submissions", content=data, timeout=300,
                       headers={**auth, "Content-Type": "application/octet-stream"})  # fmt: skip
    assert reply.status_code == 201, reply.text
    assert [n["reason"] for n in reply.json()["reasons"]] == ["judging_pending"]
    return str(reply.json()["id"])


def _wait_judged(server: h.LiveServer, submission_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stored = httpx.get(f"{server.url}/api/v1/submissions/{submission_id}", timeout=30).json()
        if stored["judgements"][PENDULUM]["state"] != "judging_pending":
            return dict(stored)
        assert time.monotonic() < deadline, f"{submission_id} still judging pending after {timeout} s"
        time.sleep(0.1)


def test_two_serve_processes_judge_each_task_exactly_once(
    world: h.World, runs: Runs, db_engine: h.Databases, tmp_path: Path
) -> None:
    database = db_engine.new(tmp_path)

    def slow(request: dict[str, Any]) -> tuple[int, bytes]:
        time.sleep(0.3)
        return faithful_answer(request)

    with serve_judge(slow) as judge:
        servers = _servers(world, tmp_path, database, judge, ["serve0", "serve1"])
        try:
            ids = [_upload_live(servers[i % 2], runs.plain, world.keys.recipient) for i in range(6)]
            for sid in ids:
                assert _wait_judged(servers[0], sid)["judgements"][PENDULUM]["state"] == "judged_faithful"
        finally:
            for server in servers:
                server.stop()
        assert len(judge.requests) == 6  # one request per task: no job was asked about twice
    jobs = db.judge_jobs(database)
    assert sorted(j["submission_id"] for j in jobs) == sorted(ids)
    assert {(j["state"], j["attempts"]) for j in jobs} == {("done", 1)}
    for sid in ids:
        stored = db.get_submission(database, sid)
        assert stored is not None
        assert [e["action"] for e in stored["history"]] == ["accepted", "judged"]
    for server in servers:
        assert b"Traceback" not in server.log()


def test_a_killed_serve_process_leaves_its_judge_job_to_the_lease_and_a_restart_resumes_it(
    world: h.World, runs: Runs, db_engine: h.Databases, tmp_path: Path
) -> None:
    database = db_engine.new(tmp_path)
    gate = Gate()  # the first request hangs: the process is killed while it waits for the judge

    def first_hangs(request: dict[str, Any]) -> tuple[int, bytes]:
        if not gate.asked.is_set():
            return gate(request)
        return faithful_answer(request)

    with serve_judge(first_hangs) as judge:
        (first,) = _servers(world, tmp_path, database, judge, ["before"], ALE_VERIFY_JUDGE_LEASE_S="2")
        try:
            sid = _upload_live(first, runs.plain, world.keys.recipient)
            assert gate.asked.wait(120), "the first process never asked the judge"
            (job,) = db.judge_jobs(database)
            assert (job["state"], job["attempts"]) == ("running", 1)
        finally:
            first.proc.kill()
            first.proc.wait()
        (second,) = _servers(world, tmp_path, database, judge, ["after"], ALE_VERIFY_JUDGE_LEASE_S="2")
        try:
            stored = _wait_judged(second, sid)
        finally:
            second.stop()
            gate.open.set()
        assert stored["judgements"][PENDULUM]["state"] == "judged_faithful"
        assert len(judge.requests) == 2  # the killed process's, then the restarted one's
    (job,) = db.judge_jobs(database)
    assert (job["state"], job["attempts"], job["outcome"]) == ("done", 2, "judged")
    assert b"Traceback" not in second.log()


def test_judge_job_settings_are_read_from_the_environment_and_bad_ones_refused() -> None:
    from ale_verify.config import Settings

    settings = Settings.from_env({"ALE_VERIFY_JUDGE_ATTEMPTS": "3", "ALE_VERIFY_JUDGE_RETRY_S": "0",
                                  "ALE_VERIFY_JUDGE_LEASE_S": "2.5", "ALE_VERIFY_JUDGE_POLL_S": "0.1"})  # fmt: skip
    assert (settings.judge_attempts, settings.judge_retry_s, settings.judge_lease_s, settings.judge_poll_s) == (
        3, 0.0, 2.5, 0.1,
    )  # fmt: skip
    defaults = Settings.from_env({})
    assert (defaults.judge_attempts, defaults.judge_retry_s, defaults.judge_lease_s) == (5, 60.0, 60.0)
    for name, bad in [("ALE_VERIFY_JUDGE_ATTEMPTS", "0"), ("ALE_VERIFY_JUDGE_ATTEMPTS", "many"),
                      ("ALE_VERIFY_JUDGE_RETRY_S", "-1"), ("ALE_VERIFY_JUDGE_RETRY_S", "nan"),
                      ("ALE_VERIFY_JUDGE_LEASE_S", "0.5"), ("ALE_VERIFY_JUDGE_LEASE_S", "inf"),
                      ("ALE_VERIFY_JUDGE_POLL_S", "0"), ("ALE_VERIFY_JUDGE_POLL_S", "1e9")]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            Settings.from_env({name: bad})


# -- fuzz ------------------------------------------------------------------------------------------


@pytest.mark.fuzz
@fuzz_settings
@given(hostile_json, st.sampled_from(["0" * 64, hashlib.sha256(b"x").hexdigest()]))
def test_fuzz_load_input_raises_only_value_errors(raw: bytes, digest: str) -> None:
    """A stored judge input read back (the database's text, whatever it became): a JudgeInput whose
    text has the job's digest, or ValueError."""
    try:
        ji = judging.load_input(raw.decode("utf-8", "surrogateescape"), digest)
    except ValueError:
        return
    assert hashlib.sha256(ji.text).hexdigest() == digest


@pytest.mark.fuzz
@fuzz_settings
@given(st.dictionaries(st.sampled_from(["status", "faithful", "source", "judge_model", "judge_key_id", "claimed",
                                        "rationale", "outcome"]), json_values))  # fmt: skip
def test_fuzz_task_judgement_of_any_stored_judgement_is_one_of_the_states(judgement: dict[str, Any]) -> None:
    """Whatever an old or sparse summary holds, the API and the exports give a documented state,
    and only a judged one names who judged it (fail-closed: anything unknown is unjudged)."""
    out = judging.task_judgement(judgement)
    assert set(out) == {"state", "judged_by", "judge_key_id", "judge_model", "reason"}
    assert out["state"] in judging.STATES
    if out["state"] == "judged_faithful":
        assert judgement.get("status") == "judged"
        assert judgement.get("faithful") is True
    if out["state"] not in ("judged_faithful", "judged_unfaithful"):
        assert (out["judged_by"], out["judge_key_id"], out["judge_model"]) == (None, None, None)
        assert isinstance(out["reason"], str)
    else:
        assert out["judged_by"] in ("judge_key", "verifier")
        assert out["reason"] is None
