"""How the evaluator steps the K copies of a vector env: fast paths must not change a single bit.

CartPole groups of 16 or more copies step as one batch with gymnasium's own CartPoleVectorEnv
dynamics (``BatchedCartPole``); Hopper groups of 6 or more and InvertedPendulum groups of 12 or
more step their copies on several threads (``ParallelMujoco``); everything else steps each copy
with its own ``env.step``. Every way must give exactly what stepping every copy on its own gives:
observations, rewards, flags, costs, final observations, the recorded episodes, and each copy's
state afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest

from ale import catalog
from ale.env.v1 import env_pb2 as pb
from ale_evaluator.domains import DOMAINS
from ale_evaluator.envs import MIN_BATCHED_COPIES, EnvGroup, make_env
from ale_evaluator.parallel import MIN_PARALLEL_COPIES, ParallelMujoco, StepPool

OUTPUTS = ("observation", "reward", "terminated", "truncated", "cost", "final_observation")


def group(task_id: str, k: int, autoreset: int, *, batched: bool = True, pool: StepPool | None = None) -> EnvGroup:
    task = catalog.get_task(task_id)
    g = EnvGroup(
        env_id=f"env-{k}",
        task=task,
        domain=DOMAINS[task.spec.domain],
        num_envs=k,
        autoreset=autoreset,
        official=False,
        owner="agent",
        step_pool=pool,
    )
    if not batched:
        g.batched = None
    return g


def balancing_actions(g: EnvGroup, rng: np.random.Generator) -> np.ndarray:
    """A state-feedback push with 15 % of the actions flipped: short and full-length (truncated) episodes."""
    s = np.array([env.unwrapped.state for env in g.envs])
    act = (s[:, 2] + 0.3 * s[:, 3] + 0.02 * s[:, 0] + 0.1 * s[:, 1] > 0).astype(np.int64)
    flip = rng.random(len(act)) < 0.15
    act[flip] = 1 - act[flip]
    return act


def assert_same_step(a, b) -> None:
    (out_a, ended_a), (out_b, ended_b) = a, b
    for field in OUTPUTS:
        x, y = getattr(out_a, field), getattr(out_b, field)
        if x is None or y is None:
            assert x is None, field
            assert y is None, field
            continue
        assert x.dtype == y.dtype, field
        assert x.shape == y.shape, field
        assert x.tobytes() == y.tobytes(), field
    assert [i for i, _ in ended_a] == [i for i, _ in ended_b]
    for (_, ma), (_, mb) in zip(ended_a, ended_b, strict=True):
        assert (ma.episode_return, ma.length, ma.safety_counts, ma.terminated, ma.truncated) == (
            mb.episode_return,
            mb.length,
            mb.safety_counts,
            mb.terminated,
            mb.truncated,
        )


@pytest.mark.parametrize(
    ("k", "autoreset"),
    [
        (64, pb.AUTORESET_MODE_SAME_STEP),
        (MIN_BATCHED_COPIES, pb.AUTORESET_MODE_SAME_STEP),
        (17, pb.AUTORESET_MODE_DISABLED),
    ],
)
def test_batched_cartpole_is_bit_identical_to_stepping_each_copy(k, autoreset):
    fast, slow = group("cartpole-balance", k, autoreset), group("cartpole-balance", k, autoreset, batched=False)
    assert fast.batched is not None
    assert slow.batched is None
    rng = np.random.default_rng(k)
    assert fast.reset(123).tobytes() == slow.reset(123).tobytes()
    ended = truncated = 0
    for _ in range(1500):
        if any(m.done for m in fast.meters):  # autoreset disabled: start over
            assert fast.reset(None).tobytes() == slow.reset(None).tobytes()
            continue
        action = balancing_actions(fast, rng)
        a, b = fast.step(action), slow.step(action)
        assert_same_step(a, b)
        ended += len(a[1])
        truncated += int(a[0].truncated.sum())
    assert ended > 10, "the run must cover terminations and resets"
    assert truncated > 0, "the run must cover truncations"
    for x, y in zip(fast.envs, slow.envs, strict=True):
        assert x.unwrapped.state.tobytes() == y.unwrapped.state.tobytes()
        assert x._elapsed_steps == y._elapsed_steps
        assert x.unwrapped.steps_beyond_terminated == y.unwrapped.steps_beyond_terminated
        assert x.unwrapped.np_random.bit_generator.state == y.unwrapped.np_random.bit_generator.state


def assert_matches_sync_vector_env(g: EnvGroup, *, seed: int, actions, steps: int) -> None:
    """Step ``g`` (SAME_STEP autoreset) and gymnasium's SyncVectorEnv of the same copies side by side."""
    import functools

    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    k = g.num_envs
    ref = SyncVectorEnv([functools.partial(make_env, g.task)] * k, autoreset_mode=AutoresetMode.SAME_STEP)
    obs_ref, _ = ref.reset(seed=[seed + i for i in range(k)])
    assert g.reset(seed).tobytes() == obs_ref.tobytes()
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        action = actions(g, rng)
        out, _ = g.step(action)
        o, r, term, trunc, info = ref.step(action)
        assert out.observation.tobytes() == o.tobytes()
        assert out.reward.tobytes() == r.astype(np.float64).tobytes()
        assert (out.terminated == term).all()
        assert (out.truncated == trunc).all()
        done = term | trunc
        if done.any():
            assert out.final_observation[done].tobytes() == np.stack(info["final_obs"][done]).tobytes()
    ref.close()


