"""The participant's side of the site API: the submission key, challenges, uploads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx


class SiteError(Exception):
    """The site refused or could not be reached; the message says which and why."""


def _check(reply: httpx.Response, what: str) -> dict[str, Any]:
    try:
        body = reply.json()
    except ValueError:
        body = None
    if reply.status_code >= 400 and not (reply.status_code == 422 and isinstance(body, dict) and "status" in body):
        error = body.get("error", {}) if isinstance(body, dict) else {}
        reason = error.get("reason", f"http_{reply.status_code}")
        raise SiteError(
            f"{what}: the site answered {reply.status_code} ({reason}): {error.get('message', reply.text[:200])}"
        )
    if not isinstance(body, dict):
        raise SiteError(f"{what}: the site's answer is not a JSON object")
    return body


class Site:
    def __init__(self, url: str, token: str | None, *, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def __enter__(self) -> Site:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _call(self, method: str, path: str, what: str, **kw: Any) -> dict[str, Any]:
        try:
            reply = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise SiteError(f"{what}: cannot reach {self.url}: {exc}") from None
        return _check(reply, what)

    def submission_key(self) -> str:
        body = self._call("GET", "/api/v1/submission-key", "fetching the submission key")
        recipient = body.get("recipient")
        if not isinstance(recipient, str) or not recipient.startswith("age1"):
            raise SiteError("the site's submission key is not an age X25519 public key")
        return recipient

    def challenge(self) -> dict[str, Any]:
        body = self._call("POST", "/api/v1/challenges", "requesting a challenge")
        if not all(isinstance(body.get(k), str) for k in ("nonce", "token")):
            raise SiteError("the site's challenge lacks a nonce or token")
        return body

    def submission(self, submission_id: str) -> dict[str, Any]:
        """A submission's public record (``GET /api/v1/submissions/{id}``)."""
        if not submission_id.replace("_", "").replace("-", "").isalnum() or len(submission_id) > 64:
            raise SiteError(f"{submission_id[:80]!r} is not a submission id")
        return self._call("GET", f"/api/v1/submissions/{submission_id}", f"fetching submission {submission_id}")

    def submit(self, bundle: Path) -> dict[str, Any]:
        data = bundle.read_bytes()
        return self._call(
            "POST", "/api/v1/submissions", "uploading the bundle", content=data,
            headers={"Content-Type": "application/octet-stream"},
        )  # fmt: skip
