"""What a run is asked to do: the agent and the run's options (light to import, so that the CLI
can check its arguments and prestart the evaluator before the harness's code loads)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ale.core.release import ReleaseManifest
from ale.runner.runtime import Limits

if TYPE_CHECKING:
    from ale.runner.gateway_proc import Upstream


#: ``--jobs`` above this is this (no run has as many tasks; the figure stays a safe JSON integer)
MAX_JOBS = 1024


@attrs.frozen
class RetryPolicy:
    """How a failed start (a gateway, an evaluator, a sandbox: ale.runner.retry) is tried again: at
    most ``attempts`` starts; before attempt n+1 a wait of ``base_s * 2**(n-1)``, at most ``max_s``."""

    attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    base_s: float = attrs.field(default=1.0, validator=attrs.validators.ge(0))
    max_s: float = attrs.field(default=8.0, validator=attrs.validators.ge(0))

    def backoff_s(self, failed: int) -> float:
        """The wait after the ``failed``-th failed attempt (1-based)."""
        return float(min(self.max_s, self.base_s * 2 ** (failed - 1)))


@attrs.frozen
class AgentSpec:
    name: str
    command: tuple[str, ...]
    declared: dict[str, Any] = attrs.Factory(dict)  # model, effort tier: submitter-declared
    modules: tuple[str, ...] = ()  # ale modules of a bundled agent, put into its environment (agent_env)
    packages: tuple[str, ...] = ()  # installed distributions put into its environment (--agent-package)


@attrs.frozen
class JudgeOptions:
    """The faithfulness judge (``ale run --judge-model``, docs/judge.md); keys never in its repr."""

    model: str
    base_url: str  # an OpenAI-compatible endpoint's base URL (its /chat/completions is asked)
    api_key: str | None = attrs.field(default=None, repr=False)
    signing_key: Any = attrs.field(default=None, repr=False)  # an Ed25519 judge key: sign the verdicts
    timeout_s: float = 300.0
    key_env: str | None = None  # the variable its key was read from (a resumed run reads it again)


@attrs.frozen
class RunOptions:
    tasks: tuple[str, ...]
    agent: AgentSpec
    release: ReleaseManifest
    release_sha256: str
    release_name: str
    episodes: int | None = None  # override the official episode count (marks the run unofficial)
    agent_time_s: float | None = None  # override the wall-time budget
    eval_time_s: float | None = None
    limits: Limits = attrs.Factory(Limits)
    nonce: str | None = None
    challenge_token: str | None = None
    workdir: Path | None = None
    upstreams: tuple[Upstream, ...] = ()  # the LLM gateway's (none: the run has no network at all)
    judge: JudgeOptions | None = None
    jobs: int = attrs.field(default=1, validator=attrs.validators.ge(1))  # tasks side by side, at most (schedule)
    retry: RetryPolicy = attrs.Factory(RetryPolicy)  # starts of gateways, evaluators and sandboxes (retry)
    #: where the run's state folder goes (``ale run --out``; ale.runner.state); None: inside the run's
    #: own folder, gone with it (the run cannot be resumed)
    state_parent: Path | None = None
    resume: str | None = None  # the run id to continue (its state folder under state_parent)
    release_source: bytes = b""  # the release manifest's bytes as read (kept in the state folder)
    site_recipient: str | None = None  # ale run --site: the site's submission key (kept in the state folder)
