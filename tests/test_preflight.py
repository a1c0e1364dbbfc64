"""scripts/preflight.sh, `make run`'s first step: a fresh machine gets what the sandbox needs, or one line.

The machine is simulated: PATH holds only the few tools the script uses plus stubs for ``id``,
``apt-get`` and ``bwrap``, so each case (not root, root with apt, apt failing, all present) runs
here without installing anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "preflight.sh"
TOOLS = ("mktemp", "tail", "rm", "cat", "chmod")

BWRAP = "#!/bin/sh\nexit 0\n"
APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$STUB_LOG"
case "$1" in
  update) exit 0 ;;
  install)
    if [ "$STUB_APT_OK" = 1 ]; then
      printf '#!/bin/sh\\nexit 0\\n' > "$STUB_BIN/bwrap"; chmod +x "$STUB_BIN/bwrap"; exit 0
    fi
    echo "E: Unable to locate package bubblewrap" >&2; exit 100 ;;
esac
"""


def _machine(tmp_path: Path, *, uid: int, apt: bool, bwrap: bool) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        os.symlink(shutil.which(tool) or f"/usr/bin/{tool}", bin_dir / tool)
    stubs = {"id": f"#!/bin/sh\necho {uid}\n"}
    if apt:
        stubs["apt-get"] = APT_GET
    if bwrap:
        stubs["bwrap"] = BWRAP
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    env = {"PATH": str(bin_dir), "STUB_LOG": str(log), "STUB_BIN": str(bin_dir), "STUB_APT_OK": "1"}
    return env, log


def _run(env: dict[str, str], python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", str(SCRIPT), python], env=env, capture_output=True, text=True, timeout=60)


def test_a_ready_machine_passes_silently(tmp_path: Path) -> None:
    env, log = _machine(tmp_path, uid=0, apt=True, bwrap=True)
    done = _run(env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert log.read_text() == ""


def test_without_bubblewrap_and_not_root_one_line_says_what_to_install(tmp_path: Path) -> None:
    env, log = _machine(tmp_path, uid=1000, apt=True, bwrap=False)
    done = _run(env)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "make run: the agent's sandbox needs bubblewrap: run 'sudo apt-get install bubblewrap', then make run again"
    ]
    assert "Traceback" not in done.stderr
    assert log.read_text() == ""  # never tries apt-get without root


def test_as_root_it_installs_bubblewrap_with_apt_after_an_update(tmp_path: Path) -> None:
    env, log = _machine(tmp_path, uid=0, apt=True, bwrap=False)
    done = _run(env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["make run: installing bubblewrap (apt-get)"]
    assert log.read_text().splitlines() == [
        "apt-get update -qq",
        "apt-get install -y -qq --no-install-recommends bubblewrap",
    ]


def test_when_apt_fails_one_line_says_so(tmp_path: Path) -> None:
    env, _log = _machine(tmp_path, uid=0, apt=True, bwrap=False)
    env["STUB_APT_OK"] = "0"
    done = _run(env)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "make run: apt-get could not install bubblewrap (E: Unable to locate package bubblewrap); "
        "install it and run make run again"
    )


def test_without_apt_it_names_the_packages(tmp_path: Path) -> None:
    env, _log = _machine(tmp_path, uid=0, apt=False, bwrap=False)
    done = _run(env)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1
    assert "needs bubblewrap" in done.stderr


def test_a_python_without_venv_gets_python3_venv_too(tmp_path: Path) -> None:
    """Debian's python3 cannot make a virtual environment until python3-venv is installed."""
    env, _log = _machine(tmp_path, uid=1000, apt=True, bwrap=False)
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\ncase "$2" in *ensurepip*) exit 1 ;; esac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done = _run(env, str(python))
    assert done.returncode == 1
    assert "needs python3-venv bubblewrap:" in done.stderr
    assert "sudo apt-get install python3-venv bubblewrap" in done.stderr


def test_bubblewrap_that_cannot_make_namespaces_is_one_line(tmp_path: Path) -> None:
    env, _log = _machine(tmp_path, uid=1000, apt=True, bwrap=True)
    (tmp_path / "bin" / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n"
    )
    done = _run(env)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "make run: bubblewrap cannot create the sandbox's namespaces here (bwrap: No permissions to creating new "
        "namespace); on a host that allows user namespaces or as root it can"
    ]


@pytest.mark.parametrize("target", ["run"])
def test_make_run_calls_the_preflight_first(target: str) -> None:
    text = (ROOT / "Makefile").read_text()
    recipe = text.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in recipe.splitlines()[1:]]
    assert lines[0].endswith("scripts/preflight.sh $(PY)"), lines


def test_ale_run_without_bubblewrap_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """What a fresh machine's first `make run` printed: RuntimeUnavailable's traceback."""
    ale = Path(sys.prefix) / "bin" / "ale"
    done = subprocess.run(
        [str(ale), "run", "cartpole-balance", "--plain", "--out", str(tmp_path)],
        env={"PATH": str(tmp_path / "empty"), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "ale: error: the agent's sandbox cannot run on this machine: "
        "bubblewrap is not installed (apt-get install bubblewrap)"
    ]
    assert "Traceback" not in done.stderr
