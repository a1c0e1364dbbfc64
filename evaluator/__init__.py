"""The trusted evaluator: one simulator and one domain metric behind gym-over-gRPC.

Installed as ``ale_evaluator``. It owns the simulator, the hidden seeds and the
domain metric; the agent only ever sees it through the ``ale.env.v1`` service.
"""

__version__ = "0.1.0"
