"""Run mypy with the project's configuration and print every path as the real file's path.

mypy names a module it found through a symlink here by the symlink's path
(`import-roots/ale_evaluator/envs.py`); this prints `evaluator/envs.py`, the file an editor
opens. Arguments go to mypy unchanged; the exit status is mypy's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def path_prefixes(roots: Path, cwd: Path) -> list[tuple[str, str]]:
    """(shown, real) path prefixes for every symlinked root, in each form mypy may print."""
    pairs: list[tuple[str, str]] = []
    for link in sorted(roots.iterdir()):
        if not link.is_symlink():
            continue
        shown, real = link.absolute(), link.resolve()
        pairs.append((f"{shown}{os.sep}", f"{real}{os.sep}"))
        if shown.is_relative_to(cwd):  # mypy prints paths under the working folder relative to it
            pairs.append((f"{os.path.relpath(shown, cwd)}{os.sep}", f"{os.path.relpath(real, cwd)}{os.sep}"))
    return pairs


def real_paths(text: str, prefixes: list[tuple[str, str]]) -> str:
    """`text` with each line that starts with a shown prefix starting with its real one."""
    out = []
    for line in text.splitlines(keepends=True):
        for shown, real in prefixes:
            if line.startswith(shown):
                line = real + line[len(shown) :]
                break
        out.append(line)
    return "".join(out)


def main(argv: list[str]) -> int:
    from mypy import api

    stdout, stderr, status = api.run(argv)
    prefixes = path_prefixes(HERE, Path.cwd())
    sys.stdout.write(real_paths(stdout, prefixes))
    sys.stderr.write(real_paths(stderr, prefixes))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
