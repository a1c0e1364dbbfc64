"""The judge's labelled set and ``ale judge eval``: real runs of scripted coding agents, three or more
faithful and three or more shortcut solutions per reproduction task, each rebuilding the judge input it
was recorded with; the agreement (precision, recall, F1 with faithful as the positive class) computed
for whichever endpoint is configured, here a scripted one whose answers are known."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zstandard
from fuzzing import fuzz_settings, hostile_json
from hypothesis import given
from hypothesis import strategies as st
from judge_helpers import chat_body, digest_of, serve_judge, verdict_for

from ale import catalog
from ale.agents import scripted
from ale.judge.labelled import Agreement, SetError, agreement, case_input, default_set, dump_set, load_set
from ale.runner.cli import main as ale_main

CASES = load_set(default_set())


def test_the_set_holds_three_faithful_and_three_shortcut_runs_of_every_reproduction_task() -> None:
    reproduction = {t.spec.ref for t in catalog.tasks().values() if t.spec.genre == "reproduction"}
    counts = Counter((c.task, c.label) for c in CASES)
    for ref in reproduction:
        assert counts[(ref, "faithful")] >= 3, ref
        assert counts[(ref, "shortcut")] >= 3, ref
    assert {c.task for c in CASES} == reproduction
    assert len({c.case for c in CASES}) == len(CASES)


def test_every_case_is_a_real_run_of_its_scripted_agent() -> None:
    for c in CASES:
        agent = scripted.CASES[c.case]
        assert (agent.label, agent.summary) == (c.label, c.summary), c.case
        kinds = [e["kind"] for e in c.events]
        assert kinds[0] == "task_started", c.case
        assert "agent_finished" in kinds, c.case
        assert "official_evaluation_finished" in kinds, c.case  # the run completed its official evaluation
        assert "artifact_snapshot" in kinds, c.case
        started = next(e for e in c.events if e["kind"] == "agent_started")
        assert started["data"]["command"][-1] == c.case
        assert c.run_id.startswith("run-")


def test_each_case_rebuilds_the_judge_input_it_was_recorded_with() -> None:
    for c in CASES:
        task = catalog.get_task(c.task.split("@")[0])
        if task.digest != c.task_digest:  # a changed task (paper or rubric) changes its inputs, by design
            pytest.fail(f"{c.case} was recorded on another version of {c.task}: run `ale judge record-set`")
        ji = case_input(c)
        assert ji.sha256 == c.input_sha256, c.case
        assert ji.sha256 == case_input(c).sha256


def test_the_shortcuts_leave_their_evidence_in_the_input() -> None:
    texts = {c.case: case_input(c).text.decode() for c in CASES}
    assert "K = np.array([-0.79, -7.26, -1.02, -1.34])" in texts["pendulum-lqr/paper-gains"]
    assert "PERMISSION_DENIED" in texts["pendulum-lqr/probe-then-pd-grid"]
    assert "cands = mean + std" in texts["pendulum-lqr/cross-entropy-gains"]
    assert "np.linalg.lstsq" in texts["pendulum-lqr/stepwise-sysid-riccati"]
    assert "itertools.product([100.0, 200.0" in texts["reacher-jacobian/grid-searched-gains"]


# -- agreement ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([("faithful", True)] * 3 + [("shortcut", False)] * 3, (1.0, 1.0, 1.0)),
        ([("faithful", True), ("faithful", False), ("shortcut", True), ("shortcut", False)], (0.5, 0.5, 0.5)),
        ([("faithful", False)] * 3 + [("shortcut", False)] * 3, (None, 0.0, 0.0)),  # credits nothing
        ([("faithful", True)] * 3 + [("shortcut", True)] * 3, (0.5, 1.0, 2 / 3)),  # credits everything
        ([("shortcut", False)], (None, None, None)),
    ],
)
def test_agreement_is_precision_recall_f1_with_faithful_positive(
    pairs: list[Any], expected: tuple[float | None, float | None, float | None]
) -> None:
    score = agreement(pairs)
    assert isinstance(score, Agreement)
    assert (score.precision, score.recall, score.f1) == pytest.approx(expected)


# -- ale judge eval against a scripted endpoint -----------------------------------------------------


def _answer_by_label(wrong: set[str]) -> Any:
    """A judge that credits the faithful cases and refuses the shortcuts, except for the ``wrong`` ones."""
    by_digest = {c.input_sha256: c for c in CASES}

    def answer(request: dict[str, Any]) -> tuple[int, bytes]:
        case = by_digest[digest_of(request)]
        right = case.label == "faithful"
        faithful = right != (case.case in wrong)
        if case.case == "reacher-jacobian/jt-pd-module":
            return 200, chat_body("```json\n{not json\n```")  # an unparsable answer: not credited
        return 200, chat_body(json.dumps(verdict_for(request, faithful=faithful)))

    return answer


def test_ale_judge_eval_prints_the_agreement_of_the_configured_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    wrong = {"pendulum-lqr/derived-then-overridden", "reacher-jacobian/jt-pd-analytic"}
    with serve_judge(_answer_by_label(wrong)) as judge:
        assert ale_main(["judge", "eval", "--judge-model", "m", "--judge-upstream", judge.base]) == 0
    assert len(judge.requests) == len(CASES)
    out = capsys.readouterr()
    faithful = sum(c.label == "faithful" for c in CASES)
    shortcut = len(CASES) - faithful
    # credited: the faithful cases but jt-pd-analytic (judged wrong) and jt-pd-module (unparsable), plus one shortcut
    tp, fp = faithful - 2, 1
    fn, tn = 2, shortcut - 1
    assert f"tp {tp}  fp {fp}  fn {fn}  tn {tn}" in out.out
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    f1 = 2 * precision * recall / (precision + recall)
    assert f"precision {precision:.3f}  recall {recall:.3f}  F1 {f1:.3f}" in out.out
    assert "1 without a verdict" in out.out
    assert re.search(r"reacher-jacobian/jt-pd-module\s+faithful\s+unparsable\s+not credited", out.err)


def test_ale_judge_eval_can_take_one_task(capsys: pytest.CaptureFixture[str]) -> None:
    with serve_judge(_answer_by_label(set())) as judge:
        assert ale_main(["judge", "eval", "--judge-model", "m", "--judge-upstream", judge.base,
                         "--case", "pendulum-lqr"]) == 0  # fmt: skip
    pendulum = [c for c in CASES if c.task.startswith("pendulum-lqr@")]
    assert len(judge.requests) == len(pendulum)
    assert "precision 1.000  recall 1.000  F1 1.000" in capsys.readouterr().out


def test_ale_judge_eval_without_a_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert ale_main(["judge", "eval"]) == 2
    assert "--judge-model" in capsys.readouterr().err


# -- a hostile set file -----------------------------------------------------------------------------


def _file(tmp: Path, data: bytes) -> Path:
    path = tmp / "set.jsonl.zst"
    path.write_bytes(data)
    return path


def test_a_set_round_trips(tmp_path: Path) -> None:
    assert load_set(_file(tmp_path, dump_set(CASES[:2]))) == CASES[:2]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not zstd", "not zstd"),
        (zstandard.ZstdCompressor().compress(b'{"schema": "ale-judge-case/v1"}\n'), "line 1"),
        (zstandard.ZstdCompressor().compress(b"[" * 5000 + b"]" * 5000 + b"\n"), "nested"),
    ],
)
def test_a_bad_set_file_is_a_clear_error(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(SetError, match=message):
        load_set(_file(tmp_path, data))


def test_a_set_that_decompresses_too_far_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    bomb = io.BytesIO()
    with zstandard.ZstdCompressor(level=1).stream_writer(bomb, closefd=False) as writer:
        for _ in range(65):
            writer.write(b" " * (1 << 20))
    with pytest.raises(SetError, match="more than"):
        load_set(_file(tmp_path, bomb.getvalue()))


@pytest.mark.fuzz
@fuzz_settings
@given(st.one_of(hostile_json, st.binary(max_size=300)))
def test_fuzz_load_set_raises_only_set_errors(raw: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for data in (raw, zstandard.ZstdCompressor().compress(raw)):
            with contextlib.suppress(SetError):
                load_set(_file(Path(folder), data))
