"""``ale-verify``: make the site's keys, serve the API, check a bundle offline, manage users."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ale_verify import __version__
from ale_verify.config import Settings
from ale_verify.db import JOB_OFFSET_MAX, JOB_PAGE_DEFAULT, JOB_PAGE_MAX, JUDGE_JOB_STATES

if TYPE_CHECKING:
    from ale.core.verify import RunnerKey

N = TypeVar("N", int, float)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def cmd_keygen(args: argparse.Namespace, settings: Settings) -> int:
    """The site's age identity (0600) and the token-signing key; prints the public key only."""
    import pyrage

    if settings.key_file.exists():
        print(f"ale-verify: error: {settings.key_file} exists; refusing to overwrite a site key", file=sys.stderr)
        return 2
    identity = pyrage.x25519.Identity.generate()
    public = str(identity.to_public())
    _write_private(settings.key_file, f"# ALE Robotics site identity\n# public key: {public}\n{identity}\n".encode())
    if not settings.signing_key_file.exists():
        _write_private(settings.signing_key_file, secrets.token_bytes(32))
    print(public)
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from ale_verify.app import create_app

    for path in (settings.key_file, settings.signing_key_file):
        if not path.exists():
            print(f"ale-verify: error: {path} is missing: run `ale-verify keygen` first", file=sys.stderr)
            return 2
    if args.workers is not None:
        import attrs

        settings = attrs.evolve(settings, workers=args.workers)
    config = Config()
    config.bind = [args.bind]
    config.accesslog = "-" if args.access_log else None
    config.errorlog = "-"
    app = create_app(settings)
    ready = {"event": "ready", "bind": args.bind, "version": __version__, "workers": settings.workers}
    print(json.dumps(ready), flush=True)
    asyncio.run(serve(app, config))
    return 0


def _registered_runners(settings: Settings) -> Callable[[str], RunnerKey | None] | None:
    """The registered, active runner keys of this verifier's database; None when it has none."""
    from ale_verify import db

    if not db.exists(settings.database):
        return None
    from ale_verify.pipeline import registered_runner

    return registered_runner(settings)


def cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    """The site's checks, offline: a signature must name a key registered in this verifier's
    database (when it has one) or given with --runner-public-key."""
    from ale.runner.inspect import inspect_bundle
    from ale_verify.judging import judge_keys

    registered = _registered_runners(settings)
    return inspect_bundle(
        Path(args.bundle),
        Path(args.identity or settings.key_file),
        as_json=args.json,
        runner_keys=args.runner_public_key,
        registered=registered,
        prog="ale-verify",
        judge_keys=judge_keys(settings),
    )


