"""What a verifier makes of ``faithfulness.json``: it never credits a bundle's verdict on its word.

1. :func:`check_faithfulness` holds the document to what an honest runner writes
   (``inconsistent_results`` otherwise): one entry per task of the run; an open-genre task's entry
   says so and nothing more; a reproduction task's names the digest of the judge input that the
   verifier rebuilds from the bundle (:mod:`ale.core.judge_input`), is faithful only when judged
   with every rubric item satisfied, and lists the findings of exactly the rubric's items; a
   signature, if any, verifies (``bad_signature``). Its verdicts are what the bundle's claimed
   scores must follow from (:func:`ale.core.verify.recompute_scores`).
2. :func:`credit` decides, per completed reproduction task, the verdict the board uses: a verdict
   signed by a judge key the verifier has registered, else the verifier's own verdict when it
   re-judged the rebuilt input with its operator's judge, else none: *unjudged*, which the gate
   treats as unfaithful (final 0). A task the verifier's judge is still to be asked about is
   *pending* (unfaithful, final 0, until :func:`verifier_credit` turns the judge's answer into its
   credit). docs/verifier.md ("Faithfulness") is this module in prose.

Pure: the re-judging itself (an HTTP call) is the caller's; its results come in as values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ale.core.documents import Verdict
from ale.core.judge_input import JudgeInput, TaskContext, build_input, task_windows
from ale.core.parse import converter
from ale.core.reasons import Reason, VerificationError
from ale.core.signing import SignatureError
from ale.core.verdict import JudgeResult, verify_verdict

if TYPE_CHECKING:  # ale.core.verify imports this module
    from ale.core.verify import Documents

CreditStatus = Literal["judged", "unjudged", "pending"]
#: the rationale of a task whose verdict the verifier's judge is still to give
PENDING_RATIONALE = (
    "judging pending: the bundle's own verdict is not credited, and the verifier's judge is asked about "
    "the rebuilt judge input after the upload: final 0 until it answers"
)


@attrs.frozen
class JudgeKey:
    """A judge key the verifier has registered (its verdicts are credited)."""

    key_id: str
    public_key: str  # base64 of the raw 32 bytes
    label: str = ""


#: Looks up a registered judge key by key id; None when there is none.
JudgeKeyLookup = Callable[[str], JudgeKey | None]


@attrs.frozen
class Credit:
    """The verdict the board uses for one completed reproduction task."""

    task: str
    status: CreditStatus
    faithful: bool  # the gate (False unless judged faithful)
    source: str | None  # "verifier" (re-judged) or "judge key <label>" (signed); None when not judged
    outcome: str  # the credited verdict's outcome, or why there is none ("pending": not yet)
    judge_model: str | None
    rationale: str
    findings: tuple[dict[str, Any], ...]
    input_sha256: str
    claimed: dict[str, Any]  # the bundle's own entry, for the record (never credited as such)
    judge_key_id: str | None = None  # the registered judge key whose signed verdict is credited

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "faithful": self.faithful,
            "source": self.source,
            "outcome": self.outcome,
            "judge_model": self.judge_model,
            "rationale": self.rationale,
            "findings": list(self.findings),
            "input_sha256": self.input_sha256,
            "claimed": self.claimed,
            "judge_key_id": self.judge_key_id,
        }


def _inconsistent(message: str) -> VerificationError:
    return VerificationError(Reason.INCONSISTENT_RESULTS, message)


def judge_inputs(docs: Documents, contexts: Mapping[str, TaskContext], events: bytes) -> dict[str, JudgeInput]:
    """The judge input of every reproduction task of the run, rebuilt from the bundle's trajectory
    (``events``, decompressed) and the task the verifier knows."""
    refs = [t.task for t in docs.results.tasks if t.genre == "reproduction"]
    missing = [ref for ref in refs if ref not in contexts]
    if missing:  # check_versions has held every task to a known one: a verifier without its rubric
        raise _inconsistent(f"no rubric is known for {', '.join(missing)}")
    windows = task_windows(events, refs)
    return {ref: build_input(windows[ref], contexts[ref], docs.manifest.run_id) for ref in refs}


def _check_open(ref: str, entry: Verdict) -> None:
    if (entry.outcome, entry.faithful, entry.input_sha256, entry.findings, entry.signature) != (
        "open_genre", None, None, (), None,
    ):  # fmt: skip
        raise _inconsistent(f"{ref}: an open-genre task has no faithfulness gate, so its entry must say only that")


def _check_reproduction(ref: str, entry: Verdict, completed: bool, ji: JudgeInput, ctx: TaskContext) -> None:
    if entry.input_sha256 != ji.sha256:
        raise _inconsistent(f"{ref}: the verdict names judge input {entry.input_sha256}, the bundle gives {ji.sha256}")
    if entry.outcome == "open_genre" or entry.faithful is None:
        raise _inconsistent(f"{ref}: a reproduction task's entry needs a verdict (faithful true or false)")
    if (entry.outcome == "not_completed") == completed:
        raise _inconsistent(f"{ref}: outcome not_completed is for a task without an official result, and only then")
    if entry.outcome != "judged":
        if entry.faithful or entry.findings or entry.signature is not None:
            raise _inconsistent(f"{ref}: without a judged verdict the task is unfaithful, with no findings")
        return
    items = [(item.id, item.kind) for item in ctx.rubric.items]
    if [(f.item, f.kind) for f in entry.findings] != items or not entry.judge_model:
        raise _inconsistent(f"{ref}: a judged verdict names its model and has one finding per rubric item, in order")
    if entry.faithful and not all(f.satisfied for f in entry.findings):
        raise _inconsistent(f"{ref}: a faithful verdict with an unsatisfied rubric item")


def check_faithfulness(
    docs: Documents, inputs: Mapping[str, JudgeInput], contexts: Mapping[str, TaskContext]
) -> dict[str, bool | None]:
    """Step 1 (see the module docstring); the bundle's own verdicts, for its claimed scores."""
    entries = docs.faithfulness.tasks
    by_ref = {t.task: t for t in docs.results.tasks}
    if set(entries) != set(by_ref):
        raise _inconsistent("faithfulness.json does not list exactly the run's tasks")
    for ref, entry in sorted(entries.items()):
        task = by_ref[ref]
        if task.genre == "open":
            _check_open(ref, entry)
            continue
        _check_reproduction(ref, entry, task.status == "completed", inputs[ref], contexts[ref])
        if entry.signature is not None:
            try:
                verify_verdict(ref, converter.unstructure(entry))
            except SignatureError as exc:
                raise VerificationError(Reason.BAD_SIGNATURE, f"{ref}: {exc}") from None
    return {ref: entry.faithful for ref, entry in entries.items()}


