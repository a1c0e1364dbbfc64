"""``ale images pin``: resolve a definition's wanted packages and wheels into its pinned lists.

Debian: from apt's own package indexes on this machine (``apt-get update`` fetched and
verified them; ``apt-helper cat-file`` decompresses them), only those of the definition's
archives and suites, resolved by :mod:`ale.images.resolve`. Wheels: pip's resolver
(``pip install --dry-run --report``) for the image's interpreter and C library, constrained to
the versions installed in this environment (the versions the test suite runs), each wheel's
URL and SHA-256 from pip's report.

The two pinned lists (``packages = [ ... ]`` in ``[debian]``, ``wheels = [ ... ]`` in
``[python]``) are rewritten in place, one inline table a line; the rest of the file, comments
included, is left as it is.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

from ale.core.parse import ParseError, parse_json
from ale.images import resolve
from ale.images.definition import Debian, Definition, Environment, Python, canonical_name

APT_LISTS = Path("/var/lib/apt/lists")
APT_HELPER = "/usr/lib/apt/apt-helper"
PROJECT_DISTRIBUTION = "ale-robotics"
MAX_REPORT = 64 * 1024 * 1024  # pip's report holds every distribution's metadata


class PinError(RuntimeError):
    """Pinning cannot proceed (no apt index for a suite, pip failed, no block to rewrite)."""


# --- Debian -------------------------------------------------------------------------------------


def _list_prefix(url: str) -> str:
    """apt's file-name prefix for an archive URL: ``deb.debian.org_debian`` for http://deb.debian.org/debian."""
    return re.sub(r"^[a-z]+://", "", url).replace("_", "%5f").replace("/", "_")


def index_files(d: Debian, lists: Path = APT_LISTS) -> list[tuple[str, Path]]:
    """(archive name, apt list file) for each archive and suite of the definition."""
    found: list[tuple[str, Path]] = []
    for archive, url in sorted(d.archives.items()):
        prefix = _list_prefix(url)
        for suite in d.suites:
            files = sorted(lists.glob(f"{prefix}_dists_{suite}_main_binary-amd64_Packages*"))
            found.extend((archive, f) for f in files)
    suites_seen = {f.name.split("_dists_")[1].split("_")[0] for _a, f in found}
    missing = [s for s in d.suites if s not in suites_seen]
    if missing:
        raise PinError(
            f"apt has no index for {', '.join(missing)} from {', '.join(d.archives.values())}: "
            "add them to apt's sources and run apt-get update"
        )
    return found


