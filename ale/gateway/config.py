"""The gateway's configuration: one JSON object the harness writes to a descriptor (docs/gateway.md).

Parsed with :func:`ale.core.parse.loads` into frozen classes; anything the contract does not
name, a bad upstream name, an unknown api kind, a URL that is not https (or plain http to a
loopback host), with credentials, a query or a fragment in it, is refused. No error message ever
holds an upstream's ``api_key`` or the placeholder (only field names and the offending URL's
scheme and host are quoted). Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal
from urllib.parse import urlsplit

import attrs

from ale.core.parse import ParseError, loads, non_negative

MAX_CONFIG_BYTES = 1 << 20
API_KINDS = ("openai", "anthropic")
_NAME = re.compile(r"[a-z0-9-]{1,32}")
_LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


class ConfigError(ValueError):
    """A configuration the gateway refuses to start with (the message names the field, never a key)."""


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _name(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    if not _NAME.fullmatch(value):
        raise ValueError("must match [a-z0-9-]{1,32}")


def _secret(_inst: object, _attr: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (not value or len(value) > 4096 or not value.isprintable() or " " in value):
        raise ValueError("must be 1 to 4096 printable characters without spaces")


def _optional_count(_inst: object, attr: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        non_negative(_inst, attr, value)  # type: ignore[arg-type]


@attrs.frozen
class RawUpstream:
    name: str = attrs.field(validator=_name)
    api: Literal["openai", "anthropic"]
    base_url: str
    api_key: str | None = attrs.field(validator=_secret, repr=False)
    ca_file: str | None = None


@attrs.frozen
class Budgets:
    requests: int | None = attrs.field(default=None, validator=_optional_count)
    input_tokens: int | None = attrs.field(default=None, validator=_optional_count)
    output_tokens: int | None = attrs.field(default=None, validator=_optional_count)

    def as_dict(self) -> dict[str, int | None]:
        return {"requests": self.requests, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@attrs.frozen
class RawConfig:
    run_id: str
    placeholder_key: str = attrs.field(validator=_secret, repr=False)  # type: ignore[assignment]
    upstreams: tuple[RawUpstream, ...]
    policy: Literal["open", "closed"]
    budgets: Budgets


@attrs.frozen
class Upstream:
    """One upstream, its URL taken apart: requests to ``/{name}/{rest}`` go to ``{base_path}/{rest}``."""

    name: str
    api: str
    scheme: str
    host: str
    port: int
    base_path: str  # "" or "/v1": no trailing slash
    api_key: str | None = attrs.field(repr=False)
    ca_file: str | None

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "api": self.api, "host": self.host_header}


@attrs.frozen
class Config:
    run_id: str
    placeholder_key: str = attrs.field(repr=False)
    upstreams: tuple[Upstream, ...]
    policy: str
    budgets: Budgets

    def upstream(self, name: str) -> Upstream | None:
        for upstream in self.upstreams:
            if upstream.name == name:
                return upstream
        return None


def parse_config(raw: bytes) -> Config:
    """The configuration in ``raw``, or :class:`ConfigError` saying what is wrong."""
    try:
        config = loads(raw, RawConfig, what="gateway config", max_bytes=MAX_CONFIG_BYTES)
    except ParseError as error:
        raise ConfigError(str(error)) from None
    if not 1 <= len(config.run_id) <= 128:
        raise ConfigError("gateway config: run_id must be 1 to 128 characters")
    if not config.upstreams:
        raise ConfigError("gateway config: upstreams is empty")
    names = [u.name for u in config.upstreams]
    if len(set(names)) != len(names):
        raise ConfigError("gateway config: two upstreams have the same name")
    upstreams = tuple(_upstream(u) for u in config.upstreams)
    if any(u.api_key == config.placeholder_key for u in upstreams):
        raise ConfigError("gateway config: an upstream's api_key equals the placeholder")
    return Config(config.run_id, config.placeholder_key, upstreams, config.policy, config.budgets)


def _upstream(raw: RawUpstream) -> Upstream:
    where = f"gateway config: upstream {raw.name!r}: base_url"
    if len(raw.base_url) > 2048 or not raw.base_url.isprintable():
        raise ConfigError(f"{where} is not a printable URL of at most 2048 characters")
    try:
        url = urlsplit(raw.base_url)
        port = url.port
    except ValueError:
        raise ConfigError(f"{where} is not a URL") from None
    host = url.hostname or ""
    if url.scheme not in ("http", "https") or not host:
        raise ConfigError(f"{where} must be an http(s) URL with a host")
    if url.username is not None or url.password is not None or url.query or url.fragment or "@" in url.netloc:
        raise ConfigError(f"{where} must hold no credentials, query or fragment")
    if url.scheme == "http" and not is_loopback(host):
        raise ConfigError(f"{where}: plain http only to a loopback host, not {host!r} (use https)")
    if raw.ca_file is not None and url.scheme != "https":
        raise ConfigError(f"gateway config: upstream {raw.name!r}: ca_file is for an https base_url")
    if "%" in url.path or "\\" in url.path or any(part in (".", "..") for part in url.path.split("/")):
        raise ConfigError(f"{where} has an escaped or relative path")
    port = port or (443 if url.scheme == "https" else 80)
    return Upstream(raw.name, raw.api, url.scheme, host.lower(), port, url.path.rstrip("/"), raw.api_key, raw.ca_file)
