"""``ale images``: build, pin, show, lock, verify and attest the OCI images ``images/`` defines."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import ale
from ale.images import definition as definitions

DEFAULT_OUT = "out/images"
#: The release whose images lock ``ale images lock`` writes by default: ``ale.catalog.DEFAULT_RELEASE``
#: (ale.catalog needs the project's dependencies; a test holds the two equal).
DEFAULT_RELEASE = "2026.11"
#: What keeps a release's lock current, said when it is not (Makefile: build the images, lock them).
RELOCK = "run `make lock` and commit the lock"


class ImagesCliError(Exception):
    """A problem the user can fix: one line, exit status 2."""


def checkout_root() -> Path:
    """The checkout this ``ale`` runs from (an editable install), where ``images/`` is."""
    root = Path(ale.__file__).resolve().parent.parent
    if not (root / "images").is_dir() or not (root / "pyproject.toml").is_file():
        raise ImagesCliError(f"images are built from a checkout; {root} has no images/ folder (use --source)")
    return root


def _source(args: argparse.Namespace) -> Path:
    return Path(args.source).resolve() if args.source else checkout_root()


def _selected(source: Path, names: list[str]) -> list[definitions.Definition]:
    try:
        found = definitions.find(source / "images")
        unknown = [n for n in names if n not in found]
        if unknown:
            raise ImagesCliError(f"no image definition {unknown[0]!r}; defined: {', '.join(found)}")
        return [definitions.load(found[n]) for n in (names or list(found))]
    except definitions.DefinitionError as exc:
        raise ImagesCliError(str(exc)) from None


def cmd_build(args: argparse.Namespace) -> int:
    from ale.images.build import BuildError, build_image
    from ale.images.fetch import FetchError, default_cache

    source = _source(args)
    out = Path(args.out)
    cache = Path(args.cache) if args.cache else default_cache()
    results = []
    for defn in _selected(source, args.images):
        try:
            built = build_image(defn, source, out / defn.name, cache, offline=args.offline, epoch=args.epoch)
        except (BuildError, FetchError) as exc:
            raise ImagesCliError(str(exc)) from None
        results.append(built)
        print(f"{built.name} {built.digest} {built.layout}")
        print(f"{built.name}: built in {built.seconds:.1f} s", file=sys.stderr)
    if args.json:
        from ale.images.attest import lock_document

        print(json.dumps(lock_document(results), indent=2, sort_keys=True))
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    from ale.images.pin import PinError, pin, pin_env
    from ale.images.resolve import ResolveError

    source = _source(args)
    envs = {p.stem: p for p in sorted((source / "images" / "env").glob("*.toml"))}
    images = [n for n in args.images if n not in envs]
    chosen_envs = [n for n in args.images if n in envs] if args.images else list(envs)
    for defn in _selected(source, images) if images or not args.images else []:
        try:
            text = pin(defn)
        except (PinError, ResolveError) as exc:
            raise ImagesCliError(f"{defn.name}: {exc}") from None
        new = definitions.parse(text.encode("utf-8"), defn.source)
        defn.source.write_text(text, encoding="utf-8")
        print(f"{defn.name}: {len(new.debian.packages)} Debian packages, {len(new.python.wheels)} wheels pinned")
    for name in chosen_envs:
        try:
            env = definitions.load_env(envs[name])
            text = pin_env(env)
            pinned = definitions.parse_env(text.encode("utf-8"), env.source)
        except (definitions.DefinitionError, PinError) as exc:
            raise ImagesCliError(f"{name}: {exc}") from None
        env.source.write_text(text, encoding="utf-8")
        print(f"{name}: {len(pinned.python.wheels)} wheels pinned (environment)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ale.images.attest import describe

    docs = {d.name: describe(d) for d in _selected(_source(args), args.images)}
    print(json.dumps(docs, indent=2, sort_keys=True))
    return 0


def release_lock(source: Path, release: str) -> Path:
    """The images lock the checkout's release manifest ``release`` names (``ale/releases/locks/...``)."""
    path = source / "ale" / "releases" / f"{release}.json"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ImagesCliError(f"cannot read the release manifest {path}: {exc.strerror}") from None
    try:  # the checkout's own file, not input: the standard library reads it
        doc = json.loads(raw) if len(raw) <= 1024 * 1024 else None
    except ValueError:
        doc = None
    name = doc.get("images_lock") if isinstance(doc, dict) else None
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        raise ImagesCliError(f"release {release} ({path}) names no images lock (images_lock)")
    return source / "ale" / "releases" / "locks" / name


def _lock_path(args: argparse.Namespace) -> Path:
    return Path(args.lock) if args.lock else release_lock(_source(args), args.release)


