"""The bundled agents ``ale run`` uses when the user gives none.

They run inside the sandbox, configured only by the environment of docs/agent-contract.md
(``ALE_EVALUATOR``, ``ALE_TASK_ID``, ``ALE_TASK_DIR``, ``ALE_WORKSPACE``, ``ALE_MODE``,
``ALE_BUDGET_*``, optionally ``ALE_EVENT_FD``), and reach the task only through the evaluator's
agent endpoint (:mod:`ale.client`): there is no simulator in the sandbox.

* ``python -m ale.agents.random_agent``: the random baseline (a random linear policy artifact, or
  a policy script that plays uniformly random actions);
* ``python -m ale.agents.demo``: solves each bundled task with the method of its paper.

Both write progress lines to stdout and a few ``note`` events to ``ALE_EVENT_FD``. Extra knobs:
``ALE_AGENT_SEED`` (default 0) seeds their random draws; ``ALE_DEMO_TIME_S`` caps the demo's
training time on hopper-hop (default 120 s).
"""

DEMO_MODULE = "ale.agents.demo"
RANDOM_MODULE = "ale.agents.random_agent"
AGENTS = {"demo": DEMO_MODULE, "random": RANDOM_MODULE}
