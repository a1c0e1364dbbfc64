"""The agent's own Python environment (ale/runner/agent_env.py): what goes in, how it is built and cached.

What the agent then sees of it from inside a sandbox is tests/test_agent_view.py.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

import ale
from ale.runner import agent_env
from ale.runner.agent_env import AgentEnvError

PACKAGE = Path(ale.__file__).resolve().parent
CLIENT_MODULES = {
    "ale",
    "ale.client",
    "ale.client._remote",
    "ale.client._rpc",
    "ale.client.sb3",
    "ale.core",
    "ale.core.parse",
    "ale.env",
    "ale.env.v1",
    "ale.env.v1.env_pb2",
    "ale.env.v1.env_pb2_grpc",
    "ale.policy",
    "ale.protocol",
    "ale._relay",  # the relay to the gateway socket a runtime starts before the command
}
VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _site(env: agent_env.AgentEnv) -> Path:
    return env.root / f"lib/python{VERSION}/site-packages"


def _names(plan: agent_env._Plan) -> set[str]:
    return {d.split("==")[0].lower().replace("_", "-") for d in plan.distributions}


# --- what goes in ---------------------------------------------------------------------------------


def test_the_client_closure_is_the_client_library_and_nothing_of_the_harness() -> None:
    modules, external = agent_env.ale_closure(agent_env.CLIENT_MODULES)
    assert set(modules) == CLIENT_MODULES
    assert {name.split(".")[0] for name in external} == {
        "attrs",
        "cattrs",
        "google",
        "grpc",
        "gymnasium",
        "numpy",
        "orjson",
        "safetensors",
    }


def test_the_distributions_are_the_clients_requirements_without_extras() -> None:
    """gymnasium is installed with its mujoco extra (the evaluator's); the client needs none of it."""
    names = _names(agent_env.plan())
    assert names == {
        "attrs",
        "cattrs",
        "cloudpickle",
        "farama-notifications",
        "grpcio",
        "gymnasium",
        "numpy",
        "orjson",
        "protobuf",
        "safetensors",
        "typing-extensions",
    }
    assert not names & {"mujoco", "trio", "quart", "pyrage", "ale-robotics", "pip", "packaging"}


def _fake_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "ale"
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return package


def test_closure_follows_relative_and_nested_imports_but_not_type_checking_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "from . import b\nfrom .c import name\n",
            "a/b.py": """
                from typing import TYPE_CHECKING
                import numpy.linalg
                if TYPE_CHECKING:
                    from ale import secret
                else:
                    import ale.shown
                def later():
                    try:
                        from ..d import thing
                    finally:
                        pass
                """,
            "a/c.py": "name = 1\n",
            "d.py": "thing = 2\n",
            "shown.py": "",
            "secret.py": "raise SystemExit('never imported by the agent')\n",
            "unrelated.py": "",
        },
    )
    monkeypatch.setattr(agent_env, "_package_root", lambda: package)
    modules, external = agent_env.ale_closure(["ale.a"])
    assert set(modules) == {"ale", "ale.a", "ale.a.b", "ale.a.c", "ale.d", "ale.shown"}
    assert external == {"numpy.linalg"}