def test_batched_cartpole_matches_sync_vector_env_with_same_step_autoreset():
    """Against gymnasium's SyncVectorEnv itself (SAME_STEP): the official per-copy semantics."""
    g = group("cartpole-balance", 32, pb.AUTORESET_MODE_SAME_STEP)
    assert g.batched is not None
    assert_matches_sync_vector_env(g, seed=5, actions=balancing_actions, steps=800)


@pytest.mark.parametrize(("task_id", "k"), [("cartpole-balance", MIN_BATCHED_COPIES - 1), ("pendulum-lqr", 64)])
def test_other_groups_step_each_copy(task_id, k):
    assert group(task_id, k, pb.AUTORESET_MODE_SAME_STEP).batched is None


# -- MuJoCo copies stepped on several threads ------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    p = StepPool(3)  # more threads than this machine may have CPUs: the chunking is what is tested
    yield p
    p.shutdown()


def mujoco_state(g: EnvGroup) -> list[bytes]:
    """Everything a copy carries into its next step (and what mj_rnePostConstraint left behind)."""
    import mujoco

    out = []
    for env in g.envs:
        raw = env.unwrapped
        m, d = raw.model, raw.data
        state = np.empty(mujoco.mj_stateSize(m, mujoco.mjtState.mjSTATE_INTEGRATION))
        mujoco.mj_getState(m, d, state, mujoco.mjtState.mjSTATE_INTEGRATION)
        out.append(b"".join(a.tobytes() for a in (state, d.qacc, d.cacc, d.cfrc_int, d.cfrc_ext, d.ctrl)))
        out.append(np.array([env._elapsed_steps]).tobytes())
    return out


