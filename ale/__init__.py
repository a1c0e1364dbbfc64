"""ALE Robotics: a benchmark for autonomous coding agents that reproduce robotics papers.

``ale.core`` is the pure core shared by the runner and the verifier; ``ale.client``
is the agent's gym client; ``ale.protocol`` the wire codecs of ``ale.env.v1``.
"""

__version__ = "0.1.0"
