"""hopper-hop: Augmented Random Search (V2-t) for a linear policy with observation normalisation.

Per iteration: N = 8 directions; the 2N perturbed policies M ± nu delta_k run one episode each, in
parallel, on two RemoteVectorEnvs of N copies reset with the same seed (copy k of the first runs
M + nu delta_k, copy k of the second M - nu delta_k, from the same initial state). The update uses
the b = 4 best directions, scaled by the standard deviation of their returns; the normaliser is
the running mean/std of every observation seen in training. The training reward is
r - 1 - lambda * (joint angles past their stops), computed from o[2:5]. Runs that stall are
restarted, as the paper advises; the best policy by practice evaluation (own seeds) is kept.

Through the gRPC boundary a rollout is slower than in-process, and the demo's default time budget
(ALE_DEMO_TIME_S, 120 s) buys far fewer than the paper's 2.5 M steps; the agent reports what it
reached on practice evaluations.
"""

from __future__ import annotations

import time

import numpy as np

from ale.agents._common import AgentContext, BudgetExhausted, box, describe_result
from ale.client import RemoteVectorEnv
from ale.policy import save_policy

N_DIRECTIONS = 8
TOP = 4
ALPHA = 0.02
NU = 0.03
PENALTY = 20.0  # per rad past a joint stop
JOINT_HI = np.array([0.0, 0.0, 0.7854])
JOINT_LO = np.array([-2.618, -2.618, -0.7854])
OBS_CLIP = 10.0
MIN_STD = 1e-2
DEFAULT_TIME_S = 120.0
CHECK_EVERY_S = 20.0
# The paper: "ARS is seed-sensitive [...] Restart runs that stall." A run stalls when its best
# practice distance has not grown by STALL_GAIN for STALL_STEPS environment steps while below STALL_BELOW.
STALL_GAIN = 0.1
STALL_STEPS = 200_000
STALL_BELOW = 5.0
CHECK_EPISODES = 5
CHECK_SEED = 50_000
FINAL_EPISODES = 20
FINAL_SEED = 60_000


class RunningStats:
    """Running mean and variance of observations, merged batch by batch (Chan et al.)."""

    def __init__(self, dim: int) -> None:
        self.count = 0
        self.mean = np.zeros(dim)
        self.m2 = np.zeros(dim)

    def add(self, batch: np.ndarray) -> None:
        n = len(batch)
        if n == 0:
            return
        b_mean = batch.mean(axis=0)
        b_m2 = ((batch - b_mean) ** 2).sum(axis=0)
        delta = b_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        self.m2 = self.m2 + b_m2 + delta**2 * self.count * n / total
        self.count = total

    def normaliser(self) -> tuple[np.ndarray, np.ndarray]:
        """(mu, sigma) with components of sigma below 0.01 replaced by 1 (ARS V2)."""
        if self.count < 2:
            return np.zeros_like(self.mean), np.ones_like(self.mean)
        sd = np.sqrt(self.m2 / (self.count - 1))
        sd[sd < MIN_STD] = 1.0
        return self.mean.copy(), sd