def mujoco_actions(g: EnvGroup, rng: np.random.Generator) -> np.ndarray:
    """Balancing/standing feedback: the first quarter of the copies with little noise (full-length,
    truncated episodes), the others with much more (falls); on the pendulum the second quarter has a
    wrong-sign cart gain that runs the slider into its end stops (the constraint solver and its warm
    start at work)."""
    space, k = g.action_space, g.num_envs
    obs = np.array([np.concatenate([env.unwrapped.data.qpos, env.unwrapped.data.qvel]) for env in g.envs])
    quarter = np.arange(k) * 4 // k
    calm = quarter < 2 if g.task.spec.gym_id.startswith("InvertedPendulum") else quarter == 0
    if g.task.spec.gym_id.startswith("InvertedPendulum"):
        cart_gain = np.where(quarter == 1, -0.5, 1.0)
        act = (cart_gain * obs[:, 0] + obs[:, 1:] @ np.array([5.0, 0.3, 0.5]))[:, None]
        act += np.where(calm, 0.02, 0.3)[:, None] * rng.standard_normal((k, 1))
        act[~calm & (rng.random(k) < 0.03)] = 3.0
    else:
        act = np.stack([-5.0 * obs[:, 3 + j] - 0.5 * obs[:, 9 + j] for j in range(3)], axis=1)
        act += np.where(calm, 0.1, 1.5)[:, None] * rng.standard_normal(act.shape)
    return np.clip(act, space.low, space.high).astype(np.float32)


@pytest.mark.parametrize(
    ("task_id", "k", "autoreset", "steps", "mode"),
    [
        ("pendulum-lqr", 16, pb.AUTORESET_MODE_SAME_STEP, 1100, "pendulum"),
        ("pendulum-lqr", MIN_PARALLEL_COPIES["pendulum"], pb.AUTORESET_MODE_DISABLED, 300, "pendulum"),
        ("hopper-hop", 9, pb.AUTORESET_MODE_SAME_STEP, 400, "threads"),
    ],
)
def test_parallel_mujoco_is_bit_identical_to_stepping_each_copy(pool, task_id, k, autoreset, steps, mode):
    fast, slow = group(task_id, k, autoreset, pool=pool), group(task_id, k, autoreset)
    assert fast.parallel is not None
    assert fast.parallel.mode == mode
    assert slow.parallel is None
    assert fast.reset(11).tobytes() == slow.reset(11).tobytes()
    rng = np.random.default_rng(3)
    ends = {"terminated": 0, "truncated": 0}
    constrained = 0  # steps on which some copy had an active constraint (contact, joint limit)
    for _ in range(steps):
        if autoreset == pb.AUTORESET_MODE_DISABLED and any(m.done for m in fast.meters):
            assert [m.done for m in fast.meters] == [m.done for m in slow.meters]
            seed = int(rng.integers(1 << 30))
            assert fast.reset(seed).tobytes() == slow.reset(seed).tobytes()
        action = mujoco_actions(fast, rng)
        a, b = fast.step(action), slow.step(action)
        assert_same_step(a, b)
        for _, m in a[1]:
            ends["terminated" if m.terminated else "truncated"] += 1
        assert mujoco_state(fast) == mujoco_state(slow)
        constrained += any(env.unwrapped.data.nefc for env in fast.envs)
    if autoreset == pb.AUTORESET_MODE_SAME_STEP:  # (without, the first fall resets every copy)
        assert constrained > 0
    assert ends["terminated"] > 0
    if steps > 1000:
        assert ends["truncated"] > 0


def test_parallel_mujoco_matches_sync_vector_env_with_same_step_autoreset(pool):
    """Against gymnasium's SyncVectorEnv itself (SAME_STEP), as for BatchedCartPole."""
    g = group("pendulum-lqr", 12, pb.AUTORESET_MODE_SAME_STEP, pool=pool)
    assert g.parallel is not None
    assert_matches_sync_vector_env(g, seed=7, actions=mujoco_actions, steps=400)


def test_small_or_single_threaded_or_other_groups_step_each_copy(pool):
    same_step = pb.AUTORESET_MODE_SAME_STEP
    assert group("pendulum-lqr", MIN_PARALLEL_COPIES["pendulum"] - 1, same_step, pool=pool).parallel is None
    assert group("hopper-hop", MIN_PARALLEL_COPIES["threads"] - 1, same_step, pool=pool).parallel is None
    assert group("pendulum-lqr", 64, pb.AUTORESET_MODE_SAME_STEP, pool=StepPool(1)).parallel is None
    assert group("reacher-jacobian", 16, pb.AUTORESET_MODE_SAME_STEP, pool=pool).parallel is None
    assert group("cartpole-balance", 64, pb.AUTORESET_MODE_SAME_STEP, pool=pool).parallel is None