def test_closure_leaves_out_distributions_imported_only_under_except_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import guarded by ``except ImportError`` (or ModuleNotFoundError, alone or in a tuple) is
    optional: an ale module it names is still bundled, another distribution is not required."""
    package = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": """
                import numpy
                try:
                    import torch.nn
                    from ale import helper
                except ImportError:
                    torch = None
                try:
                    from stable_baselines3 import PPO
                except (ValueError, ModuleNotFoundError):
                    PPO = None
                try:
                    import required_one
                except ValueError:
                    pass
                try:
                    pass
                except ImportError:
                    import fallback_needed
                """,
            "helper.py": "import scipy\n",
        },
    )
    monkeypatch.setattr(agent_env, "_package_root", lambda: package)
    modules, external = agent_env.ale_closure(["ale.a"])
    assert set(modules) == {"ale", "ale.a", "ale.helper"}
    assert external == {"numpy", "scipy", "required_one", "fallback_needed"}


@pytest.mark.parametrize("name", ["os", "ale.nonexistent", "alex.client", ""])
def test_a_module_that_is_not_in_the_ale_package_is_refused(name: str) -> None:
    with pytest.raises(AgentEnvError, match="ale package"):
        agent_env.plan((name,))


# --- distributions ------------------------------------------------------------------------------------


def _fake_dist(site: Path, name: str, requires: list[str], files: list[str], *, version: str = "1.0") -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    meta = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    for rel in files:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x = 1\n")
    rows = [f"{rel},sha256=x,6" for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


def test_requirements_with_extras_or_false_markers_are_left_out(fake_site: Path) -> None:
    _fake_dist(
        fake_site,
        "fakea",
        ["fakeb>=1", 'fakec; extra == "gpu"', 'faked; python_version < "3"', "fakee[fast]"],
        ["fakea/__init__.py", "fakea/sub/mod.py"],
    )
    _fake_dist(fake_site, "fakeb", [], ["fakeb.py"])
    _fake_dist(fake_site, "fakee", ['fakef; extra == "fast"'], ["fakee/__init__.py"])
    _fake_dist(fake_site, "fakef", [], ["fakef/__init__.py"])
    found = agent_env.distribution_closure({"fakea.sub.mod"})
    assert [d.name for d in found] == ["fakea", "fakeb", "fakee", "fakef"]  # fakef: through fakee[fast]


def test_a_missing_requirement_is_a_clear_error(fake_site: Path) -> None:
    _fake_dist(fake_site, "fakeg", ["fakemissing"], ["fakeg/__init__.py"])
    with pytest.raises(AgentEnvError, match=r"fakemissing.*not installed"):
        agent_env.distribution_closure({"fakeg"})


def test_an_import_no_distribution_provides_is_a_clear_error(fake_site: Path) -> None:
    with pytest.raises(AgentEnvError, match=r"no installed distribution provides 'fakenothing\.sub'"):
        agent_env.distribution_closure({"fakenothing.sub"})


def test_an_unreadable_requirement_is_a_clear_error(fake_site: Path) -> None:
    _fake_dist(fake_site, "fakeh", ["!!! not a requirement"], ["fakeh/__init__.py"])
    with pytest.raises(AgentEnvError, match="fakeh has an unreadable requirement"):
        agent_env.distribution_closure({"fakeh"})


def test_an_editable_distribution_is_refused(fake_site: Path) -> None:
    _fake_dist(fake_site, "fakei", [], ["fakei/__init__.py", "__editable___fakei_1_0_finder.py"])
    (found,) = agent_env.distribution_closure({"fakei"})
    with pytest.raises(AgentEnvError, match="fakei is an editable install"):
        list(agent_env._dist_files(found))


def test_an_agent_package_brings_its_distribution_and_what_it_requires(fake_site: Path) -> None:
    """``--agent-package``: a named distribution (with its extras) and its requirements join the
    client's; nothing imports it, so it is found by its name."""
    _fake_dist(fake_site, "fakesdk", ["fakehttp>=1", 'fakeextra; extra == "fast"'], ["fakesdk/__init__.py"])
    _fake_dist(fake_site, "fakehttp", [], ["fakehttp/__init__.py"])
    _fake_dist(fake_site, "fakeextra", [], ["fakeextra/__init__.py"])
    assert [d.name for d in agent_env.distribution_closure(set(), ["fakesdk"])] == ["fakehttp", "fakesdk"]
    found = agent_env.distribution_closure(set(), ["FakeSDK[fast]"])
    assert [d.name for d in found] == ["fakeextra", "fakehttp", "fakesdk"]


@pytest.mark.parametrize(
    ("package", "message"),
    [
        ("fakesdk==1.0", "name a distribution"),
        ("fakesdk; python_version > '3'", "name a distribution"),
        ("fakesdk @ https://example.invalid/x.whl", "name a distribution"),
        ("ale-robotics", "the project itself"),
        ("ale_verify", "the project itself"),
        ("not a name!", "not a distribution name"),
        ("fakenotinstalled", "'fakenotinstalled', which is not installed"),
    ],
)
def test_an_agent_package_that_is_not_a_plain_installed_name_is_refused(
    fake_site: Path, package: str, message: str
) -> None:
    _fake_dist(fake_site, "fakesdk", [], ["fakesdk/__init__.py"])
    with pytest.raises(AgentEnvError, match=re.escape(message)):
        agent_env.plan(packages=[package])


