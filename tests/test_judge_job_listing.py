"""The operator's view of the judge-job queue (docs/verifier.md, "Judge jobs"):
``GET /api/v1/operator/judge-jobs`` and ``ale-verify judge-jobs`` give the count in each state, the
oldest pending job and its age, and one bounded page of jobs (each failed one with its last
error); every query parameter that is not one of these, in range, once, is a clear 400. Runs on
SQLite and on PostgreSQL (conftest.py's ``db_engine``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import verifier_helpers as h
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from openapi_helpers import schema_errors

from ale_verify import cli, db, openapi

#: (task, state, last error, queued_at): queued out of order on purpose, the listing sorts them.
JOBS = [
    ("task-c@1", "pending", None, 30.0),
    ("task-a@1", "pending", "judge unreachable (attempt 1 of 3)", 10.0),
    ("task-b@1", "running", None, 20.0),
    ("task-d@1", "failed", "the judge answered HTTP 500 twice", 40.0),
    ("task-e@1", "failed", "a verdict for another input", 50.0),
    ("task-f@1", "done", None, 60.0),
    ("task-g@1", "pending", None, 70.0),
]


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


def _fill(database: Any) -> None:
    """A submission and its judge jobs, straight in the database (the judge worker's tests make real ones)."""
    with db.connect(database) as s:
        s.execute("INSERT INTO users VALUES ('u', 'u', 'local', 0)")
        s.execute("INSERT INTO submissions VALUES ('sub_1', 'u', 1.0, 'x', 'accepted', 'validated', NULL, '[]', "
                  "NULL, '{}')")  # fmt: skip
        for task, state, error, queued in JOBS:
            s.execute(
                "INSERT INTO judge_jobs (submission_id, task, state, input_sha256, attempts, not_before, "
                "last_error, queued_at) VALUES ('sub_1', ?, ?, ?, 1, 0, ?, ?)",
                [task, state, "b" * 64, error, queued],
            )


@pytest.fixture
def site(world: h.World, tmp_path: Path) -> h.Verifier:
    v = h.Verifier(world, tmp_path)
    _fill(v.settings.database)
    return v


def _listing(v: h.Verifier, query: str = "") -> dict[str, Any]:
    reply = h.run(v.get(f"/api/v1/operator/judge-jobs{query}", user=h.OPERATOR))
    assert reply.status == 200, reply.body
    assert schema_errors(openapi.ref("JudgeJobs"), reply.json) == []
    listing: dict[str, Any] = reply.json
    return listing


def test_the_listing_counts_each_state_and_pages_through_every_job_in_queue_order(site: h.Verifier) -> None:
    before = time.time()
    first = _listing(site)
    assert first["counts"] == {"pending": 3, "running": 1, "failed": 2, "done": 1}
    assert first["oldest_pending_queued_at"] == 10.0
    assert before - 10.0 <= first["oldest_pending_age_s"] <= time.time() - 10.0
    assert (first["total"], first["limit"], first["offset"], first["next_offset"]) == (7, 50, 0, None)
    queue_order = [t for t, *_ in sorted(JOBS, key=lambda j: j[3])]
    assert [j["task"] for j in first["jobs"]] == queue_order

    walked, offset, pages = [], 0, 0
    while offset is not None:
        page = _listing(site, f"?limit=3&offset={offset}")
        assert len(page["jobs"]) <= 3
        walked += page["jobs"]
        offset, pages = page["next_offset"], pages + 1
    assert (walked, pages) == (first["jobs"], 3)

    failed = _listing(site, "?state=failed")
    assert (failed["state"], failed["total"]) == ("failed", 2)
    assert {j["task"]: j["last_error"] for j in failed["jobs"]} == {
        "task-d@1": "the judge answered HTTP 500 twice", "task-e@1": "a verdict for another input",
    }  # fmt: skip
    assert _listing(site, "?offset=7")["jobs"] == []
    assert _listing(site, "?offset=1000000000")["next_offset"] is None


def test_an_empty_queue_has_no_oldest_pending_job(world: h.World, tmp_path: Path) -> None:
    listing = _listing(h.Verifier(world, tmp_path))
    assert listing["counts"] == dict.fromkeys(db.JUDGE_JOB_STATES, 0)
    assert (listing["oldest_pending_queued_at"], listing["oldest_pending_age_s"], listing["jobs"]) == (None, None, [])


HOSTILE = {
    "garbage": ("limit=abc", "bad_request", "limit"),
    "empty": ("limit=", "bad_request", "limit"),
    "negative": ("limit=-1", "bad_request", "limit"),
    "zero": ("limit=0", "bad_request", "limit"),
    "over-the-page": ("limit=501", "bad_request", "limit"),
    "huge": ("limit=" + "9" * 5000, "bad_request", "limit"),
    "exponent": ("limit=1e3", "bad_request", "limit"),
    "float": ("limit=5.0", "bad_request", "limit"),
    "hex": ("limit=0x10", "bad_request", "limit"),
    "plus-sign": ("limit=%2B5", "bad_request", "limit"),
    "padded": ("limit=%205", "bad_request", "limit"),
    "arabic-indic-digit": ("limit=" + quote("\u0665"), "bad_request", "limit"),
    "nul": ("limit=5%00", "bad_request", "limit"),
    "repeated-limit": ("limit=1&limit=2", "bad_request", "limit"),
    "negative-offset": ("offset=-5", "bad_request", "offset"),
    "huge-offset": ("offset=1000000001", "bad_request", "offset"),
    "huger-offset": ("offset=" + "9" * 200, "bad_request", "offset"),
    "unknown-state": ("state=stuck", "bad_request", "state"),
    "empty-state": ("state=", "bad_request", "state"),
    "repeated-state": ("state=pending&state=done", "bad_request", "state"),
    "unknown-parameter": ("page=2", "unknown_field", "page"),
    "level-claim": ("level=audited", "self_elevation", "levels"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_judge_job_query_parameters_are_a_clear_400(site: h.Verifier, case: str) -> None:
    query, reason, names = HOSTILE[case]
    reply = h.run(site.get(f"/api/v1/operator/judge-jobs?{query}", user=h.OPERATOR))
    assert (reply.status, reply.reason) == (400, reason), reply.body
    assert names in reply.json["error"]["message"]
    assert schema_errors(openapi.ref("Error"), reply.json) == []
    h.run(site.assert_healthy())


@pytest.fixture(scope="module")
def fuzz_site(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> h.Verifier:
    v = h.Verifier(world, tmp_path_factory.mktemp("fuzz-jobs"))
    _fill(v.settings.database)
    return v


def _expected(pairs: list[tuple[str, str]]) -> bool:
    """Whether the listing takes these parameters (docs/verifier.md, "Judge jobs"), written apart
    from the route: known names, each once, ``state`` a state, the integers ASCII digits in range."""
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names) or not set(names) <= {"state", "limit", "offset"}:
        return False
    for name, value in pairs:
        if name == "state" and value not in ("pending", "running", "failed", "done"):
            return False
        if name != "state" and not (value.isascii() and value.isdigit()):
            return False
        if name == "limit" and not 1 <= int(value) <= 500:
            return False
        if name == "offset" and not 0 <= int(value) <= 10**9:
            return False
    return True


_NAMES = st.sampled_from(["state", "limit", "offset", "page", "level", "limit ", "LIMIT"])
_VALUES = st.one_of(
    st.text(max_size=30),
    st.integers(-(10**12), 10**12).map(str),
    st.sampled_from(["pending", "done", "stuck", "", "0", "500", "501", "1000000000", "1000000001", "\u0665", "1e3"]),
)


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=4))
def test_fuzz_judge_job_query_is_a_page_or_a_clear_400(fuzz_site: h.Verifier, pairs: list[tuple[str, str]]) -> None:
    reply = h.run(fuzz_site.get(f"/api/v1/operator/judge-jobs?{urlencode(pairs)}", user=h.OPERATOR))
    if _expected(pairs):
        assert reply.status == 200, (pairs, reply.body)
        assert schema_errors(openapi.ref("JudgeJobs"), reply.json) == []
        assert len(reply.json["jobs"]) <= reply.json["limit"] <= 500
    else:
        assert reply.status == 400, (pairs, reply.body)
        assert reply.reason in {"bad_request", "unknown_field", "self_elevation"}, (pairs, reply.body)


def test_the_judge_job_listing_is_for_operators(site: h.Verifier) -> None:
    assert h.run(site.get("/api/v1/operator/judge-jobs")).status == 401
    reply = h.run(site.get("/api/v1/operator/judge-jobs", user=h.PARTICIPANT))
    assert (reply.status, reply.reason) == (403, "forbidden")


# -- ale-verify judge-jobs -------------------------------------------------------------------------


@pytest.fixture
def cli_env(site: h.Verifier, monkeypatch: pytest.MonkeyPatch) -> h.Verifier:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("ALE_VERIFY_DATABASE", raising=False)
    where = site.settings.database
    if isinstance(where, db.PostgresUrl):
        monkeypatch.setenv("DATABASE_URL", where.url)
    else:
        monkeypatch.setenv("ALE_VERIFY_DATABASE", str(where.path if isinstance(where, db.SqliteUrl) else where))
    return site


def test_ale_verify_judge_jobs_gives_the_endpoints_listing(
    cli_env: h.Verifier, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["judge-jobs", "--json", "--state", "pending", "--limit", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    served = _listing(cli_env, "?state=pending&limit=2")
    assert {**printed, "oldest_pending_age_s": 0} == {**served, "oldest_pending_age_s": 0}
    assert printed["next_offset"] == 2

    assert cli.main(["judge-jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "judge jobs: 3 pending, 1 running, 2 failed, 1 done; oldest pending queued 1970-01-01T00:00:10Z"
    )
    assert any("task-d@1" in line and "last error: the judge answered HTTP 500 twice" in line for line in lines)
    assert lines[-1] == "showing 1-7 of 7"

    assert cli.main(["judge-jobs", "--limit", "3", "--offset", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "showing 4-6 of 7; next: --offset 6"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--limit", "-5"], "'-5': between 1 and 500 jobs"),
        (["--limit", "0"], "'0': between 1 and 500 jobs"),
        (["--limit", "9" * 40], "between 1 and 500 jobs"),
        (["--limit", "ten"], "'ten' is not a number of jobs"),
        (["--offset", "-1"], "'-1': between 0 and 1000000000 jobs"),
        (["--state", "stuck"], "invalid choice: 'stuck'"),
    ],
)
def test_ale_verify_judge_jobs_refuses_bad_arguments(
    cli_env: h.Verifier, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["judge-jobs", *argv])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_ale_verify_judge_jobs_without_a_database_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("ALE_VERIFY_DATABASE", str(tmp_path / "none.sqlite3"))
    assert cli.main(["judge-jobs"]) == 2
    assert "the database does not exist yet" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite3").exists()


def test_the_cli_number_parsers_keep_their_bounds_and_messages() -> None:
    """One helper (cli._bounded) makes every bounded-number argument; the old ones still say the same."""
    import argparse

    assert (cli._period("0.1"), cli._period("86400"), cli._workers("0"), cli._workers("1024")) == (0.1, 86400, 0, 1024)
    for parse, raw, message in [
        (cli._period, "0.05", "'0.05': between 0.1 and 86400 seconds"),
        (cli._period, "nan", "'nan': between 0.1 and 86400 seconds"),
        (cli._period, "soon", "'soon' is not a number of seconds"),
        (cli._workers, "1025", "'1025': between 0 and 1024 worker processes"),
        (cli._workers, "2.5", "'2.5' is not a number of worker processes"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=message.replace(".", r"\.")):
            parse(raw)
