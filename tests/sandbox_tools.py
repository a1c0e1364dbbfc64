"""What the sandbox tests need of the machine, and the rule for when it is missing.

The isolation tests (test_seccomp.py, test_cgroups.py) that speak only the runtime interface run
against every backend of the conformance suite (:func:`backends`); a backend that attests a
facility as missing is skipped for it with the reason.

A developer's machine without bubblewrap, libseccomp or writable cgroups skips these tests with
the reason; CI (``ALE_SITE_TOOLS_REQUIRED=1``, set by ``.ci/run``, which installs them) fails
instead, so a CI run can never pass by skipping the isolation tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

from ale.runner.runtime import RuntimeUnavailable


def tools_required() -> bool:
    return os.environ.get("ALE_SITE_TOOLS_REQUIRED") == "1"


def missing(reason: str) -> None:
    """Skip (a developer's machine) or fail (CI) because ``reason``."""
    if tools_required():
        pytest.fail(f"required in CI (ALE_SITE_TOOLS_REQUIRED=1): {reason}")
    pytest.skip(reason)


def bwrap_unavailable() -> str | None:
    """None when bubblewrap can create the sandbox's namespaces here, else why not."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-net", "--ro-bind", "/", "/", "--", "true"], capture_output=True)
    return None if probe.returncode == 0 else f"bwrap cannot create namespaces here: {probe.stderr!r}"


def need_bwrap() -> None:
    reason = bwrap_unavailable()
    if reason is not None:
        missing(reason)


def need_facilities(runtime: Any, *names: str) -> None:
    """Skip (or fail in CI) unless the runtime attests each isolation facility as in force."""
    described = runtime.attestation().get("isolation", {})
    for name in names:
        entry = described.get(name)
        if entry is None:
            missing(f"{runtime.name}: attests no {name!r} facility")
        elif not entry["in_force"]:
            missing(f"{runtime.name}: {name}: {entry['reason']}")


def backends() -> list[Any]:
    """The runtime backends of the conformance suite: one per registered name (tests/test_runtime_conformance.py)."""
    from test_runtime_conformance import RUNTIMES

    return list(RUNTIMES)


def make_runtime(backend: Any, *facilities: str) -> Any:
    """A checked runtime of ``backend`` with ``facilities`` in force (else skip, or fail in CI)."""
    reason = backend.unavailable()
    if reason is not None:
        missing(f"{backend.id}: {reason}")
    runtime = backend.make()
    try:
        runtime.check()
    except RuntimeUnavailable as exc:
        missing(f"{backend.id}: {exc}")
    need_facilities(runtime, *facilities)
    return runtime
