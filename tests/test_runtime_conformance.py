"""The runtime conformance suite (ale/runner/conformance.py) against every registered backend this machine has.

The backends are the registry's (:mod:`ale.runner.runtimes`): one :class:`Backend` per registered
name, so a backend joins the suite by being registered. A backend that cannot run here (its
``check()`` raises RuntimeUnavailable) is skipped with the reason on a developer's machine and
fails in CI (``ALE_SITE_TOOLS_REQUIRED=1``, tests/sandbox_tools.py). The isolation tests
(test_seccomp.py, test_cgroups.py, test_agent_view.py) take the same list (``sandbox_tools.backends``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import attrs
import pytest
from oci_images import prepare
from sandbox_tools import missing

from ale.runner import runtimes, supervise
from ale.runner.conformance import RuntimeConformance
from ale.runner.runtime import Runtime, RuntimeUnavailable

ROOT = Path(__file__).resolve().parents[1]


@attrs.frozen
class Backend:
    id: str  # the registry name

    def make(self) -> Runtime:
        prepare(self.id)  # the OCI backends: their images built and locked (tests/oci_images.py)
        return runtimes.make(self.id)

    def unavailable(self) -> str | None:
        """None when this backend can run here, else why not (its check()'s message)."""
        return _unavailable(self.id)


@functools.cache
def _unavailable(name: str) -> str | None:
    if (why := prepare(name)) is not None:
        return why
    try:
        runtimes.make(name).check()
    except RuntimeUnavailable as exc:
        return str(exc)
    return None


RUNTIMES = [Backend(name) for name in runtimes.names()]


class TestRuntimeConformance(RuntimeConformance):
    """The package's suite, once per registered backend."""

    @pytest.fixture(params=RUNTIMES, ids=[b.id for b in RUNTIMES])
    def runtime(self, request: pytest.FixtureRequest) -> Runtime:
        backend: Backend = request.param
        reason = backend.unavailable()
        if reason is not None:
            missing(f"{backend.id}: {reason}")  # skips on a developer's machine, fails in CI
        return backend.make()


# --- the registry ------------------------------------------------------------------------------------


def test_local_is_registered_and_the_default() -> None:
    assert "local" in runtimes.names()
    assert runtimes.DEFAULT == "local"
    from ale.runner.local import LocalRuntime

    assert runtimes.runtime_class("local") is LocalRuntime


@pytest.mark.parametrize("name", runtimes.names())
def test_each_registered_runtime_is_named_as_registered(name: str) -> None:
    """The manifest's runtime.runtime (the attestation's "runtime") is the name ``--runtime`` takes."""
    assert runtimes.runtime_class(name).name == name


@pytest.mark.parametrize("name", ["rkt", "", "LOCAL", "Podman", "docker ", "ale.runner.local:LocalRuntime"])
def test_unknown_runtime_names_the_known_ones(name: str) -> None:
    with pytest.raises(runtimes.UnknownRuntime) as info:
        runtimes.make(name)
    message = str(info.value)
    assert "\n" not in message
    assert repr(name) in message
    assert message.endswith(f"known runtimes: {', '.join(runtimes.names())}")


def test_ci_installs_bubblewrap_and_requires_the_sandbox_tools() -> None:
    """The suite must not skip in CI: .ci/run installs bubblewrap and sets ALE_SITE_TOOLS_REQUIRED=1."""
    ci = (ROOT / ".ci" / "run").read_text()
    install = next(line for line in ci.splitlines() if line.strip().startswith("for pkg in"))
    assert "bubblewrap" in install.split()
    assert "export ALE_SITE_TOOLS_REQUIRED=1" in ci


def _doc_table_names(heading: str) -> set[str]:
    """The backticked first cells of the table under ``heading`` in docs/runtime.md."""
    section = (ROOT / "docs" / "runtime.md").read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return {re.match(r"\| `(\w+)", row).group(1) for row in section.splitlines() if re.match(r"\| `\w+", row)}  # type: ignore[union-attr]


def test_docs_name_every_member_a_backend_implements() -> None:
    """docs/runtime.md's table is exactly the Runtime protocol's members; its backends, the registry's."""
    members = {m for m in vars(Runtime) if not m.startswith("_")} | set(Runtime.__annotations__)
    assert _doc_table_names("What a backend implements") == members
    assert _doc_table_names("Choosing a backend") == set(runtimes.names())
    sandboxed = {m for m in vars(supervise.Sandboxed) | vars(supervise.Killable) if not m.startswith("_")}
    sandboxed |= set(supervise.Sandboxed.__annotations__)
    doc = (ROOT / "docs" / "runtime.md").read_text()
    assert all(f"`{m}" in doc for m in sandboxed), sandboxed
