from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]

class AutoresetMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUTORESET_MODE_DISABLED: _ClassVar[AutoresetMode]
    AUTORESET_MODE_SAME_STEP: _ClassVar[AutoresetMode]

class BatchState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BATCH_STATE_UNSPECIFIED: _ClassVar[BatchState]
    BATCH_STATE_PENDING: _ClassVar[BatchState]
    BATCH_STATE_RUNNING: _ClassVar[BatchState]
    BATCH_STATE_DONE: _ClassVar[BatchState]
    BATCH_STATE_FAILED: _ClassVar[BatchState]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT64: DType
DTYPE_INT32: DType
DTYPE_INT64: DType
DTYPE_UINT8: DType
DTYPE_BOOL: DType
AUTORESET_MODE_DISABLED: AutoresetMode
AUTORESET_MODE_SAME_STEP: AutoresetMode
BATCH_STATE_UNSPECIFIED: BatchState
BATCH_STATE_PENDING: BatchState
BATCH_STATE_RUNNING: BatchState
BATCH_STATE_DONE: BatchState
BATCH_STATE_FAILED: BatchState

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class BoxSpace(_message.Message):
    __slots__ = ("low", "high")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    low: Tensor
    high: Tensor
    def __init__(self, low: _Optional[_Union[Tensor, _Mapping]] = ..., high: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class DiscreteSpace(_message.Message):
    __slots__ = ("n", "start")
    N_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    n: int
    start: int
    def __init__(self, n: _Optional[int] = ..., start: _Optional[int] = ...) -> None: ...

class Space(_message.Message):
    __slots__ = ("box", "discrete")
    BOX_FIELD_NUMBER: _ClassVar[int]
    DISCRETE_FIELD_NUMBER: _ClassVar[int]
    box: BoxSpace
    discrete: DiscreteSpace
    def __init__(self, box: _Optional[_Union[BoxSpace, _Mapping]] = ..., discrete: _Optional[_Union[DiscreteSpace, _Mapping]] = ...) -> None: ...

class CreateEnvRequest(_message.Message):
    __slots__ = ("task_id", "num_envs", "official", "autoreset_mode")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    OFFICIAL_FIELD_NUMBER: _ClassVar[int]
    AUTORESET_MODE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    num_envs: int
    official: bool
    autoreset_mode: AutoresetMode
    def __init__(self, task_id: _Optional[str] = ..., num_envs: _Optional[int] = ..., official: _Optional[bool] = ..., autoreset_mode: _Optional[_Union[AutoresetMode, str]] = ...) -> None: ...

class EnvSpec(_message.Message):
    __slots__ = ("task_id", "task_version", "gym_id", "observation_space", "action_space", "num_envs", "autoreset_mode", "max_episode_steps", "official", "genre", "mode", "headline_metric", "headline_direction", "safety_metrics", "official_episodes", "evaluator_version", "task_digest")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_VERSION_FIELD_NUMBER: _ClassVar[int]
    GYM_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    AUTORESET_MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    OFFICIAL_FIELD_NUMBER: _ClassVar[int]
    GENRE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_METRIC_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    SAFETY_METRICS_FIELD_NUMBER: _ClassVar[int]
    OFFICIAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_DIGEST_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    task_version: str
    gym_id: str
    observation_space: Space
    action_space: Space
    num_envs: int
    autoreset_mode: AutoresetMode
    max_episode_steps: int
    official: bool
    genre: str
    mode: str
    headline_metric: str
    headline_direction: str
    safety_metrics: _containers.RepeatedScalarFieldContainer[str]
    official_episodes: int
    evaluator_version: str
    task_digest: str
    def __init__(self, task_id: _Optional[str] = ..., task_version: _Optional[str] = ..., gym_id: _Optional[str] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ..., num_envs: _Optional[int] = ..., autoreset_mode: _Optional[_Union[AutoresetMode, str]] = ..., max_episode_steps: _Optional[int] = ..., official: _Optional[bool] = ..., genre: _Optional[str] = ..., mode: _Optional[str] = ..., headline_metric: _Optional[str] = ..., headline_direction: _Optional[str] = ..., safety_metrics: _Optional[_Iterable[str]] = ..., official_episodes: _Optional[int] = ..., evaluator_version: _Optional[str] = ..., task_digest: _Optional[str] = ...) -> None: ...

class CreateEnvResponse(_message.Message):
    __slots__ = ("env_id", "spec")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    spec: EnvSpec
    def __init__(self, env_id: _Optional[str] = ..., spec: _Optional[_Union[EnvSpec, _Mapping]] = ...) -> None: ...

class GetSpecRequest(_message.Message):
    __slots__ = ("env_id",)
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    def __init__(self, env_id: _Optional[str] = ...) -> None: ...

class GetSpecResponse(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: EnvSpec
    def __init__(self, spec: _Optional[_Union[EnvSpec, _Mapping]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("env_id", "seed")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    seed: int
    def __init__(self, env_id: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class EvalProgress(_message.Message):
    __slots__ = ("session_id", "episode_index", "episodes_done", "num_episodes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    EPISODES_DONE_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    episode_index: int
    episodes_done: int
    num_episodes: int
    def __init__(self, session_id: _Optional[str] = ..., episode_index: _Optional[int] = ..., episodes_done: _Optional[int] = ..., num_episodes: _Optional[int] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("observation", "seed_ignored", "eval")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    SEED_IGNORED_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    observation: Tensor
    seed_ignored: bool
    eval: EvalProgress
    def __init__(self, observation: _Optional[_Union[Tensor, _Mapping]] = ..., seed_ignored: _Optional[bool] = ..., eval: _Optional[_Union[EvalProgress, _Mapping]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("env_id", "action")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    action: Tensor
    def __init__(self, env_id: _Optional[str] = ..., action: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("observation", "reward", "terminated", "truncated", "final_observation", "cost", "eval")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    observation: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    final_observation: Tensor
    cost: Tensor
    eval: EvalProgress
    def __init__(self, observation: _Optional[_Union[Tensor, _Mapping]] = ..., reward: _Optional[_Union[Tensor, _Mapping]] = ..., terminated: _Optional[_Union[Tensor, _Mapping]] = ..., truncated: _Optional[_Union[Tensor, _Mapping]] = ..., final_observation: _Optional[_Union[Tensor, _Mapping]] = ..., cost: _Optional[_Union[Tensor, _Mapping]] = ..., eval: _Optional[_Union[EvalProgress, _Mapping]] = ...) -> None: ...

class StartEvalSessionRequest(_message.Message):
    __slots__ = ("env_id", "num_episodes")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    num_episodes: int
    def __init__(self, env_id: _Optional[str] = ..., num_episodes: _Optional[int] = ...) -> None: ...

class StartEvalSessionResponse(_message.Message):
    __slots__ = ("session_id", "env_id", "num_episodes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    env_id: str
    num_episodes: int
    def __init__(self, session_id: _Optional[str] = ..., env_id: _Optional[str] = ..., num_episodes: _Optional[int] = ...) -> None: ...

class GetEvalResultRequest(_message.Message):
    __slots__ = ("session_id", "finalize")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    finalize: bool
    def __init__(self, session_id: _Optional[str] = ..., finalize: _Optional[bool] = ...) -> None: ...

class EpisodeRecord(_message.Message):
    __slots__ = ("index", "seed_commitment", "episode_return", "length", "success", "safety_counts", "terminated", "truncated", "aborted", "abort_reason", "headline_value")
    class SafetyCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SEED_COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURN_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_COUNTS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    ABORT_REASON_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_VALUE_FIELD_NUMBER: _ClassVar[int]
    index: int
    seed_commitment: bytes
    episode_return: float
    length: int
    success: bool
    safety_counts: _containers.ScalarMap[str, int]
    terminated: bool
    truncated: bool
    aborted: bool
    abort_reason: str
    headline_value: float
    def __init__(self, index: _Optional[int] = ..., seed_commitment: _Optional[bytes] = ..., episode_return: _Optional[float] = ..., length: _Optional[int] = ..., success: _Optional[bool] = ..., safety_counts: _Optional[_Mapping[str, int]] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., aborted: _Optional[bool] = ..., abort_reason: _Optional[str] = ..., headline_value: _Optional[float] = ...) -> None: ...

class SafetyMetric(_message.Message):
    __slots__ = ("name", "count", "rate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    rate: float
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., rate: _Optional[float] = ...) -> None: ...

class EvalResult(_message.Message):
    __slots__ = ("session_id", "run_id", "task_id", "task_version", "task_digest", "mode", "official", "complete", "num_episodes", "episodes", "headline_metric", "headline_direction", "headline_value", "safety", "passed_episodes", "evaluator_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OFFICIAL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_METRIC_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_VALUE_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    PASSED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    task_id: str
    task_version: str
    task_digest: str
    mode: str
    official: bool
    complete: bool
    num_episodes: int
    episodes: _containers.RepeatedCompositeFieldContainer[EpisodeRecord]
    headline_metric: str
    headline_direction: str
    headline_value: float
    safety: _containers.RepeatedCompositeFieldContainer[SafetyMetric]
    passed_episodes: int
    evaluator_version: str
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., task_version: _Optional[str] = ..., task_digest: _Optional[str] = ..., mode: _Optional[str] = ..., official: _Optional[bool] = ..., complete: _Optional[bool] = ..., num_episodes: _Optional[int] = ..., episodes: _Optional[_Iterable[_Union[EpisodeRecord, _Mapping]]] = ..., headline_metric: _Optional[str] = ..., headline_direction: _Optional[str] = ..., headline_value: _Optional[float] = ..., safety: _Optional[_Iterable[_Union[SafetyMetric, _Mapping]]] = ..., passed_episodes: _Optional[int] = ..., evaluator_version: _Optional[str] = ...) -> None: ...

class GetEvalResultResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: EvalResult
    def __init__(self, result: _Optional[_Union[EvalResult, _Mapping]] = ...) -> None: ...

class SubmitBatchEvalRequest(_message.Message):
    __slots__ = ("policy", "official", "num_episodes", "seed")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    OFFICIAL_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    policy: bytes
    official: bool
    num_episodes: int
    seed: int
    def __init__(self, policy: _Optional[bytes] = ..., official: _Optional[bool] = ..., num_episodes: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class SubmitBatchEvalResponse(_message.Message):
    __slots__ = ("batch_id", "num_episodes")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    num_episodes: int
    def __init__(self, batch_id: _Optional[str] = ..., num_episodes: _Optional[int] = ...) -> None: ...

class GetBatchEvalStatusRequest(_message.Message):
    __slots__ = ("batch_id", "wait_ms")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    wait_ms: int
    def __init__(self, batch_id: _Optional[str] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class GetBatchEvalStatusResponse(_message.Message):
    __slots__ = ("state", "episodes_done", "num_episodes", "error", "result")
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPISODES_DONE_FIELD_NUMBER: _ClassVar[int]
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    state: BatchState
    episodes_done: int
    num_episodes: int
    error: str
    result: EvalResult
    def __init__(self, state: _Optional[_Union[BatchState, str]] = ..., episodes_done: _Optional[int] = ..., num_episodes: _Optional[int] = ..., error: _Optional[str] = ..., result: _Optional[_Union[EvalResult, _Mapping]] = ...) -> None: ...
