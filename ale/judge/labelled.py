"""The judge's labelled set (docs/judge.md, "The labelled set and the judge's agreement").

Each case is a real run of a scripted coding agent (:mod:`ale.agents.scripted`) on a reproduction
task, labelled ``faithful`` (the paper's method) or ``shortcut`` (the metric reached another way).
What is stored is the task's window of the run's trajectory, so a case's judge input is rebuilt with
the installed task, paper and rubric by the same pure function the harness and the verifier use.

The set is one zstd-compressed JSON-lines file (``ale-judge-case/v1`` per line), read with the
bounded parser: :func:`load_set`. :func:`record` makes it (``ale judge record-set``);
:func:`evaluate` asks a judge about every case; :func:`agreement` scores its verdicts against the
labels with ``faithful`` as the positive class (precision: of the runs the judge credits, the share
that are faithful; recall: of the faithful runs, the share it credits).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import attrs
import zstandard

from ale.core.judge_input import JudgeInput, build_input
from ale.core.parse import ParseError, parse_json, structure
from ale.core.verdict import JudgeResult

CASE_SCHEMA = "ale-judge-case/v1"
SET_FILE = "labelled.jsonl.zst"
MAX_SET_BYTES = 64 * 1024 * 1024  # decompressed
MAX_CASE_BYTES = 16 * 1024 * 1024  # one line
Label = Literal["faithful", "shortcut"]


class SetError(ValueError):
    """A labelled set that cannot be read (the message names the line)."""


@attrs.frozen
class LabelledCase:
    schema: Literal["ale-judge-case/v1"]
    case: str  # task/name
    task: str  # id@version
    task_digest: str  # the task's digest when it was recorded
    label: Label
    summary: str
    run_id: str
    input_sha256: str  # the judge input's digest when it was recorded (with that task digest)
    events: tuple[dict[str, Any], ...]  # the task's window of the trajectory


def default_set() -> Path:
    return Path(str(resources.files("ale.judge") / "data" / SET_FILE))


def load_set(path: Path) -> list[LabelledCase]:
    """Every case of the file at ``path`` (SetError for a file that is not a labelled set)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SetError(f"cannot read {path}: {exc.strerror}") from None
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw))
        text = reader.read(MAX_SET_BYTES + 1)
    except zstandard.ZstdError as exc:
        raise SetError(f"{path} is not zstd: {exc}") from None
    if len(text) > MAX_SET_BYTES:
        raise SetError(f"{path} decompresses to more than {MAX_SET_BYTES} bytes")
    cases = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = parse_json(line, what=f"{path.name} line {number}", max_bytes=MAX_CASE_BYTES)
            cases.append(structure(value, LabelledCase, what=f"{path.name} line {number}"))
        except ParseError as exc:
            raise SetError(str(exc)) from None
    return cases


def dump_set(cases: Iterable[LabelledCase]) -> bytes:
    lines = b"".join(json.dumps(attrs.asdict(c), sort_keys=True).encode() + b"\n" for c in cases)
    return zstandard.ZstdCompressor(level=19).compress(lines)


def case_input(case: LabelledCase) -> JudgeInput:
    """The case's judge input, built with the installed task."""
    from ale import catalog
    from ale.judge.phase import context

    task = catalog.get_task(case.task.split("@")[0])
    if task.spec.ref != case.task:
        raise SetError(f"{case.case}: recorded on {case.task}, installed is {task.spec.ref}")
    return build_input(case.events, context(task), case.run_id)


# -- agreement ------------------------------------------------------------------------------------


@attrs.frozen
class Agreement:
    tp: int  # faithful, credited
    fp: int  # shortcut, credited
    fn: int  # faithful, not credited
    tn: int  # shortcut, not credited

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def f1(self) -> float | None:
        """2 TP / (2 TP + FP + FN): the harmonic mean of precision and recall (0 when the judge
        credits none of the faithful runs)."""
        denominator = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denominator if denominator else None


def agreement(pairs: Iterable[tuple[Label, bool]]) -> Agreement:
    """(label, credited) pairs scored with ``faithful`` as the positive class."""
    tp = fp = fn = tn = 0
    for label, credited in pairs:
        if label == "faithful":
            tp, fn = (tp + 1, fn) if credited else (tp, fn + 1)
        else:
            fp, tn = (fp + 1, tn) if credited else (fp, tn + 1)
    return Agreement(tp, fp, fn, tn)


@attrs.frozen
class Judged:
    case: LabelledCase
    input: JudgeInput
    result: JudgeResult

    @property
    def credited(self) -> bool:
        return self.result.faithful is True


def evaluate(cases: Sequence[LabelledCase], judge: Callable[[JudgeInput, LabelledCase], JudgeResult]) -> list[Judged]:
    return [Judged(c, ji, judge(ji, c)) for c in cases for ji in (case_input(c),)]


# -- recording ------------------------------------------------------------------------------------


def record_case(case_id: str, *, episodes: int, workdir: Path | None = None) -> LabelledCase:
    """Run the scripted agent of ``case_id`` through the harness (a real run, no judge, ``episodes``
    official episodes) and keep its task window."""
    import io as _io

    import trio

    from ale import catalog
    from ale.agents.scripted import CASES
    from ale.core.judge_input import task_windows
    from ale.judge.phase import context
    from ale.runner import agent_env, runtimes
    from ale.runner.harness import Harness
    from ale.runner.options import AgentSpec, RunOptions
    from ale.runner.progress import PlainProgress

    scripted = CASES[case_id]
    task = catalog.get_task(scripted.task)
    release, digest = catalog.release()
    agent = AgentSpec(
        name="ale-scripted",
        command=(agent_env.PYTHON, "-m", "ale.agents.scripted", case_id),
        modules=("ale.agents.scripted",),
    )
    options = RunOptions(
        tasks=(scripted.task,), agent=agent, release=release, release_sha256=digest, release_name=release.release,
        episodes=episodes, agent_time_s=600.0, workdir=workdir,
    )  # fmt: skip
    runtime = runtimes.make(runtimes.DEFAULT)
    try:
        record = trio.run(Harness(options, runtime, PlainProgress(out=_io.StringIO())).run)
    finally:
        runtime.close()
    try:
        outcome = record.outcomes[0]
        if outcome.status != "completed":
            raise SetError(f"{case_id}: the run did not complete: {outcome.reason}")
        window = task_windows(record.trajectory.read_bytes(), [task.spec.ref])[task.spec.ref]
    finally:
        import shutil

        shutil.rmtree(record.root, ignore_errors=True)
    judge_input = build_input(window, context(task), record.run_id)
    return LabelledCase(
        CASE_SCHEMA, case_id, task.spec.ref, task.digest, scripted.label, scripted.summary,  # type: ignore[arg-type]
        record.run_id, judge_input.sha256, tuple(window),
    )  # fmt: skip
