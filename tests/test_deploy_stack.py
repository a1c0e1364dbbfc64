"""The operators' site, brought up as docs/operators.md says: the verifier image built by
``ale images build``, copied into podman by ``deploy/load-image``, its keys made by
``deploy/keygen``, ``podman-compose up`` on ``deploy/compose.yaml``; then a real run
(``ale run --site``: the challenge and the site's key fetched through the proxy) uploaded by
``ale submit`` over HTTPS through Caddy, trusted through Caddy's own local CA alone; the board
read through it once the exporter has caught up; the data still there after ``down`` and ``up``;
and the key nowhere in the image.

Slow (about a minute: the build, the stack's start and a run). Needs podman, podman-compose and
skopeo (CI installs them and fails instead of skipping: ``ALE_SITE_TOOLS_REQUIRED=1``), the
Debian mirror and PyPI unless the download cache has the pins.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sandbox_tools import missing
from verifier_helpers import free_port

from ale.core import provenance
from ale.core.canonical import canonical_json
from ale.core.signing import key_id, public_raw
from ale.core.verify import RunnerKey
from ale.images import definition, layout
from ale.images.attest import lock_document
from ale.images.build import Built, build_image
from ale.images.fetch import FetchError, default_cache
from ale.images.provenance import attest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
"""
CA_ROOT = "caddy/pki/authorities/local/root.crt"  # in the caddy volume (XDG_DATA_HOME=/var/lib/caddy)
AGE_IDENTITY = re.compile(rb"AGE-SECRET-KEY-1[02-9AC-HJ-NP-Z]{58}")


@attrs.frozen
class Site:
    folder: Path
    project: str
    url: str  # https://localhost:PORT
    http_port: int
    ca: Path  # Caddy's local root certificate, copied out of its volume
    recipient: str
    env: dict[str, str]
    built: Built

    def compose(self, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            ["podman-compose", "-p", self.project, *argv],
            cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert r.returncode == 0, f"podman-compose {' '.join(argv)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    def podman(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["podman", *argv], env=self.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 or not check, f"podman {' '.join(argv)}: {r.stderr[-2000:]}"
        return r

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=str(self.ca)), timeout=30)

    def logs(self) -> str:
        return "\n".join(
            f"--- {s}\n{self.podman('logs', '--tail', '30', self.container(s), check=False).stderr}"
            for s in ("verifier", "exporter", "proxy")
        )


def _tools() -> dict[str, str]:
    for tool, package in (("podman", "podman runc"), ("podman-compose", "podman-compose"), ("skopeo", "skopeo")):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed (apt-get install {package})")
    env = dict(os.environ)
    if not env.get("CONTAINERS_CONF"):
        conf = Path(os.environ.get("TMPDIR", "/tmp")) / f"ale-deploy-containers-{os.getpid()}.conf"
        conf.write_text(CONTAINERS_CONF)
        env["CONTAINERS_CONF"] = str(conf)
    probe = subprocess.run(["podman", "info"], capture_output=True, text=True, env=env, timeout=120)
    if probe.returncode != 0:
        missing(f"podman cannot run here: {probe.stderr.strip()[-300:]}")
    return env


