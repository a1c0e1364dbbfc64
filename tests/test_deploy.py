"""The operators' site without running it: the verifier image's definition holds exactly the
verifier's import closure and data and wants exactly what it imports; the compose file runs that
image by digest, hardened, with the keys as secrets of the verifier alone and the proxy as the one
published service; the Caddyfile routes to the socket the verifier listens on; the exporter's
loop (``ale-verify export-site --every``) exports when the database changed and stops on SIGTERM.

tests/test_deploy_stack.py brings the stack up with podman-compose."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from images_helpers import mini_image
from sandbox_tools import missing

from ale.images import definition
from ale.images.build import build_image, project_files
from ale_verify import db, export_watch

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
VERIFIER = definition.load(ROOT / "images" / "verifier.toml")
ROOTS = {"ale": ROOT / "ale", "ale_verify": ROOT / "verify", "ale_site": ROOT / "static-site"}
#: The distribution of each top-level module the verifier imports (PEP 503 names).
DISTRIBUTIONS = {
    "attr": "attrs", "attrs": "attrs", "cattrs": "cattrs", "cryptography": "cryptography", "httpx": "httpx",
    "hypercorn": "hypercorn", "jinja2": "jinja2", "jsonschema": "jsonschema", "markdown_it": "markdown-it-py",
    "markupsafe": "markupsafe", "numpy": "numpy", "orjson": "orjson", "pyrage": "pyrage", "quart": "quart",
    "rfc8785": "rfc8785",
    "psycopg": "psycopg", "psycopg_pool": "psycopg-pool", "werkzeug": "werkzeug", "zstandard": "zstandard",
}  # fmt: skip


# --- the image's definition ---------------------------------------------------------------------


def _module_file(name: str) -> Path | None:
    top, *rest = name.split(".")
    base = ROOTS[top].joinpath(*rest)
    for candidate in (base / "__init__.py", base.with_name(base.name + ".py")):
        if candidate.is_file():
            return candidate
    return None


def _closure(roots: list[str]) -> tuple[set[str], set[str]]:
    """(checkout paths of the project modules ``roots`` reach through imports, third-party top names)."""
    seen: dict[str, Path] = {}
    external: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        top = name.split(".")[0]
        if top not in ROOTS:
            if top and top not in sys.stdlib_module_names:
                external.add(top)
            continue
        if name in seen or (path := _module_file(name)) is None:
            continue
        seen[name] = path
        todo.append(name.rpartition(".")[0])
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name if is_pkg else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                todo.append(base)
                todo.extend(f"{base}.{a.name}" for a in node.names)
    return {p.relative_to(ROOT).as_posix() for p in seen.values()}, external


def _verifier_modules() -> list[str]:
    return ["ale_verify", "ale_site", *(f"ale_verify.{p.stem}" for p in (ROOT / "verify").glob("*.py"))]


def _image_files() -> set[str]:
    return {src.relative_to(ROOT).as_posix() for _dest, src in project_files(VERIFIER, ROOT)}


def test_verifier_image_holds_exactly_the_verifiers_import_closure_and_its_data() -> None:
    files = _image_files()
    code, _external = _closure(_verifier_modules())
    assert {f for f in files if f.endswith(".py")} == code
    tracked = set(subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split())
    data = {
        f
        for f in tracked
        if re.fullmatch(
            r"ale/(schemas/.*\.schema\.json|releases/.*\.json|tasks/[^/]+/(task\.json|paper\.md|rubric\.json))", f
        )
        or re.fullmatch(r"static-site/(templates/.*\.html|assets/[^/]+)|docs/[^/]+\.md", f)
    }
    assert {f for f in files if not f.endswith(".py")} == data | {"ale/py.typed"}


def test_verifier_image_wants_exactly_what_the_verifier_imports() -> None:
    _code, external = _closure(_verifier_modules())
    assert {DISTRIBUTIONS[m] for m in external} == set(VERIFIER.python.want)
    assert set(VERIFIER.python.want) <= {w.name for w in VERIFIER.python.wheels}, "each one pinned"


def test_verifier_image_holds_nothing_of_the_harness_the_evaluator_or_the_agents() -> None:
    for f in _image_files():
        assert not f.startswith(("evaluator/", "ale/agents/", "ale/gateway/", "ale/images/", "deploy/")), f
        if f.startswith("ale/runner/"):
            assert f in {"ale/runner/__init__.py", "ale/runner/inspect.py"}, f  # `ale-verify check`'s report
    wheels = {w.name for w in VERIFIER.python.wheels}
    # numpy, though: the verifier recomputes the scores' bootstrap intervals (ale.core.intervals)
    assert not wheels & {"mujoco", "gymnasium", "grpcio", "trio"}, wheels


def test_verifier_image_runs_caddy_and_the_verifier_as_its_one_non_root_user() -> None:
    debs = {p.name for p in VERIFIER.debian.packages}
    assert {"caddy", "ca-certificates", "python3.11"} <= debs
    assert "libnss3-tools" not in debs, "the local CA is never installed into a trust store"
    assert VERIFIER.user.uid == 10003
    assert VERIFIER.entrypoint == ("/usr/bin/python3.11", "-m", "ale_verify.cli")
    assert not any("KEY" in k or "SECRET" in k for k in VERIFIER.env), VERIFIER.env


# --- the compose file and the Caddyfile ---------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_compose_runs_the_verifier_image_by_digest_in_every_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"verifier", "exporter", "proxy"}
    for name, service in services.items():
        assert service["image"].startswith("${ALE_VERIFIER_IMAGE:?"), name  # NAME@sha256:..., never a tag
        assert service["pull_policy"] == "never", name
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert service["security_opt"] == ["no-new-privileges"], name
        assert "user" not in service, name
        assert "privileged" not in service, name


def test_compose_gives_the_keys_to_the_verifier_alone_as_secrets(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["verifier"]["secrets"] == ["site-identity", "signing-key"]
    env = services["verifier"]["environment"]
    assert env["ALE_VERIFY_KEY_FILE"] == "/run/secrets/site-identity"
    assert env["ALE_VERIFY_SIGNING_KEY_FILE"] == "/run/secrets/signing-key"
    assert {k: v["file"] for k, v in compose["secrets"].items()} == {
        "site-identity": "./secrets/site-identity.txt",
        "signing-key": "./secrets/signing-key.bin",
    }
    for name, service in services.items():
        if name != "verifier":
            assert "secrets" not in service, name
        for volume in service.get("volumes", []):
            assert "secrets" not in volume, f"{name} mounts {volume}: keys are secrets, not volumes"
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/deploy/secrets/" in ignored
    assert "/deploy/.env" in ignored


def test_compose_publishes_only_the_proxy_and_keeps_the_data_on_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert [s for s, d in services.items() if d.get("ports")] == ["proxy"]
    assert {p.rsplit(":", 1)[1] for p in services["proxy"]["ports"]} == {"80", "443", "443/udp"}
    assert "data:/var/lib/ale-verify" in services["verifier"]["volumes"]
    assert "data:/var/lib/ale-verify" in services["exporter"]["volumes"]
    assert "board:/srv/site:ro" in services["proxy"]["volumes"]
    assert "board:/srv/site" in services["exporter"]["volumes"]
    assert not any(v.startswith("data:") for v in services["proxy"]["volumes"]), "the proxy never sees the database"
    assert set(compose["volumes"]) == {"data", "socket", "board", "caddy"}


def test_caddyfile_routes_the_api_to_the_socket_the_verifier_listens_on(compose: dict[str, Any]) -> None:
    caddyfile = (DEPLOY / "Caddyfile").read_text()
    bind = compose["services"]["verifier"]["command"]
    assert bind == ["serve", "--bind", "unix:/run/ale-site/verifier.sock"]
    assert "reverse_proxy unix//run/ale-site/verifier.sock" in caddyfile
    assert "@verifier path /api/* /auth/* /healthz" in caddyfile
    assert "root * /srv/site/board" in caddyfile
    exporter = compose["services"]["exporter"]["command"]
    assert exporter[:2] == ["export-site", "/srv/site/board"]
    assert exporter[2] == "--every"
    assert "admin off" in caddyfile
    assert "skip_install_trust" in caddyfile


@pytest.mark.parametrize("script", ["load-image", "keygen"])
def test_deploy_scripts_are_valid_shell(script: str) -> None:
    path = DEPLOY / script
    assert os.access(path, os.X_OK)
    assert subprocess.run(["sh", "-n", str(path)], capture_output=True).returncode == 0


def test_ci_installs_podman_compose_for_the_stack_test() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"for pkg in .*\bpodman-compose\b", ci)


def test_load_image_refuses_a_folder_that_is_not_a_layout(tmp_path: Path) -> None:
    r = subprocess.run([str(DEPLOY / "load-image"), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "is not an OCI layout" in r.stderr


def test_load_image_refuses_a_layout_whose_digest_is_not_the_locks(tmp_path: Path) -> None:
    if shutil.which("skopeo") is None:
        missing("skopeo is not installed (apt-get install skopeo)")
    checkout, path, cache = mini_image(tmp_path)
    built = build_image(definition.load(path), checkout, tmp_path / "out" / "mini", cache, offline=True,
                        log=lambda _l: None)  # fmt: skip
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"format": "ale-images-lock/v1", "images": {"mini": {"digest": "sha256:" + "0" * 64}}}))
    r = subprocess.run([str(DEPLOY / "load-image"), "--lock", str(lock), str(built.layout)], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert f"is {built.digest}, the lock" in r.stderr
    assert r.stdout == ""
    lock.write_text(json.dumps({"format": "ale-images-lock/v1", "images": {}}))
    r = subprocess.run([str(DEPLOY / "load-image"), "--lock", str(lock), str(built.layout)], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert "has no entry for mini" in r.stderr


# --- the exporter's loop ------------------------------------------------------------------------


def _loop(database: Path, *, rounds: int, between: Any = None) -> tuple[int, list[str]]:
    """Run the loop for ``rounds`` periods with a stand-in export; ``between(i)`` runs after period i."""
    seen: list[str] = []
    stop = threading.Event()
    period = 0

    class Clocked(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            nonlocal period
            if between is not None:
                between(period)
            period += 1
            if period >= rounds:
                stop.set()
            return stop.is_set()

        def is_set(self) -> bool:
            return stop.is_set()

    exports = export_watch.watch(
        lambda: seen.append("export") or "report",
        lambda: export_watch.file_state(database),
        0.0,
        stop=Clocked(),
        report=lambda r: seen.append(f"report {r}"),
        waiting=lambda: seen.append("waiting"),
    )
    return exports, seen


def test_export_loop_exports_once_while_the_database_is_unchanged(tmp_path: Path) -> None:
    database = tmp_path / "verifier.sqlite3"
    db.migrate(database)
    exports, seen = _loop(database, rounds=5)
    assert exports == 1
    assert seen == ["export", "report report"]


def test_export_loop_exports_again_after_each_commit(tmp_path: Path) -> None:
    database = tmp_path / "verifier.sqlite3"
    db.migrate(database)

    def commit(period: int) -> None:
        if period in (1, 3):
            db.upsert_user(database, f"user{period}", f"user{period}", "local")
            os.utime(database, ns=(time.time_ns(), time.time_ns() + period))  # a clock with coarse ticks

    exports, _seen = _loop(database, rounds=6, between=commit)
    assert exports == 3


def test_export_loop_waits_for_a_database_that_does_not_exist_yet(tmp_path: Path) -> None:
    database = tmp_path / "verifier.sqlite3"

    def appear(period: int) -> None:
        if period == 2:
            db.migrate(database)

    exports, seen = _loop(database, rounds=5, between=appear)
    assert exports == 1
    assert seen == ["waiting", "export", "report report"], "told once that it waits, then one export"


def test_export_loop_ends_on_an_export_error(tmp_path: Path) -> None:
    from ale_verify.export import ExportError

    database = tmp_path / "verifier.sqlite3"
    db.migrate(database)

    def fail() -> None:
        raise ExportError("not a previous export")

    with pytest.raises(ExportError):
        export_watch.watch(
            fail, lambda: export_watch.file_state(database), 0.0, stop=threading.Event(), report=print, waiting=print
        )


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "nan", "1e9"])
def test_export_site_every_refuses_a_period_that_is_not_one(tmp_path: Path, bad: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ale_verify.cli", "export-site", str(tmp_path / "site"), "--every", bad],
        capture_output=True, text=True, env={**os.environ, "ALE_VERIFY_DATA": str(tmp_path)}, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "--every" in r.stderr


def test_export_site_every_exports_then_stops_on_sigterm(tmp_path: Path) -> None:
    """As the exporter container's first process: it exports, keeps running, and SIGTERM ends it
    at once with status 0 (a first process ignores a signal it has no handler for)."""
    env = {**os.environ, "ALE_VERIFY_DATA": str(tmp_path), "ALE_VERIFY_WORKERS": "0"}
    db.migrate(tmp_path / "verifier.sqlite3")
    out = tmp_path / "site" / "board"
    with subprocess.Popen(
        [sys.executable, "-m", "ale_verify.cli", "export-site", str(out), "--every", "0.2", "--jobs", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())
            assert first["event"] == "exported"
            assert first["submissions"] == 0
            assert (out / "index.html").is_file()
            time.sleep(0.5)
            assert proc.poll() is None, "it keeps running"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
            assert proc.stdout.read() == "", "nothing changed: no second export"
        finally:
            if proc.poll() is None:
                proc.kill()