def signed_by(docs: Documents, ref: str, keys: JudgeKeyLookup | None) -> JudgeKey | None:
    """The registered judge key that signed the task's verdict (checked by check_faithfulness), if any."""
    signature = docs.faithfulness.tasks[ref].signature
    if signature is None or keys is None:
        return None
    key = keys(signature.key_id)
    return key if key is not None and key.public_key == signature.public_key else None


def to_judge(docs: Documents, keys: JudgeKeyLookup | None) -> list[str]:
    """The completed reproduction tasks a re-judging verifier must ask its own judge about: those
    without a verdict signed by a registered judge key."""
    return [
        t.task
        for t in docs.results.tasks
        if t.genre == "reproduction" and t.status == "completed" and signed_by(docs, t.task, keys) is None
    ]


def credit(
    docs: Documents,
    inputs: Mapping[str, JudgeInput],
    *,
    keys: JudgeKeyLookup | None = None,
    rejudged: Mapping[str, JudgeResult] | None = None,
    rejudge_configured: bool = False,
    pending: Collection[str] = (),
) -> dict[str, Credit]:
    """Step 2 (see the module docstring), for every completed reproduction task; ``pending``: the
    tasks whose verdict the verifier's judge is still to give (credited as pending)."""
    credits = {}
    for t in docs.results.tasks:
        if t.genre != "reproduction" or t.status != "completed":
            continue
        ref, entry = t.task, docs.faithfulness.tasks[t.task]
        claimed = converter.unstructure(entry)
        digest = inputs[ref].sha256
        key = signed_by(docs, ref, keys)
        mine = (rejudged or {}).get(ref)
        if key is not None:
            credits[ref] = Credit(ref, "judged", bool(entry.faithful), f"judge key {key.label or key.key_id[:16]}",
                                  entry.outcome, entry.judge_model, entry.rationale,
                                  tuple(claimed["findings"]), digest, claimed, key.key_id)  # fmt: skip
        elif mine is not None:
            credits[ref] = verifier_credit(ref, mine, digest, claimed)
        elif ref in pending:
            credits[ref] = Credit(ref, "pending", False, None, "pending", None, PENDING_RATIONALE, (), digest, claimed)
        else:
            why = unjudged_reason(None, configured=rejudge_configured, signed=entry.signature is not None)
            credits[ref] = Credit(ref, "unjudged", False, None, "no_judge", None, why, (), digest, claimed)
    return credits


def verifier_credit(ref: str, mine: JudgeResult, digest: str, claimed: dict[str, Any], *, attempts: int = 1) -> Credit:
    """The credit the verifier's own judge's answer gives: its verdict when it judged (faithful or
    not), else unjudged with the reason (``attempts``: how many times it was asked)."""
    if mine.outcome == "judged":
        return Credit(ref, "judged", bool(mine.faithful), "verifier", mine.outcome, mine.judge_model, mine.rationale,
                      tuple(attrs.asdict(f) for f in mine.findings), digest, claimed)  # fmt: skip
    why = unjudged_reason(mine, configured=True, signed=claimed.get("signature") is not None, attempts=attempts)
    return Credit(ref, "unjudged", False, None, mine.outcome, mine.judge_model, why, (), digest, claimed)


def unjudged_reason(mine: JudgeResult | None, *, configured: bool, signed: bool, attempts: int = 1) -> str:
    parts = ["the bundle's own verdict is not credited"]
    if signed:
        parts.append("its signature is not by a judge key this verifier has registered")
    if mine is not None:
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        parts.append(f"the verifier's judge gave no verdict{tries} ({mine.outcome}: {mine.rationale})")
    elif not configured:
        parts.append("this verifier has no judge to re-judge it with")
    return "; ".join(parts) + ": unjudged, final 0"