def test_the_real_sdks_come_with_their_requirements_and_the_digest_changes() -> None:
    """The openai and anthropic SDKs (the dev extra installs both) make an environment of their own."""
    plain = agent_env.plan()
    sdks = agent_env.plan(packages=["openai", "anthropic"])
    assert {"openai", "anthropic", "pydantic", "anyio"} <= {n.split("==")[0].lower() for n in sdks.distributions}
    assert set(plain.distributions) < set(sdks.distributions)
    assert sdks.digest != plain.digest
    assert "ale-robotics" not in {n.split("==")[0].lower() for n in sdks.distributions}


def test_files_outside_site_packages_and_host_paths_stay_out(fake_site: Path) -> None:
    _fake_dist(fake_site, "fakej", [], ["fakej/__init__.py"])
    info = fake_site / "fakej-1.0.dist-info"
    (info / "direct_url.json").write_text('{"url": "file:///home/someone/src/fakej", "dir_info": {}}')
    with open(info / "RECORD", "a") as fh:
        fh.write("../../../bin/fakej,,\nfakej-1.0.dist-info/direct_url.json,,\nfakej/gone.py,,\n")
    (found,) = agent_env.distribution_closure({"fakej"})
    rels = sorted(rel for rel, _path, _st in agent_env._dist_files(found))
    assert rels == ["fakej-1.0.dist-info/METADATA", "fakej-1.0.dist-info/RECORD", "fakej/__init__.py"]


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(st.text(max_size=60), max_size=30))
def test_fuzz_record_rows_give_module_names_or_nothing(rows: list[str]) -> None:
    """Any RECORD text: the module names come out as dotted names, never an exception."""
    for name in agent_env._module_names(row.rsplit(",", 2)[0] for row in rows):
        assert isinstance(name, str)
        assert name.count(".") <= 2


# --- the interpreter --------------------------------------------------------------------------------


def test_the_interpreter_shows_its_standard_library_and_hides_the_base_site_packages() -> None:
    interp = agent_env.interpreter()
    assert interp.version == VERSION
    assert os.path.isfile(interp.executable)
    assert os.access(interp.executable, os.X_OK)
    visible = (*agent_env.SYSTEM_TREES, *interp.binds)
    assert agent_env._under(os.path.realpath(os.path.dirname(os.__file__)), visible)
    for folder in {os.path.realpath(p) for p in __import__("site").getsitepackages([sys.base_prefix])}:
        if os.path.isdir(folder) and agent_env._under(folder, visible):
            assert agent_env._under(folder, interp.hidden), folder
    assert not any(agent_env._under(str(PACKAGE), [b]) for b in interp.binds)


def test_project_code_inside_a_visible_tree_is_hidden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A project installed into a system prefix (say /usr/local/lib/python3.X/site-packages/ale)
    would show through the /usr bind: an empty folder goes over it."""
    system = tmp_path / "usr"
    installed = system / "lib" / "site" / "ale"
    installed.mkdir(parents=True)
    monkeypatch.setattr(agent_env, "SYSTEM_TREES", (*agent_env.SYSTEM_TREES, str(system)))
    monkeypatch.setattr(agent_env, "_project_folders", lambda: [str(installed)])
    assert str(installed) in agent_env.interpreter().hidden


def test_an_interpreter_inside_a_hidden_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout that holds the interpreter (a Python built inside it): hiding the checkout would
    hide the standard library too, so the environment cannot be made."""
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    monkeypatch.setattr(agent_env, "_project_folders", lambda: [os.path.dirname(stdlib)])
    with pytest.raises(AgentEnvError, match="lies inside"):
        agent_env.interpreter()


# --- building and caching -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> agent_env.AgentEnv:
    return agent_env.ensure(cache_dir=tmp_path_factory.mktemp("cache") / "agent-env")


def test_the_environment_is_a_venv_of_the_host_interpreter(built: agent_env.AgentEnv) -> None:
    interp = built.interpreter
    assert os.readlink(built.root / "bin" / "python3") == interp.executable
    assert os.readlink(built.root / "bin" / "python") == "python3"
    cfg = (built.root / "pyvenv.cfg").read_text()
    assert f"home = {os.path.dirname(interp.executable)}\n" in cfg
    assert "include-system-site-packages = false\n" in cfg
    assert built.root.name == built.digest
    assert sorted(os.listdir(built.empty)) == []
    assert stat.S_IMODE(built.empty.stat().st_mode) == 0o555


