"""The demonstration agent: ``python -m ale.agents.demo``, what ``ale run`` uses when no agent is given.

It solves each bundled task through the evaluator's agent endpoint only (``ale.client``), with the
method its paper describes:

* ``cartpole-balance``: LQR on the linearised cart-pole, a discrete linear policy artifact;
* ``pendulum-lqr``: least-squares identification from random exploration, discrete LQR, a policy script;
* ``reacher-jacobian``: the Jacobian-transpose operational-space PD controller, a policy script;
* ``hopper-hop``: Augmented Random Search (V2-t) for a normalised linear policy, within a time
  budget (``ALE_DEMO_TIME_S``, default 120 s, capped by the wall-time budget).

A task it does not know gets the random baseline (:mod:`ale.agents.random_agent`).
"""

from __future__ import annotations

from collections.abc import Callable

from ale.agents import _cartpole, _hopper, _pendulum, _reacher, random_agent
from ale.agents._common import AgentContext, run_main

# Imported, not named by string: the agent's environment holds the modules its imports reach
# (ale.runner.agent_env follows import statements only).
SOLVERS: dict[str, Callable[[AgentContext], None]] = {
    "cartpole-balance": _cartpole.solve,
    "pendulum-lqr": _pendulum.solve,
    "reacher-jacobian": _reacher.solve,
    "hopper-hop": _hopper.solve,
}


def solver_for(task_id: str) -> Callable[[AgentContext], None]:
    solve = SOLVERS.get(task_id)
    if solve is None:

        def fallback(ctx: AgentContext) -> None:
            ctx.note(f"no demo solver for task {task_id!r}; writing the random baseline instead")
            random_agent.solve(ctx)

        return fallback
    return solve


def solve(ctx: AgentContext) -> None:
    solver_for(ctx.task_id)(ctx)


def main() -> int:
    return run_main("demo-agent", solve)


if __name__ == "__main__":
    raise SystemExit(main())