def test_the_pendulum_way_mirrors_the_installed_gymnasium(monkeypatch):
    """The ``pendulum`` way computes InvertedPendulumEnv.step's expressions itself: it is used only
    while gymnasium's code is the code it mirrors. A gymnasium that changes it fails here first (check
    the mirror against the new code, then update PENDULUM_CODE_SHA256); meanwhile it is not used."""
    from gymnasium.envs.mujoco.inverted_pendulum_v5 import InvertedPendulumEnv

    from ale_evaluator import parallel

    assert parallel.pendulum_code_matches()
    envs = [make_env(catalog.get_task("pendulum-lqr")) for _ in range(MIN_PARALLEL_COPIES["pendulum"])]
    assert ParallelMujoco.mode_for(envs) == "pendulum"

    original = InvertedPendulumEnv.step

    def step(self, action):  # the same behaviour, other code: not what the mirror was checked against
        return original(self, action)

    monkeypatch.setattr(InvertedPendulumEnv, "step", step)
    parallel.pendulum_code_sha256.cache_clear()
    try:
        assert not parallel.pendulum_code_matches()
        assert ParallelMujoco.mode_for(envs) is None
    finally:
        monkeypatch.undo()
        parallel.pendulum_code_sha256.cache_clear()
    assert ParallelMujoco.mode_for(envs) == "pendulum"
    envs[3].unwrapped.step = lambda action: None  # a patched copy is not the code mirrored either
    assert ParallelMujoco.mode_for(envs) is None


def test_step_pool_runs_every_chunk_and_raises_the_first_error():
    p = StepPool(3)
    try:
        for n in (0, 1, 2, 3, 7, 64):
            seen: list[tuple[int, int]] = []
            p.run(lambda lo, hi, seen=seen: seen.append((lo, hi)), n)
            assert sorted(seen)[0][0] == 0 or n == 0
            covered = sorted(i for lo, hi in seen for i in range(lo, hi))
            assert covered == list(range(n))
            assert len(seen) == max(1, min(3, n))

        finished = []

        def work(lo: int, hi: int) -> None:
            if lo == 0:
                raise ValueError("chunk 0 failed")
            import time

            time.sleep(0.05)
            finished.append(lo)

        with pytest.raises(ValueError, match="chunk 0 failed"):
            p.run(work, 9)
        assert sorted(finished) == [3, 6], "the other chunks ran to their end before the error came back"

        def helper_fails(lo: int, hi: int) -> None:
            if lo != 0:
                raise RuntimeError(f"chunk {lo} failed")

        with pytest.raises(RuntimeError, match="chunk 3 failed"):
            p.run(helper_fails, 9)
    finally:
        p.shutdown()
    with pytest.raises(ValueError, match="at least 1"):
        StepPool(0)


# -- batch evaluation: episodes run side by side ------------------------------------------------------


