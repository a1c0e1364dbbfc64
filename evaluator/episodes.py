"""Authoritative episode records and the task-level result built from them."""

from __future__ import annotations

from ale.core.results import AbortReason, Episode
from ale.env.v1 import env_pb2 as pb
from ale_evaluator.domains import Domain, EpisodeMeter

#: Why an episode did not run to its end.
ABORT_REASONS = ("reset_mid_episode", "session_closed", "not_started", "policy_error", "evaluator_error")


#: The evaluator records exactly the episode the bundle carries (``task_results.json``), so the
#: definition of an episode and of its passing lives in one place, the pure core.
EpisodeRecord = Episode


def finished(index: int, commitment: bytes, meter: EpisodeMeter, value: float, success: bool) -> EpisodeRecord:
    return EpisodeRecord(
        index=index,
        seed_commitment=commitment.hex(),
        episode_return=meter.episode_return,
        length=meter.length,
        success=success,
        safety_counts=dict(meter.safety_counts),
        terminated=meter.terminated,
        truncated=meter.truncated,
        aborted=False,
        abort_reason="",
        headline_value=value,
    )


def aborted(
    index: int, commitment: bytes, domain: Domain, reason: AbortReason, meter: EpisodeMeter | None
) -> EpisodeRecord:
    """An episode that did not end on its own: it scores the domain's worst value."""
    assert reason in ABORT_REASONS
    counts = dict(meter.safety_counts) if meter else dict.fromkeys(domain.safety_metrics, 0)
    return EpisodeRecord(
        index=index,
        seed_commitment=commitment.hex(),
        episode_return=meter.episode_return if meter else 0.0,
        length=meter.length if meter else 0,
        success=False,
        safety_counts=counts,
        terminated=False,
        truncated=False,
        aborted=True,
        abort_reason=reason,
        headline_value=domain.worst,
    )


def build_result(
    *,
    records: list[EpisodeRecord],
    num_episodes: int,
    domain: Domain,
    direction: str,
    session_id: str,
    run_id: str,
    task_id: str,
    task_version: str,
    task_digest: str,
    mode: str,
    official: bool,
    evaluator_version: str,
) -> pb.EvalResult:
    """The EvalResult for ``records`` (episodes not yet recorded count as missing)."""
    complete = len(records) == num_episodes
    result = pb.EvalResult(
        session_id=session_id,
        run_id=run_id,
        task_id=task_id,
        task_version=task_version,
        task_digest=task_digest,
        mode=mode,
        official=official,
        complete=complete,
        num_episodes=num_episodes,
        headline_metric=domain.headline_metric,
        headline_direction=direction,
        evaluator_version=evaluator_version,
    )
    for rec in sorted(records, key=lambda r: r.index):
        result.episodes.add(
            index=rec.index,
            seed_commitment=bytes.fromhex(rec.seed_commitment),
            episode_return=rec.episode_return,
            length=rec.length,
            success=rec.success,
            safety_counts=rec.safety_counts,
            terminated=rec.terminated,
            truncated=rec.truncated,
            aborted=rec.aborted,
            abort_reason=rec.abort_reason,
            headline_value=rec.headline_value,
        )
    # Headline: mean over all num_episodes; unrecorded episodes score the worst value.
    total = sum(r.headline_value for r in records) + domain.worst * (num_episodes - len(records))
    result.headline_value = total / num_episodes if num_episodes else 0.0
    for name in domain.safety_metrics:
        count = sum(r.safety_counts.get(name, 0) for r in records)
        result.safety.add(name=name, count=count, rate=count / num_episodes if num_episodes else 0.0)
    result.passed_episodes = sum(r.passed for r in records)
    return result
