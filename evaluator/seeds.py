"""Hidden seeds and their commitments.

The evaluator secret is 32 random bytes that never leave the evaluator. The
hidden seed of official episode ``i`` is the first 8 bytes (big-endian, top
bit cleared) of ``HMAC-SHA256(secret, "ale/hidden-seed/v1" 0x00 run_id 0x00
task_id 0x00 decimal(i))``. Each episode record carries only the commitment
``SHA256(seed || run_id || secret)`` with the seed as 8 bytes big-endian and
run_id in UTF-8. Neither the seed nor the secret appears in any reply, log
line or error message.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

import attrs

from ale.core.parse import JsonLimitError, ParseError, parse_json

SECRET_BYTES = 32
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class RunConfigError(ValueError):
    """The run configuration handed over by the harness is unusable."""


@attrs.frozen(repr=False)
class RunConfig:
    """The run id and evaluator secret; its repr never shows the secret."""

    run_id: str
    secret: bytes

    def __attrs_post_init__(self) -> None:
        if not _RUN_ID.fullmatch(self.run_id):
            raise RunConfigError("run_id must be 1-128 characters of [A-Za-z0-9._:-]")
        if len(self.secret) != SECRET_BYTES:
            raise RunConfigError(f"the evaluator secret must be {SECRET_BYTES} bytes")

    def __repr__(self) -> str:
        return f"RunConfig(run_id={self.run_id!r}, secret=<redacted>)"

    @classmethod
    def generate(cls) -> RunConfig:
        """A fresh run id and secret, for an evaluator started without a harness."""
        return cls(run_id="local-" + secrets.token_hex(8), secret=secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def from_json(cls, raw: bytes) -> RunConfig:
        """Parse ``{"run_id": "...", "secret": "<64 hex digits>"}``.

        Error messages never quote the input: it holds the secret.
        """
        try:
            data = parse_json(raw, what="run configuration", max_bytes=4096, max_depth=2)
        except JsonLimitError as exc:
            raise RunConfigError(f"run configuration is past its {exc.limit} limit (4096 bytes, 2 levels)") from None
        except ParseError:  # its message may quote the input
            raise RunConfigError("run configuration is not valid JSON") from None
        if not isinstance(data, dict) or set(data) != {"run_id", "secret"}:
            raise RunConfigError('run configuration must be an object with exactly "run_id" and "secret"')
        run_id, secret_hex = data["run_id"], data["secret"]
        if not isinstance(run_id, str) or not isinstance(secret_hex, str):
            raise RunConfigError("run_id and secret must be strings")
        if not re.fullmatch(r"[0-9a-fA-F]{64}", secret_hex):
            raise RunConfigError("secret must be 64 hexadecimal digits")
        return cls(run_id=run_id, secret=bytes.fromhex(secret_hex))


def hidden_seed(config: RunConfig, task_id: str, episode: int) -> int:
    """The hidden seed of official episode ``episode`` (0-based)."""
    msg = b"\x00".join([b"ale/hidden-seed/v1", config.run_id.encode(), task_id.encode(), str(episode).encode()])
    digest = hmac.new(config.secret, msg, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def commitment(config: RunConfig, seed: int) -> bytes:
    """``SHA256(seed || run_id || secret)``: 32 bytes that bind, but do not reveal, a seed."""
    return hashlib.sha256(seed.to_bytes(8, "big") + config.run_id.encode() + config.secret).digest()