def _batch_records(
    policy_raw: bytes,
    episodes: int,
    *,
    lockstep: bool,
    official: bool = False,
    cancel_after=None,
    task_id: str = "cartpole-balance",
    pool: StepPool | None = None,
):
    import threading

    from ale.policy import load_policy
    from ale_evaluator import batch as batch_module
    from ale_evaluator.seeds import RunConfig

    task = catalog.get_task(task_id)
    job = batch_module.BatchJob(
        batch_id="b", task=task, domain=DOMAINS[task.spec.domain], policy=load_policy(policy_raw),
        num_episodes=episodes, official=official, owner="harness" if official else "agent",
        config=RunConfig("run-lockstep", b"\x07" * 32), base_seed=11, step_pool=pool if lockstep else None,
    )  # fmt: skip
    if cancel_after is not None:
        job.on_record = lambda rec: job.cancel.set() if len(job.records) >= cancel_after else None
    original, run_lockstep = batch_module.BatchedCartPole.fits, batch_module.BatchJob._run_lockstep
    used: list[int] = []

    def spy(self, envs, step):  # type: ignore[no-untyped-def]
        used.append(len(envs))
        return run_lockstep(self, envs, step)

    try:
        batch_module.BatchJob._run_lockstep = spy  # type: ignore[method-assign]
        if not lockstep:
            batch_module.BatchedCartPole.fits = staticmethod(lambda envs: False)  # type: ignore[method-assign]
        thread = threading.Thread(target=job.run)
        thread.start()
        thread.join()
    finally:
        batch_module.BatchedCartPole.fits = original  # type: ignore[method-assign]
        batch_module.BatchJob._run_lockstep = run_lockstep  # type: ignore[method-assign]
    if task_id == "cartpole-balance":
        least = MIN_BATCHED_COPIES
    else:
        least = MIN_PARALLEL_COPIES[ParallelMujoco.mode_for([make_env(task)] * 64) or ""]
    assert used == ([min(episodes, 32)] if lockstep and episodes >= least else [])
    return job


@pytest.mark.parametrize("official", [False, True])
@pytest.mark.parametrize(
    "second_row",
    [
        (0.0, 0.5, 10.0, 2.0),  # balances: episodes run to the time limit (truncated at 500)
        (0.05, 0.5, 10.0, 2.0),  # balances while drifting: some reach the track edge (safety events)
        (0.0, 0.0, 1.0, 0.0),  # falls within a few dozen steps (terminated)
    ],
)
@pytest.mark.parametrize("episodes", [1, 15, 16, 45])
def test_lockstep_batch_gives_the_episodes_of_the_sequential_batch(second_row, episodes, official):
    """Same records, field for field, as running the episodes one after another: returns, lengths,
    safety counts, commitments, terminated/truncated, headline values."""
    from ale.policy import linear_policy

    raw = linear_policy(np.array([[0.0, 0.0, 0.0, 0.0], second_row]), output="discrete")
    fast = _batch_records(raw, episodes, lockstep=True, official=official)
    slow = _batch_records(raw, episodes, lockstep=False, official=official)
    assert fast.state == slow.state == pb.BATCH_STATE_DONE
    by_index = sorted(fast.records, key=lambda r: r.index)
    assert [r.index for r in by_index] == list(range(episodes))
    assert by_index == slow.records
    if episodes == 45:  # the runs cover what an episode can do
        outcomes = {(r.terminated, r.truncated) for r in slow.records}
        assert outcomes & {(True, False), (False, True)}


def test_a_cancelled_lockstep_batch_aborts_every_episode_in_flight():
    from ale.policy import linear_policy

    theta = np.array((1.0, 0.3, 0.02, 0.1))
    raw = linear_policy(np.stack([-theta, theta]), output="discrete")
    job = _batch_records(raw, 200, lockstep=True, cancel_after=1)
    assert job.state == pb.BATCH_STATE_FAILED
    aborted = [r for r in job.records if r.aborted]
    assert aborted
    assert all(r.abort_reason == "session_closed" for r in aborted)
    assert len({r.index for r in job.records}) == len(job.records) < 200


def _same_batch(fast, slow, episodes: int) -> None:
    assert fast.state == slow.state == pb.BATCH_STATE_DONE
    by_index = sorted(fast.records, key=lambda r: r.index)
    assert [r.index for r in by_index] == list(range(episodes))
    assert by_index == slow.records