def cmd_check_provenance(args: argparse.Namespace, settings: Settings) -> int:
    """The images' provenance statements against a lock: signed by a registered runner key."""
    from ale.core.provenance import ProvenanceError
    from ale_verify import provenance

    registered = _registered_runners(settings)
    try:
        trusted = provenance.lookup(provenance.given_keys(args.runner_public_key), registered)
        report = provenance.check_files(
            Path(args.lock), Path(args.statements), trusted, allow_unsigned=args.allow_unsigned
        )
    except provenance.ProvenanceInputError as exc:
        print(f"ale-verify: error: {exc}", file=sys.stderr)
        return 2
    except ProvenanceError as exc:
        print(f"ale-verify: provenance refused ({exc.reason}): {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"images": report}, indent=2, sort_keys=True))
        return 0
    for name, entry in report.items():
        signer = entry["signed_by"]
        by = f"signed by runner key {signer['key_id']} ({signer['kind']})" if signer else "unsigned"
        print(f"{name} {entry['digest']}: provenance matches the lock, {by}")
    return 0


def cmd_register_provenance(args: argparse.Namespace, settings: Settings) -> int:
    """Register the images' provenance statements (docs/verifier.md, "Image provenance"): each
    signed by a registered, active runner key, for an image an installed release's lock holds."""
    from ale.core.provenance import ProvenanceError
    from ale.runner.inspect import installed_releases
    from ale_verify import provenance

    if settings.provenance_dir is None:  # pragma: no cover - from_env always sets it
        print("ale-verify: error: no folder for provenance statements (ALE_VERIFY_PROVENANCE_DIR)", file=sys.stderr)
        return 2
    registered = _registered_runners(settings)
    releases = list(installed_releases().values())
    status = 0
    for name in args.statements:
        try:
            raw = provenance.read_statement(Path(name))
        except provenance.ProvenanceInputError as exc:
            print(f"ale-verify: error: {exc}", file=sys.stderr)
            status = 2
            continue
        try:
            done = provenance.register(
                raw, settings.provenance_dir, releases, registered if registered is not None else lambda _k: None
            )
        except ProvenanceError as exc:
            print(f"ale-verify: {name}: provenance refused ({exc.reason}): {exc.message}", file=sys.stderr)
            status = max(status, 1)
            continue
        print(
            f"registered {done.name} {done.digest} (release {done.release}), signed by runner key "
            f"{done.signer.key_id} ({done.signer.kind})"
        )
    return status


def cmd_create_token(args: argparse.Namespace, settings: Settings) -> int:
    from ale_verify import db

    db.migrate(settings.database)
    db.upsert_user(settings.database, args.user, args.user, "local")
    print(db.create_api_token(settings.database, args.user, args.label))
    return 0


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from ale_verify import db

    print(f"schema version {db.migrate(settings.database)}")
    return 0


def cmd_export_site(args: argparse.Namespace, settings: Settings) -> int:
    """The static leaderboard: plain files for a CDN, rendered from the database (docs/leaderboard-export.md)."""
    from ale_verify import export

    docs = Path(args.docs) if args.docs else export.default_docs_dir()

    def run_export() -> export.ExportReport:
        # it keeps no connection open (export.read_rows): nothing of it looks like a commit to --every
        return export.export_site(
            settings.database, Path(args.dir), docs_dir=docs, page_size=args.page_size, top_n=args.top_n,
            jobs=args.jobs,
        )  # fmt: skip

    def say(report: export.ExportReport) -> None:
        print(json.dumps({"event": "exported", "dir": str(report.directory), "files": report.files,
                          "pages": report.pages, "bytes": report.bytes, "submissions": report.submissions,
                          "ranked": report.ranked, "unchanged": report.unchanged,
                          "docs": str(docs) if docs else None}), flush=True)  # fmt: skip

    try:
        if args.every is None:
            say(run_export())
            return 0
        from ale_verify import export_watch

        export_watch.watch(
            run_export, lambda: export_watch.database_state(settings.database), args.every,
            stop=export_watch.stop_on_sigterm(), report=say,
            waiting=lambda: print(json.dumps({"event": "waiting", "database": str(settings.database)}), flush=True),
        )  # fmt: skip
    except export.ExportError as exc:
        print(f"ale-verify: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _bounded(convert: Callable[[str], N], low: N, high: N, unit: str) -> Callable[[str], N]:
    """An argparse type: the argument as ``convert`` reads it, from ``low`` to ``high`` ``unit``."""

    def parse(raw: str) -> N:
        try:
            value = convert(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number of {unit}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{raw!r}: between {low} and {high} {unit}")
        return value

    return parse


_period = _bounded(float, 0.1, 86400, "seconds")
_workers = _bounded(int, 0, 1024, "worker processes")


def cmd_judge_jobs(args: argparse.Namespace, settings: Settings) -> int:
    """The verifier's judge jobs (docs/verifier.md, "Judge jobs"): what the operator endpoint gives."""
    import time

    from ale_verify import db
    from ale_verify._routes_operator import judge_job_listing

    if not db.exists(settings.database):
        print("ale-verify: error: the database does not exist yet (ale-verify migrate makes it)", file=sys.stderr)
        return 2
    listing = judge_job_listing(
        settings.database, state=args.state, limit=args.limit, offset=args.offset, now=time.time()
    )
    if args.json:
        print(json.dumps(listing, indent=2, sort_keys=True))
        return 0
    for line in judge_job_lines(listing):
        print(line)
    return 0


def _when(epoch: float | None) -> str:
    import datetime

    if epoch is None:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def judge_job_lines(listing: dict[str, Any]) -> list[str]:
    """The listing as text: the counts and the oldest pending job's age, a line per job (a failed
    or retried one's last error on it), then where the next page starts."""
    counts = listing["counts"]
    head = "judge jobs: " + ", ".join(f"{counts[name]} {name}" for name in counts)
    if listing["oldest_pending_age_s"] is not None:
        head += (f"; oldest pending queued {_when(listing['oldest_pending_queued_at'])} "
                 f"({listing['oldest_pending_age_s']:.0f} s ago)")  # fmt: skip
    lines = [head]
    for job in listing["jobs"]:
        line = (f"{job['state']:<8} {job['submission_id']} {job['task']} attempts {job['attempts']} "
                f"queued {_when(job['queued_at'])}")  # fmt: skip
        if job["last_error"]:
            line += f" last error: {job['last_error']}"
        lines.append(line)
    first, shown = listing["offset"], len(listing["jobs"])
    which = f" {listing['state']}" if listing["state"] else ""
    span = f"{first + 1}-{first + shown}" if shown else "none"
    tail = f"showing {span} of {listing['total']}{which}"
    if listing["next_offset"] is not None:
        tail += f"; next: --offset {listing['next_offset']}"
    return [*lines, tail]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ale-verify",
        description="The ALE Robotics verifier. Configuration comes from the environment "
        "(ALE_VERIFY_DATA, DATABASE_URL, ALE_VERIFY_KEY_FILE, KEEP_SUBMISSION_BUNDLES, ...; docs/verifier.md).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    keygen = sub.add_parser("keygen", help="make the site's age identity and signing key; print the public key")
    keygen.set_defaults(func=cmd_keygen)
    serve = sub.add_parser("serve", help="serve the API under hypercorn")
    serve.add_argument("--bind", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000)")
    serve.add_argument("--access-log", action="store_true", help="log every request to stdout")
    serve.add_argument(
        "--workers",
        type=_workers,
        metavar="N",
        help="upload worker processes (default: $ALE_VERIFY_WORKERS, else the usable cores; 0: every check "
        "in the server's own process)",
    )
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser("check", help="run the site's checks on a bundle offline (operators, CI)")
    check.add_argument("bundle")
    check.add_argument("--identity", help="age identity file (default: the site's key file)")
    check.add_argument(
        "--runner-public-key",
        action="append",
        default=[],
        metavar="BASE64",
        help="a runner public key to accept besides the database's registered keys (repeatable)",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=cmd_check)
    prov = sub.add_parser(
        "check-provenance", help="check the images' provenance statements against a lock (docs/images.md)"
    )
    prov.add_argument("--lock", required=True, help="the images lock (ale images lock)")
    prov.add_argument(
        "--statements", required=True, metavar="DIR", help="folder of NAME.intoto.json statements (ale images attest)"
    )
    prov.add_argument(
        "--runner-public-key",
        action="append",
        default=[],
        metavar="BASE64",
        help="a runner public key to trust besides the database's registered keys (repeatable)",
    )
    prov.add_argument("--allow-unsigned", action="store_true", help="accept statements outside a DSSE envelope")
    prov.add_argument("--json", action="store_true", help="print the report as JSON")
    prov.set_defaults(func=cmd_check_provenance)
    register = sub.add_parser(
        "register-provenance",
        help="register the images' signed provenance statements, checked against the installed releases' locks",
    )
    register.add_argument(
        "statements", nargs="+", metavar="STATEMENT", help="NAME.intoto.json as ale images attest --key writes it"
    )
    register.set_defaults(func=cmd_register_provenance)
    token = sub.add_parser("create-token", help="create a local user's API token (for CI and bootstrapping)")
    token.add_argument("--user", required=True, help="user id, e.g. ci or operator:alice")
    token.add_argument("--label", default="created with ale-verify create-token")
    token.set_defaults(func=cmd_create_token)
    migrate = sub.add_parser("migrate", help="create or upgrade the database")
    migrate.set_defaults(func=cmd_migrate)
    site = sub.add_parser("export-site", help="render the static leaderboard into DIR (plain files for a CDN)")
    site.add_argument("dir", help="the site's folder (replaced; only if empty or a previous export)")
    site.add_argument("--docs", help="markdown docs to render under docs/ (default: the checkout's docs/)")
    site.add_argument(
        "--page-size", type=_bounded(int, 1, 10_000, "rows"), default=100, help="rows per board page (default 100)"
    )
    site.add_argument(
        "--top-n", type=_bounded(int, 1, 1000, "agents"), default=10, help="agents in the Top-N chart (default 10)"
    )
    site.add_argument(
        "--jobs",
        type=_bounded(int, 1, 64, "worker processes"),
        default=None,
        help="worker processes for the pages, 1 to 64 (default: the CPUs, up to 8)",
    )
    site.add_argument(
        "--every",
        type=_period,
        metavar="SECONDS",
        help="keep running: export again whenever the database changed, looking every SECONDS (deploy/compose.yaml)",
    )
    site.set_defaults(func=cmd_export_site)
    jobs = sub.add_parser("judge-jobs", help="list the verifier's judge jobs: counts, the oldest pending, one page")
    jobs.add_argument("--state", choices=JUDGE_JOB_STATES, help="only the jobs in this state (default: all)")
    jobs.add_argument(
        "--limit",
        type=_bounded(int, 1, JOB_PAGE_MAX, "jobs"),
        default=JOB_PAGE_DEFAULT,
        help=f"jobs in the page (default {JOB_PAGE_DEFAULT}, at most {JOB_PAGE_MAX})",
    )
    jobs.add_argument(
        "--offset", type=_bounded(int, 0, JOB_OFFSET_MAX, "jobs"), default=0, help="jobs skipped, in queue order"
    )
    jobs.add_argument("--json", action="store_true", help="print the listing as the operator endpoint gives it")
    jobs.set_defaults(func=cmd_judge_jobs)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ale_verify import db

    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"ale-verify: error: {exc}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args, settings))
    except db.Unavailable as exc:  # one line, never a traceback, never a password
        print(f"ale-verify: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