def test_the_site_packages_holds_the_closure_and_nothing_else(built: agent_env.AgentEnv) -> None:
    site = _site(built)
    ale_modules = {
        p.relative_to(site).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        for p in (site / "ale").rglob("*.py")
    }
    assert ale_modules == CLIENT_MODULES
    tops = {p.name for p in site.iterdir()}
    assert {"ale", "numpy", "grpc", "gymnasium", "google", "typing_extensions.py"} <= tops
    assert not tops & {"mujoco", "trio", "quart", "pip", "ale_evaluator", "ale_verify", "_virtualenv.py"}
    assert not list(site.glob("*.pth")), "no path configuration files: nothing outside the environment is added"
    assert not list(site.glob("ale_robotics*")), "the project's own metadata (its editable finder) stays out"


def test_distribution_files_are_hard_links_and_ale_files_copies(built: agent_env.AgentEnv) -> None:
    import numpy

    site = _site(built)
    host_numpy = Path(numpy.__file__)
    if host_numpy.stat().st_dev == site.stat().st_dev:
        assert (site / "numpy" / "__init__.py").stat().st_ino == host_numpy.stat().st_ino
    ours = site / "ale" / "client" / "_remote.py"
    assert ours.stat().st_ino != (PACKAGE / "client" / "_remote.py").stat().st_ino
    assert ours.read_bytes() == (PACKAGE / "client" / "_remote.py").read_bytes()
    assert (site / "ale" / "client" / "__pycache__").is_dir(), "compiled at build time: the sandbox cannot"


def test_everything_is_readable_by_any_uid(built: agent_env.AgentEnv) -> None:
    """The sandbox runs as an unprivileged uid of its own; the environment must not need the owner's."""
    for folder, dirs, files in os.walk(built.root):
        for name in dirs:
            mode = os.stat(os.path.join(folder, name)).st_mode
            assert mode & 0o005 == 0o005, os.path.join(folder, name)
        for name in files:
            path = os.path.join(folder, name)
            assert os.stat(path).st_mode & 0o004, path


def test_the_digest_is_stable_and_the_environment_reused(built: agent_env.AgentEnv) -> None:
    again = agent_env.ensure(cache_dir=built.root.parent)
    assert again.root == built.root
    assert agent_env.plan().digest == built.digest


def test_a_changed_client_module_is_a_new_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "ale"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(agent_env, "_package_root", lambda: package)
    before = agent_env.plan().digest
    (package / "protocol.py").write_text((package / "protocol.py").read_text() + "\n# changed\n")
    after = agent_env.plan().digest
    assert before != after
    (package / "runner" / "harness.py").write_text("# the harness is not in the environment\n")
    assert agent_env.plan().digest == after


def test_a_concurrent_build_never_shows_half_an_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four runs start on a machine without the environment at once: each builds in its own
    temporary folder; one rename wins, the others use its result; no temporary folder is left."""
    cache = tmp_path / "agent-env"
    real_build = agent_env._build
    barrier = threading.Barrier(4, timeout=60)

    def build_together(p: agent_env._Plan, final: Path) -> None:
        barrier.wait()  # every thread has seen no environment and starts its own build
        real_build(p, final)

    monkeypatch.setattr(agent_env, "_build", build_together)
    results: list[agent_env.AgentEnv] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(agent_env.ensure(cache_dir=cache))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert len(results) == 4
    assert len({r.root for r in results}) == 1
    assert sorted(os.listdir(cache)) == [results[0].digest]
    assert (results[0].root / "pyvenv.cfg").is_file()


def test_old_builds_and_unused_environments_are_removed(built: agent_env.AgentEnv, tmp_path: Path) -> None:
    cache = tmp_path / "agent-env"
    cache.mkdir()
    old, recent = time.time() - 40 * 24 * 3600, time.time() - 3600
    crashed, unused, in_use, other = cache / ".build-abc-x", cache / ("a" * 64), cache / ("b" * 64), cache / "notes"
    for folder, when in ((crashed, old), (unused, old), (in_use, recent), (other, old)):
        folder.mkdir()
        os.utime(folder, (when, when))
    env = agent_env.ensure(cache_dir=cache)
    assert sorted(os.listdir(cache)) == sorted([env.digest, in_use.name, other.name])


def test_another_filesystem_gets_copies(tmp_path: Path) -> None:
    """Hard links cannot cross filesystems: the files are copied (readable by anyone) instead."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == Path(agent_env.__file__).stat().st_dev:
        pytest.skip("no second filesystem (/dev/shm) on this machine")
    cache = Path(os.path.join(shm, f"ale-agent-env-test-{os.getpid()}"))
    try:
        env = agent_env.ensure(cache_dir=cache)
        import numpy

        ours = _site(env) / "numpy" / "__init__.py"
        assert ours.read_bytes() == Path(numpy.__file__).read_bytes()
        assert ours.stat().st_nlink == 1
        assert ours.stat().st_mode & 0o004
    finally:
        agent_env._remove(cache) if cache.exists() else None