@pytest.mark.parametrize("official", [False, True])
@pytest.mark.parametrize(
    ("task_id", "weights", "episodes"),
    [
        # InvertedPendulum: balances (1000 steps, truncated), a wrong-sign cart gain (the slider runs
        # into its end stops, rail_limit_steps), falls within a few steps.
        ("pendulum-lqr", [[1.0, 5.0, 0.3, 0.5]], 13),
        ("pendulum-lqr", [[-0.5, 5.0, 0.3, 0.5]], 40),
        ("pendulum-lqr", [[0.0, -5.0, 0.0, 0.0]], 33),
        ("pendulum-lqr", [[0.0, 0.0, 0.0, 0.0]], MIN_PARALLEL_COPIES["pendulum"] - 1),
        # Hopper: a PD hold of the three hinges stands; a crude push falls.
        ("hopper-hop", "stand", 8),
        ("hopper-hop", "push", 12),
    ],
)
def test_mujoco_lockstep_batch_gives_the_episodes_of_the_sequential_batch(pool, task_id, weights, episodes, official):
    from ale.policy import linear_policy

    if weights in ("stand", "push"):
        w = np.zeros((3, 11))
        for j in range(3):
            w[j, 2 + j], w[j, 8 + j] = (-5.0, -0.5) if weights == "stand" else (3.0, 0.0)
        weights = w
    raw = linear_policy(np.array(weights, dtype=float), output="clip")
    fast = _batch_records(raw, episodes, lockstep=True, official=official, task_id=task_id, pool=pool)
    slow = _batch_records(raw, episodes, lockstep=False, official=official, task_id=task_id)
    _same_batch(fast, slow, episodes)


def test_a_non_finite_action_aborts_only_its_episode_in_a_mujoco_lockstep_batch(pool):
    """Observation-dependent overflow: 1e300 x angle x 9.2e8 overflows to inf once the pole leans past
    ~0.195 rad, and the last layer's 0 x inf is NaN (else the action is 0). The episodes whose pole is
    seen in (0.195, 0.2] are aborted with policy_error, the others fall past 0.2 in one step
    (terminated), exactly as in the sequential run."""
    from ale.policy import save_policy

    layers = [(np.array([[0.0, 1e300, 0.0, 0.0]]), np.zeros(1), "identity")]
    layers += [(np.array([[9.2e8]]), np.zeros(1), "identity"), (np.array([[0.0]]), np.zeros(1), "identity")]
    raw = save_policy(layers, output="clip")
    fast = _batch_records(raw, 45, lockstep=True, task_id="pendulum-lqr", pool=pool)
    slow = _batch_records(raw, 45, lockstep=False, task_id="pendulum-lqr")
    _same_batch(fast, slow, 45)  # more episodes than slots: aborted slots go on to the next
    assert {r.abort_reason for r in slow.records} == {"policy_error", ""}


def test_groups_stepped_at_once_on_one_pool_give_what_they_give_alone(pool):
    """Several serving threads step their groups at once, sharing the helper threads (and a batch may
    use them too): each group still gets exactly what it gets stepped alone."""
    import threading

    tasks = ["pendulum-lqr", "hopper-hop", "pendulum-lqr", "hopper-hop"]
    shared = [group(t, 16, pb.AUTORESET_MODE_SAME_STEP, pool=pool) for t in tasks]
    alone = [group(t, 16, pb.AUTORESET_MODE_SAME_STEP) for t in tasks]
    assert all(g.parallel is not None for g in shared)
    steps = 150
    plans = []
    for n, (g, ref) in enumerate(zip(shared, alone, strict=True)):
        assert g.reset(n).tobytes() == ref.reset(n).tobytes()
        rng = np.random.default_rng(n)
        plans.append([np.clip(rng.normal(0, 1, (16, *g.action_space.shape)), -1, 1).astype(np.float32)
                      for _ in range(steps)])  # fmt: skip
    got: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(shared))

    def drive(n: int) -> None:
        try:
            barrier.wait()
            got[n] = [shared[n].step(a) for a in plans[n]]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(n,)) for n in range(len(shared))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for n, ref in enumerate(alone):
        for a, out in zip(plans[n], got[n], strict=True):
            assert_same_step(out, ref.step(a))
        assert mujoco_state(shared[n]) == mujoco_state(ref)