def cmd_lock(args: argparse.Namespace) -> int:
    from ale.images.attest import AttestError, lock_difference, read_lock, read_lock_entries, write_lock

    path = _lock_path(args)
    names = list(args.images)
    if not names and path.is_file():  # relock what the lock holds
        try:
            names = sorted(read_lock(path))
        except AttestError as exc:
            raise ImagesCliError(str(exc)) from None
    try:
        entries = read_lock_entries(Path(args.out), _selected(_source(args), names))
    except AttestError as exc:
        raise ImagesCliError(f"{exc} ({RELOCK})" if args.check else str(exc)) from None
    if args.check:
        difference = lock_difference(path, entries)
        if difference is not None:
            print(f"ale: images lock: {path} is stale: {difference} ({RELOCK})", file=sys.stderr)
            return 1
        print(f"{path} is the built images' lock")
        return 0
    write_lock(path, entries)
    for name, entry in sorted(entries.items()):
        print(f"{name} {entry['digest']}")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from ale.images.attest import AttestError, verify_layouts

    try:
        for name, digest in verify_layouts(_lock_path(args), Path(args.out)):
            print(f"{name} {digest} matches the lock")
    except AttestError as exc:
        print(f"ale: images verify: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_attest(args: argparse.Namespace) -> int:
    """Each built image's provenance (docs/images.md, "Provenance"), signed with --key."""
    from ale.core.canonical import canonical_json
    from ale.core.signing import SignatureError, load_private_key
    from ale.images.attest import AttestError
    from ale.images.provenance import attest

    source, out = _source(args), Path(args.out)
    try:
        key = load_private_key(Path(args.key).read_bytes()) if args.key else None
    except (OSError, SignatureError) as exc:
        raise ImagesCliError(f"--key {args.key}: {getattr(exc, 'strerror', None) or exc}") from None
    for defn in _selected(source, args.images):
        try:
            doc = attest(defn, source, out / defn.name, key)
        except AttestError as exc:
            raise ImagesCliError(str(exc)) from None
        path = out / f"{defn.name}.intoto.json"
        path.write_bytes(canonical_json(doc) + b"\n")
        print(f"{defn.name} {'signed' if key is not None else 'unsigned'} {path}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ale images ...`` to the ``ale`` command's subcommands."""
    images = sub.add_parser("images", help="build and attest the evaluator and agent OCI images (docs/images.md)")
    isub = images.add_subparsers(dest="images_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("images", nargs="*", help="image names (default: every definition in images/)")
        p.add_argument("--source", help="the checkout to build from (default: the one ale runs from)")

    build = isub.add_parser("build", help="build OCI layouts and print each image's manifest digest")
    common(build)
    build.add_argument(
        "--out", default=DEFAULT_OUT, help=f"folder for the layouts, one an image (default {DEFAULT_OUT})"
    )
    build.add_argument("--cache", help="download cache (default $XDG_CACHE_HOME/ale/images)")
    build.add_argument("--offline", action="store_true", help="use only the cache; fetch nothing")
    build.add_argument("--epoch", type=int, help="modification time of every entry (default $SOURCE_DATE_EPOCH or 0)")
    build.add_argument("--json", action="store_true", help="also print the lock entries as JSON")
    build.set_defaults(func=_guarded(cmd_build))

    pin = isub.add_parser("pin", help="resolve the definitions' wanted packages and wheels into their pinned lists")
    common(pin)
    pin.set_defaults(func=_guarded(cmd_pin))

    show = isub.add_parser("show", help="print the definitions as JSON (what flake.nix reads from them)")
    common(show)
    show.set_defaults(func=_guarded(cmd_show))

    def lock_file(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", default=DEFAULT_OUT, help=f"folder of built layouts (default {DEFAULT_OUT})")
        p.add_argument(
            "--release",
            default=DEFAULT_RELEASE,
            help=f"the release whose lock it is: its images_lock in ale/releases/locks/ (default {DEFAULT_RELEASE})",
        )
        p.add_argument("--lock", help="another lock file instead of the release's")

    lock = isub.add_parser("lock", help="write the image digests read from built layouts into a release's lock")
    lock.add_argument(
        "images", nargs="*", help="image names (default: those the lock holds; for a new lock every definition)"
    )
    lock.add_argument("--source", help="the checkout to build from (default: the one ale runs from)")
    lock_file(lock)
    lock.add_argument(
        "--check",
        action="store_true",
        help="write nothing: exit status 1 and one line when the lock is not the built images'",
    )
    lock.set_defaults(func=_guarded(cmd_lock))

    verify = isub.add_parser("verify", help="check built layouts against a lock file's digests")
    verify.add_argument("--source", help="the checkout whose release names the lock (default: the one ale runs from)")
    lock_file(verify)
    verify.set_defaults(func=_guarded(cmd_verify))

    attest = isub.add_parser(
        "attest", help="write each built image's in-toto provenance statement (SLSA v1) beside its layout"
    )
    common(attest)
    attest.add_argument("--out", default=DEFAULT_OUT, help=f"folder of built layouts (default {DEFAULT_OUT})")
    attest.add_argument("--key", help="a runner's Ed25519 private key (PEM): sign each statement (a DSSE envelope)")
    attest.set_defaults(func=_guarded(cmd_attest))


def _guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command`` with a user's error printed as one line, exit status 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ImagesCliError as exc:
            print(f"ale: images {args.images_command}: {exc}", file=sys.stderr)
            return 2

    return run


def main(argv: list[str] | None = None) -> int:
    """``python -m ale.images``: the same subcommands without the rest of ``ale`` (and its
    dependencies), for a bare interpreter such as a Nix build's."""
    parser = argparse.ArgumentParser(prog="python -m ale.images", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["images", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
