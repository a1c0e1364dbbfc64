"""The OpenAPI document held to the server (docs/verifier.md, "API v1"): every route the app
registers is documented and every documented one registered; real answers of every documented
operation (accepted, rejected, audited and revoked uploads, runner and judge keys, judge jobs, the
login flow, errors) validate against the document's schemas with a JSON Schema 2020-12 validator;
and the export's leaderboard.json validates against the document's ``LeaderboardExport``.
Runs on SQLite and on PostgreSQL (conftest.py's ``db_engine``)."""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import openapi_spec_validator
import pytest
import site_fixtures as sf
import verifier_helpers as h
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from jsonschema import Draft202012Validator
from openapi_helpers import DOCUMENT, schema_errors, validator

from ale.core.results import TASK_RESULTS_SCHEMA, Ended, RunScore, TaskResult, TaskResults
from ale.core.scoring import aggregate
from ale_verify import db, export, judging, openapi

SCHEMAS = DOCUMENT["components"]["schemas"]
OPERATIONS = {
    op["operationId"]: (method.upper(), path) for path, item in DOCUMENT["paths"].items() for method, op in item.items()
}


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


def _template(method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The documented operation that ``method`` ``path`` (a concrete path, no query) calls."""
    for template, item in DOCUMENT["paths"].items():
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path) and method.lower() in item:
            return template, item[method.lower()]
    raise AssertionError(f"{method} {path} is not documented")


class Checker:
    """Validates each answer against the operation it came from and records what it checked."""

    def __init__(self, v: h.Verifier) -> None:
        self.v = v
        self.seen: set[tuple[str, int]] = set()  # (operationId, status)

    async def __call__(self, method: str, target: str, status: int, **kw: Any) -> h.Reply:
        reply = await self.v.call(method, target, **kw)
        assert reply.status == status, (method, target, reply.status, reply.body[:500])
        _path, op = _template(method, urlsplit(target).path)
        documented = op["responses"].get(str(status))
        assert documented is not None, f"{method} {target}: {status} is not documented"
        if "content" in documented:
            assert reply.headers["Content-Type"].startswith("application/json")
            errors = schema_errors(documented["content"]["application/json"]["schema"], reply.json)
            assert errors == [], f"{method} {target} {status}: {errors}"
        else:
            for name, header in documented.get("headers", {}).items():
                assert not header.get("required") or name in reply.headers, f"{method} {target}: no {name}"
        self.seen.add((op["operationId"], status))
        return reply


class Provider:
    """A stand-in OAuth provider: grants a token for any code and names the user ``octo``."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._json({"access_token": "provider-token"})

            def do_GET(self) -> None:
                self._json({"login": "octo"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def provider() -> Iterator[Provider]:
    p = Provider()
    try:
        yield p
    finally:
        p.close()


def _judge_public_key() -> str:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def _add_jobs(database: Any, submission_id: str) -> None:
    """Judge jobs in every state, straight in the database (the judge worker's tests make real ones)."""
    jobs = [
        ("t-pending@1", "pending", None, 5.0),
        ("t-running@1", "running", None, 6.0),
        ("t-failed@1", "failed", "the judge answered HTTP 500 twice", 7.0),
        ("t-done@1", "done", None, 8.0),
    ]
    with db.connect(database) as s:
        for task, state, error, queued in jobs:
            s.execute(
                "INSERT INTO judge_jobs (submission_id, task, state, input_sha256, attempts, not_before, "
                "last_error, queued_at) VALUES (?, ?, ?, ?, 1, 0, ?, ?)",
                [submission_id, task, state, "a" * 64, error, queued],
            )


def test_the_document_is_valid_openapi_3_1_and_each_schema_valid_json_schema() -> None:
    openapi_spec_validator.OpenAPIV31SpecValidator(DOCUMENT).validate()
    for name, schema in SCHEMAS.items():
        Draft202012Validator.check_schema(schema)
        assert validator(schema).schema, name
    for path, item in DOCUMENT["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                for media in response.get("content", {}).values():
                    Draft202012Validator.check_schema(media["schema"])
                    if int(status) < 300:
                        assert _closed_all_the_way(media["schema"]), f"{method} {path} {status}"


def _closed_all_the_way(schema: Any, seen: frozenset[str] = frozenset()) -> bool:
    """Every object a schema reaches lists its members (or its values' schema), none is a bare
    ``{"type": "object"}`` but the run documents the server passes through as the run wrote them."""
    if isinstance(schema, dict):
        target = schema.get("$ref")
        if isinstance(target, str):
            name = target.rsplit("/", 1)[1]
            return name in seen or _closed_all_the_way(SCHEMAS[name], seen | {name})
        if schema.get("type") == "object" and set(schema) == {"type"} and schema is not openapi.OBJECT:
            return False
        return all(_closed_all_the_way(v, seen) for v in schema.values())
    if isinstance(schema, list):
        return all(_closed_all_the_way(v, seen) for v in schema)
    return True


def test_every_registered_route_is_documented_and_every_documented_route_registered(
    world: h.World, tmp_path: Path
) -> None:
    app = h.Verifier(world, tmp_path).app
    routes = {
        (method, re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule))
        for rule in app.url_map.iter_rules()
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    assert routes == set(OPERATIONS.values())


def test_real_answers_of_every_operation_match_the_document(world: h.World, tmp_path: Path, provider: Provider) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path, github_client_id="client", github_client_secret="secret",
                       github_authorize_url=f"{provider.url}/authorize", github_token_url=f"{provider.url}/token",
                       github_user_url=f"{provider.url}/user")  # fmt: skip
        check = Checker(v)
        op, part = h.OPERATOR, h.PARTICIPANT
        await check("GET", "/healthz", 200)
        await check("GET", "/api/v1/openapi.json", 200)
        await check("GET", "/api/v1/submission-key", 200)
        # challenges
        await check("POST", "/api/v1/challenges", 201, user=part)
        await check("POST", "/api/v1/challenges", 401)
        await check("POST", "/api/v1/challenges?level=audited", 400, user=part)
        await check("POST", "/api/v1/challenges", 415, user=part, data=b"{}", headers={"Content-Type": "text/plain"})
        await check("POST", "/api/v1/challenges", 413, user=part, json={"x": "y" * 200_000})
        # uploads: two accepted runs of one bundle (their intervals tie), a third revoked, a fourth audited
        plain = world.bundles["plain"]
        octet = {"Content-Type": "application/octet-stream"}
        ids = [(await check("POST", "/api/v1/submissions", 201, user=part, data=plain, headers=octet)).json["id"]
               for _ in range(4)]  # fmt: skip
        rejected = await check("POST", "/api/v1/submissions", 422, user=part, data=plain[:-5], headers=octet)
        await check("POST", "/api/v1/submissions", 400, user=part, data=b"", headers=octet)
        await check("POST", "/api/v1/submissions?level=audited", 400, user=part, data=plain, headers=octet)
        await check("POST", "/api/v1/submissions", 415, user=part, data=plain, headers={"Content-Type": "text/plain"})
        await check("POST", "/api/v1/submissions", 401, data=plain, headers=octet)
        # level changes
        reason = {"reason": "checked by hand"}
        await check("POST", f"/api/v1/operator/submissions/{ids[3]}/audit", 200, user=op, json=reason)
        await check("POST", f"/api/v1/operator/submissions/{ids[2]}/revoke", 200, user=op, json=reason)
        await check("POST", f"/api/v1/operator/submissions/{ids[2]}/revoke", 409, user=op, json=reason)
        await check("POST", f"/api/v1/operator/submissions/{ids[2]}/audit", 409, user=op, json=reason)
        await check("POST", "/api/v1/operator/submissions/sub_nothing/audit", 404, user=op, json=reason)
        await check("POST", f"/api/v1/operator/submissions/{ids[0]}/revoke", 403, user=part, json=reason)
        await check("POST", f"/api/v1/operator/submissions/{ids[0]}/revoke", 400, user=op, json={"reason": ""})
        await check("POST", f"/api/v1/operator/submissions/{ids[0]}/revoke", 401, json=reason)
        # submissions, each kind
        for sid in [*ids, rejected.json["id"]]:
            await check("GET", f"/api/v1/submissions/{sid}", 200)
        await check("GET", "/api/v1/submissions/sub_nothing", 404)
        # the boards
        boards = {
            c: (await check("GET", f"/api/v1/leaderboard?category={c}", 200)).json for c in openapi.CATEGORY["enum"]
        }
        await check("GET", "/api/v1/leaderboard", 200)
        await check("GET", "/api/v1/leaderboard?category=gold", 400)
        rows = boards["overall"]["rows"]
        assert [r["rank"] for r in rows][:3] == [1, 1, 1]
        assert rows[-1]["rank"] is None
        assert {r["level"] for r in rows} == {"self_reported", "audited", "revoked"}
        # runner keys
        body = {"public_key": world.runner_public, "kind": "benchmark_team", "label": "ci"}
        key_id = (await check("POST", "/api/v1/operator/runner-keys", 201, user=op, json=body)).json["key_id"]
        await check("POST", "/api/v1/operator/runner-keys", 409, user=op, json=body)
        await check("POST", "/api/v1/operator/runner-keys", 400, user=op, json={**body, "kind": "friend"})
        await check("GET", "/api/v1/operator/runner-keys", 200, user=op)
        await check("DELETE", f"/api/v1/operator/runner-keys/{key_id}", 200, user=op)
        await check("DELETE", f"/api/v1/operator/runner-keys/{key_id}", 404, user=op)
        listed = await check("GET", "/api/v1/operator/runner-keys", 200, user=op)
        assert listed.json["keys"][0]["retired_at"] is not None
        await check("GET", "/api/v1/operator/runner-keys", 403, user=part)
        # judge keys
        judge = {"public_key": _judge_public_key(), "label": "a judging party"}
        jkey = (await check("POST", "/api/v1/operator/judge-keys", 201, user=op, json=judge)).json["key_id"]
        await check("POST", "/api/v1/operator/judge-keys", 409, user=op, json=judge)
        await check("POST", "/api/v1/operator/judge-keys", 400, user=op, json={**judge, "public_key": "QUFB"})
        await check("GET", "/api/v1/operator/judge-keys", 200, user=op)
        await check("POST", f"/api/v1/operator/judge-keys/{jkey}/revoke", 200, user=op, json=reason)
        await check("POST", f"/api/v1/operator/judge-keys/{jkey}/revoke", 409, user=op, json=reason)
        await check("POST", "/api/v1/operator/judge-keys/nokey/revoke", 404, user=op, json=reason)
        await check("GET", "/api/v1/operator/judge-keys", 200, user=op)
        # judge jobs
        await check("GET", "/api/v1/operator/judge-jobs", 200, user=op)  # none yet
        _add_jobs(v.settings.database, ids[0])
        listing = (await check("GET", "/api/v1/operator/judge-jobs?limit=2", 200, user=op)).json
        assert (listing["total"], listing["next_offset"], len(listing["jobs"])) == (4, 2, 2)
        await check("GET", "/api/v1/operator/judge-jobs?state=failed", 200, user=op)
        await check("GET", "/api/v1/operator/judge-jobs?limit=-1", 400, user=op)
        await check("GET", "/api/v1/operator/judge-jobs", 403, user=part)
        await check("GET", "/api/v1/operator/judge-jobs", 401)
        # the login flow
        await check("GET", "/auth/whoami", 401)
        await check("GET", "/auth/login", 302)
        await check("GET", "/auth/callback?state=wrong&code=c", 400)
        login = await check("GET", "/auth/login", 302)
        state = parse_qs(urlsplit(login.headers["Location"]).query)["state"][0]
        await check("GET", f"/auth/callback?state={state}&code=c", 302)
        assert (await check("GET", "/auth/whoami", 200)).json == {"user": "github:octo", "operator": False}
        await check("POST", "/auth/tokens", 201)
        await check("POST", "/auth/logout", 200)
        await check("POST", "/auth/tokens", 401)
        down = h.Verifier(world, tmp_path / "down", github_client_id="client", github_token_url="http://127.0.0.1:9/t")
        down_check = Checker(down)
        login = await down_check("GET", "/auth/login", 302)
        state = parse_qs(urlsplit(login.headers["Location"]).query)["state"][0]
        await down_check("GET", f"/auth/callback?state={state}&code=c", 502)
        unconfigured = Checker(h.Verifier(world, tmp_path / "plain"))
        await unconfigured("GET", "/auth/login", 404)

        answered = {name for name, status in check.seen | down_check.seen if status < 400}
        assert answered == set(OPERATIONS), f"not checked: {sorted(set(OPERATIONS) - answered)}"

        # the static site's leaderboard.json, of the same database
        export.export_site(v.settings.database, tmp_path / "site")
        data = json.loads((tmp_path / "site" / "leaderboard.json").read_bytes())
        assert schema_errors(openapi.ref("LeaderboardExport"), data) == []
        assert {r["level"] for r in data["submissions"]} == {"self_reported", "audited", "revoked"}

    h.run(go())


# -- the schemas refuse what the server never says ------------------------------------------------


def _row(**changes: Any) -> dict[str, Any]:
    row = {"rank": 1, "submission_id": "sub_1", "agent": "a", "model": None, "effort": None, "score": 0.5,
           "lower": 0.4, "upper": 0.6, "pass_rate": 0.5, "covered": 1, "required": 4, "complete": False,
           "level": "validated", "received_at": 1.0}  # fmt: skip
    return {**row, **changes}


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"extra": 1}, "Additional properties"),
        ({"rank": 0}, "less than the minimum"),
        ({"rank": None}, "not of type"),  # a standing row always has a rank
        ({"level": "revoked"}, "None was expected"),  # a revoked row never has one
        ({"level": "gold"}, "is not one of"),
        ({"pass_rate": 1.5}, "greater than the maximum"),
        ({"covered": -1}, "less than the minimum"),
        ({"complete": "yes"}, "not of type"),
    ],
)
def test_a_leaderboard_row_the_server_never_writes_is_refused(changes: dict[str, Any], why: str) -> None:
    assert schema_errors(openapi.ref("LeaderboardRow"), _row()) == []
    assert schema_errors(openapi.ref("LeaderboardRow"), _row(level="revoked", rank=None)) == []
    errors = schema_errors(openapi.ref("LeaderboardRow"), _row(**changes))
    assert errors
    assert any(why in e for e in errors), errors