def _read_index(path: Path) -> str:
    try:
        out = subprocess.run([APT_HELPER, "cat-file", str(path)], check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PinError(f"cannot read apt's index {path}: {exc}") from None
    return out.stdout.decode("utf-8", "replace")


def debian_candidates(d: Debian, lists: Path = APT_LISTS) -> dict[str, resolve.Candidate]:
    """The newest candidate of every package in the definition's archives and suites."""
    cands = []
    for archive, path in index_files(d, lists):
        for fields in resolve.paragraphs(_read_index(path)):
            if (c := resolve.candidate(fields, archive)) is not None:
                cands.append(c)
    return resolve.newest(cands)


def _toml_string(value: str) -> str:
    if any(c in value for c in '"\\\n') or not value.isascii():
        raise PinError(f"{value!r} cannot be written as a plain TOML string")
    return f'"{value}"'


def debian_block(packages: Iterable[resolve.Candidate]) -> str:
    rows = [
        f"  {{ name = {_toml_string(p.name)}, version = {_toml_string(p.version)}, archive = {_toml_string(p.archive)},"
        f" path = {_toml_string(p.path)}, sha256 = {_toml_string(p.sha256)}, size = {p.size} }},"
        for p in packages
    ]
    return "packages = [\n" + "".join(r + "\n" for r in rows) + "]\n"


# --- wheels -------------------------------------------------------------------------------------


def platforms(glibc: str) -> list[str]:
    """The manylinux tags a C library of version ``glibc`` runs, newest first."""
    minor = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{m}_x86_64" for m in range(minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def installed_constraints() -> list[str]:
    """``name==version`` of each distribution installed here, the project itself left out."""
    out = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical_name(name) != PROJECT_DISTRIBUTION:
            out.add(f"{canonical_name(name)}=={dist.version}")
    return sorted(out)


def pip_report(p: Python, constraints: Sequence[str]) -> list[dict[str, object]]:
    """pip's resolution of ``p.want`` for the image's interpreter: its report's ``install`` list."""
    with tempfile.TemporaryDirectory(prefix="ale-pin-") as tmp:
        cfile = Path(tmp) / "constraints.txt"
        cfile.write_text("".join(c + "\n" for c in constraints))
        argv = [
            sys.executable, "-m", "pip", "--isolated", "install", "--quiet", "--dry-run", "--ignore-installed",
            "--only-binary=:all:", "--index-url", "https://pypi.org/simple",
            *(f"--platform={t}" for t in platforms(p.glibc)),
            f"--python-version={p.version}", "--implementation=cp", f"--abi={p.abi}",
            "--target", str(Path(tmp) / "target"), "--report", str(Path(tmp) / "report.json"),
            "-c", str(cfile), *p.want,
        ]  # fmt: skip
        try:
            subprocess.run(argv, check=True, capture_output=True, timeout=900)
        except subprocess.CalledProcessError as exc:
            tail = exc.stderr.decode(errors="replace")[-2000:]
            raise PinError(f"pip could not resolve {list(p.want)}: {tail}") from None
        except (OSError, subprocess.SubprocessError) as exc:
            raise PinError(f"cannot run pip: {exc}") from None
        raw = (Path(tmp) / "report.json").read_bytes()
    try:  # pip's output, but it carries the packages' metadata from the index
        report = parse_json(raw, what="pip's report", max_bytes=MAX_REPORT)
    except ParseError as exc:
        raise PinError(str(exc)) from None
    install = report.get("install") if isinstance(report, dict) else None
    if not isinstance(install, list):
        raise PinError("pip's report has no install list")
    return install


def wheel_rows(install: Sequence[dict[str, object]]) -> list[tuple[str, str, str, str]]:
    """(name, version, url, sha256) from pip's report, sorted by canonical name."""
    rows = []
    for item in install:
        meta, info = item.get("metadata"), item.get("download_info")
        if not isinstance(meta, dict) or not isinstance(info, dict):
            raise PinError(f"pip's report has an entry without metadata or download_info: {item!r:.200}")
        url = str(info.get("url", ""))
        archive = info.get("archive_info")
        hashes = archive.get("hashes", {}) if isinstance(archive, dict) else {}
        sha = hashes.get("sha256", "") if isinstance(hashes, dict) else ""
        if not url.startswith("https://") or not url.endswith(".whl") or not sha:
            raise PinError(f"{meta.get('name')}: pip chose {url!r}, not a hash-pinned https wheel")
        rows.append((canonical_name(str(meta["name"])), str(meta["version"]), url, str(sha)))
    return sorted(rows)


def wheel_block(rows: Iterable[tuple[str, str, str, str]]) -> str:
    lines = [
        f"  {{ name = {_toml_string(n)}, version = {_toml_string(v)}, url = {_toml_string(u)},"
        f" sha256 = {_toml_string(s)} }},"
        for n, v, u, s in rows
    ]
    return "wheels = [\n" + "".join(line + "\n" for line in lines) + "]\n"


# --- rewriting ----------------------------------------------------------------------------------


def replace_block(text: str, key: str, block: str, what: str) -> str:
    """``text`` with its one ``key = [`` ... ``]`` block (the closing bracket alone on a line) replaced."""
    pattern = re.compile(rf"^{key} = \[\n(?:.*\n)*?\]\n", re.MULTILINE)
    matches = pattern.findall(text)
    if len(matches) != 1:
        raise PinError(f"{what}: needs exactly one `{key} = [` block ending in a line `]`, found {len(matches)}")
    return pattern.sub(lambda _m: block, text, count=1)


def pin_env(env: Environment, *, constraints: Sequence[str] | None = None) -> str:
    """The environment file's text with its wheels resolved afresh."""
    rows = wheel_rows(pip_report(env.python, installed_constraints() if constraints is None else constraints))
    return replace_block(env.source.read_text(encoding="utf-8"), "wheels", wheel_block(rows), str(env.source))


def pin(defn: Definition, *, lists: Path = APT_LISTS, constraints: Sequence[str] | None = None) -> str:
    """The definition file's text with both pinned lists resolved afresh."""
    chosen = resolve.resolve(debian_candidates(defn.debian, lists), defn.debian.want, defn.debian.exclude)
    rows = wheel_rows(pip_report(defn.python, installed_constraints() if constraints is None else constraints))
    text = defn.source.read_text(encoding="utf-8")
    text = replace_block(text, "packages", debian_block(chosen), str(defn.source))
    return replace_block(text, "wheels", wheel_block(rows), str(defn.source))