def artifact(m: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> bytes:
    """a = clip(M clip((o - mu) / sd, -10, 10), -1, 1) as an ale-policy/v1 artifact."""
    return save_policy([(m, np.zeros(m.shape[0]), "identity")], output="clip", normalizer=(mu, sd, OBS_CLIP))


def joint_penalty(obs: np.ndarray) -> np.ndarray:
    q = obs[:, 2:5]
    penalty: np.ndarray = np.sum(np.maximum(0.0, np.maximum(q - JOINT_HI, JOINT_LO - q)), axis=1)
    return penalty


class StallMonitor:
    """A run's progress: stalled when its best practice distance has not grown by STALL_GAIN (at least
    5 cm) for STALL_STEPS environment steps while it is still below STALL_BELOW."""

    def __init__(self, steps: int) -> None:
        self.best = -np.inf
        self.best_steps = steps  # when the last real gain happened

    def stalled(self, value: float, steps: int) -> bool:
        if not np.isfinite(self.best) or value > self.best + max(STALL_GAIN * abs(self.best), 0.05):
            self.best_steps = steps
        self.best = max(self.best, value)
        return self.best < STALL_BELOW and steps - self.best_steps > STALL_STEPS


class Trainer:
    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.obs_dim = int(np.prod(box(ctx.observation_space).shape))
        self.act_dim = int(np.prod(box(ctx.action_space).shape))
        self.horizon = int(ctx.spec.max_episode_steps) or 1000
        self.k = 2 * N_DIRECTIONS
        self.envs = [RemoteVectorEnv(ctx.evaluator, N_DIRECTIONS) for _ in range(2)]  # plus, minus
        self.iterations = 0  # over all runs
        self.run = -1
        self.start_run()

    def start_run(self) -> None:
        """A fresh ARS run (M = 0, empty normaliser statistics) with its own random stream."""
        self.run += 1
        self.rng = np.random.default_rng(self.ctx.seed + 1000 * self.run)
        self.m = np.zeros((self.act_dim, self.obs_dim))
        self.stats = RunningStats(self.obs_dim)
        self.mu, self.sd = self.stats.normaliser()
        self.progress = StallMonitor(self.ctx.steps_used)

    def rollouts(self, policies: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """One episode per policy: (training returns, episode lengths).

        Policy k runs on copy k of the "plus" environment and policy N + k on copy k of the
        "minus" one; both are reset with the same seed, so the two episodes of a pair start from
        the same state (copy k of each is seeded with seed + k).
        """
        k = self.k
        obs = np.concatenate([env.reset(seed=seed)[0] for env in self.envs])
        active = np.ones(k, dtype=bool)
        returns = np.zeros(k)
        lengths = np.zeros(k, dtype=np.int64)
        seen = []
        for _ in range(self.horizon):
            x = np.clip((obs - self.mu) / self.sd, -OBS_CLIP, OBS_CLIP)
            actions = np.clip(np.einsum("kij,kj->ki", policies, x), -1.0, 1.0)
            seen.append(obs[active])
            nxt, last, reward, done = self._step(actions)
            shaped = reward - 1.0 - PENALTY * joint_penalty(last)
            returns[active] += shaped[active]
            lengths[active] += 1
            active &= ~done
            obs = nxt
            if not active.any():
                break
        self.stats.add(np.concatenate(seen))
        return returns, lengths

    def _step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step both environments: (observations, true last observations, rewards, done flags)."""
        parts = []
        for env, act in zip(self.envs, np.split(actions, len(self.envs)), strict=True):
            nxt, reward, terminated, truncated, infos = env.step(act)
            self.ctx.count_steps(env.num_envs)
            done = terminated | truncated
            # A finished copy's row already starts a new episode; its last observation is final_obs.
            last = np.where(done[:, None], infos["final_obs"], nxt) if done.any() else nxt
            parts.append((nxt, last, reward, done))
        observations, lasts, rewards, dones = (np.concatenate(p) for p in zip(*parts, strict=True))
        return observations, lasts, rewards, dones

    def iteration(self) -> tuple[np.ndarray, np.ndarray]:
        n = N_DIRECTIONS
        deltas = self.rng.standard_normal((n, self.act_dim, self.obs_dim))
        seed = int(self.rng.integers(2**31))
        policies = np.concatenate([self.m + NU * deltas, self.m - NU * deltas])
        returns, lengths = self.rollouts(policies, seed)
        r_plus, r_minus = returns[:n], returns[n:]
        top = np.argsort(-np.maximum(r_plus, r_minus))[:TOP]
        sigma_r = float(np.concatenate([r_plus[top], r_minus[top]]).std()) + 1e-8
        self.m = self.m + ALPHA / (TOP * sigma_r) * np.einsum("k,kij->ij", r_plus[top] - r_minus[top], deltas[top])
        self.mu, self.sd = self.stats.normaliser()
        self.iterations += 1
        return returns, lengths

    def artifact(self) -> bytes:
        return artifact(self.m, self.mu, self.sd)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class Best:
    """The best policy seen so far (over all runs) by practice evaluation; kept in the workspace."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.value = -np.inf
        self.raw = b""
        self.where = ""

    def offer(self, trainer: Trainer) -> float:
        raw = trainer.artifact()
        result = self.ctx.practice_batch_eval(raw, episodes=CHECK_EPISODES, seed=CHECK_SEED)
        value = result.headline_value
        if value > self.value:
            self.value, self.raw = value, raw
            self.where = f"run {trainer.run}, iteration {trainer.iterations}"
            self.ctx.write_artifact(raw)
        self.ctx.note(
            f"run {trainer.run}, iteration {trainer.iterations}, {self.ctx.steps_used} env steps: practice "
            f"{result.headline_metric} {value:.3f} m over {CHECK_EPISODES} episodes "
            f"({result.passed_episodes} ran to their end); best so far {self.value:.3f} m ({self.where})"
        )
        return value


def solve(ctx: AgentContext) -> None:
    budget = ctx.time_budget(DEFAULT_TIME_S, env_var="ALE_DEMO_TIME_S")
    reserve = min(15.0, 0.25 * budget)  # the final practice evaluation and writing the artifact
    train_until = ctx.started + budget - reserve
    trainer = Trainer(ctx)
    best = Best(ctx)
    ctx.note(
        f"ARS V2-t: N={N_DIRECTIONS} directions, top b={TOP}, alpha={ALPHA}, nu={NU}, joint-stop penalty "
        f"{PENALTY}/rad, {trainer.k} copies per iteration, episodes up to {trainer.horizon} steps; "
        f"time budget {budget:.0f} s (training until {budget - reserve:.0f} s)"
    )
    # Something valid is in the workspace from the start (the zero policy), replaced by better ones.
    ctx.write_artifact(trainer.artifact())
    last_iter_s, last_check, checked_at = 0.0, time.monotonic(), -1
    stop_reason = "time budget"
    try:
        while True:
            now = time.monotonic()
            if now + 1.3 * last_iter_s > train_until:
                break
            try:
                ctx.reserve_steps(trainer.k * trainer.horizon)
            except BudgetExhausted:
                stop_reason = "environment-step budget"
                break
            returns, lengths = trainer.iteration()
            last_iter_s = time.monotonic() - now
            ctx.log(
                f"iteration {trainer.iterations}: training return mean {returns.mean():.1f} max {returns.max():.1f}, "
                f"episode length mean {lengths.mean():.0f} max {lengths.max()}, {ctx.steps_used} env steps, "
                f"{last_iter_s:.2f} s"
            )
            if time.monotonic() - last_check > CHECK_EVERY_S:
                value = best.offer(trainer)
                last_check, checked_at = time.monotonic(), trainer.iterations
                if trainer.progress.stalled(value, ctx.steps_used):
                    ctx.note(
                        f"run {trainer.run} stalled at {trainer.progress.best:.2f} m (no {STALL_GAIN:.0%} gain in "
                        f"{STALL_STEPS} steps); restarting ARS from M = 0 with a fresh random stream"
                    )
                    trainer.start_run()
                    last_iter_s = 0.0
        ctx.note(f"training stopped ({stop_reason}) after {trainer.iterations} iterations, {ctx.steps_used} steps")
        if checked_at != trainer.iterations:
            best.offer(trainer)
    finally:
        trainer.close()
    path = ctx.write_artifact(best.raw)
    ctx.note(f"wrote the linear policy of {best.where} with its normaliser to {path} ({len(best.raw)} bytes)")
    result = ctx.practice_batch_eval(best.raw, episodes=FINAL_EPISODES, seed=FINAL_SEED)
    ctx.note(
        f"final practice evaluation (own seeds, not the official one): {describe_result(result)}; "
        f"the paper reports 17.0 m after about 2.5 M steps, this run used {ctx.steps_used}"
    )