def test_a_cache_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another uid")
    cache = tmp_path / "theirs"
    cache.mkdir()
    os.chown(cache, 65534, 65534)
    with pytest.raises(AgentEnvError, match="belongs to uid 65534"):
        agent_env.ensure(cache_dir=cache)


def test_an_unwritable_cache_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(AgentEnvError, match="cannot build the agent's environment in"):
        agent_env.ensure(cache_dir=blocker / "agent-env")


def test_the_default_cache_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert agent_env.default_cache_dir() == tmp_path / "ale" / "agent-env"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert agent_env.default_cache_dir() == tmp_path / "home" / ".cache" / "ale" / "agent-env"


def test_the_interpreter_imports_the_client_from_the_environment_alone(built: agent_env.AgentEnv) -> None:
    """Outside any sandbox: the environment's python3 finds the client in its own site-packages and
    nothing of the host's (the sandbox test checks the same behind bubblewrap)."""
    code = (
        "import sys, ale.client, ale.policy, ale\n"
        "print(ale.__file__)\n"
        "for m in ('ale.runner', 'ale.agents', 'trio', 'ale_evaluator'):\n"
        "    try:\n"
        "        __import__(m)\n"
        "        print('IMPORTED', m)\n"
        "    except ImportError:\n"
        "        pass\n"
    )
    proc = subprocess.run(
        [str(built.root / "bin" / "python3"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={},
        cwd=built.root,  # not the checkout: -c puts the working folder first on sys.path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(_site(built) / "ale" / "__init__.py")]


def test_closures_in_many_threads_at_once_do_not_break_the_parser() -> None:
    """CPython 3.11's ast.parse raised SystemError ("AST constructor recursion depth mismatch")
    when another thread parsed while it was building its tree (a garbage collection running a
    finalizer that switches threads is enough): the closure's parsing is serialised."""

    class Switches:
        """Cyclic garbage whose finalizer lets another thread run, wherever the collector runs it."""

        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            time.sleep(0)

    errors: list[BaseException] = []
    barrier = threading.Barrier(8, timeout=60)

    def run() -> None:
        barrier.wait()
        for _ in range(10):
            try:
                _ = [Switches() for _ in range(3)]
                agent_env.ale_closure(agent_env.CLIENT_MODULES)
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=run) for _ in range(8)]
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # collect at nearly every allocation: inside the parser too
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()
    assert errors == []


def test_the_contract_lists_the_environments_distributions_and_modules() -> None:
    """docs/agent-contract.md names what the environment holds: it must say what the code builds."""
    text = " ".join((PACKAGE.parent / "docs" / "agent-contract.md").read_text().split())
    listed = re.search(r"installed: today (.*?)\. No `pip`", text)
    assert listed, "the contract's list of distributions is gone"
    names = {n.lower().replace("_", "-") for n in re.findall(r"`([A-Za-z0-9_.-]+)`", listed.group(1))}
    assert names - {"mujoco"} == _names(agent_env.plan())
    private = {"ale.client._remote", "ale.client._rpc", "ale.env", "ale.env.v1.env_pb2", "ale.env.v1.env_pb2_grpc"}
    for module in CLIENT_MODULES - private:
        assert f"`{module}`" in text, module
