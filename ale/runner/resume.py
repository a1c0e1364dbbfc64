"""What a run's state folder keeps of its options (run.json's ``options``), so that ``ale run
--resume RUN`` continues the very run: the same tasks, agent, release, episode and time overrides,
limits, challenge, LLM upstreams and judge. No key is kept: an upstream's key is read again from
the variable it came from (``key_var``), the judge's from its own, when the run resumes. ``jobs``
may differ in a resumed run; nothing else may.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ale.core.parse import ParseError, Scalar, converter, structure
from ale.runner.options import AgentSpec, JudgeOptions, RunOptions
from ale.runner.runtime import Limits

#: members a resumed run may change
FREE = frozenset({"jobs"})


@attrs.frozen
class AgentDoc:
    name: str
    command: tuple[str, ...]
    declared: dict[str, Scalar]
    modules: tuple[str, ...]
    packages: tuple[str, ...]


@attrs.frozen
class ReleaseDoc:
    name: str
    sha256: str
    manifest: str | None  # the manifest's text as the run read it (None: the installed release of that name)


@attrs.frozen
class UpstreamDoc:
    name: str
    api: str
    base_url: str
    ca_file: str | None
    key_var: str | None
    source: str


@attrs.frozen
class JudgeDoc:
    model: str
    base_url: str
    key_env: str | None
    timeout_s: float


@attrs.frozen
class OptionsDoc:
    tasks: tuple[str, ...]
    agent: AgentDoc
    release: ReleaseDoc
    episodes: int | None
    agent_time_s: float | None
    eval_time_s: float | None
    limits: Limits
    nonce: str | None
    challenge_token: str | None
    site_recipient: str | None
    upstreams: tuple[UpstreamDoc, ...]
    judge: JudgeDoc | None
    runtime: str
    jobs: int


def options_document(options: RunOptions, runtime: str) -> dict[str, Any]:
    """run.json's ``options`` for a run of ``options`` on the runtime named ``runtime``."""
    a, j = options.agent, options.judge
    doc = OptionsDoc(
        tasks=tuple(options.tasks),
        agent=AgentDoc(a.name, tuple(a.command), dict(a.declared), tuple(a.modules), tuple(a.packages)),
        release=ReleaseDoc(
            options.release_name,
            options.release_sha256,
            options.release_source.decode("utf-8", "replace") if options.release_source else None,
        ),
        episodes=options.episodes,
        agent_time_s=options.agent_time_s,
        eval_time_s=options.eval_time_s,
        limits=options.limits,
        nonce=options.nonce,
        challenge_token=options.challenge_token,
        site_recipient=options.site_recipient,
        upstreams=tuple(
            UpstreamDoc(u.name, u.api, u.base_url, u.ca_file, u.key_var, u.source) for u in options.upstreams
        ),
        judge=None if j is None else JudgeDoc(j.model, j.base_url, j.key_env, j.timeout_s),
        runtime=runtime,
        jobs=options.jobs,
    )
    return converter.unstructure(doc)  # type: ignore[no-any-return]


def differences(kept: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The members (but the free ones) in which two options documents differ."""
    names = sorted((set(kept) | set(now)) - FREE)
    return [name for name in names if _comparable(name, kept.get(name)) != _comparable(name, now.get(name))]


def _comparable(name: str, value: Any) -> Any:
    if name == "release" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "manifest"}  # its digest says it all
    return value


def parse(options: Any) -> OptionsDoc:
    """run.json's ``options`` as the run wrote them (ParseError)."""
    return structure(options, OptionsDoc, what="run.json options")


def restore(doc: OptionsDoc, environ: Mapping[str, str], *, jobs: int | None = None) -> dict[str, Any]:
    """RunOptions' arguments for continuing the run (less its release, state and resume members:
    the caller's), the keys read from ``environ`` where the run read them. ValueError: they cannot be."""
    from ale.runner.gateway_proc import Upstream, check

    upstreams = tuple(
        Upstream(
            name=u.name,
            api=u.api,
            base_url=u.base_url,
            ca_file=u.ca_file,
            source=u.source,
            key_var=u.key_var,
            api_key=(environ.get(u.key_var) or None) if u.key_var else None,
        )
        for u in doc.upstreams
    )
    if upstreams:
        check(upstreams)
    judge = None
    if doc.judge is not None:
        key = (environ.get(doc.judge.key_env) or None) if doc.judge.key_env else None
        judge = JudgeOptions(doc.judge.model, doc.judge.base_url, api_key=key, timeout_s=doc.judge.timeout_s,
                             key_env=doc.judge.key_env)  # fmt: skip
    a = doc.agent
    return {
        "tasks": doc.tasks,
        "agent": AgentSpec(a.name, a.command, dict(a.declared), a.modules, a.packages),
        "episodes": doc.episodes,
        "agent_time_s": doc.agent_time_s,
        "eval_time_s": doc.eval_time_s,
        "limits": doc.limits,
        "nonce": doc.nonce,
        "challenge_token": doc.challenge_token,
        "site_recipient": doc.site_recipient,
        "upstreams": upstreams,
        "judge": judge,
        "jobs": jobs if jobs is not None else doc.jobs,
    }


__all__ = ["OptionsDoc", "ParseError", "differences", "options_document", "parse", "restore"]
