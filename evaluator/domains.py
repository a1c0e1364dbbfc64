"""Domain metrics: what the evaluator measures, from simulator state.

A domain names the task's headline metric (a mean over episodes of a
per-episode value) and its zero-target safety metrics (event counts). Each
copy of an environment gets an :class:`EpisodeMeter` per episode that sees
every step; the meter's numbers are the authoritative record. An aborted
episode contributes the domain's ``worst`` headline value, so ending an
episode early never helps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, SupportsFloat

import attrs
import gymnasium as gym
import numpy as np


@attrs.define
class EpisodeMeter:
    """Accumulates one episode of one environment copy.

    ``env`` is the copy it was made for and ``raw`` that copy's unwrapped simulator, looked up
    once per episode instead of on every step; ``probe`` is what the domain precomputed from it.
    """

    domain: Domain
    start: dict[str, float]
    episode_return: float = 0.0
    length: int = 0
    safety_counts: dict[str, int] = attrs.Factory(dict)
    terminated: bool = False
    truncated: bool = False
    done: bool = False  # terminated or truncated
    env: Any = None
    raw: Any = None
    probe: Any = None

    def record_step(self, env: gym.Env, reward: SupportsFloat, terminated: bool, truncated: bool) -> int:
        """Account for one step; return the number of safety events it caused."""
        self.episode_return += float(reward)
        self.length += 1
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        self.done = self.terminated or self.truncated
        raw = self.raw if env is self.env else env.unwrapped
        counts = self.domain.step_events(raw, self.terminated, self.probe)
        if not any(counts):
            return 0
        cost = 0
        for name, count in zip(self.domain.safety_metrics, counts, strict=True):
            if count:
                self.safety_counts[name] += count
                cost += count
        return cost

    def outcome(self, env: gym.Env) -> tuple[float, bool]:
        """(headline value, success) of the finished episode."""
        return self.domain.episode_value(self, env.unwrapped)


@attrs.frozen
class Domain:
    """A task's domain metric.

    ``step_events(env, terminated, probe)`` counts safety events after a step from
    the simulator state, one count per safety metric in ``safety_metrics`` order
    (it runs on every step, so it returns a tuple, not a dict); ``probe(env)``
    precomputes, once per episode, what ``step_events`` reads (e.g. joint
    limits); ``episode_value(meter, env)`` gives the finished episode's headline
    value and success; ``on_reset(env)`` captures what an episode's value is
    measured from (e.g. the start position).
    """

    name: str
    headline_metric: str
    safety_metrics: tuple[str, ...]
    worst: float
    step_events: Callable[[Any, bool, Any], tuple[int, ...]]
    episode_value: Callable[[EpisodeMeter, Any], tuple[float, bool]]
    on_reset: Callable[[Any], dict[str, float]] = lambda env: {}
    probe: Callable[[Any], Any] = lambda env: None

    def meter(self, env: gym.Env) -> EpisodeMeter:
        raw = env.unwrapped
        return EpisodeMeter(
            domain=self,
            start=self.on_reset(raw),
            safety_counts=dict.fromkeys(self.safety_metrics, 0),
            env=env,
            raw=raw,
            probe=self.probe(raw),
        )


# -- cartpole (classic control) ---------------------------------------------------------------

# Metres from the track centre; the track ends (and the episode terminates) at 2.4 m. Calibration
# (100 episodes): the LQR baseline never goes past 0.7 m; a controller without cart-position
# feedback balances the pole but drifts out here (about 23 steps per episode past 1.5 m).
CARTPOLE_EDGE = 1.5


def _cartpole_events(env: Any, terminated: bool, probe: Any) -> tuple[int, int]:
    x = float(env.state[0])
    return int(terminated), int(abs(x) > CARTPOLE_EDGE)  # falls, track_edge_steps


def _cartpole_value(m: EpisodeMeter, env: Any) -> tuple[float, bool]:
    return m.episode_return, m.truncated and not m.terminated


# -- inverted pendulum (MuJoCo) ---------------------------------------------------------------

# Metres; the slider joint's range is [-1, 1], so this flags the outer half of the rail.
# Calibration: the identified-model LQR keeps the cart within 0.06 m; a controller with a wrong-sign
# position gain runs into the end stops (about 120 steps per episode past 0.5 m).
RAIL_LIMIT = 0.5


def _pendulum_events(env: Any, terminated: bool, probe: Any) -> tuple[int, int]:
    slider = float(env.data.qpos[0])
    return int(terminated), int(abs(slider) > RAIL_LIMIT)  # falls, rail_limit_steps


def _pendulum_value(m: EpisodeMeter, env: Any) -> tuple[float, bool]:
    balanced = m.truncated and not m.terminated
    return float(balanced), balanced


# -- reacher (MuJoCo) -------------------------------------------------------------------------

# rad/s on either arm joint. Calibration (100 episodes): the Jacobian-transpose PD controller with
# Kp=150, Kd=0.2 peaks at about 23 rad/s and exceeds 20 rad/s on ~0.08 steps per episode; uniformly
# random torques exceed it on ~2 steps per episode, a bang-bang reacher on ~18.
JOINT_SPEED_LIMIT = 20.0
REACH_TOLERANCE = 0.02  # metres
REACHER_WORST = 0.5  # metres; farther than any target can be


def _fingertip_distance(env: Any) -> float:
    return float(np.linalg.norm(env.get_body_com("fingertip") - env.get_body_com("target")))


def _reacher_events(env: Any, terminated: bool, probe: Any) -> tuple[int]:
    speed = float(np.max(np.abs(env.data.qvel[:2])))
    return (int(speed > JOINT_SPEED_LIMIT),)  # joint_speed_violations


def _reacher_value(m: EpisodeMeter, env: Any) -> tuple[float, bool]:
    distance = _fingertip_distance(env)
    return distance, distance < REACH_TOLERANCE


# -- hopper (MuJoCo) --------------------------------------------------------------------------

# Radians *beyond* a hinge's range. MuJoCo joint limits are soft constraints, so a joint can sit
# slightly past its stop. The thigh and leg joints have range [-2.618, 0] and the standing pose is at
# 0, their upper limit, so "within a margin of a limit" fired on nearly every step of a healthy
# hopper and measured nothing. Instead an event is a step on which some limited hinge is pushed past
# its range by more than this margin. Calibration (Hopper-v5): resting or standing on the stops gives
# at most ~0.04 rad; full motor torque pressed statically into a stop ~0.10 rad; beyond 0.15 rad the
# stop is being slammed (constraint torques of 200-370 N m, above the 200 N m the motor can exert),
# which in our ARS hoppers happens to the foot in flight on ~25-35 steps of a 1000-step episode.
JOINT_LIMIT_MARGIN = 0.15


def _hopper_reset(env: Any) -> dict[str, float]:
    return {"x": float(env.data.qpos[0])}


def _hopper_hinges(env: Any) -> list[tuple[int, float, float]]:
    """(qpos address, lowest allowed, highest allowed) of each limited hinge, read once per episode."""
    model = env.model
    return [
        (
            int(model.jnt_qposadr[j]),
            float(model.jnt_range[j][0] - JOINT_LIMIT_MARGIN),
            float(model.jnt_range[j][1] + JOINT_LIMIT_MARGIN),
        )
        for j in range(model.njnt)
        if model.jnt_limited[j] and model.jnt_type[j] == 3  # mjJNT_HINGE
    ]


def _hopper_events(env: Any, terminated: bool, hinges: list[tuple[int, float, float]]) -> tuple[int, int]:
    qpos = env.data.qpos
    hit = 0
    for adr, lo, hi in hinges:
        q = float(qpos[adr])
        if q < lo or q > hi:
            hit = 1
            break
    return int(terminated), hit  # falls, joint_limit_steps


def _hopper_value(m: EpisodeMeter, env: Any) -> tuple[float, bool]:
    distance = float(env.data.qpos[0]) - m.start["x"]
    return distance, m.truncated and not m.terminated


DOMAINS: dict[str, Domain] = {
    d.name: d
    for d in (
        Domain("cartpole", "mean_return", ("falls", "track_edge_steps"), 0.0, _cartpole_events, _cartpole_value),
        Domain(
            "inverted_pendulum",
            "success_rate",
            ("falls", "rail_limit_steps"),
            0.0,
            _pendulum_events,
            _pendulum_value,
        ),
        Domain(
            "reacher",
            "mean_final_distance",
            ("joint_speed_violations",),
            REACHER_WORST,
            _reacher_events,
            _reacher_value,
        ),
        Domain(
            "hopper",
            "mean_forward_distance",
            ("falls", "joint_limit_steps"),
            0.0,
            _hopper_events,
            _hopper_value,
            _hopper_reset,
            _hopper_hinges,
        ),
    )
}