def _wait(what: str, probe: Any, site_logs: Any, budget: float = 60) -> Any:
    deadline = time.monotonic() + budget
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (OSError, httpx.HTTPError, ssl.SSLError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{what} within {budget} s (last error: {last!r})\n{site_logs()}")


def _up(site: Site) -> None:
    site.compose("up", "-d")
    caddy = site.podman("volume", "inspect", f"{site.project}_caddy", "--format", "{{.Mountpoint}}").stdout.strip()
    root = Path(caddy) / CA_ROOT
    _wait("Caddy made its local CA", root.is_file, site.logs)
    shutil.copyfile(root, site.ca)

    def key() -> bool:
        with site.client() as c:
            return c.get("/api/v1/submission-key").status_code == 200

    _wait("the API answered through the proxy", key, site.logs)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    env = _tools()
    timings: list[str] = []
    start = time.monotonic()
    defn = definition.load(ROOT / "images" / "verifier.toml")
    out = tmp_path_factory.mktemp("verifier-image")
    try:
        built = build_image(defn, ROOT, out / "verifier", Path(os.environ.get("ALE_IMAGES_CACHE") or default_cache()),
                            log=lambda _line: None)  # fmt: skip
    except FetchError as exc:
        missing(f"the pinned downloads are neither cached nor reachable: {exc}")
    timings.append(f"build {time.monotonic() - start:.1f} s")

    tag = secrets.token_hex(4)
    name, project = f"localhost/ale-test-verifier-{tag}", f"ale-test-site-{tag}"
    folder = tmp_path_factory.mktemp("site")
    for f in ("compose.yaml", "Caddyfile"):
        shutil.copyfile(DEPLOY / f, folder / f)
    t = time.monotonic()
    load = subprocess.run(
        [str(DEPLOY / "load-image"), str(built.layout)],
        env={**env, "ALE_VERIFIER_NAME": name}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert load.returncode == 0, load.stderr
    assert load.stdout.strip() == f"ALE_VERIFIER_IMAGE={name}@{built.digest}"
    image = f"{name}@{built.digest}"
    keygen = subprocess.run([str(DEPLOY / "keygen"), image, str(folder / "secrets")], env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert keygen.returncode == 0, keygen.stderr
    recipient = keygen.stdout.strip()
    assert recipient.startswith("age1")
    timings.append(f"load and keygen {time.monotonic() - t:.1f} s")

    https, http = free_port(), free_port()
    (folder / ".env").write_text(
        f"ALE_VERIFIER_IMAGE={image}\nALE_SITE_ADDRESS=localhost\nALE_SITE_BIND=127.0.0.1\n"
        f"ALE_SITE_HTTPS_PORT={https}\nALE_SITE_HTTP_PORT={http}\nALE_VERIFY_PUBLIC_URL=https://localhost:{https}\n"
        "ALE_SITE_EXPORT_EVERY=0.5\nALE_VERIFY_WORKERS=1\n"
    )
    s = Site(folder, project, f"https://localhost:{https}", http, folder / "root.crt", recipient, env, built)
    try:
        t = time.monotonic()
        _up(s)
        timings.append(f"up {time.monotonic() - t:.1f} s")
        yield s
    finally:
        t = time.monotonic()
        subprocess.run(["podman-compose", "-p", project, "down", "-v"], cwd=folder, env=env, capture_output=True,
                       timeout=180)  # fmt: skip
        # podman-compose 1.0.3 leaves the project's network behind
        subprocess.run(["podman", "network", "rm", "-f", f"{project}_default"], env=env, capture_output=True)
        subprocess.run(["podman", "rmi", "--force", image], env=env, capture_output=True, timeout=120)
        timings.append(f"down {time.monotonic() - t:.1f} s")
        print("deploy stack timings:", "; ".join(timings))


@attrs.frozen
class Uploaded:
    submission_id: str
    reply: str


@pytest.fixture(scope="module")
def uploaded(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Uploaded:
    """A real run bound to the site's challenge, uploaded through the proxy."""
    token = site.podman(
        "exec", site.container("verifier"), "/usr/bin/python3.11", "-m", "ale_verify.cli", "create-token",
        "--user", "participant",
    ).stdout.strip()  # fmt: skip
    runs = tmp_path_factory.mktemp("runs")
    # The runner trusts the site through Caddy's local CA and nothing else of this machine's.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALE_", "SSL_CERT"))}
    env["SSL_CERT_FILE"] = str(site.ca)
    cli = (sys.executable, "-m", "ale.runner.cli")
    run = subprocess.run(
        [*cli, "run", "cartpole-balance", "--plain", "--agent-time", "30", "--site", site.url, "--token", token,
         "--out", str(runs)],
        cwd=runs, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    bundle = run.stdout.strip().splitlines()[-1]
    submit = subprocess.run(
        [*cli, "submit", bundle, "--site", site.url, "--token", token],
        cwd=runs, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr[-3000:]
    found = re.search(r"/api/v1/submissions/(sub_[0-9a-f]+)", submit.stdout)
    assert found, submit.stdout
    return Uploaded(found.group(1), submit.stdout.strip())


def test_site_serves_the_api_over_tls_from_its_own_ca_with_the_site_key(site: Site) -> None:
    with site.client() as c:
        reply = c.get("/api/v1/submission-key")
        assert reply.json()["recipient"] == site.recipient
        assert reply.headers["strict-transport-security"].startswith("max-age=")
        assert c.get("/healthz").json()["status"] == "ok"
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{site.url}/api/v1/submission-key", timeout=10)  # not a certificate anyone else trusts
    plain = httpx.get(f"http://127.0.0.1:{site.http_port}/", headers={"Host": "localhost"}, timeout=10)
    assert plain.status_code == 308
    assert plain.headers["location"].startswith("https://localhost")


def test_real_bundle_uploaded_through_the_proxy_is_validated_and_reaches_the_board(
    site: Site, uploaded: Uploaded
) -> None:
    assert uploaded.reply.startswith("accepted: level validated"), uploaded.reply
    page = f"submissions/{uploaded.submission_id}.html"

    def on_board() -> bool:
        with site.client() as c:
            return page in c.get("/").text

    _wait("the exporter put the submission on the board", on_board, site.logs, budget=30)
    with site.client() as c:
        assert uploaded.submission_id in c.get(f"/{page}").text
        rows = c.get("/api/v1/leaderboard").json()["rows"]
        assert [r["submission_id"] for r in rows] == [uploaded.submission_id]
        assert c.get("/leaderboard.json").status_code == 200


def test_data_volume_and_ca_survive_down_and_up(site: Site, uploaded: Uploaded) -> None:
    before = site.ca.read_bytes()
    site.compose("down")  # the volumes stay
    _up(site)
    assert site.ca.read_bytes() == before, "Caddy kept its CA (the caddy volume)"
    with site.client() as c:
        reply = c.get(f"/api/v1/submissions/{uploaded.submission_id}")
        assert reply.status_code == 200
        assert reply.json()["level"] == "validated"


def test_site_key_is_mounted_into_the_verifier_alone_and_is_nowhere_in_the_image(site: Site) -> None:
    identity = next(
        line.encode()
        for line in (site.folder / "secrets" / "site-identity.txt").read_text().splitlines()
        if line.startswith("AGE-SECRET-KEY-")
    )
    signing = (site.folder / "secrets" / "signing-key.bin").read_bytes()
    assert len(signing) == 32
    blobs = sorted((site.built.layout / "blobs" / "sha256").iterdir())
    assert len(blobs) == len(layout.layer_paths(site.built.layout)) + 2  # the layers, the config, the manifest
    for blob in blobs:
        data = blob.read_bytes()
        assert identity not in data, f"the site's identity is in {blob.name}"
        assert signing not in data, f"the site's signing key is in {blob.name}"
        assert not AGE_IDENTITY.search(data), f"an age identity is in {blob.name}"
    for service in ("verifier", "exporter", "proxy"):
        shown = "{{range .Mounts}}{{.Source}}>{{.Destination}}>{{.RW}} {{end}}"
        mounts = site.podman("inspect", site.container(service), "--format", shown).stdout.split()
        secret = [m for m in mounts if "/secrets/" in m]
        if service == "verifier":
            assert sorted(m.split(">", 1)[1] for m in secret) == [
                "/run/secrets/signing-key>false",
                "/run/secrets/site-identity>false",
            ]
        else:
            assert secret == [], f"{service} mounts {secret}"
    published = site.podman("port", site.container("verifier"), check=False).stdout.strip()
    assert published == "", f"the verifier is reached through the proxy alone, not {published}"


def test_real_verifier_image_has_provenance_that_checks_against_its_lock(site: Site) -> None:
    """`ale images attest` on the image the stack ran: signed, it passes the verifier's check."""
    key = Ed25519PrivateKey.generate()
    raw = public_raw(key)
    runner = RunnerKey(key_id(raw), base64.b64encode(raw).decode(), "benchmark_team")
    defn = definition.load(ROOT / "images" / "verifier.toml")
    envelope = canonical_json(attest(defn, ROOT, site.built.layout, key))
    lock = lock_document([site.built])["images"]
    checked = provenance.check_lock(lock, {"verifier": envelope}, trusted={runner.key_id: runner}.get)
    p = checked["verifier"].provenance
    assert p.digest == site.built.digest
    assert {d.name for d in p.dependencies if d.kind == "deb"} >= {"caddy", "python3.11"}
    assert {"verify/app.py", "verify/cli.py", "ale/core/provenance.py"} <= {
        d.name for d in p.dependencies if d.kind == "project"
    }