def test_an_uncompleted_tasks_ending_is_typed_by_the_closed_sets() -> None:
    task = {"task": "t@1", "genre": "open", "status": "not_completed", "reason": "the agent timed out"}
    schema = openapi.ref("UncompletedTask")
    assert schema_errors(schema, task) == []  # stored by an older verifier
    assert schema_errors(schema, {**task, "ended": None}) == []
    assert schema_errors(schema, {**task, "ended": {"phase": "agent", "category": "agent/timeout"}}) == []
    assert schema_errors(schema, {**task, "ended": {"phase": "agent", "category": "agent/bored"}})
    assert schema_errors(schema, {**task, "ended": {"phase": "lunch", "category": "agent/timeout"}})


def test_the_static_sites_mix_of_runs_answers_and_exports_as_the_document_says(world: h.World, tmp_path: Path) -> None:
    """tests/site_fixtures.py's mix (complete and partial runs, tied and separated intervals,
    judged, unjudged and pending tasks, token counts, runner kinds, rejected, audited, revoked):
    the boards, each submission and leaderboard.json hold to the document."""
    database = tmp_path / "verifier.sqlite3"
    ids = sf.fill_mix(database)

    async def go() -> None:
        check = Checker(h.Verifier(world, tmp_path, database=database))
        for category in openapi.CATEGORY["enum"]:
            await check("GET", f"/api/v1/leaderboard?category={category}", 200)
        for sid in [*ids["accepted"], *ids["rejected"]]:
            await check("GET", f"/api/v1/submissions/{sid}", 200)

    h.run(go())
    export.export_site(database, tmp_path / "site")
    data = json.loads((tmp_path / "site" / "leaderboard.json").read_bytes())
    assert schema_errors(openapi.ref("LeaderboardExport"), data) == []
    assert len(data["submissions"]) == len(ids["accepted"])


def test_the_summary_says_how_an_uncompleted_task_ended() -> None:
    """judging.score_members (every accepted upload's summary, and its re-scoring) keeps the
    bundle's ``ended`` of a task that ended early; null when the bundle records none."""
    tasks = (
        TaskResult("a@1", "open", "batch", 10, "not_completed", "the agent timed out", None,
                   Ended("agent", "agent/timeout")),
        TaskResult("b@1", "reproduction", "batch", 10, "not_completed", "an older bundle", None),
    )  # fmt: skip
    run = RunScore((), aggregate([], required=["a@1", "b@1"]))
    members = judging.score_members(run, TaskResults(TASK_RESULTS_SCHEMA, "run-1", tasks), {})
    assert [t["ended"] for t in members["tasks"]] == [{"phase": "agent", "category": "agent/timeout"}, None]
    for task in members["tasks"]:
        assert schema_errors(openapi.ref("UncompletedTask"), task) == []
