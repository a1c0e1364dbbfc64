"""flake.nix and flake.lock, checked as far as a machine without Nix's caches can: the flake parses;
the lock pins one real nixpkgs revision (the one docs/images.md names, in the form Nix writes);
`nix flake metadata --offline` reads it unchanged; the images the flake builds are described by
the same documents `ale images show` prints (same .debs, wheels and hashes: one definition); and
every output evaluates against a stand-in for nixpkgs that records what the flake asks of it.

Building needs nixpkgs' sources and caches, which these machines cannot reach:
scripts/verify-repro does that on a machine with network (docs/images.md, "Checking a rebuild").
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sandbox_tools import missing

from ale.core.parse import parse_json
from ale.images import definition
from ale.images.attest import describe

ROOT = Path(__file__).resolve().parents[1]
NIX_ENV = {"NIX_CONFIG": "experimental-features = nix-command flakes\nwarn-dirty = false"}
FLAKE_REF = f"git+file://{ROOT}"  # the tracked files, as a Nix user's checkout gives them


def _nix(*argv: str) -> subprocess.CompletedProcess[str]:
    if not (ROOT / ".git").exists():
        missing(f"{ROOT} is not a git checkout: Nix would copy the whole folder, .venv included")
    exe = shutil.which(argv[0])
    if exe is None:
        missing(f"{argv[0]} is not installed (apt-get install nix-bin)")
    return subprocess.run(
        [exe, *argv[1:]], capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **NIX_ENV}
    )


def _ok(r: subprocess.CompletedProcess[str]) -> str:
    if r.returncode != 0 and ("Permission denied" in r.stderr or "cannot connect to socket" in r.stderr):
        missing(f"nix cannot use its store here: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stderr
    return r.stdout


def _lock() -> dict[str, Any]:
    doc = parse_json((ROOT / "flake.lock").read_bytes(), what="flake.lock")
    assert isinstance(doc, dict)
    return doc


def test_flake_nix_parses() -> None:
    _ok(_nix("nix-instantiate", "--parse", str(ROOT / "flake.nix")))


def test_flake_lock_pins_one_full_nixpkgs_revision_as_nix_writes_it() -> None:
    lock = _lock()
    assert lock["version"] == 7
    assert lock["root"] == "root"
    assert lock["nodes"]["root"] == {"inputs": {"nixpkgs": "nixpkgs"}}
    node = lock["nodes"]["nixpkgs"]
    locked, original = node["locked"], node["original"]
    assert set(locked) == {"lastModified", "narHash", "owner", "repo", "rev", "type"}
    assert (locked["type"], locked["owner"], locked["repo"]) == ("github", "NixOS", "nixpkgs")
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"]), "a full commit, not a branch"
    assert locked["narHash"].startswith("sha256-")
    assert len(base64.b64decode(locked["narHash"][7:], validate=True)) == 32
    assert isinstance(locked["lastModified"], int)
    flake = (ROOT / "flake.nix").read_text()
    url = re.search(r'inputs\.nixpkgs\.url = "github:NixOS/nixpkgs/([^"]+)";', flake)
    assert url is not None
    assert original == {"owner": "NixOS", "ref": url.group(1), "repo": "nixpkgs", "type": "github"}


def test_the_pinned_revision_is_the_one_the_docs_cite() -> None:
    """docs/images.md names where rev and narHash were taken from; the lock must hold those values."""
    locked = _lock()["nodes"]["nixpkgs"]["locked"]
    doc = (ROOT / "docs" / "images.md").read_text()
    assert locked["rev"] in doc
    assert locked["narHash"] in doc


def test_flake_metadata_reads_the_lock_offline_and_unchanged() -> None:
    out = _ok(_nix("nix", "flake", "metadata", "--offline", "--no-update-lock-file", "--json", FLAKE_REF))
    meta = json.loads(out)
    assert meta["locks"]["nodes"]["nixpkgs"] == _lock()["nodes"]["nixpkgs"]


def test_flake_describes_each_image_as_the_builder_does() -> None:
    """The Nix build fetches exactly what `ale images build` fetches, from one definition."""
    out = _ok(_nix("nix", "eval", "--offline", "--no-update-lock-file", "--json", f"{FLAKE_REF}#lib.imageDescriptions"))
    from_nix = json.loads(out)
    found = definition.find(ROOT / "images")
    assert set(from_nix) == set(found)
    for name, path in found.items():
        assert from_nix[name] == describe(definition.load(path)), name


# --- every output, evaluated against a stand-in for nixpkgs -------------------------------------

STUB = r"""
{
  outputs = { self }:
    let
      store = "/nix/store/00000000000000000000000000000000";
      drv = name: args: { type = "stub"; outPath = "${store}-${name}"; inherit name args; };
      call = kind: args: drv (args.name or args.pname or kind) (args // { _kind = kind; });
      pythonPkgs = {
        buildPythonPackage = call "buildPythonPackage";
        buildPythonApplication = call "buildPythonApplication";
        setuptools = drv "setuptools" { };
        wheel = drv "wheel" { };
        pip = drv "pip" { };
      };
      python311 = (drv "python3.11" { }) // {
        pkgs = pythonPkgs;
        interpreter = "${store}-python3.11/bin/python3.11";
        sitePackages = "lib/python3.11/site-packages";
      };
      pkgs = {
        inherit python311;
        lib = {
          concatStringsSep = builtins.concatStringsSep;
          makeBinPath = ps: builtins.concatStringsSep ":" (map (p: "${p}/bin") ps);
          makeLibraryPath = ps: builtins.concatStringsSep ":" (map (p: "${p}/lib") ps);
        };
        runCommand = name: env: script: drv name { inherit env script; _kind = "runCommand"; };
        linkFarm = name: entries: drv name { inherit entries; _kind = "linkFarm"; };
        fetchurl = args:
          drv (args.name or (baseNameOf (args.url or (builtins.head args.urls)))) (args // { _kind = "fetchurl"; });
        mkShell = call "mkShell";
        stdenv = { mkDerivation = call "mkDerivation"; cc.cc.lib = drv "gcc-lib" { }; };
        rustPlatform = {
          importCargoLock = args: drv "cargo-vendor" (args // { _kind = "importCargoLock"; });
          cargoSetupHook = drv "cargoSetupHook" { };
          maturinBuildHook = drv "maturinBuildHook" { };
        };
        autoPatchelfHook = drv "autoPatchelfHook" { };
        xorg.libX11 = drv "libX11" { };
      } // builtins.listToAttrs (map (n: { name = n; value = drv n { }; })
        [ "zlib" "libGL" "bubblewrap" "age" "zstd" "libseccomp" "git" "skopeo" "podman" ]);
    in { legacyPackages.x86_64-linux = pkgs; };
}
"""


@pytest.fixture(scope="module")
def flake_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    stub = tmp_path_factory.mktemp("nixpkgs-stub")
    (stub / "flake.nix").write_text(STUB)
    attrs = {
        "packages": "packages.x86_64-linux",
        "apps": "apps.x86_64-linux",
        "checks": "checks.x86_64-linux",
        "devShells": "devShells.x86_64-linux",
    }
    out: dict[str, Any] = {}
    for key, attr in attrs.items():
        r = _nix(
            "nix", "eval", "--offline", "--no-write-lock-file", "--json",
            "--override-input", "nixpkgs", f"path:{stub}", f"{FLAKE_REF}#{attr}",
            "--apply", _APPLY,
        )  # fmt: skip
        out[key] = json.loads(_ok(r))
    return out


# Reduce each output to plain data: a stub derivation's arguments without its outPath (through
# which builtins.toJSON would print the path alone), functions as a marker.
_APPLY = """
let
  clean = v:
    if builtins.isAttrs v then
      (if v ? outPath && !(v ? type && v.type == "stub") then { outPath = v.outPath; }
       else builtins.mapAttrs (_: clean) (builtins.removeAttrs v [ "pkgs" "outPath" ]))
    else if builtins.isList v then map clean v
    else if builtins.isFunction v then "<function>"
    else v;
in clean
"""


def _sha_set(d: definition.Definition) -> set[str]:
    return {p.sha256 for p in d.debian.packages} | {w.sha256 for w in d.python.wheels}


@pytest.mark.parametrize("name", ["evaluator", "agent-base", "verifier"])
def test_flake_image_package_fetches_every_pin_and_runs_the_builder(flake_outputs: dict[str, Any], name: str) -> None:
    pkg = flake_outputs["packages"][f"{name}-image"]
    assert pkg["args"]["_kind"] == "runCommand"
    script = pkg["args"]["script"]
    assert f"python3 -m ale.images build {name} " in script
    assert "--offline --epoch 0" in script
    farm = re.search(r"--cache (/nix/store/\S+)", script)
    assert farm is not None
    assert farm.group(1).endswith(f"ale-image-{name}-downloads")
    d = definition.load(ROOT / "images" / f"{name}.toml")
    farm = flake_outputs["packages"][f"{name}-downloads"]["args"]
    assert farm["_kind"] == "linkFarm"
    entries = {e["name"]: e["path"]["args"] for e in farm["entries"]}
    assert set(entries) == {f"sha256/{sha}" for sha in _sha_set(d)}
    described = describe(d)
    for deb in described["debs"]:
        assert entries[f"sha256/{deb['sha256']}"]["urls"] == deb["urls"]
    for wheel in described["wheels"]:
        assert entries[f"sha256/{wheel['sha256']}"]["url"] == wheel["url"]
    assert all(e["sha256"] == key[7:] for key, e in entries.items())


def test_flake_ale_package_uses_the_pinned_wheels_and_pyrage_from_source(flake_outputs: dict[str, Any]) -> None:
    env = definition.load_env(ROOT / "images" / "env" / "ale.toml")
    ale = flake_outputs["packages"]["ale"]["args"]
    assert ale["_kind"] == "buildPythonApplication"
    assert ale["dependencies"][0]["name"] == "pyrage"
    pyrage = flake_outputs["packages"]["pyrage"]["args"]
    assert pyrage["src"]["args"]["sha256"] == env.from_source[0].sha256
    assert pyrage["cargoDeps"]["args"]["_kind"] == "importCargoLock"
    wrapper = " ".join(ale["makeWrapperArgs"])
    assert "ale-wheels/lib/python3.11/site-packages" in wrapper
    assert flake_outputs["apps"]["ale"]["program"].endswith("-ale-robotics/bin/ale")


def test_flake_checks_build_each_image_twice(flake_outputs: dict[str, Any]) -> None:
    checks = flake_outputs["checks"]
    for name in ("evaluator", "agent-base", "verifier"):
        script = checks[f"{name}-image-reproducible"]["args"]["script"]
        assert "for run in one two" in script
        assert 'cmp "$TMPDIR/one.digest" "$TMPDIR/two.digest"' in script
    assert "ale-runs" in checks
    assert flake_outputs["devShells"]["default"]["args"]["_kind"] == "mkShell"


# --- the ale package's environment --------------------------------------------------------------


def test_ale_environment_wants_exactly_the_projects_dependencies() -> None:
    env = definition.load_env(ROOT / "images" / "env" / "ale.toml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert list(env.python.want) == project


def test_ale_environment_pins_satisfy_the_projects_requirements() -> None:
    env = definition.load_env(ROOT / "images" / "env" / "ale.toml")
    pinned = {canonicalize_name(w.name): w.version for w in env.python.wheels}
    for raw in env.python.want:
        req = Requirement(raw)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{raw}: no wheel pinned"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{raw}: pinned {pinned[name]}"
    for src in env.from_source:
        assert src.version == pinned[src.name], f"{src.name}: the source release and the wheel differ"


def test_pyrage_cargo_lock_pins_only_registry_crates_with_checksums() -> None:
    """importCargoLock fetches each crate by its checksum; a git dependency would need a hash we do not have."""
    env = definition.load_env(ROOT / "images" / "env" / "ale.toml")
    lock = tomllib.loads((ROOT / "images" / "env" / env.from_source[0].cargo_lock).read_text())
    for pkg in lock["package"]:
        if pkg["name"] == "pyrage":
            continue
        assert pkg.get("source") == "registry+https://github.com/rust-lang/crates.io-index", pkg["name"]
        assert re.fullmatch(r"[0-9a-f]{64}", pkg.get("checksum", "")), pkg["name"]


def test_verify_repro_script_is_valid_shell_with_help() -> None:
    script = ROOT / "scripts" / "verify-repro"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "nix build" in r.stdout


def test_ci_installs_what_the_image_and_flake_tests_need() -> None:
    """These tests must not skip in CI: .ci/run installs nix-bin, podman, skopeo and runc, points
    CONTAINERS_CONF at a file that selects runc, and sets ALE_SITE_TOOLS_REQUIRED=1."""
    ci = (ROOT / ".ci" / "run").read_text()
    for pkg in ("nix-bin", "podman", "skopeo", "runc"):
        assert re.search(rf"for pkg in .*\b{pkg}\b", ci), pkg
    assert 'export CONTAINERS_CONF="$PWD/.ci/containers.conf"' in ci
    assert "export ALE_SITE_TOOLS_REQUIRED=1" in ci
    conf = tomllib.loads((ROOT / ".ci" / "containers.conf").read_text())
    assert conf["engine"]["runtime"] == "runc"
    assert conf["containers"]["default_ulimits"]
