"""Resolving a definition's wanted Debian packages into a closed, pinned set (pure: no I/O).

``ale images pin`` hands this the paragraphs of apt's package indexes; it returns every package
the wanted ones need (``Pre-Depends`` and ``Depends``, never ``Recommends``), each at the newest
version the indexes offer, with its pool path and SHA-256. Alternatives (``a | b``) take the
first that is already chosen, else the first that exists; a virtual package takes a provider
already chosen, else the first by name. Names in the definition's ``exclude`` count as present
without being installed (``debconf``: nothing in an image runs maintainer scripts).

Versions compare as dpkg compares them (:func:`compare_versions`, Debian Policy 5.6.12).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass


class ResolveError(ValueError):
    """The wanted packages cannot be satisfied from the indexes (the message says which)."""


# --- versions -----------------------------------------------------------------------------------


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_lexical(x: str, y: str) -> int:
    for i in range(max(len(x), len(y))):
        ox = _order(x[i]) if i < len(x) else 0
        oy = _order(y[i]) if i < len(y) else 0
        if ox != oy:
            return ox - oy
    return 0


def _run(s: str, digits: bool) -> tuple[str, str]:
    """The leading run of digits (or of non-digits) of ``s``, and the rest."""
    i = 0
    while i < len(s) and s[i].isdigit() == digits:
        i += 1
    return s[:i], s[i:]


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternating non-digit runs (compared by :func:`_order`) and digit runs
    (compared as numbers)."""
    while a or b:
        na, a = _run(a, digits=False)
        nb, b = _run(b, digits=False)
        if c := _compare_lexical(na, nb):
            return c
        da, a = _run(a, digits=True)
        db, b = _run(b, digits=True)
        if c := int(da or "0") - int(db or "0"):
            return c
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, _, rest = version.rpartition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    try:
        return int(epoch or "0"), upstream, revision
    except ValueError:
        raise ResolveError(f"{version!r} is not a Debian version") from None


def compare_versions(a: str, b: str) -> int:
    """Negative, zero or positive as ``a`` is older than, the same as or newer than ``b``."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)


_RELATIONS = {
    "<<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    "=": lambda c: c == 0,
    ">=": lambda c: c >= 0,
    ">>": lambda c: c > 0,
    "<": lambda c: c <= 0,  # obsolete forms, as dpkg reads them
    ">": lambda c: c >= 0,
}


# --- indexes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    name: str
    version: str
    archive: str
    path: str
    sha256: str
    size: int
    depends: str  # Pre-Depends and Depends, joined
    provides: tuple[tuple[str, str], ...]  # (virtual name, version or "")


def paragraphs(text: str) -> Iterator[dict[str, str]]:
    """The fields of each paragraph of a Packages file (continuation lines joined)."""
    fields: dict[str, str] = {}
    key = ""
    for line in text.split("\n"):
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, ""
        elif line[0] in " \t":
            if key:
                fields[key] += "\n" + line.strip()
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    if fields:
        yield fields


_PROVIDE = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]+)(?::\S+)?\s*(?:\(\s*=\s*([^)\s]+)\s*\))?\s*$")


def candidate(fields: Mapping[str, str], archive: str) -> Candidate | None:
    """The candidate a Packages paragraph describes, or None when it lacks what a pin needs."""
    try:
        name, version, path, sha = fields["Package"], fields["Version"], fields["Filename"], fields["SHA256"]
        size = int(fields["Size"])
    except (KeyError, ValueError):
        return None
    provides = []
    for item in fields.get("Provides", "").split(","):
        if m := _PROVIDE.match(item):
            provides.append((m.group(1), m.group(2) or ""))
    depends = ", ".join(v for v in (fields.get("Pre-Depends", ""), fields.get("Depends", "")) if v)
    return Candidate(name, version, archive, path, sha, size, depends, tuple(provides))


def newest(candidates: Iterable[Candidate]) -> dict[str, Candidate]:
    """The newest version of each package name (the first seen wins a tie)."""
    best: dict[str, Candidate] = {}
    for c in candidates:
        old = best.get(c.name)
        if old is None or compare_versions(c.version, old.version) > 0:
            best[c.name] = c
    return best


# --- relations ----------------------------------------------------------------------------------

_ALTERNATIVE = re.compile(
    r"^\s*([a-z0-9][a-z0-9+.-]+)(?::[a-z0-9-]+)?\s*(?:\(\s*(<<|<=|=|>=|>>|<|>)\s*([0-9A-Za-z.+~:-]+)\s*\))?"
    r"\s*(?:\[[^\]]*\])?\s*(?:<[^>]*>\s*)*$"
)


@dataclass(frozen=True)
class Alternative:
    name: str
    relation: str  # "" when any version does
    version: str

    def allows(self, version: str) -> bool:
        return not self.relation or _RELATIONS[self.relation](compare_versions(version, self.version))

    def __str__(self) -> str:
        return f"{self.name} ({self.relation} {self.version})" if self.relation else self.name


def relations(field: str, what: str) -> list[list[Alternative]]:
    """A Depends field as groups of alternatives."""
    groups = []
    for group in filter(None, (g.strip() for g in field.split(","))):
        alts = []
        for alt in group.split("|"):
            m = _ALTERNATIVE.match(alt)
            if m is None:
                raise ResolveError(f"{what}: cannot read the relation {alt.strip()!r}")
            alts.append(Alternative(m.group(1), m.group(2) or "", m.group(3) or ""))
        groups.append(alts)
    return groups


# --- resolution ---------------------------------------------------------------------------------


def _provides(p: Candidate, alt: Alternative) -> bool:
    """Whether ``p``'s Provides satisfy ``alt`` (a versioned relation needs a versioned Provides)."""
    return not alt.relation or any(v and alt.allows(v) for n, v in p.provides if n == alt.name)


