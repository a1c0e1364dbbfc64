"""The OpenAPI document, and a schema-driven fuzz of the API from it (schemathesis over ASGI):
no request, well-formed or not, gets a 5xx, and every answer matches the document."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import hypothesis
import openapi_spec_validator
import pytest
import schemathesis
import verifier_helpers as h
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from ale_verify import openapi

DOCUMENT = openapi.document("http://127.0.0.1:8000")
OPERATIONS = sorted(
    f"{method.upper()} {path}" for path, item in DOCUMENT["paths"].items() for method in item if method != "parameters"
)
EXAMPLES = 40


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


# -- the document --------------------------------------------------------------------------------


def test_served_document_is_valid_openapi_3_1(world: h.World, tmp_path: Path) -> None:
    async def go() -> dict[str, Any]:
        v = h.Verifier(world, tmp_path, public_url="https://verify.example.org")
        reply = await v.get("/api/v1/openapi.json")
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("application/json")
        return dict(reply.json)

    served = h.run(go())
    assert served["openapi"] == "3.1.0"
    assert served["servers"] == [{"url": "https://verify.example.org"}]
    openapi_spec_validator.validate(served)  # raises on any violation
    openapi_spec_validator.OpenAPIV31SpecValidator(served).validate()
    assert served == json.loads(json.dumps(openapi.document("https://verify.example.org")))


def test_document_structure() -> None:
    ids = [op["operationId"] for item in DOCUMENT["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), "operationIds are unique"
    for path, item in DOCUMENT["paths"].items():
        for method, op in item.items():
            assert op["responses"], f"{method} {path} documents its responses"
            for status, response in op["responses"].items():
                assert status.isdigit()
                assert response["description"]
                if status == "302":  # a redirect (the login flow) has no body, a Location
                    assert "content" not in response
                    assert response["headers"]["Location"]["required"]
                    continue
                schema = response["content"]["application/json"]["schema"]
                if (method, path, status) == ("post", "/api/v1/submissions", "422"):
                    assert schema == {"$ref": "#/components/schemas/Verdict"}  # a rejection is a verdict
                elif int(status) >= 400:
                    assert schema == {"$ref": "#/components/schemas/Error"}, f"{method} {path} {status}"
            if op.get("security"):
                assert "401" in op["responses"], f"{method} {path} documents 401"
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert "{" + param["name"] + "}" in path


# Every route registered is documented and the other way round: tests/test_api_schemas.py.


# -- the fuzz ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_target(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, str], h.Verifier]:
    tmp = tmp_path_factory.mktemp("fuzz")
    v = h.Verifier(world, tmp, uploads_per_hour=10**6, challenges_per_hour=10**6)
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", v.app)
    return schema, {"Authorization": f"Bearer {v.token(h.OPERATOR)}"}, v


CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]

# schemathesis draws from the global `random` inside its strategies (a binding's probability, a
# negative mutation's channel), which Hypothesis reports as a deprecation only on the draws that take
# that path: with warnings as errors the fuzz failed now and then, as a FlakyFailure. Hypothesis seeds
# the global `random` for each example, so the draws stay reproducible; only the fuzz ignores the
# warning, and only this one (the suite's own strategies still fail on it, see below).
SCHEMATHESIS_GLOBAL_RANDOM = (
    "ignore:Do not use the `random` module inside strategies:hypothesis.errors.HypothesisDeprecationWarning"
)


@pytest.mark.filterwarnings(SCHEMATHESIS_GLOBAL_RANDOM)
@pytest.mark.parametrize("label", OPERATIONS)
def test_schemathesis_finds_no_server_error(fuzz_target: Any, label: str) -> None:
    """Positive and negative cases for every documented operation, as an operator (so that the
    operator API's bodies are reached): every answer is below 500, documented, and matches its
    documented schema."""
    schema, auth, v = fuzz_target
    method, path = label.split(" ", 1)
    operation = schema[path][method]
    tried = 0
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @hsettings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is reported as found
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case: Any) -> None:
            nonlocal tried
            tried += 1
            response = case.call(headers=auth)
            assert response.status_code < 500, f"{label}: {response.status_code} for {case.as_curl_command()}"
            case.validate_response(response, checks=CHECKS, headers=auth)

        try:
            fuzz()
        except hypothesis.errors.Unsatisfiable:
            # an operation with no parameters has no invalid form to generate
            assert mode is GenerationMode.NEGATIVE
            assert not operation.definition.raw.get("parameters")
    assert tried > 0
    assert v.leftovers() == []


def _draw_from_global_random() -> list[tuple[int, float]]:
    seen: list[tuple[int, float]] = []

    @hsettings(max_examples=5, database=None, deadline=None)
    @given(x=st.tuples(st.integers(0, 10**6), st.builds(random.random)))
    def draw(x: tuple[int, float]) -> None:
        seen.append(x)

    draw()
    return seen


@pytest.mark.filterwarnings(SCHEMATHESIS_GLOBAL_RANDOM)
def test_fuzz_flaky_on_schemathesis_global_random_is_ignored_there() -> None:
    """The regression: a strategy that draws from the global `random` passes under the fuzz's filter."""
    assert len(_draw_from_global_random()) == 5


def test_global_random_in_a_strategy_still_warns_elsewhere() -> None:
    """The filter is not dead and not wide: this Hypothesis still warns, and outside the fuzz the
    suite's `filterwarnings = error` would fail on it (when Hypothesis stops warning, drop the filter)."""
    with pytest.warns(hypothesis.errors.HypothesisDeprecationWarning, match="`random` module inside strategies"):
        _draw_from_global_random()


# -- what the fuzz found, pinned -----------------------------------------------------------------
# The fuzz above reproduces these at random; these tests reproduce them every time.


@pytest.mark.parametrize("body", [b"\xff\xfe\xfa", b'{"reason": "\xe9"}', b"\xc3"], ids=["bytes", "latin1", "cut"])
def test_operator_body_that_is_not_utf8_is_400(world: h.World, tmp_path: Path, body: bytes) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        for path in ("/api/v1/operator/submissions/sub_x/audit", "/api/v1/operator/runner-keys"):
            reply = await v.post(path, user=h.OPERATOR, data=body, headers={"Content-Type": "application/json"})
            assert (reply.status, reply.reason) == (400, "bad_request"), (path, reply.body)
        await v.assert_healthy()

    h.run(go())


@pytest.mark.parametrize(
    "public_key", ["ü" * 44, "AAAA\u00e9AAAA", "\U0001f511" * 11], ids=["umlauts", "accent", "emoji"]
)
def test_runner_key_that_is_not_ascii_is_400(world: h.World, tmp_path: Path, public_key: str) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        reply = await v.post(
            "/api/v1/operator/runner-keys",
            user=h.OPERATOR,
            json={"public_key": public_key, "kind": "benchmark_team", "label": "x"},
        )
        assert (reply.status, reply.reason) == (400, "bad_request"), reply.body
        await v.assert_healthy()

    h.run(go())
