"""What the sandbox tests need of the machine, and the rule for when it is missing.

A developer's machine without bubblewrap, libseccomp or writable cgroups skips these tests with
the reason; CI (``ALE_SITE_TOOLS_REQUIRED=1``, set by ``.ci/run``, which installs them) fails
instead, so a CI run can never pass by skipping the isolation tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


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
