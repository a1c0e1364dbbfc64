"""The verifier's own faithfulness judge (docs/verifier.md, "Faithfulness").

With ``ALE_VERIFY_JUDGE_MODEL`` set, step 12 asks the operator's judge (any OpenAI-compatible
endpoint, ``ALE_VERIFY_JUDGE_BASE_URL``, its key read from ``ALE_VERIFY_JUDGE_API_KEY_FILE``)
about the judge input it rebuilt from the bundle, for each completed reproduction task whose
verdict no registered judge key signed. The request and the parsing are the harness's
(:func:`ale.judge.client.ask`): every failure is a result without a verdict, never an exception.
Blocking: it runs in the upload's worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping

from ale.core.faithfulness import JudgeKey, JudgeKeyLookup
from ale.core.judge_input import JudgeInput, TaskContext
from ale.core.signing import key_id
from ale.core.verdict import JudgeResult, failed
from ale_verify.config import Settings


def configured(settings: Settings) -> bool:
    return bool(settings.judge_model)


def judge_keys(settings: Settings) -> JudgeKeyLookup:
    """The registered judge keys by key id."""
    import base64

    keys = {}
    for label, public in settings.judge_keys:
        kid = key_id(base64.b64decode(public))
        keys[kid] = JudgeKey(kid, public, label)
    return keys.get


def _api_key(settings: Settings) -> str | None:
    if settings.judge_api_key_file is None:
        return None
    text = settings.judge_api_key_file.read_text(encoding="utf-8").strip()
    return text or None


def rejudge(
    settings: Settings, refs: list[str], inputs: Mapping[str, JudgeInput], contexts: Mapping[str, TaskContext]
) -> dict[str, JudgeResult]:
    """The operator's judge's result for each of ``refs``."""
    from ale.judge.client import Endpoint, EndpointError, Transport, ask

    if not refs:
        return {}
    try:
        Endpoint.parse(settings.judge_base_url)
        key = _api_key(settings)
    except (EndpointError, OSError) as exc:  # the operator's configuration: no verdict, said why
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        return {ref: failed("error", f"the verifier's judge is misconfigured: {reason}", model=settings.judge_model,
                            input_sha256=inputs[ref].sha256) for ref in refs}  # fmt: skip
    transport = Transport(settings.judge_base_url, key, timeout=settings.judge_timeout_s)
    return {ref: ask(transport, settings.judge_model, inputs[ref], contexts[ref].rubric).result for ref in refs}