class _Resolver:
    def __init__(self, index: Mapping[str, Candidate], exclude: Sequence[str]) -> None:
        self.index = index
        self.exclude = set(exclude)
        self.chosen: dict[str, Candidate] = {}
        self.providers: dict[str, list[Candidate]] = {}
        for c in sorted(index.values(), key=lambda c: c.name):
            for virtual, _version in c.provides:
                self.providers.setdefault(virtual, []).append(c)

    def _satisfied(self, alt: Alternative) -> bool:
        if alt.name in self.exclude:
            return True
        chosen = self.chosen.get(alt.name)
        if chosen is not None and alt.allows(chosen.version):
            return True
        return any(p.name in self.chosen and _provides(p, alt) for p in self.providers.get(alt.name, ()))

    def _pick(self, alts: list[Alternative], why: str) -> Candidate:
        for alt in alts:
            c = self.index.get(alt.name)
            if c is not None and alt.allows(c.version):
                return c
        for alt in alts:
            for p in self.providers.get(alt.name, ()):
                if _provides(p, alt):
                    return p
        raise ResolveError(f"{why} needs {' | '.join(map(str, alts))}, which no index offers")

    def add(self, wanted: Sequence[Candidate]) -> None:
        """Choose ``wanted`` first (a wanted provider then satisfies a virtual dependency), then
        everything they need."""
        for c in wanted:
            self.chosen.setdefault(c.name, c)
        todo = [(c, "the definition") for c in reversed(wanted)]
        walked: set[str] = set()
        while todo:
            pkg, reason = todo.pop()
            if pkg.name in walked:
                continue
            walked.add(pkg.name)
            for alts in relations(pkg.depends, pkg.name):
                if any(self._satisfied(a) for a in alts):
                    continue
                picked = self._pick(alts, f"{pkg.name} (wanted by {reason})")
                self.chosen[picked.name] = picked
                todo.append((picked, pkg.name))


def resolve(index: Mapping[str, Candidate], want: Sequence[str], exclude: Sequence[str] = ()) -> list[Candidate]:
    """Every package ``want`` needs, sorted by name. ``want`` items are names or ``name=version``."""
    r = _Resolver(index, exclude)
    wanted = []
    for item in want:
        name, _, version = item.partition("=")
        c = index.get(name)
        if c is None:
            raise ResolveError(f"wanted package {name!r} is in no index")
        if version and c.version != version:
            raise ResolveError(f"wanted {name}={version}, but the indexes offer {c.version}")
        wanted.append(c)
    r.add(wanted)
    return [r.chosen[n] for n in sorted(r.chosen)]
