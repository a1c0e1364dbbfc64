"""What of the sandbox's isolation this machine provides, probed once by the local runtime's ``check()``.

Each facility is either in force or missing with a reason; :meth:`Isolation.describe` is what
the bundle manifest records (``runtime.isolation``), so a run on a machine without one says so
instead of running weaker in silence.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import attrs

from ale.runner import seccomp


@attrs.frozen
class Isolation:
    filter: seccomp.Filter | None
    missing: dict[str, str] = attrs.field(factory=dict)  # facility -> why it is not in force

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["seccomp"] = (
            {"in_force": True, **self.filter.describe()}
            if self.filter is not None
            else {"in_force": False, "reason": self.missing["seccomp"]}
        )
        return out


def _probe_seccomp(bwrap: str) -> tuple[seccomp.Filter | None, str]:
    try:
        flt = seccomp.build()
    except seccomp.SeccompUnavailable as exc:
        return None, str(exc)
    fd = seccomp.program_fd(flt)
    try:
        probe = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--seccomp", str(fd), "--", "true"],
            capture_output=True,
            timeout=30,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    if probe.returncode != 0:
        return None, f"bubblewrap could not install the filter: {probe.stderr.decode(errors='replace').strip()}"
    return flt, ""


def probe(bwrap: str = "bwrap") -> Isolation:
    """Probe every facility (after :func:`ale.runner.sandbox.detect` found bubblewrap working)."""
    missing: dict[str, str] = {}
    flt, why = _probe_seccomp(bwrap)
    if flt is None:
        missing["seccomp"] = why
    return Isolation(filter=flt, missing=missing)
